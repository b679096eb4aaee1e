package mongofake

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Limits reported in hello and buildInfo.
const (
	maxBSONObjectSize = 16 * 1024 * 1024
	maxWriteBatchSize = 100_000
	minWireVersion    = 0
	maxWireVersion    = 21 // MongoDB 7.0
	sessionTimeoutMin = 30
)

func init() {
	register(commandSpec{names: []string{"hello", "isMaster", "ismaster"}, handler: hello, noSession: true})
}

// hello answers the handshake and monitoring command as the primary of a
// single-node replica set. It leaves out topologyVersion (no awaitable
// hello: with it drivers would stream hellos) and compression (none is
// offered), and never answers saslSupportedMechs or speculativeAuthenticate
// (there is no authentication).
func hello(r *request) (bson.D, error) {
	s, c := r.srv, r.conn
	helloOK := false
	for _, e := range r.cmd[1:] {
		if e.Key == "helloOk" {
			helloOK, _ = e.Value.(bool)
		}
	}

	host := s.advertisedHost(c)
	ts := s.engine.ClusterTime()
	now := time.Now()
	lastWriteDate := now
	if ts.T != 0 {
		lastWriteDate = time.Unix(int64(ts.T), 0)
	}
	opTime := bson.D{{Key: "ts", Value: ts}, {Key: "t", Value: int64(1)}}
	primaryKey := "isWritablePrimary"
	if r.name != "hello" {
		primaryKey = "ismaster"
	}
	out := bson.D{
		{Key: primaryKey, Value: true},
		{Key: "hosts", Value: bson.A{host}},
		{Key: "setName", Value: s.cfg.replSet},
		{Key: "setVersion", Value: int32(1)},
		{Key: "secondary", Value: false},
		{Key: "primary", Value: host},
		{Key: "me", Value: host},
		{Key: "electionId", Value: s.electionID},
		{Key: "lastWrite", Value: bson.D{
			{Key: "opTime", Value: opTime},
			{Key: "lastWriteDate", Value: bson.NewDateTimeFromTime(lastWriteDate)},
			{Key: "majorityOpTime", Value: opTime},
			{Key: "majorityWriteDate", Value: bson.NewDateTimeFromTime(lastWriteDate)},
		}},
		{Key: "maxBsonObjectSize", Value: int32(maxBSONObjectSize)},
		{Key: "maxMessageSizeBytes", Value: int32(s.cfg.maxMessageSize)},
		{Key: "maxWriteBatchSize", Value: int32(maxWriteBatchSize)},
		{Key: "localTime", Value: bson.NewDateTimeFromTime(now)},
		{Key: "logicalSessionTimeoutMinutes", Value: int32(sessionTimeoutMin)},
		{Key: "connectionId", Value: int32(c.id)},
		{Key: "minWireVersion", Value: int32(minWireVersion)},
		{Key: "maxWireVersion", Value: int32(maxWireVersion)},
		{Key: "readOnly", Value: false},
	}
	if helloOK {
		out = append(out, bson.E{Key: "helloOk", Value: true})
	}
	return out, nil
}

// noteClientMetadata records the client document of a connection's first
// hello or isMaster (the handshake), as mongod does before it runs the
// command: a failCommand fail point restricted to an appName therefore
// matches the handshake itself. Later client documents are ignored.
func (c *conn) noteClientMetadata(name string, body bson.D) {
	if c.gotMetadata || (name != "hello" && name != "isMaster" && name != "ismaster") {
		return
	}
	client, ok := lookupD(body, "client").(bson.D)
	if !ok {
		return
	}
	c.gotMetadata = true
	c.metadata.Store(&client)
	if app, ok := lookupD(client, "application").(bson.D); ok {
		if name, ok := lookupD(app, "name").(string); ok {
			c.appName = name
		}
	}
}

// lookupD returns the value of a top-level field, or nil.
func lookupD(d bson.D, key string) any {
	for _, e := range d {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}

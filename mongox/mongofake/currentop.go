package mongofake

import (
	"fmt"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/query"
)

// $currentOp and the currentOp command
// (https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/currentOp/,
// https://www.mongodb.com/docs/v7.0/reference/command/currentOp/): one
// document per connection running a command (with idleConnections: true,
// the idle connections too), as mongosh's db.currentOp() shows them. The
// server takes no locks and never yields, so locks is empty and numYields
// 0; idle cursors and sessions are not listed.

// runningOp is the command a connection is running.
type runningOp struct {
	opid    int64
	name    string
	db      string
	cmd     bson.D
	started time.Time
}

func init() {
	register(commandSpec{names: []string{"currentOp"}, handler: cmdCurrentOp, adminOnly: true, noSession: true})
}

// currentOpOptions are the options of $currentOp that change its output.
type currentOpOptions struct {
	idleConnections bool
}

func parseCurrentOpOptions(arg any) (currentOpOptions, error) {
	var o currentOpOptions
	spec, ok := arg.(bson.D)
	if !ok {
		return o, errorf(9, "FailedToParse", fmt.Sprintf("$currentOp options must be specified in an object, but found: %v", arg))
	}
	for _, e := range spec {
		if !currentOpOptionNames[e.Key] {
			return o, errorf(9, "FailedToParse", "Unrecognized option '"+e.Key+"' in $currentOp stage.")
		}
		b, isBool := e.Value.(bool)
		if !isBool {
			return o, wrongType("$currentOp."+e.Key, e.Value, "bool")
		}
		if e.Key == "idleConnections" {
			o.idleConnections = b
		}
	}
	return o, nil
}

// currentOps lists the operations for a leading $currentOp stage.
func currentOps(r *request, arg any) ([]bson.D, error) {
	o, err := parseCurrentOpOptions(arg)
	if err != nil {
		return nil, err
	}
	s := r.srv
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	sort.Slice(conns, func(i, j int) bool { return conns[i].id < conns[j].id })
	now := time.Now()
	host := s.advertisedHost(r.conn)
	out := make([]bson.D, 0, len(conns))
	for _, c := range conns {
		op := c.op.Load()
		if op == nil && !o.idleConnections {
			continue
		}
		d := bson.D{
			{Key: "type", Value: "op"},
			{Key: "host", Value: host},
			{Key: "desc", Value: fmt.Sprintf("conn%d", c.id)},
			{Key: "connectionId", Value: c.id},
			{Key: "client", Value: c.remote},
		}
		if md := c.metadata.Load(); md != nil {
			if app, ok := lookupD(*md, "application").(bson.D); ok {
				if name, ok := lookupD(app, "name").(string); ok {
					d = append(d, bson.E{Key: "appName", Value: name})
				}
			}
			d = append(d, bson.E{Key: "clientMetadata", Value: *md})
		}
		d = append(d,
			bson.E{Key: "active", Value: op != nil},
			bson.E{Key: "currentOpTime", Value: now.Format("2006-01-02T15:04:05.000-07:00")},
		)
		if op != nil {
			running := now.Sub(op.started)
			d = append(d,
				bson.E{Key: "threaded", Value: true},
				bson.E{Key: "opid", Value: int32(op.opid)},
				bson.E{Key: "secs_running", Value: int64(running / time.Second)},
				bson.E{Key: "microsecs_running", Value: running.Microseconds()},
				bson.E{Key: "op", Value: opType(op.name)},
				bson.E{Key: "ns", Value: opNamespace(op)},
				bson.E{Key: "command", Value: op.cmd},
				bson.E{Key: "numYields", Value: int32(0)},
			)
			if lsid, ok := lookupD(op.cmd, "lsid").(bson.D); ok {
				d = append(d, bson.E{Key: "lsid", Value: lsid})
			}
			d = append(d,
				bson.E{Key: "locks", Value: bson.D{}},
				bson.E{Key: "waitingForLock", Value: false},
				bson.E{Key: "lockStats", Value: bson.D{}},
			)
		}
		out = append(out, d)
	}
	return out, nil
}

// opType is currentOp's op field: the CRUD commands by their kind, every
// other command "command".
func opType(name string) string {
	switch name {
	case "find":
		return "query"
	case "getMore":
		return "getmore"
	case "insert", "update", "remove":
		return name
	case "delete":
		return "remove"
	}
	return "command"
}

// opNamespace is currentOp's ns: db.collection for a command naming a
// collection, db.$cmd otherwise.
func opNamespace(op *runningOp) string {
	if len(op.cmd) > 0 {
		if coll, ok := op.cmd[0].Value.(string); ok && coll != "" && op.name != "getMore" {
			return op.db + "." + coll
		}
		if c, ok := lookupD(op.cmd, "collection").(string); ok && op.name == "getMore" {
			return op.db + "." + c
		}
	}
	if op.name == "aggregate" {
		return op.db + ".$cmd.aggregate"
	}
	return op.db + ".$cmd"
}

// cmdCurrentOp is the currentOp command: {inprog: [...]}. Its options
// are those of $currentOp ($all: idle connections too); its other fields
// are a filter on the operations, as a $match after $currentOp.
func cmdCurrentOp(r *request) (bson.D, error) {
	opts, filter := bson.D{}, bson.D{}
	for _, e := range r.cmd[1:] {
		switch {
		case e.Key == "$all":
			b, _ := e.Value.(bool)
			opts = append(opts, bson.E{Key: "idleConnections", Value: b})
		case e.Key == "$ownOps":
		case currentOpOptionNames[e.Key]:
			opts = append(opts, e)
		case !genericFields[e.Key]:
			filter = append(filter, e)
		}
	}
	m, err := query.Compile(filter)
	if err != nil {
		return nil, err
	}
	ops, err := currentOps(r, opts)
	if err != nil {
		return nil, err
	}
	inprog := bson.A{}
	for _, d := range ops {
		if m.Match(d) {
			inprog = append(inprog, d)
		}
	}
	return bson.D{{Key: "inprog", Value: inprog}}, nil
}

// currentOpOptionNames are the options of $currentOp.
var currentOpOptionNames = map[string]bool{
	"idleConnections": true, "allUsers": true, "idleSessions": true, "idleCursors": true,
	"localOps": true, "backtrace": true, "truncateOps": true, "targetAllNodes": true,
}

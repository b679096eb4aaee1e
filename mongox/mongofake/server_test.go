package mongofake

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

func TestHandshakeBothURIs(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	require.Regexp(t, `^mongodb://127\.0\.0\.1:\d+/\?replicaSet=rs0$`, srv.URI())
	require.Regexp(t, `^mongodb://127\.0\.0\.1:\d+/\?directConnection=true$`, srv.DirectURI())
	for _, uri := range []string{srv.URI(), srv.DirectURI()} {
		client := connect(t, uri)
		ctx := testCtx(t)
		require.NoError(t, client.Ping(ctx, readpref.Primary()), uri)
		require.NoError(t, client.Ping(ctx, readpref.SecondaryPreferred()), uri)
		_, err := runCmd(t, client.Database("admin"), bson.D{{Key: "ping", Value: 1}})
		require.NoError(t, err)
	}
}

func TestReplicaSetName(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, ReplicaSetName("other"))
	require.Contains(t, srv.URI(), "replicaSet=other")
	client := connect(t, srv.URI())
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "hello", Value: 1}})
	require.NoError(t, err)
	require.Equal(t, "other", get(reply, "setName"))
}

func TestBuildInfo(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	for _, name := range []string{"buildInfo", "buildinfo"} {
		reply, err := runCmd(t, client.Database("test"), bson.D{{Key: name, Value: 1}})
		require.NoError(t, err)
		require.Equal(t, "7.0.0", get(reply, "version"))
		require.Equal(t, bson.A{int32(7), int32(0), int32(0), int32(0)}, get(reply, "versionArray"))
		require.Equal(t, int32(64), get(reply, "bits"))
		require.Equal(t, bson.A{}, get(reply, "modules"))
		require.Equal(t, 1.0, get(reply, "ok"))
	}
	// Command names are case-sensitive apart from the known aliases.
	_, err := runCmd(t, client.Database("test"), bson.D{{Key: "BUILDINFO", Value: 1}})
	requireCode(t, err, 59)
}

func TestHelloFields(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true}})
	require.NoError(t, err)
	require.Equal(t, true, get(reply, "isWritablePrimary"))
	require.Nil(t, get(reply, "ismaster"))
	require.Equal(t, false, get(reply, "secondary"))
	require.Equal(t, "rs0", get(reply, "setName"))
	require.Equal(t, int32(1), get(reply, "setVersion"))
	require.Equal(t, bson.A{srv.Addr()}, get(reply, "hosts"))
	require.Equal(t, srv.Addr(), get(reply, "primary"))
	require.Equal(t, srv.Addr(), get(reply, "me"))
	require.IsType(t, bson.ObjectID{}, get(reply, "electionId"))
	require.Equal(t, int32(16777216), get(reply, "maxBsonObjectSize"))
	require.Equal(t, int32(48000000), get(reply, "maxMessageSizeBytes"))
	require.Equal(t, int32(100000), get(reply, "maxWriteBatchSize"))
	require.Equal(t, int32(30), get(reply, "logicalSessionTimeoutMinutes"))
	require.Equal(t, int32(0), get(reply, "minWireVersion"))
	require.Equal(t, int32(21), get(reply, "maxWireVersion"))
	require.Equal(t, false, get(reply, "readOnly"))
	require.Equal(t, true, get(reply, "helloOk"))
	require.IsType(t, bson.DateTime(0), get(reply, "localTime"))
	require.IsType(t, int32(0), get(reply, "connectionId"))
	lastWrite, ok := get(reply, "lastWrite").(bson.D)
	require.True(t, ok)
	require.IsType(t, bson.DateTime(0), get(lastWrite, "lastWriteDate"))
	opTime, ok := get(lastWrite, "opTime").(bson.D)
	require.True(t, ok)
	require.Equal(t, int64(1), get(opTime, "t"))
	for _, absent := range []string{"topologyVersion", "compression", "saslSupportedMechs", "speculativeAuthenticate"} {
		require.Nil(t, get(reply, absent), absent)
	}
	ct, ok := get(reply, "$clusterTime").(bson.D)
	require.True(t, ok)
	sig, _ := get(ct, "signature").(bson.D)
	require.Equal(t, bson.Binary{Subtype: 0, Data: make([]byte, 20)}, get(sig, "hash"))
	require.Equal(t, int64(0), get(sig, "keyId"))
	require.IsType(t, bson.Timestamp{}, get(reply, "operationTime"))

	// Legacy form answers ismaster, and helloOk only when asked for; a
	// handshake asking for SASL mechanisms gets none.
	reply, err = runCmd(t, client.Database("test"), bson.D{{Key: "isMaster", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.bob"}})
	require.NoError(t, err)
	require.Equal(t, true, get(reply, "ismaster"))
	require.Nil(t, get(reply, "isWritablePrimary"))
	require.Nil(t, get(reply, "helloOk"))
	require.Nil(t, get(reply, "saslSupportedMechs"))
}

func TestConnectionIDsIncrease(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	var last int32
	for i := range 3 {
		nc := rawDial(t, srv)
		rawMsg(t, nc, 1, 0, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
		_, reply := readMsgReply(t, nc)
		id := get(reply, "connectionId").(int32)
		if i > 0 {
			require.Greater(t, id, last)
		}
		last = id
	}
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	_, err := runCmd(t, client.Database("test"), bson.D{{Key: "foo", Value: 1}})
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(59), ce.Code)
	require.Equal(t, "CommandNotFound", ce.Name)
	require.Equal(t, "no such command: 'foo'", ce.Message)
	require.Empty(t, ce.Labels)

	_, err = runCmd(t, client.Database("admin"), bson.D{{Key: "atlasVersion", Value: 1}})
	requireCode(t, err, 59)
}

func TestErrorReplyShape(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	nc := rawDial(t, srv)
	rawMsg(t, nc, 7, 0, bson.D{{Key: "nope", Value: 1}, {Key: "$db", Value: "x"}})
	m, reply := readMsgReply(t, nc)
	require.Equal(t, int32(7), m.Header.ResponseTo)
	require.Equal(t, []string{"ok", "errmsg", "code", "codeName", "$clusterTime", "operationTime"}, keys(reply))
	require.Equal(t, 0.0, get(reply, "ok"))
	require.Equal(t, int32(59), get(reply, "code"))

	// OP_MSG without $db.
	rawMsg(t, nc, 8, 0, bson.D{{Key: "ping", Value: 1}})
	_, reply = readMsgReply(t, nc)
	require.Equal(t, int32(40571), get(reply, "code"))

	// Admin-only command on another database.
	rawMsg(t, nc, 9, 0, bson.D{{Key: "getParameter", Value: 1}, {Key: "featureCompatibilityVersion", Value: 1}, {Key: "$db", Value: "x"}})
	_, reply = readMsgReply(t, nc)
	require.Equal(t, int32(13), get(reply, "code"))
}

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	admin := client.Database("admin")

	reply, err := runCmd(t, admin, bson.D{{Key: "getParameter", Value: 1}, {Key: "featureCompatibilityVersion", Value: 1}})
	require.NoError(t, err)
	require.Equal(t, bson.D{{Key: "version", Value: "7.0"}}, get(reply, "featureCompatibilityVersion"))
	reply, err = runCmd(t, admin, bson.D{{Key: "getParameter", Value: "*"}})
	require.NoError(t, err)
	require.Equal(t, true, get(reply, "enableTestCommands"))
	_, err = runCmd(t, admin, bson.D{{Key: "getParameter", Value: 1}, {Key: "noSuchParameter", Value: 1}})
	requireCode(t, err, 72)

	reply, err = runCmd(t, admin, bson.D{{Key: "getLog", Value: "startupWarnings"}})
	require.NoError(t, err)
	require.Equal(t, int32(0), get(reply, "totalLinesWritten"))
	require.Equal(t, bson.A{}, get(reply, "log"))

	reply, err = runCmd(t, admin, bson.D{{Key: "replSetGetStatus", Value: 1}})
	require.NoError(t, err)
	members := get(reply, "members").(bson.A)
	require.Len(t, members, 1)
	require.Equal(t, "PRIMARY", get(members[0].(bson.D), "stateStr"))
	require.Equal(t, srv.Addr(), get(members[0].(bson.D), "name"))

	reply, err = runCmd(t, admin, bson.D{{Key: "serverStatus", Value: 1}})
	require.NoError(t, err)
	require.Equal(t, "7.0.0", get(reply, "version"))
	require.NotNil(t, get(reply, "connections"))

	reply, err = runCmd(t, admin, bson.D{{Key: "connectionStatus", Value: 1}})
	require.NoError(t, err)
	info := get(reply, "authInfo").(bson.D)
	require.Equal(t, bson.A{}, get(info, "authenticatedUsers"))

	reply, err = runCmd(t, admin, bson.D{{Key: "listCommands", Value: 1}})
	require.NoError(t, err)
	require.NotNil(t, get(get(reply, "commands").(bson.D), "hello"))

	for _, cmd := range []string{"getCmdLineOpts", "hostInfo", "whatsmyuri", "getFreeMonitoringStatus", "replSetGetConfig", "getDefaultRWConcern", "logout"} {
		_, err = runCmd(t, admin, bson.D{{Key: cmd, Value: 1}})
		require.NoError(t, err, cmd)
	}

	_, err = runCmd(t, admin, bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"}, {Key: "payload", Value: bson.Binary{}}})
	requireCode(t, err, 18)
	require.ErrorContains(t, err, "no authentication")
}

func TestAuthenticationFailsClearly(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	client := connect(t, "mongodb://bob:secret@"+srv.Addr()+"/?directConnection=true")
	err := client.Ping(testCtx(t), nil)
	require.Error(t, err)
	require.ErrorContains(t, err, "no authentication")
}

func TestConcurrentClients(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	const clients, pings = 16, 30
	var wg sync.WaitGroup
	errs := make(chan error, clients*pings)
	for range clients {
		client := connect(t, srv.URI())
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := testCtx(t)
			for range pings {
				if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
					errs <- err
				}
				if err := client.Database("x").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Err(); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, srv.ConnectionCount())
}

func TestCloseIdempotentAndDropsClients(t *testing.T) {
	t.Parallel()
	srv, err := NewServer()
	require.NoError(t, err)
	client := connect(t, srv.URI())
	require.NoError(t, client.Ping(testCtx(t), nil))
	nc := rawDial(t, srv)
	waitFor(t, "raw connection registered", func() bool { return srv.ConnectionCount() >= 2 })
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
	require.Zero(t, srv.ConnectionCount())
	expectClosed(t, nc)
	// The port is free again.
	again, err := NewServer(ListenAddr(srv.Addr()))
	require.NoError(t, err)
	require.NoError(t, again.Close())
}

func TestCloseWhileBlocked(t *testing.T) {
	t.Parallel()
	srv, err := NewServer()
	require.NoError(t, err)
	srv.FailCommand(FailPoint{Commands: []string{"ping"}, BlockTime: time.Hour})
	nc := rawDial(t, srv)
	rawMsg(t, nc, 1, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	waitFor(t, "connection registered", func() bool { return srv.ConnectionCount() == 1 })
	done := make(chan struct{})
	go func() { _ = srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung on a blocked command")
	}
}

func TestDropConnections(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	ctx := testCtx(t)
	require.NoError(t, client.Ping(ctx, nil))
	require.Positive(t, srv.ConnectionCount())
	srv.DropConnections()
	waitFor(t, "connections dropped", func() bool { return srv.ConnectionCount() == 0 })
	// The driver reconnects; the first command may see the dead pooled
	// connection, so allow one failure.
	err := client.Ping(ctx, nil)
	if err != nil {
		require.True(t, mongo.IsNetworkError(err), "%v", err)
		require.NoError(t, client.Ping(ctx, nil))
	}
}

func TestDefaultListenAddrAndOptions(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, ListenAddr("127.0.0.1:0"), OplogSize(10), TTLInterval(time.Second),
		TransactionLifetime(5*time.Second), MaxMessageSize(1<<20), Logger(nil))
	client := connect(t, srv.DirectURI())
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "hello", Value: 1}})
	require.NoError(t, err)
	require.Equal(t, int32(1<<20), get(reply, "maxMessageSizeBytes"))
	reply, err = runCmd(t, client.Database("admin"), bson.D{{Key: "getParameter", Value: 1}, {Key: "transactionLifetimeLimitSeconds", Value: 1}})
	require.NoError(t, err)
	require.Equal(t, int32(5), get(reply, "transactionLifetimeLimitSeconds"))

	_, err = NewServer(ReplicaSetName(""))
	require.Error(t, err)
	_, err = NewServer(ListenAddr("256.0.0.1:1"))
	require.Error(t, err)
}

func requireCode(t testing.TB, err error, code int32) {
	t.Helper()
	var ce mongo.CommandError
	require.True(t, errors.As(err, &ce), "want command error %d, got %v", code, err)
	require.Equal(t, code, ce.Code, "%v", err)
}

func keys(d bson.D) []string {
	out := make([]string, len(d))
	for i, e := range d {
		out[i] = e.Key
	}
	return out
}

func TestDropConnectionsEndsBlockedCommand(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	defer srv.FailCommand(FailPoint{Commands: []string{"ping"}, BlockTime: time.Hour})()
	nc := rawDial(t, srv)
	rawMsg(t, nc, 1, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	waitFor(t, "connection registered", func() bool { return srv.ConnectionCount() == 1 })
	srv.DropConnections()
	expectClosed(t, nc)
	waitFor(t, "connection goroutine ended", func() bool { return srv.ConnectionCount() == 0 })
}

func TestUnspecifiedListenAddress(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, ListenAddr("0.0.0.0:0"))
	require.Regexp(t, `^mongodb://127\.0\.0\.1:\d+/\?replicaSet=rs0$`, srv.URI())
	client := connect(t, srv.URI())
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "hello", Value: 1}})
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(srv.Addr())
	require.Equal(t, "127.0.0.1:"+port, get(reply, "me"), "hello reports the address the client dialled")
	require.Equal(t, bson.A{"127.0.0.1:" + port}, get(reply, "hosts"))
}

func TestCompressorsAreNotNegotiated(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	client := connect(t, srv.URI()+"&compressors=zstd,snappy,zlib&appName=compress")
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "hello", Value: 1}})
	require.NoError(t, err)
	require.Nil(t, get(reply, "compression"))
	_, err = client.Database("c").Collection("c").InsertOne(testCtx(t), bson.D{{Key: "x", Value: 1}})
	require.NoError(t, err)
}

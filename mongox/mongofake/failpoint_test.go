package mongofake

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	driverevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func configure(t *testing.T, client *mongo.Client, mode any, data bson.D) {
	t.Helper()
	_, err := runCmd(t, client.Database("admin"), bson.D{
		{Key: "configureFailPoint", Value: "failCommand"},
		{Key: "mode", Value: mode},
		{Key: "data", Value: data},
	})
	require.NoError(t, err)
}

func TestConfigureFailPointNeedsTestCommands(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	client := connect(t, srv.URI())
	_, err := runCmd(t, client.Database("admin"), bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}})
	requireCode(t, err, 59)
	require.ErrorContains(t, err, "test commands")
}

func TestFailPointErrorCodeTimesAndLabels(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	db := client.Database("test")
	configure(t, client, bson.D{{Key: "times", Value: 2}}, bson.D{
		{Key: "failCommands", Value: bson.A{"buildInfo"}},
		{Key: "errorCode", Value: 2},
		{Key: "errorLabels", Value: bson.A{"Custom"}},
	})
	for range 2 {
		_, err := runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
		var ce mongo.CommandError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, int32(2), ce.Code)
		require.Equal(t, "BadValue", ce.Name)
		require.Equal(t, []string{"Custom"}, ce.Labels)
		require.Equal(t, "Failing command via 'failCommand' failpoint", ce.Message)
	}
	_, err := runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err, "the fail point ran out")
	// Commands not named are never failed.
	_, err = runCmd(t, db, bson.D{{Key: "ping", Value: 1}})
	require.NoError(t, err)
}

func TestFailPointAlwaysOnOffAndSkip(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	db := client.Database("test")
	configure(t, client, "alwaysOn", bson.D{{Key: "failCommands", Value: bson.A{"buildInfo"}}, {Key: "errorCode", Value: 8}})
	for range 3 {
		_, err := runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
		requireCode(t, err, 8)
	}
	reply, err := runCmd(t, client.Database("admin"), bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}})
	require.NoError(t, err)
	require.Equal(t, int64(3), get(reply, "count"))
	_, err = runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)

	configure(t, client, bson.D{{Key: "skip", Value: 1}}, bson.D{{Key: "failCommands", Value: bson.A{"buildInfo"}}, {Key: "errorCode", Value: 8}})
	_, err = runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err, "skipped")
	_, err = runCmd(t, db, bson.D{{Key: "buildInfo", Value: 1}})
	requireCode(t, err, 8)
}

func TestFailPointRetryableLabelRule(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	// Label computation as mongod does it, checked on requests directly.
	txn := int64(1)
	f := false
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	retryable := &request{srv: srv, name: "insert", lsid: lsid, txnNumber: &txn}
	require.Equal(t, []string{labelRetryableWrite}, retryable.errorLabels(91, 0, false))
	require.Empty(t, retryable.errorLabels(2, 0, false))
	require.Equal(t, []string{labelRetryableWrite}, retryable.errorLabels(0, 11600, true))
	noTxn := &request{srv: srv, name: "insert"}
	require.Empty(t, noTxn.errorLabels(91, 0, false))
	find := &request{srv: srv, name: "find", lsid: lsid, txnNumber: &txn}
	require.Empty(t, find.errorLabels(91, 0, false))
	inTxn := &request{srv: srv, name: "insert", lsid: lsid, txnNumber: &txn, autocommit: &f}
	require.Equal(t, []string{labelTransientTransaction}, inTxn.errorLabels(112, 0, false))
	require.Equal(t, []string{labelTransientTransaction}, inTxn.errorLabels(91, 0, false))
	commit := &request{srv: srv, name: "commitTransaction", lsid: lsid, txnNumber: &txn, autocommit: &f}
	require.Equal(t, []string{labelRetryableWrite}, commit.errorLabels(91, 0, false))
	require.Equal(t, []string{labelTransientTransaction}, commit.errorLabels(251, 0, false))
	require.Empty(t, commit.errorLabels(251, 64, true))

	// Through the wire: a fail point without errorLabels gets the rule.
	nc := rawDial(t, srv)
	cancel := srv.FailCommand(FailPoint{Commands: []string{"insert"}, ErrorCode: 91})
	defer cancel()
	rawMsg(t, nc, 1, 0, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{}}},
		{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(3)}, {Key: "$db", Value: "test"}})
	_, reply := readMsgReply(t, nc)
	require.Equal(t, int32(91), get(reply, "code"))
	require.Equal(t, "ShutdownInProgress", get(reply, "codeName"))
	require.Equal(t, bson.A{labelRetryableWrite}, get(reply, "errorLabels"))
	// An explicit empty label list overrides the rule.
	cancel()
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, ErrorCode: 91, ErrorLabels: []string{}})()
	rawMsg(t, nc, 2, 0, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{}}},
		{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(4)}, {Key: "$db", Value: "test"}})
	_, reply = readMsgReply(t, nc)
	require.Nil(t, get(reply, "errorLabels"))
}

func TestFailPointCloseConnection(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	configure(t, client, bson.D{{Key: "times", Value: 1}}, bson.D{{Key: "failCommands", Value: bson.A{"buildInfo"}}, {Key: "closeConnection", Value: true}})
	_, err := runCmd(t, client.Database("test"), bson.D{{Key: "buildInfo", Value: 1}})
	require.Error(t, err)
	require.True(t, mongo.IsNetworkError(err), "%v", err)
	_, err = runCmd(t, client.Database("test"), bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)

	// The Go API works without test commands too.
	plain := newTestServer(t)
	pc := connect(t, plain.DirectURI())
	defer plain.FailCommand(FailPoint{Commands: []string{"buildInfo"}, CloseConnection: true, Times: 1})()
	_, err = runCmd(t, pc.Database("test"), bson.D{{Key: "buildInfo", Value: 1}})
	require.True(t, mongo.IsNetworkError(err), "%v", err)
	_ = srv
}

func TestFailPointBlockConnection(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	configure(t, client, bson.D{{Key: "times", Value: 1}}, bson.D{
		{Key: "failCommands", Value: bson.A{"buildInfo"}},
		{Key: "blockConnection", Value: true},
		{Key: "blockTimeMS", Value: 150},
	})
	start := time.Now()
	_, err := runCmd(t, client.Database("test"), bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	configure(t, client, bson.D{{Key: "times", Value: 1}}, bson.D{
		{Key: "failCommands", Value: bson.A{"buildInfo"}},
		{Key: "blockConnection", Value: true},
		{Key: "blockTimeMS", Value: 50},
		{Key: "errorCode", Value: 262},
	})
	start = time.Now()
	_, err = runCmd(t, client.Database("test"), bson.D{{Key: "buildInfo", Value: 1}})
	requireCode(t, err, 262)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
}

func TestFailPointWriteConcernError(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, EnableTestCommands(true))
	nc := rawDial(t, srv)
	rawMsg(t, nc, 1, 0, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: bson.D{{Key: "times", Value: 1}}},
		{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"ping"}}, {Key: "writeConcernError", Value: bson.D{
			{Key: "code", Value: int32(91)}, {Key: "errmsg", Value: "Replication is being shut down"}}}}},
		{Key: "$db", Value: "admin"}})
	_, reply := readMsgReply(t, nc)
	require.Equal(t, 1.0, get(reply, "ok"))
	rawMsg(t, nc, 2, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	_, reply = readMsgReply(t, nc)
	require.Equal(t, 1.0, get(reply, "ok"))
	wce := get(reply, "writeConcernError").(bson.D)
	require.Equal(t, int32(91), get(wce, "code"))
	require.Nil(t, get(reply, "errorLabels"), "ping is not a retryable write")
}

func TestFailPointAppName(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	mine := connect(t, srv.URI(), options.Client().SetAppName("victim"))
	other := connect(t, srv.URI(), options.Client().SetAppName("bystander"))
	cancel := srv.FailCommand(FailPoint{Commands: []string{"buildInfo"}, AppName: "victim", ErrorCode: 8})
	defer cancel()
	_, err := runCmd(t, other.Database("x"), bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)
	_, err = runCmd(t, mine.Database("x"), bson.D{{Key: "buildInfo", Value: 1}})
	requireCode(t, err, 8)
	cancel()
	cancel() // idempotent
	_, err = runCmd(t, mine.Database("x"), bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)

	srv.FailCommand(FailPoint{Commands: []string{"buildInfo"}, ErrorCode: 8})
	srv.ClearFailPoints()
	_, err = runCmd(t, mine.Database("x"), bson.D{{Key: "buildInfo", Value: 1}})
	require.NoError(t, err)
}

func TestRetryableWriteAfterCloseConnection(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	coll := client.Database("retry").Collection("c")
	ctx := testCtx(t)
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, CloseConnection: true, Times: 1})()
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: "x"}})
	require.NoError(t, err, "the driver retries the insert once")
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	// A retryable error code with the label is retried too.
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, ErrorCode: 91, Times: 1})()
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	require.NoError(t, err)
}

func TestFailPointWriteConcernErrorOnRetryableWrite(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	coll := client.Database("wce").Collection("c")
	ctx := testCtx(t)
	// The write is applied, the reply carries a retryable write concern
	// error with the RetryableWriteError label; the driver retries and the
	// server answers the retry from its retryable-write record.
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, Times: 1,
		WriteConcernError: &WriteConcernError{Code: 91, Message: "Replication is being shut down"}})()
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	// Without retries the error reaches the caller, labelled.
	noRetry := connect(t, srv.URI(), options.Client().SetRetryWrites(false))
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, Times: 1,
		WriteConcernError: &WriteConcernError{Code: 64, Message: "waiting for replication timed out"}})()
	_, err = noRetry.Database("wce").Collection("c").InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	var we mongo.WriteException
	require.ErrorAs(t, err, &we)
	require.NotNil(t, we.WriteConcernError)
	require.Equal(t, 64, we.WriteConcernError.Code)
}

func TestFailPointTransientTransactionError(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	coll := client.Database("txn").Collection("c")
	ctx := testCtx(t)
	require.NoError(t, client.Database("txn").CreateCollection(ctx, "c"))
	defer srv.FailCommand(FailPoint{Commands: []string{"insert"}, ErrorCode: 112, Times: 1})()
	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	attempts := 0
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		attempts++
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: attempts}})
		return nil, err
	})
	require.NoError(t, err)
	require.Equal(t, 2, attempts, "WriteConflict in a transaction is labelled TransientTransactionError and retried")
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// A failCommand fail point restricted to an appName matches the
// connection's handshake itself: mongod records the client metadata of the
// first hello before it runs the command, so the hello that carries the
// appName can fail (the SDAM spec tests fail handshakes this way).
func TestFailPointMatchesHandshakeByAppName(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	configure(t, client, "alwaysOn", bson.D{
		{Key: "failCommands", Value: bson.A{"hello", "isMaster"}},
		{Key: "appName", Value: "handshake"},
		{Key: "errorCode", Value: 91},
	})
	failed := make(chan error, 100)
	mon := &driverevent.ServerMonitor{ServerHeartbeatFailed: func(ev *driverevent.ServerHeartbeatFailedEvent) {
		select {
		case failed <- ev.Failure:
		default:
		}
	}}
	// A long heartbeat interval: only the connection's first hello (the
	// handshake) is sent within the test.
	connect(t, srv.URI(), options.Client().SetAppName("handshake").SetServerMonitor(mon).SetHeartbeatInterval(time.Minute))
	select {
	case err := <-failed:
		require.ErrorContains(t, err, "failCommand")
	case <-testCtx(t).Done():
		t.Fatal("the handshake of a client with the fail point's appName did not fail")
	}
	_, err := runCmd(t, client.Database("admin"), bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}})
	require.NoError(t, err)
}

// A blocked command's maxTimeMS runs during the fail point's block, as in
// mongod (whose wait is interruptible): when it expires first the command
// fails with MaxTimeMSExpired and never runs, so a client that gave up
// does not see its write happen later (CSOT spec tests rely on it).
func TestFailPointBlockCountsAgainstMaxTimeMS(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	db := client.Database("test")
	configure(t, client, bson.D{{Key: "times", Value: 1}}, bson.D{
		{Key: "failCommands", Value: bson.A{"insert"}},
		{Key: "blockConnection", Value: true},
		{Key: "blockTimeMS", Value: 2000},
	})
	_, err := runCmd(t, db, bson.D{
		{Key: "insert", Value: "c"},
		{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}},
		{Key: "maxTimeMS", Value: 20},
	})
	requireCode(t, err, 50)
	n, err := db.Collection("c").CountDocuments(testCtx(t), bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "the insert never ran")
}

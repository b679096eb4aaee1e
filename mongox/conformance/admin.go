package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

func clusterTimeCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"OperationTimeAdvances", testOperationTime},
		{"RepliesCarryClusterTime", testReplyClusterTime},
	})
}

func catalogCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"Collections", testCollections},
		{"Databases", testDatabases},
		{"HelloBuildInfoPing", testHello},
		{"UnknownCommand", testUnknownCommand},
	})
}

func failPointCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"ErrorCodeAndLabels", testFailPointError},
		{"Times", testFailPointTimes},
		{"BlockConnection", testFailPointBlock},
		{"AlwaysOnThenOff", testFailPointOff},
		{"GoFaultAPI", testGoFaultAPI},
		{"TransactionalWriteClosesConnection", testFailPointTransactionalWrite},
		{"TransactionalWriteFailsBeforeCommit", testFailPointTransactionalWriteNotCommitted},
		{"GetMoreAfterCursorCheckout", testFailPointGetMore},
	})
}

func unsupportedCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"ClearErrors", testUnsupported},
	})
}

func testOperationTime(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	coll := db.Collection("c")
	_, err = coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	t1 := sess.OperationTime()
	require.NotNil(t, t1, "operationTime after a write")
	_, err = coll.InsertOne(sctx, D(`{"_id":2}`))
	require.NoError(t, err)
	t2 := sess.OperationTime()
	require.True(t, t2.After(*t1), "operationTime advances with each write: %v then %v", *t1, *t2)

	ct := sess.ClusterTime()
	require.NotNil(t, ct, "the session has gossiped a $clusterTime")
	ctT, ctI, ok := ct.Lookup("$clusterTime", "clusterTime").TimestampOK()
	require.True(t, ok, "$clusterTime.clusterTime is a timestamp: %s", ct)
	require.False(t, bson.Timestamp{T: ctT, I: ctI}.Before(*t2), "clusterTime %v.%v >= operationTime %v", ctT, ctI, *t2)
	_, ok = ct.Lookup("$clusterTime", "signature").DocumentOK()
	require.True(t, ok, "$clusterTime.signature is a document: %s", ct)

	// A read in the session reports an operationTime too (not older).
	require.NoError(t, coll.FindOne(sctx, D(`{"_id":1}`)).Err())
	require.False(t, sess.OperationTime().Before(*t2))
}

func testReplyClusterTime(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	raw, err := db.RunCommand(ctx, D(`{"insert":"c","documents":[{"_id":1}]}`)).Raw()
	require.NoError(t, err)
	require.Equal(t, "1", num(raw.Lookup("n")), "insert reply n: %s", raw)
	_, _, ok := raw.Lookup("operationTime").TimestampOK()
	require.True(t, ok, "write replies carry operationTime: %s", raw)
	_, _, ok = raw.Lookup("$clusterTime", "clusterTime").TimestampOK()
	require.True(t, ok, "replies carry $clusterTime: %s", raw)
	raw, err = db.RunCommand(ctx, D(`{"ping":1}`)).Raw()
	require.NoError(t, err)
	_, _, ok = raw.Lookup("$clusterTime", "clusterTime").TimestampOK()
	require.True(t, ok, "ping replies carry $clusterTime: %s", raw)
}

func testCollections(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	require.NoError(t, db.CreateCollection(ctx, "a"))
	err := db.CreateCollection(ctx, "a")
	requireCode(t, err, 48, "creating an existing collection is NamespaceExists")
	_, err = db.Collection("b").InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err, "an insert creates its collection")

	names, err := db.ListCollectionNames(ctx, bson.D{})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b"}, names)
	names, err = db.ListCollectionNames(ctx, D(`{"name":"a"}`))
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, names)
	specs, err := db.ListCollectionSpecifications(ctx, D(`{"name":"b"}`))
	require.NoError(t, err)
	require.Len(t, specs, 1)
	require.Equal(t, "collection", specs[0].Type)
	require.False(t, specs[0].ReadOnly)

	require.NoError(t, db.Collection("a").Drop(ctx))
	require.NoError(t, db.Collection("never").Drop(ctx), "dropping a missing collection is not an error for the driver")
	names, err = db.ListCollectionNames(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, names)
	// The raw drop of a missing collection is NamespaceNotFound (26) up to
	// MongoDB 6.x and ok from 7.0 on: accept both.
	if err = db.RunCommand(ctx, D(`{"drop":"never"}`)).Err(); err != nil {
		requireCode(t, err, 26, "the raw drop of a missing collection")
	}
}

func testDatabases(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	_, err := db.Collection("c").InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	names, err := e.Client.ListDatabaseNames(ctx, bson.D{{Key: "name", Value: db.Name()}})
	require.NoError(t, err)
	require.Equal(t, []string{db.Name()}, names)
	all, err := e.Client.ListDatabaseNames(ctx, bson.D{})
	require.NoError(t, err)
	require.Contains(t, all, "admin", "listDatabases includes admin")

	res, err := e.Client.ListDatabases(ctx, bson.D{{Key: "name", Value: db.Name()}})
	require.NoError(t, err)
	require.Len(t, res.Databases, 1)
	require.False(t, res.Databases[0].Empty)

	require.NoError(t, db.Drop(ctx))
	names, err = e.Client.ListDatabaseNames(ctx, bson.D{{Key: "name", Value: db.Name()}})
	require.NoError(t, err)
	require.Empty(t, names, "a dropped database is not listed")
	n, err := db.Collection("c").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n)
}

func testHello(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	admin := e.Client.Database("admin")
	var hello bson.M
	require.NoError(t, admin.RunCommand(ctx, D(`{"hello":1}`)).Decode(&hello))
	require.Equal(t, true, hello["isWritablePrimary"], "hello: %v", hello)
	setName, ok := hello["setName"].(string)
	require.True(t, ok && setName != "", "hello.setName: %v", hello)
	hosts, ok := hello["hosts"].(bson.A)
	require.True(t, ok && len(hosts) > 0, "hello.hosts: %v", hello)
	require.Equal(t, hosts[0], hello["primary"], "the single member is the primary")
	for _, f := range []string{"maxWireVersion", "minWireVersion", "maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize", "logicalSessionTimeoutMinutes", "localTime", "connectionId"} {
		require.Contains(t, hello, f, "hello has %s", f)
	}
	if !e.Real {
		require.Contains(t, hosts, strings.TrimPrefix(strings.Split(e.URI, "/?")[0], "mongodb://"), "hosts contains the dialled address")
	}

	var bi bson.M
	require.NoError(t, admin.RunCommand(ctx, D(`{"buildInfo":1}`)).Decode(&bi))
	version, ok := bi["version"].(string)
	require.True(t, ok && version != "", "buildInfo.version: %v", bi)
	va, ok := bi["versionArray"].(bson.A)
	require.True(t, ok && len(va) == 4, "buildInfo.versionArray: %v", bi)
	require.True(t, strings.HasPrefix(version, toString(va[0])+"."+toString(va[1])), "version %s agrees with versionArray %v", version, va)

	raw, err := db.RunCommand(ctx, D(`{"ping":1}`)).Raw()
	require.NoError(t, err)
	require.Equal(t, "1", num(raw.Lookup("ok")), "ping ok: %s", raw)
	require.NoError(t, e.Client.Ping(ctx, nil))

	// The legacy isMaster command answers too.
	var im bson.M
	require.NoError(t, admin.RunCommand(ctx, D(`{"isMaster":1}`)).Decode(&im))
	require.Equal(t, true, im["ismaster"], "isMaster: %v", im)
}

func toString(v any) string { return fmt.Sprint(v) }

func testUnknownCommand(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	err := db.RunCommand(ctx, D(`{"noSuchCommandXyz":1}`)).Err()
	requireCode(t, err, 59, "an unknown command is CommandNotFound")
	require.Contains(t, err.Error(), "noSuchCommandXyz", "the error names the command")
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "CommandNotFound", ce.Name)
}

// setFailPoint configures the failCommand fail point (mode and data as
// extended JSON) through the configureFailPoint command and turns it off
// in t.Cleanup. Against a real MongoDB without test commands it skips.
func setFailPoint(t *testing.T, ctx context.Context, e *mongotest.Env, mode, data string) {
	t.Helper()
	setNamedFailPoint(t, ctx, e, "failCommand", mode, data)
}

// setNamedFailPoint configures the fail point name as setFailPoint does.
// The fail points other than failCommand have no appName filter: on a
// shared real server they fire for whichever case gets there first, so the
// cases using them hold the fail point lock and write only with their own
// client.
func setNamedFailPoint(t *testing.T, ctx context.Context, e *mongotest.Env, name, mode, data string) {
	t.Helper()
	if e.Real {
		holdFailPoint(t)
	}
	cmd := bson.D{{Key: "configureFailPoint", Value: name}, {Key: "mode", Value: D(`{"m":` + mode + `}`)[0].Value}, {Key: "data", Value: D(data)}}
	err := e.Client.Database("admin").RunCommand(ctx, cmd).Err()
	if err != nil && e.Real {
		t.Skipf("configureFailPoint unavailable on this server (start mongod with --setParameter enableTestCommands=1): %v", err)
	}
	require.NoError(t, err, "configureFailPoint "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Client.Database("admin").RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: name}, {Key: "mode", Value: "off"}}).Err()
	})
}

// testFailPointTransactionalWrite: onPrimaryTransactionalWrite (without
// data) lets a retryable write commit, then closes the connection; the
// driver's retry gets the recorded result and the write happens once.
func testFailPointTransactionalWrite(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	cl, log, _ := failPointClient(t, e)
	coll := cl.Database(db.Name()).Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	setNamedFailPoint(t, ctx, e, "onPrimaryTransactionalWrite", `{"times":1}`, `{}`)
	res, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"x":1}}`))
	require.NoError(t, err, "the retry succeeds")
	require.Equal(t, int64(1), res.ModifiedCount, "the retry reports the first attempt's result")
	require.Equal(t, 2, log.count("update"), "the closed connection made the driver retry")
	requireDocs(t, `[{"_id":1,"x":2}]`, find(t, ctx, db.Collection("c"), bson.D{}), "the update ran once")
}

// testFailPointTransactionalWriteNotCommitted: with
// failBeforeCommitExceptionCode the statement is not reflected.
func testFailPointTransactionalWriteNotCommitted(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	cl, log, _ := failPointClient(t, e)
	coll := cl.Database(db.Name()).Collection("c")
	setNamedFailPoint(t, ctx, e, "onPrimaryTransactionalWrite", `{"times":1}`, `{"failBeforeCommitExceptionCode":1}`)
	_, err := coll.InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err, "the retry inserts")
	require.Equal(t, 2, log.count("insert"))
	require.Equal(t, idList(1), ids(t, ctx, db.Collection("c"), bson.D{}), "the first attempt was not reflected, the retry was")

	setNamedFailPoint(t, ctx, e, "onPrimaryTransactionalWrite", `{"times":2}`, `{"failBeforeCommitExceptionCode":1}`)
	// Without a deadline the driver retries once (with one it retries
	// until the deadline).
	_, err = coll.InsertOne(context.WithoutCancel(ctx), D(`{"_id":2}`))
	require.Error(t, err, "both attempts fail")
	require.Equal(t, idList(1), ids(t, ctx, db.Collection("c"), bson.D{}), "neither attempt was reflected")
}

// testFailPointGetMore: failGetMoreAfterCursorCheckout fails a change
// stream's getMore with a resumable code (labelled
// ResumableChangeStreamError); the driver resumes and sees the event.
func testFailPointGetMore(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	cl, log, _ := failPointClient(t, e)
	coll := cl.Database(db.Name()).Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(100*time.Millisecond))
	require.NoError(t, err)
	defer cs.Close(ctx)
	setNamedFailPoint(t, ctx, e, "failGetMoreAfterCursorCheckout", `{"times":1}`, `{"errorCode":10107}`)
	insert(t, ctx, db.Collection("c"), `[{"_id":1}]`)
	require.True(t, cs.Next(ctx), "the stream resumes after the failed getMore: %v", cs.Err())
	require.Equal(t, "insert", cs.Current.Lookup("operationType").StringValue())
	require.Equal(t, 2, log.count("aggregate"), "the driver resumed with a new aggregate")
	log.mu.Lock()
	defer log.mu.Unlock()
	var labelled bool
	for _, f := range log.failed {
		if f.CommandName == "getMore" {
			var le interface{ HasErrorLabel(string) bool }
			labelled = errors.As(f.Failure, &le) && le.HasErrorLabel("ResumableChangeStreamError")
		}
	}
	require.True(t, labelled, "the failed getMore carries ResumableChangeStreamError")
}

// failCommand is one fail point per server: cases sharing a real server take
// turns using it, from their first setFailPoint until they end.
var (
	failPointMu      sync.Mutex
	failPointHolders sync.Map // *testing.T -> struct{}
)

func holdFailPoint(t *testing.T) {
	if _, held := failPointHolders.LoadOrStore(t, struct{}{}); held {
		return
	}
	failPointMu.Lock()
	t.Cleanup(func() {
		failPointHolders.Delete(t)
		failPointMu.Unlock()
	})
}

// failPointClient returns a client with a unique appName and that name, so
// that fail points limited to it do not disturb parallel cases on a shared
// server.
func failPointClient(t *testing.T, e *mongotest.Env) (*mongo.Client, *commandLog, string) {
	t.Helper()
	app := mongotest.UniqueName(t)
	cl, log := monitoredClient(t, e, options.Client().SetAppName(app))
	return cl, log, app
}

func testFailPointError(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("c"), `[{"_id":1}]`)
	cl, _, app := failPointClient(t, e)
	setFailPoint(t, ctx, e, `{"times":1}`, `{"failCommands":["find"],"appName":"`+app+`","errorCode":96,"errorLabels":["MyLabel"]}`)
	coll := cl.Database(db.Name()).Collection("c")
	err := coll.FindOne(ctx, bson.D{}).Err()
	requireCode(t, err, 96, "the fail point's errorCode")
	se := serverError(t, err)
	require.True(t, se.HasErrorLabel("MyLabel"), "the fail point's errorLabels: %v", err)
	require.NoError(t, coll.FindOne(ctx, bson.D{}).Err(), "times:1 fails once")
	require.NoError(t, db.Collection("c").FindOne(ctx, bson.D{}).Err())
}

func testFailPointTimes(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	cl, log, app := failPointClient(t, e)
	coll := cl.Database(db.Name()).Collection("c")
	setFailPoint(t, ctx, e, `{"times":2}`, `{"failCommands":["insert"],"appName":"`+app+`","errorCode":96}`)
	_, err := coll.InsertOne(ctx, D(`{"_id":1}`))
	requireCode(t, err, 96, "first failure")
	_, err = coll.InsertOne(ctx, D(`{"_id":2}`))
	requireCode(t, err, 96, "second failure")
	_, err = coll.InsertOne(ctx, D(`{"_id":3}`))
	require.NoError(t, err, "after times:2 the fail point is off")
	require.Equal(t, 3, log.count("insert"), "a non-retryable error code is not retried")
	require.Equal(t, idList(3), ids(t, ctx, db.Collection("c"), bson.D{}), "a failed command does not run")
}

func testFailPointBlock(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("c"), `[{"_id":1}]`)
	cl, _, app := failPointClient(t, e)
	setFailPoint(t, ctx, e, `{"times":1}`, `{"failCommands":["find"],"appName":"`+app+`","blockConnection":true,"blockTimeMS":300}`)
	start := time.Now()
	require.NoError(t, cl.Database(db.Name()).Collection("c").FindOne(ctx, bson.D{}).Err(), "blockConnection without errorCode delays, then succeeds")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
}

func testFailPointOff(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	cl, _, app := failPointClient(t, e)
	coll := cl.Database(db.Name()).Collection("c")
	setFailPoint(t, ctx, e, `"alwaysOn"`, `{"failCommands":["insert"],"appName":"`+app+`","errorCode":96}`)
	for i := range 3 {
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}})
		requireCode(t, err, 96, "alwaysOn")
	}
	require.NoError(t, e.Client.Database("admin").RunCommand(ctx, D(`{"configureFailPoint":"failCommand","mode":"off"}`)).Err())
	_, err := coll.InsertOne(ctx, D(`{"_id":9}`))
	require.NoError(t, err, "mode off disables the fail point")
	_, err = db.Collection("other").InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
}

func testUnsupported(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	embeddedOnly(t, e, "a real MongoDB supports these features")
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	checks := []struct {
		name string
		run  func() error
	}{
		{"$where", func() error {
			_, err := coll.Find(ctx, D(`{"$where":"this._id == 1"}`))
			return err
		}},
		{"$function", func() error {
			_, err := coll.Aggregate(ctx, Ds(`[{"$project":{"x":{"$function":{"body":"function(){return 1}","args":[],"lang":"js"}}}}]`))
			return err
		}},
		{"$geoNear", func() error {
			_, err := coll.Aggregate(ctx, Ds(`[{"$geoNear":{"near":[0,0],"distanceField":"d"}}]`))
			return err
		}},
		{"text indexes", func() error {
			_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"s":"text"}`)})
			return err
		}},
		{"$text", func() error {
			_, err := coll.Find(ctx, D(`{"$text":{"$search":"x"}}`))
			return err
		}},
		{"mapReduce", func() error {
			return db.RunCommand(ctx, D(`{"mapReduce":"c","map":"function(){}","reduce":"function(){}","out":{"inline":1}}`)).Err()
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			require.Error(t, err, "%s must be rejected, never silently ignored", c.name)
			serverError(t, err)
			require.Contains(t, err.Error(), c.name, "the error names the unsupported feature")
		})
	}
}

package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Manual pages of the parameter and read concern cases.
const (
	// manualParameters: ttlMonitorSleepSecs, transactionLifetimeLimitSeconds
	// and minSnapshotHistoryWindowInSeconds can be read with getParameter
	// and set at run time with setParameter.
	manualParameters = "https://www.mongodb.com/docs/v7.0/reference/parameters/"
	// manualAtClusterTime: a snapshot read at a time within the history
	// window reads that time's data; afterClusterTime and atClusterTime
	// later than the server's cluster time are refused.
	manualAtClusterTime = "https://www.mongodb.com/docs/v7.0/reference/read-concern-snapshot/"
)

func parameterCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"GetParameter", testGetParameter},
		{"SetParameterKeepsValue", testSetParameterSame},
		{"TransactionLifetimeAtRunTime", testSetTxnLifetime},
		{"TTLMonitorSleepAtRunTime", testSetTTLSleep},
	})
}

// param returns a parameter's value as getParameter reports it.
func param(t *testing.T, ctx context.Context, cl *mongo.Client, name string) bson.RawValue {
	t.Helper()
	raw, err := cl.Database("admin").RunCommand(ctx, bson.D{{Key: "getParameter", Value: 1}, {Key: name, Value: 1}}).Raw()
	require.NoError(t, err, "getParameter %s (%s)", name, manualParameters)
	v := raw.Lookup(name)
	_, ok := v.AsInt64OK()
	require.True(t, ok, "getParameter reports %s as a number: %s", name, raw)
	return v
}

func testGetParameter(t *testing.T, env EnvFunc) {
	e, _, ctx := setup(t, env)
	for _, name := range []string{"ttlMonitorSleepSecs", "transactionLifetimeLimitSeconds", "minSnapshotHistoryWindowInSeconds"} {
		n, _ := param(t, ctx, e.Client, name).AsInt64OK()
		require.GreaterOrEqual(t, n, int64(0), name)
	}
}

// testSetParameterSame sets parameters to the values they have, which a
// shared real deployment tolerates, and checks the reply and the bounds.
func testSetParameterSame(t *testing.T, env EnvFunc) {
	e, _, ctx := setup(t, env)
	admin := e.Client.Database("admin")
	for _, name := range []string{"ttlMonitorSleepSecs", "transactionLifetimeLimitSeconds"} {
		cur := param(t, ctx, e.Client, name)
		raw, err := admin.RunCommand(ctx, bson.D{{Key: "setParameter", Value: 1}, {Key: name, Value: cur}}).Raw()
		require.NoError(t, err, "setParameter %s (%s)", name, manualParameters)
		require.Equal(t, num(cur), num(raw.Lookup("was")), "the reply names the previous value: %s", raw)
		err = admin.RunCommand(ctx, bson.D{{Key: "setParameter", Value: 1}, {Key: name, Value: 0}}).Err()
		require.Error(t, err, "%s must be at least 1", name)
	}
}

func testSetTxnLifetime(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	embeddedOnly(t, e, "shortening the lifetime would abort other cases' transactions on a shared deployment")
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"v":0}]`)
	require.NoError(t, e.Client.Database("admin").RunCommand(ctx, D(`{"setParameter":1,"transactionLifetimeLimitSeconds":1}`)).Err())
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)
	// The expired transaction releases the document: this write waits for
	// the abort, a second or so.
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
	require.NoError(t, err)
	requireCode(t, sess.CommitTransaction(ctx), 251, "a transaction past transactionLifetimeLimitSeconds is aborted")
	requireDocs(t, `[{"_id":1,"v":10}]`, find(t, ctx, coll, bson.D{}))
}

func testSetTTLSleep(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	embeddedOnly(t, e, "changing the TTL monitor's pace would change other cases' on a shared deployment")
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"at":1}`), Options: options.Index().SetExpireAfterSeconds(0)})
	require.NoError(t, err)
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "at", Value: bson.NewDateTimeFromTime(time.Now().Add(-time.Hour))}})
	require.NoError(t, err)
	// The monitor was sleeping 60 s; the new pace applies at once.
	require.NoError(t, e.Client.Database("admin").RunCommand(ctx, D(`{"setParameter":1,"ttlMonitorSleepSecs":1}`)).Err())
	eventually(t, 20*time.Second, "the TTL monitor runs at the new pace", func() bool {
		n, err := coll.CountDocuments(ctx, bson.D{})
		return err == nil && n == 0
	})
}

// snapshotHistoryCases are the SnapshotReads cases about reading the past.
var snapshotHistoryCases = []tcase{
	{"AtClusterTimeInThePast", testAtClusterTimePast},
	{"AtClusterTimeBeyondHistory", testAtClusterTimeTooOld},
	{"ClusterTimeInTheFuture", testClusterTimeFuture},
}

// operationTime returns the operationTime of a ping: the cluster time now.
func operationTime(t *testing.T, ctx context.Context, db *mongo.Database) bson.Timestamp {
	t.Helper()
	raw, err := db.RunCommand(ctx, D(`{"ping":1}`)).Raw()
	require.NoError(t, err)
	tt, ti, ok := raw.Lookup("operationTime").TimestampOK()
	require.True(t, ok, "ping replies carry operationTime: %s", raw)
	return bson.Timestamp{T: tt, I: ti}
}

// snapshotFind runs find with readConcern snapshot at ts.
func snapshotFind(ctx context.Context, db *mongo.Database, coll string, ts bson.Timestamp) ([]bson.D, error) {
	var got bson.D
	err := db.RunCommand(ctx, bson.D{{Key: "find", Value: coll}, {Key: "sort", Value: D(`{"_id":1}`)},
		{Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}, {Key: "atClusterTime", Value: ts}}}}).Decode(&got)
	if err != nil {
		return nil, err
	}
	return toDocs(get(get(got, "cursor").(bson.D), "firstBatch").(bson.A)), nil
}

func testAtClusterTimePast(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	ts := operationTime(t, ctx, db)
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)
	insert(t, ctx, coll, `[{"_id":2,"x":2}]`)
	got, err := snapshotFind(ctx, db, "c", ts)
	require.NoError(t, err, "a snapshot read a moment in the past, no snapshot session holding it (%s)", manualAtClusterTime)
	requireDocs(t, `[{"_id":1,"x":1}]`, got, "it reads the data as of that time")
}

func testAtClusterTimeTooOld(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	embeddedOnly(t, e, "emptying the history window would break other cases' snapshot reads on a shared deployment")
	require.NoError(t, e.Client.Database("admin").RunCommand(ctx, D(`{"setParameter":1,"minSnapshotHistoryWindowInSeconds":0}`)).Err())
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	ts := operationTime(t, ctx, db)
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":3}}`))
	require.NoError(t, err)
	_, err = snapshotFind(ctx, db, "c", ts)
	requireCode(t, err, 239, "a read older than the retained history is SnapshotTooOld, never newer data")
}

func testClusterTimeFuture(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("c"), `[{"_id":1}]`)
	now := operationTime(t, ctx, db)
	later := bson.Timestamp{T: now.T + 3600, I: 1}
	err := db.RunCommand(ctx, bson.D{{Key: "find", Value: "c"}, {Key: "readConcern", Value: bson.D{{Key: "afterClusterTime", Value: later}}}}).Err()
	requireCode(t, err, 72, "afterClusterTime beyond the server's cluster time is InvalidOptions ("+manualAtClusterTime+")")
	_, err = snapshotFind(ctx, db, "c", later)
	requireCode(t, err, 72, "atClusterTime beyond the server's cluster time is InvalidOptions")
}

package conformance

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The commands a deployment check (the framework's doctor) reads: the
// replica set's status, the oplog's first and last entries, server
// parameters, the default write concern, and index definitions.
func diagnosticsCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"OplogFirstAndLast", testOplogFirstAndLast},
		{"ReplSetGetStatus", testReplSetGetStatus},
		{"TransactionLifetimeParameter", testTransactionLifetimeParameter},
		{"DefaultWriteConcern", testDefaultWriteConcern},
		{"ListIndexesTTLPartial", testListIndexesTTLPartial},
		{"CurrentOp", testCurrentOp},
	})
}

// oplogEntry is the envelope of an oplog document.
type oplogEntry struct {
	TS   bson.Timestamp `bson:"ts"`
	Wall time.Time      `bson:"wall"`
	Op   string         `bson:"op"`
	NS   *string        `bson:"ns"`
}

// testOplogFirstAndLast reads the first and last entries of local.oplog.rs
// in natural order, as db.getReplicationInfo() does to measure the
// replication window
// (https://www.mongodb.com/docs/manual/reference/method/db.getReplicationInfo/,
// https://www.mongodb.com/docs/manual/core/replica-set-oplog/): each has a
// ts timestamp, a wall date, an op code and an ns; the last is not older
// than a write just made, the first not newer than the last.
func testOplogFirstAndLast(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	_, err = db.Collection("c").InsertOne(mongo.NewSessionContext(ctx, sess), D(`{"_id":1}`))
	require.NoError(t, err)
	written := *sess.OperationTime()

	oplog := e.Client.Database("local").Collection("oplog.rs")
	read := func(dir int) oplogEntry {
		t.Helper()
		var en oplogEntry
		require.NoError(t, oplog.FindOne(ctx, bson.D{}, options.FindOne().
			SetSort(bson.D{{Key: "$natural", Value: dir}}).
			SetProjection(D(`{"ts":1,"wall":1,"op":1,"ns":1,"_id":0}`))).Decode(&en))
		require.NotZero(t, en.TS.T, "ts")
		require.False(t, en.Wall.IsZero(), "wall")
		require.Contains(t, []string{"i", "u", "d", "c", "n"}, en.Op)
		require.NotNil(t, en.NS, "ns is present (\"\" for a no-op)")
		return en
	}
	first, last := read(1), read(-1)
	require.False(t, last.TS.Before(written), "the last entry (%v) is not older than the insert (%v)", last.TS, written)
	require.False(t, last.TS.Before(first.TS), "first %v, last %v", first.TS, last.TS)
	require.False(t, last.Wall.Before(first.Wall), "first %v, last %v", first.Wall, last.Wall)

	// The insert's own entry, newest first.
	cur, err := oplog.Find(ctx, bson.D{}, options.Find().SetSort(D(`{"$natural":-1}`)).SetLimit(50).
		SetProjection(D(`{"ts":1,"op":1,"ns":1}`)))
	require.NoError(t, err)
	var entries []oplogEntry
	require.NoError(t, cur.All(ctx, &entries))
	found := false
	for i, en := range entries {
		if i > 0 {
			require.False(t, entries[i-1].TS.Before(en.TS), "newest first")
		}
		if en.TS == written && en.Op == "i" && *en.NS == db.Name()+".c" {
			found = true
		}
	}
	require.True(t, found, "the insert's entry {op: i, ns: %s.c, ts: %v} in %v", db.Name(), written, entries)
}

// testReplSetGetStatus: replSetGetStatus names the set hello reports and
// lists this member as PRIMARY
// (https://www.mongodb.com/docs/manual/reference/command/replSetGetStatus/).
func testReplSetGetStatus(t *testing.T, env EnvFunc) {
	e, _, ctx := setup(t, env)
	admin := e.Client.Database("admin")
	var hello struct {
		SetName string `bson:"setName"`
	}
	require.NoError(t, admin.RunCommand(ctx, D(`{"hello":1}`)).Decode(&hello))
	var st struct {
		Set     string `bson:"set"`
		MyState int32  `bson:"myState"`
		Members []struct {
			StateStr   string    `bson:"stateStr"`
			Self       bool      `bson:"self"`
			OptimeDate time.Time `bson:"optimeDate"`
		} `bson:"members"`
	}
	require.NoError(t, admin.RunCommand(ctx, D(`{"replSetGetStatus":1}`)).Decode(&st))
	require.Equal(t, hello.SetName, st.Set)
	require.Equal(t, int32(1), st.MyState, "PRIMARY")
	self := 0
	for _, m := range st.Members {
		if m.Self {
			self++
			require.Equal(t, "PRIMARY", m.StateStr)
			require.False(t, m.OptimeDate.IsZero())
		}
	}
	require.Equal(t, 1, self)
}

// testTransactionLifetimeParameter: getParameter returns
// transactionLifetimeLimitSeconds as a positive integer (60 by default)
// (https://www.mongodb.com/docs/manual/reference/parameters/#mongodb-parameter-param.transactionLifetimeLimitSeconds).
func testTransactionLifetimeParameter(t *testing.T, env EnvFunc) {
	e, _, ctx := setup(t, env)
	raw, err := e.Client.Database("admin").RunCommand(ctx, D(`{"getParameter":1,"transactionLifetimeLimitSeconds":1}`)).Raw()
	require.NoError(t, err)
	n, ok := raw.Lookup("transactionLifetimeLimitSeconds").AsInt64OK()
	require.True(t, ok, "an integer: %s", raw)
	require.Positive(t, n)
}

// testDefaultWriteConcern: getDefaultRWConcern reports the cluster-wide
// default write concern and where it comes from; on a replica set without
// arbiters and no default set, the implicit default is w: "majority"
// (https://www.mongodb.com/docs/manual/reference/command/getDefaultRWConcern/,
// https://www.mongodb.com/docs/manual/reference/mongodb-defaults/#default-write-concern).
func testDefaultWriteConcern(t *testing.T, env EnvFunc) {
	e, _, ctx := setup(t, env)
	var rw struct {
		WriteConcern *struct {
			W any `bson:"w"`
		} `bson:"defaultWriteConcern"`
		Source string `bson:"defaultWriteConcernSource"`
	}
	require.NoError(t, e.Client.Database("admin").RunCommand(ctx, D(`{"getDefaultRWConcern":1}`)).Decode(&rw))
	require.Contains(t, []string{"implicit", "global"}, rw.Source)
	if rw.Source == "implicit" {
		require.NotNil(t, rw.WriteConcern)
		require.Equal(t, "majority", rw.WriteConcern.W)
	}
}

// testListIndexesTTLPartial: listIndexes returns a partial TTL index with
// its expireAfterSeconds and partialFilterExpression as created
// (https://www.mongodb.com/docs/manual/core/index-ttl/,
// https://www.mongodb.com/docs/manual/core/index-partial/).
func testListIndexesTTLPartial(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"done_at":1}`),
		Options: options.Index().SetName("ttl").SetExpireAfterSeconds(3600).SetPartialFilterExpression(D(`{"done":true}`))})
	require.NoError(t, err)
	cur, err := coll.Indexes().List(ctx)
	require.NoError(t, err)
	var ixs []bson.M
	require.NoError(t, cur.All(ctx, &ixs))
	var ttl bson.M
	for _, ix := range ixs {
		if ix["name"] == "ttl" {
			ttl = ix
		}
	}
	require.NotNil(t, ttl, "%v", ixs)
	require.EqualValues(t, 3600, ttl["expireAfterSeconds"])
	require.Equal(t, bson.D{{Key: "done", Value: true}}, ttl["partialFilterExpression"])
	require.Equal(t, bson.D{{Key: "done_at", Value: int32(1)}}, ttl["key"])
}

// testCurrentOp: $currentOp (on admin, {aggregate: 1}) and the currentOp
// command list the running operations, the command running $currentOp
// among them.
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/currentOp/
// https://www.mongodb.com/docs/v7.0/reference/command/currentOp/
func testCurrentOp(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	admin := e.Client.Database("admin")
	marker := "currentop-" + db.Name()
	cur, err := admin.Aggregate(ctx, Ds(`[{"$currentOp":{"allUsers":true}},{"$match":{"command.comment":"`+marker+`"}}]`),
		options.Aggregate().SetComment(marker))
	got := all(t, ctx, cur, err)
	require.Len(t, got, 1, "the aggregate running $currentOp lists itself: %s", js(got))
	require.Equal(t, true, get(got[0], "active"))
	require.Equal(t, "command", get(got[0], "op"))
	require.NotNil(t, get(got[0], "opid"))
	require.NotNil(t, get(got[0], "connectionId"))

	raw, err := admin.RunCommand(ctx, D(`{"currentOp":1,"command.comment":"`+marker+`-cmd","comment":"`+marker+`-cmd"}`)).Raw()
	require.NoError(t, err)
	inprog := raw.Lookup("inprog").Array()
	vals, err := inprog.Values()
	require.NoError(t, err)
	require.Len(t, vals, 1, "%s", raw)
	require.Equal(t, "currentOp", vals[0].Document().Lookup("command").Document().Index(0).Key())

	_, err = db.Aggregate(ctx, Ds(`[{"$currentOp":{}}]`))
	requireCode(t, err, 73, "$currentOp outside admin")
}

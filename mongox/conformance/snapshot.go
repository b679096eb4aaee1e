package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// snapshotCases cover reads that must not answer with the current data:
// snapshot sessions and readConcern atClusterTime (MongoDB 5.0+), and the
// answers a single-node replica set owes to requests it cannot honour
// (writes in a snapshot session, a write concern it cannot satisfy).
func snapshotCases(t *testing.T, env EnvFunc) {
	runCases(t, env, append([]tcase{
		{"SnapshotSessionReadsItsSnapshot", testSnapshotSession},
		{"AtClusterTimeFromAnotherSession", testAtClusterTime},
		{"WritesInSnapshotSessionRefused", testSnapshotWritesRefused},
		{"UnsatisfiableWriteConcern", testUnsatisfiableWriteConcern},
	}, snapshotHistoryCases...))
}

func snapshotSession(t *testing.T, e interface {
	StartSession(...options.Lister[options.SessionOptions]) (*mongo.Session, error)
}) *mongo.Session {
	t.Helper()
	sess, err := e.StartSession(options.Session().SetSnapshot(true))
	require.NoError(t, err)
	return sess
}

func testSnapshotSession(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1},{"_id":2,"x":2}]`)
	sess := snapshotSession(t, e.Client)
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)

	requireDocs(t, `[{"_id":1,"x":1},{"_id":2,"x":2}]`, find(t, sctx, coll, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))))
	require.False(t, sess.SnapshotTime().IsZero(), "the first read fixes the session's snapshot time")

	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":100}}`))
	require.NoError(t, err)
	_, err = coll.InsertOne(ctx, D(`{"_id":3,"x":3}`))
	require.NoError(t, err)
	_, err = coll.DeleteOne(ctx, D(`{"_id":2}`))
	require.NoError(t, err)

	requireDocs(t, `[{"_id":1,"x":1},{"_id":2,"x":2}]`, find(t, sctx, coll, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"find in the snapshot session does not see later writes")
	cur, err := coll.Aggregate(sctx, Ds(`[{"$group":{"_id":null,"s":{"$sum":"$x"}}}]`))
	requireDocs(t, `[{"_id":null,"s":3}]`, all(t, sctx, cur, err), "aggregate reads the snapshot")
	res := coll.Distinct(sctx, "x", bson.D{})
	require.NoError(t, res.Err())
	var xs []int32
	require.NoError(t, res.Decode(&xs))
	require.ElementsMatch(t, []int32{1, 2}, xs, "distinct reads the snapshot")

	requireDocs(t, `[{"_id":1,"x":100},{"_id":3,"x":3}]`, find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"outside the session the latest data is visible")
}

func testAtClusterTime(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	first := snapshotSession(t, e.Client)
	defer first.EndSession(ctx)
	require.NoError(t, coll.FindOne(mongo.NewSessionContext(ctx, first), bson.D{}).Err())
	ts := first.SnapshotTime()
	require.False(t, ts.IsZero())

	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)

	var got bson.D
	err = db.RunCommand(ctx, bson.D{{Key: "find", Value: "c"}, {Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}, {Key: "atClusterTime", Value: ts}}}}).Decode(&got)
	require.NoError(t, err)
	cursor := get(got, "cursor").(bson.D)
	requireDocs(t, `[{"_id":1,"x":1}]`, toDocs(get(cursor, "firstBatch").(bson.A)), "readConcern atClusterTime reads that point in time")
	require.Equal(t, ts, get(cursor, "atClusterTime"), "the reply names the snapshot's time")
}

func toDocs(a bson.A) []bson.D {
	out := make([]bson.D, len(a))
	for i, v := range a {
		out[i] = v.(bson.D)
	}
	return out
}

func testSnapshotWritesRefused(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	sess := snapshotSession(t, e.Client)
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err := coll.InsertOne(sctx, D(`{"_id":2}`))
	var se mongo.ServerError
	require.ErrorAs(t, err, &se, "the server refuses a write with readConcern snapshot")
	_, err = coll.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$set":{"x":1}}`))
	require.ErrorAs(t, err, &se)
	_, err = db.ListCollectionNames(sctx, bson.D{})
	require.ErrorAs(t, err, &se, "listCollections does not take readConcern snapshot")
	requireDocs(t, `[{"_id":1}]`, find(t, ctx, coll, bson.D{}), "nothing was written")
}

func testUnsatisfiableWriteConcern(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	if e.Real {
		// A real deployment may have ten members; the case assumes fewer.
		var status bson.M
		if err := e.Client.Database("admin").RunCommand(ctx, D(`{"replSetGetStatus":1}`)).Decode(&status); err != nil ||
			len(status["members"].(bson.A)) >= 10 {
			t.Skip("needs a replica set with fewer than 10 members")
		}
	}
	coll := db.Collection("c", options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: 10}))
	_, err := coll.InsertOne(ctx, D(`{"_id":1}`))
	var wce mongo.WriteException
	require.ErrorAs(t, err, &wce, "w:10 reports a write concern error")
	require.NotNil(t, wce.WriteConcernError)
	require.Equal(t, 100, wce.WriteConcernError.Code, "UnsatisfiableWriteConcern")
	requireDocs(t, `[{"_id":1}]`, find(t, ctx, db.Collection("c"), bson.D{}), "the write itself was applied")

	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		return db.Collection("c").InsertOne(sctx, D(`{"_id":2}`))
	}, options.Transaction().SetWriteConcern(&writeconcern.WriteConcern{W: 10}))
	require.Error(t, err, "commitTransaction with w:10 reports the write concern error")
}

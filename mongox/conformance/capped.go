package conformance

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Capped collections.
// https://www.mongodb.com/docs/v7.0/core/capped-collections/
func cappedCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"MaxDocuments", testCappedMax},
		{"SizeLimit", testCappedSize},
		{"CreateRules", testCappedCreateRules},
		{"NotInTransactions", testCappedNotInTxn},
	})
}

// createCapped creates a capped collection with the given create options.
func createCapped(t *testing.T, db *mongo.Database, name string, opts *options.CreateCollectionOptionsBuilder) *mongo.Collection {
	t.Helper()
	require.NoError(t, db.CreateCollection(testCtx(t), name, opts))
	return db.Collection(name)
}

// testCappedMax: with max, inserting past it removes the oldest documents;
// the rest stay in insertion order, and listCollections reports the
// options.
func testCappedMax(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createCapped(t, db, "c", options.CreateCollection().SetCapped(true).SetSizeInBytes(4096).SetMaxDocuments(3))
	for _, id := range []int{5, 1, 4, 2, 3} {
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}})
		require.NoError(t, err)
	}
	requireDocs(t, `[{"_id":4},{"_id":2},{"_id":3}]`, find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"$natural":1}`))), "the three newest, in insertion order")
	requireDocs(t, `[{"_id":3},{"_id":2},{"_id":4}]`, find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"$natural":-1}`))))

	specs, err := db.ListCollectionSpecifications(ctx, D(`{"name":"c"}`))
	require.NoError(t, err)
	require.Len(t, specs, 1)
	opts := rawDoc(t, specs[0].Options)
	require.Equal(t, true, get(opts, "capped"), "options %s", js(opts))
	require.Equal(t, "3", num(specs[0].Options.Lookup("max")), "options %s", js(opts))
	require.Equal(t, "4096", num(specs[0].Options.Lookup("size")), "options %s", js(opts))
}

// testCappedSize: the size limit removes the oldest documents once the
// documents' total size passes it; each insert succeeds and the newest
// documents stay, in insertion order.
func testCappedSize(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createCapped(t, db, "c", options.CreateCollection().SetCapped(true).SetSizeInBytes(4096))
	pad := strings.Repeat("x", 1000)
	for i := range 20 {
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}, {Key: "pad", Value: pad}})
		require.NoError(t, err)
	}
	got := find(t, ctx, coll, bson.D{}, options.Find().SetProjection(D(`{"pad":0}`)))
	require.NotEmpty(t, got)
	require.Less(t, len(got), 5, "at most four 1 KB documents fit in 4096 bytes: %s", js(got))
	for i, d := range got {
		require.Equal(t, int32(20-len(got)+i), get(d, "_id"), "the newest documents in insertion order: %s", js(got))
	}
	// A document larger than the collection's size cannot be inserted.
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "big"}, {Key: "pad", Value: strings.Repeat("y", 5000)}})
	require.Error(t, err)
}

// testCappedCreateRules: capped needs a size; a negative size is refused.
func testCappedCreateRules(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	err := db.RunCommand(ctx, D(`{"create":"a","capped":true}`)).Err()
	requireCode(t, err, 72, "capped without size: InvalidOptions")
	err = db.RunCommand(ctx, D(`{"create":"b","capped":true,"size":-1}`)).Err()
	requireCode(t, err, 2, "negative size: BadValue")
	// size and max without capped make an ordinary collection.
	require.NoError(t, db.RunCommand(ctx, D(`{"create":"c","size":100,"max":2}`)).Err())
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1},{"_id":2},{"_id":3}]`)
	require.Equal(t, idList(1, 2, 3), ids(t, ctx, coll, bson.D{}))
}

// testCappedNotInTxn: a capped collection cannot be written in a
// multi-document transaction
// (https://www.mongodb.com/docs/v7.0/core/transactions-operations/#restrictions).
func testCappedNotInTxn(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createCapped(t, db, "c", options.CreateCollection().SetCapped(true).SetSizeInBytes(4096))
	insert(t, ctx, coll, `[{"_id":1}]`)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = coll.InsertOne(sctx, D(`{"_id":2}`))
	requireCode(t, err, 263, "insert into a capped collection in a transaction")
	_ = sess.AbortTransaction(ctx)
	require.Equal(t, idList(1), ids(t, ctx, coll, bson.D{}))
}

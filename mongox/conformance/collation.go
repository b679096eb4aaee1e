package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// collationCases cover an operation's collation (locale and strength) on
// filters, sorts, distinct, counts, updates, deletes and aggregate $match.
func collationCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"FindFilterAndSort", testCollationFind},
		{"WritesAndCounts", testCollationWrites},
		{"DistinctAndAggregate", testCollationDistinctAggregate},
	})
}

var (
	caseInsensitive = &options.Collation{Locale: "en", Strength: 2}
	baseLetters     = &options.Collation{Locale: "en", Strength: 1}
)

func testCollationFind(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":"ping"},{"_id":2,"x":"PING"},{"_id":3,"x":"péng"},{"_id":4,"x":"b"},{"_id":5,"x":"A"}]`)
	require.Equal(t, idList(2), ids(t, ctx, coll, D(`{"x":"PING"}`)), "simple collation: binary comparison")
	got := find(t, ctx, coll, D(`{"x":"PING"}`), options.Find().SetCollation(caseInsensitive).SetSort(D(`{"_id":1}`)))
	require.Len(t, got, 2, "strength 2 ignores case")
	got = find(t, ctx, coll, D(`{"x":{"$in":["PENG"]}}`), options.Find().SetCollation(baseLetters))
	requireDocs(t, `[{"_id":3,"x":"péng"}]`, got, "strength 1 also ignores diacritics")
	got = find(t, ctx, coll, D(`{"x":{"$gte":"a","$lt":"c"}}`), options.Find().SetCollation(caseInsensitive).SetSort(D(`{"x":1,"_id":1}`)))
	requireDocs(t, `[{"_id":5,"x":"A"},{"_id":4,"x":"b"}]`, got, "ranges and sort follow the locale, not byte order")
	got = find(t, ctx, coll, bson.D{}, options.Find().SetCollation(&options.Collation{Locale: "en"}).SetSort(D(`{"x":1}`)).SetProjection(D(`{"_id":1}`)))
	requireDocs(t, `[{"_id":5},{"_id":4},{"_id":3},{"_id":1},{"_id":2}]`, got, "strength 3: letters first (é between e and f), then lowercase before uppercase")
}

func testCollationWrites(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":"ping"},{"_id":2,"x":"Ping"},{"_id":3,"x":"pong"}]`)
	n, err := coll.CountDocuments(ctx, D(`{"x":"PING"}`), options.Count().SetCollation(caseInsensitive))
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	res, err := coll.UpdateMany(ctx, D(`{"x":"PING"}`), D(`{"$set":{"u":true}}`), options.UpdateMany().SetCollation(caseInsensitive))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.ModifiedCount)
	var got bson.D
	require.NoError(t, coll.FindOneAndUpdate(ctx, D(`{"x":"PONG"}`), D(`{"$set":{"v":1}}`),
		options.FindOneAndUpdate().SetCollation(caseInsensitive).SetReturnDocument(options.After)).Decode(&got))
	requireDoc(t, `{"_id":3,"x":"pong","v":1}`, got)
	dres, err := coll.DeleteMany(ctx, D(`{"x":"PING"}`), options.DeleteMany().SetCollation(caseInsensitive))
	require.NoError(t, err)
	require.Equal(t, int64(2), dres.DeletedCount)
	bres, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewDeleteOneModel().SetFilter(D(`{"x":"PONG"}`)).SetCollation(caseInsensitive),
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), bres.DeletedCount)
}

func testCollationDistinctAggregate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"s":"a"},{"_id":2,"s":"A"},{"_id":3,"s":"b"}]`)
	res := coll.Distinct(ctx, "s", bson.D{}, options.Distinct().SetCollation(caseInsensitive))
	require.NoError(t, res.Err())
	var vals []string
	require.NoError(t, res.Decode(&vals))
	require.Len(t, vals, 2, "collation-equal values are one distinct value: %v", vals)
	cur, err := coll.Aggregate(ctx, Ds(`[{"$match":{"s":"A"}},{"$count":"n"}]`), options.Aggregate().SetCollation(caseInsensitive))
	requireDocs(t, `[{"n":2}]`, all(t, ctx, cur, err))
}

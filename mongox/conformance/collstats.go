package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Collection statistics, as mongosh's db.coll.stats() reads them.
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/collStats/
// https://www.mongodb.com/docs/v7.0/reference/command/collStats/
func collStatsCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"CollStatsStage", testCollStatsStage},
		{"CollStatsCommand", testCollStatsCommand},
		{"Validate", testValidate},
	})
}

// testCollStatsStage: $collStats reports the count, the storage sizes and
// the capped options, one size per index; it must be the first stage.
func testCollStatsStage(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	require.NoError(t, db.CreateCollection(ctx, "c", options.CreateCollection().SetCapped(true).SetSizeInBytes(8192)))
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":"x"},{"_id":2,"a":"y"}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)

	cur, err := coll.Aggregate(ctx, Ds(`[{"$collStats":{"storageStats":{},"count":{}}}]`))
	got := all(t, ctx, cur, err)
	require.Len(t, got, 1)
	raw, err := bson.Marshal(got[0])
	require.NoError(t, err)
	doc := bson.Raw(raw)
	require.Equal(t, db.Name()+".c", doc.Lookup("ns").StringValue())
	require.Equal(t, "2", num(doc.Lookup("count")), "%s", doc)
	require.Equal(t, "2", num(doc.Lookup("storageStats", "count")), "%s", doc)
	require.True(t, doc.Lookup("storageStats", "capped").Boolean(), "%s", doc)
	require.Equal(t, "8192", num(doc.Lookup("storageStats", "maxSize")), "%s", doc)
	require.Equal(t, "2", num(doc.Lookup("storageStats", "nindexes")), "%s", doc)
	for _, f := range []string{"size", "storageSize", "totalIndexSize", "totalSize"} {
		n, ok := doc.Lookup("storageStats", f).AsInt64OK()
		require.True(t, ok && n > 0, "storageStats.%s is a positive number: %s", f, doc)
	}
	for _, ix := range []string{"_id_", "a_1"} {
		n, ok := doc.Lookup("storageStats", "indexSizes", ix).AsInt64OK()
		require.True(t, ok && n > 0, "indexSizes.%s: %s", ix, doc)
	}

	_, err = coll.Aggregate(ctx, Ds(`[{"$match":{}},{"$collStats":{"count":{}}}]`))
	requireCode(t, err, 40602, "$collStats not first")
	_, err = db.Collection("missing").Aggregate(ctx, Ds(`[{"$collStats":{"storageStats":{}}}]`))
	requireCode(t, err, 26, "storageStats of a missing collection")
}

// testCollStatsCommand: the (deprecated) collStats command answers the
// storage statistics at the top level, with ns.
func testCollStatsCommand(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("c"), `[{"_id":1},{"_id":2},{"_id":3}]`)
	raw, err := db.RunCommand(ctx, D(`{"collStats":"c"}`)).Raw()
	require.NoError(t, err)
	require.Equal(t, db.Name()+".c", raw.Lookup("ns").StringValue())
	require.Equal(t, "3", num(raw.Lookup("count")), "%s", raw)
	require.False(t, raw.Lookup("capped").Boolean(), "%s", raw)
	require.Equal(t, "1", num(raw.Lookup("nindexes")), "%s", raw)
	n, ok := raw.Lookup("indexSizes", "_id_").AsInt64OK()
	require.True(t, ok && n > 0, "%s", raw)
}

// testValidate: validate reports a valid collection, its records and the
// keys of each index (an array holds one key per element, a missing field
// the null key).
// https://www.mongodb.com/docs/v7.0/reference/command/validate/
func testValidate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":1},{"_id":2,"a":[1,2]},{"_id":3}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)
	raw, err := db.RunCommand(ctx, D(`{"validate":"c"}`)).Raw()
	require.NoError(t, err)
	require.True(t, raw.Lookup("valid").Boolean(), "%s", raw)
	require.Equal(t, "3", num(raw.Lookup("nrecords")), "%s", raw)
	require.Equal(t, "2", num(raw.Lookup("nIndexes")), "%s", raw)
	require.Equal(t, "3", num(raw.Lookup("keysPerIndex", "_id_")), "%s", raw)
	require.Equal(t, "4", num(raw.Lookup("keysPerIndex", "a_1")), "%s", raw)
	err = db.RunCommand(ctx, D(`{"validate":"missing"}`)).Err()
	requireCode(t, err, 26)
}

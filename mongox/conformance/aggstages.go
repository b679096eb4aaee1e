package conformance

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// aggregateStageCases cover the stages that reach beyond one collection:
// $lookup, $out, $merge, the database-level sources $documents and
// $listLocalSessions, the Atlas Search commands a server without Atlas
// refuses, and (catalog) the clusteredIndex collection option.
func aggregateStageCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"LookupLocalForeign", testLookupEquality},
		{"LookupPipelineLet", testLookupPipeline},
		{"Out", testOut},
		{"OutOtherDatabase", testOutOtherDB},
		{"MergeModes", testMergeModes},
		{"MergeOnNeedsUniqueIndex", testMergeOnIndex},
		{"DocumentsAndLocalSessions", testDBLevelAggregate},
		{"SearchIndexesNeedAtlas", testSearchIndexes},
		{"ClusteredCollection", testClusteredCollection},
		{"BucketAndBucketAuto", testBuckets},
		{"SetWindowFields", testSetWindowFields},
	})
}

// testBuckets: $bucket groups by boundary intervals [b[i], b[i+1]) in
// boundary order with the default bucket last; $bucketAuto cuts the sorted
// values into about equal buckets {min, max}, max being the next bucket's
// min and the last bucket's maximum.
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/bucket/
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/bucketAuto/
func testBuckets(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"p":10},{"_id":2,"p":25},{"_id":3,"p":5},{"_id":4,"p":40},{"_id":5,"p":200},{"_id":6}]`)
	cur, err := coll.Aggregate(ctx, Ds(`[{"$sort":{"_id":1}},
		{"$bucket":{"groupBy":"$p","boundaries":[0,20,50],"default":"other","output":{"n":{"$sum":1},"ids":{"$push":"$_id"}}}}]`))
	requireDocs(t, `[{"_id":0,"n":2,"ids":[1,3]},{"_id":20,"n":2,"ids":[2,4]},{"_id":"other","n":2,"ids":[5,6]}]`, all(t, ctx, cur, err))
	_, err = coll.Aggregate(ctx, Ds(`[{"$bucket":{"groupBy":"$p","boundaries":[0,20]}}]`))
	requireCode(t, err, 40066, "a value outside the boundaries and no default")

	cur, err = coll.Aggregate(ctx, Ds(`[{"$match":{"p":{"$exists":true}}},{"$bucketAuto":{"groupBy":"$p","buckets":2}}]`))
	requireDocs(t, `[{"_id":{"min":5,"max":40},"count":3},{"_id":{"min":40,"max":200},"count":2}]`, all(t, ctx, cur, err))
}

func testLookupEquality(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("orders"), `[{"_id":1,"sku":"a","qty":2},{"_id":2,"sku":["b","c"]},{"_id":3}]`)
	insert(t, ctx, db.Collection("items"), `[{"_id":"i1","sku":"a"},{"_id":"i2","sku":"b"},{"_id":"i3","sku":"c"},{"_id":"i4"},{"_id":"i5","sku":null}]`)
	cur, err := db.Collection("orders").Aggregate(ctx, Ds(`[
		{"$lookup":{"from":"items","localField":"sku","foreignField":"sku","as":"inv"}},
		{"$project":{"inv.sku":0}},
		{"$sort":{"_id":1}}
	]`))
	requireDocs(t, `[
		{"_id":1,"sku":"a","qty":2,"inv":[{"_id":"i1"}]},
		{"_id":2,"sku":["b","c"],"inv":[{"_id":"i2"},{"_id":"i3"}]},
		{"_id":3,"inv":[{"_id":"i4"},{"_id":"i5"}]}
	]`, all(t, ctx, cur, err), "an array localField matches any element; a missing one matches null and missing")
}

func testLookupPipeline(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("orders"), `[{"_id":1,"item":"a","min":5},{"_id":2,"item":"b","min":1}]`)
	insert(t, ctx, db.Collection("stock"), `[{"_id":1,"item":"a","n":3},{"_id":2,"item":"a","n":9},{"_id":3,"item":"b","n":4}]`)
	cur, err := db.Collection("orders").Aggregate(ctx, Ds(`[
		{"$lookup":{"from":"stock","let":{"it":"$item","lo":"$min"},"pipeline":[
			{"$match":{"$expr":{"$and":[{"$eq":["$item","$$it"]},{"$gte":["$n","$$lo"]}]}}},
			{"$project":{"_id":0,"n":1}}
		],"as":"ok"}},
		{"$sort":{"_id":1}}
	]`))
	requireDocs(t, `[{"_id":1,"item":"a","min":5,"ok":[{"n":9}]},{"_id":2,"item":"b","min":1,"ok":[{"n":4}]}]`, all(t, ctx, cur, err))

	cur, err = db.Collection("orders").Aggregate(ctx, Ds(`[
		{"$match":{"_id":1}},
		{"$lookup":{"from":"stock","localField":"item","foreignField":"item","pipeline":[{"$count":"c"}],"as":"cnt"}}
	]`))
	requireDocs(t, `[{"_id":1,"item":"a","min":5,"cnt":[{"c":2}]}]`, all(t, ctx, cur, err), "localField/foreignField with a pipeline (5.0+)")
}

func testOut(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("src"), `[{"_id":1,"g":"x"},{"_id":2,"g":"y"},{"_id":3,"g":"x"}]`)
	insert(t, ctx, db.Collection("dst"), `[{"_id":"old"}]`)
	_, err := db.Collection("dst").Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"n":1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	cur, err := db.Collection("src").Aggregate(ctx, Ds(`[{"$group":{"_id":"$g","n":{"$sum":1}}},{"$out":"dst"}]`))
	require.Empty(t, all(t, ctx, cur, err), "$out returns no documents")
	requireDocs(t, `[{"_id":"x","n":2},{"_id":"y","n":1}]`, find(t, ctx, db.Collection("dst"), bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"$out replaces the target's documents")
	specs, err := db.Collection("dst").Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 2, "$out keeps the target's indexes")

	_, err = db.Collection("src").Aggregate(ctx, Ds(`[{"$project":{"n":{"$literal":1}}},{"$out":"dst"}]`))
	requireCode(t, err, 11000, "a unique index of the target applies")
	require.Len(t, find(t, ctx, db.Collection("dst"), bson.D{}), 2, "a failed $out leaves the target as it was")

	_, err = db.Collection("src").Aggregate(ctx, Ds(`[{"$out":"dst"},{"$match":{}}]`))
	requireCode(t, err, 40601, "$out must be last")
}

func testOutOtherDB(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("src"), `[{"_id":1}]`)
	other := db.Name() + "_o"
	t.Cleanup(func() { _ = e.Client.Database(other).Drop(testCtx(t)) })
	cur, err := db.Collection("src").Aggregate(ctx, Ds(`[{"$out":{"db":"`+other+`","coll":"t"}}]`))
	require.Empty(t, all(t, ctx, cur, err))
	requireDocs(t, `[{"_id":1}]`, find(t, ctx, e.Client.Database(other).Collection("t"), bson.D{}))
}

func testMergeModes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	src, dst := db.Collection("src"), db.Collection("dst")
	insert(t, ctx, src, `[{"_id":1,"a":10},{"_id":2,"a":20}]`)
	insert(t, ctx, dst, `[{"_id":1,"a":1,"b":1}]`)
	merge := func(spec string) error {
		cur, err := src.Aggregate(ctx, Ds(`[{"$merge":`+spec+`}]`))
		if err == nil {
			_ = cur.Close(ctx)
		}
		return err
	}
	require.NoError(t, merge(`{"into":"dst","whenMatched":"keepExisting","whenNotMatched":"discard"}`))
	requireDocs(t, `[{"_id":1,"a":1,"b":1}]`, find(t, ctx, dst, bson.D{}), "keepExisting + discard change nothing")

	require.NoError(t, merge(`"dst"`))
	requireDocs(t, `[{"_id":1,"a":10,"b":1},{"_id":2,"a":20}]`, find(t, ctx, dst, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"the defaults: merge matched documents, insert the others")

	require.NoError(t, merge(`{"into":"dst","whenMatched":"replace"}`))
	requireDocs(t, `[{"_id":1,"a":10},{"_id":2,"a":20}]`, find(t, ctx, dst, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))))

	require.NoError(t, merge(`{"into":"dst","let":{"inc":"$a"},"whenMatched":[{"$set":{"a":{"$add":["$a","$$inc"]}}}]}`))
	requireDocs(t, `[{"_id":1,"a":20},{"_id":2,"a":40}]`, find(t, ctx, dst, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"a whenMatched pipeline sees let variables evaluated on the source document")

	require.NoError(t, merge(`{"into":"dst","whenMatched":[{"$set":{"from":"$$new.a"}}]}`))
	requireDocs(t, `[{"_id":1,"a":20,"from":10},{"_id":2,"a":40,"from":20}]`, find(t, ctx, dst, bson.D{}, options.Find().SetSort(D(`{"_id":1}`))),
		"without let, $$new is the source document")

	err := merge(`{"into":"dst","whenMatched":"fail"}`)
	requireCode(t, err, 11000, "whenMatched fail reports a duplicate key")

	insert(t, ctx, src, `[{"_id":3,"a":30}]`)
	err = merge(`{"into":"dst","whenMatched":"keepExisting","whenNotMatched":"fail"}`)
	requireCode(t, err, 13113, "whenNotMatched fail")
}

func testMergeOnIndex(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	src, dst := db.Collection("src"), db.Collection("dst")
	insert(t, ctx, src, `[{"_id":1,"k":"a","v":1}]`)
	insert(t, ctx, dst, `[{"_id":9,"k":"a","v":0}]`)
	_, err := src.Aggregate(ctx, Ds(`[{"$project":{"_id":0}},{"$merge":{"into":"dst","on":"k"}}]`))
	requireCode(t, err, 51183, "'on' fields need a unique index")
	_, err = dst.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"k":1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	cur, err := src.Aggregate(ctx, Ds(`[{"$project":{"_id":0}},{"$merge":{"into":"dst","on":"k","whenMatched":"merge"}}]`))
	require.Empty(t, all(t, ctx, cur, err))
	requireDocs(t, `[{"_id":9,"k":"a","v":1}]`, find(t, ctx, dst, bson.D{}), "matched on k, _id kept")
}

func testDBLevelAggregate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	cur, err := db.Aggregate(ctx, Ds(`[{"$documents":[{"x":1},{"x":2},{"x":3}]},{"$match":{"x":{"$gte":2}}}]`))
	requireDocs(t, `[{"x":2},{"x":3}]`, all(t, ctx, cur, err))
	cur, err = db.Aggregate(ctx, Ds(`[{"$documents":[{"_id":1,"y":"a"}]},{"$merge":{"into":"m"}}]`))
	require.Empty(t, all(t, ctx, cur, err))
	requireDocs(t, `[{"_id":1,"y":"a"}]`, find(t, ctx, db.Collection("m"), bson.D{}), "$documents into $merge")

	cur, err = db.Client().Database("admin").Aggregate(ctx, Ds(`[{"$listLocalSessions":{}},{"$limit":1},{"$project":{"_id":0,"has":{"$gt":["$_id.id",null]}}}]`))
	requireDocs(t, `[{"has":true}]`, all(t, ctx, cur, err), "$listLocalSessions lists the session in use")
}

func testSearchIndexes(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	if e.Real && strings.Contains(e.URI, "mongodb.net") {
		t.Skip("an Atlas cluster supports search indexes")
	}
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	_, err := coll.SearchIndexes().CreateOne(ctx, mongo.SearchIndexModel{Definition: D(`{"mappings":{"dynamic":true}}`)})
	require.ErrorContains(t, err, "Atlas")
	_, err = coll.SearchIndexes().List(ctx, nil)
	require.ErrorContains(t, err, "Atlas")
	require.ErrorContains(t, coll.SearchIndexes().DropOne(ctx, "x"), "Atlas")
}

// testClusteredCollection: a collection clustered by _id (MongoDB 5.3+)
// reports its clusteredIndex in listCollections and listIndexes.
func testClusteredCollection(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	require.NoError(t, db.CreateCollection(ctx, "cl", options.CreateCollection().SetClusteredIndex(D(`{"key":{"_id":1},"unique":true,"name":"by id"}`))))
	specs, err := db.ListCollectionSpecifications(ctx, D(`{"name":"cl"}`))
	require.NoError(t, err)
	require.Len(t, specs, 1)
	ci := get(rawDoc(t, specs[0].Options), "clusteredIndex").(bson.D)
	require.Equal(t, "by id", get(ci, "name"))
	idx, err := db.Collection("cl").Indexes().List(ctx)
	docs := all(t, ctx, idx, err)
	require.Len(t, docs, 1)
	require.Equal(t, true, get(docs[0], "clustered"), "listIndexes shows the clustered index: %s", js(docs[0]))
	insert(t, ctx, db.Collection("cl"), `[{"_id":2},{"_id":1}]`)
	require.Equal(t, idList(1, 2), ids(t, ctx, db.Collection("cl"), bson.D{}))
	err = db.CreateCollection(ctx, "bad", options.CreateCollection().SetClusteredIndex(D(`{"key":{"x":1},"unique":true}`)))
	require.Error(t, err, "only _id may cluster a collection")
}

// testSetWindowFields: window functions per partition in sortBy order:
// a running total over documents, a range window on the sort value, rank
// and $shift.
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/setWindowFields/
func testSetWindowFields(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"g":"a","t":1,"v":10},{"_id":2,"g":"b","t":1,"v":5},{"_id":3,"g":"a","t":2,"v":20},
		{"_id":4,"g":"a","t":2,"v":30},{"_id":5,"g":"a","t":5,"v":40},{"_id":6,"g":"b","t":3,"v":7}]`)
	cur, err := coll.Aggregate(ctx, Ds(`[
		{"$setWindowFields":{"partitionBy":"$g","sortBy":{"t":1,"_id":1},"output":{
			"run":{"$sum":"$v","window":{"documents":["unbounded","current"]}},
			"n":{"$documentNumber":{}},
			"prev":{"$shift":{"output":"$_id","by":-1,"default":0}}}}},
		{"$setWindowFields":{"partitionBy":"$g","sortBy":{"t":1},"output":{
			"near":{"$sum":"$v","window":{"range":[-1,0]}},
			"r":{"$rank":{}}}}},
		{"$project":{"g":0,"t":0,"v":0}},
		{"$sort":{"_id":1}}]`))
	requireDocs(t, `[
		{"_id":1,"run":10,"n":1,"prev":0,"near":10,"r":1},
		{"_id":2,"run":5,"n":1,"prev":0,"near":5,"r":1},
		{"_id":3,"run":30,"n":2,"prev":1,"near":60,"r":2},
		{"_id":4,"run":60,"n":3,"prev":3,"near":60,"r":2},
		{"_id":5,"run":100,"n":4,"prev":4,"near":40,"r":4},
		{"_id":6,"run":12,"n":2,"prev":2,"near":7,"r":2}]`, all(t, ctx, cur, err))
}

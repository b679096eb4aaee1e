package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func aggregateCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"Stages", testAggregateStages},
		{"GroupAccumulators", testGroupAccumulators},
		{"BatchesAndGetMore", testAggregateGetMore},
		{"MoreStages", testMoreStages},
	})
}

// aggregate runs pipeline (extended JSON array) on coll.
func aggregate(t *testing.T, coll *mongo.Collection, pipeline string, opts ...options.Lister[options.AggregateOptions]) []bson.D {
	t.Helper()
	ctx := testCtx(t)
	cur, err := coll.Aggregate(ctx, Ds(pipeline), opts...)
	require.NoError(t, err, "pipeline %s", pipeline)
	return all(t, ctx, cur, nil)
}

func seedSales(t *testing.T, db *mongo.Database) *mongo.Collection {
	t.Helper()
	coll := db.Collection("sales")
	insert(t, testCtx(t), coll, `[
		{"_id":1,"item":"a","qty":2,"price":10,"tags":["x","y"]},
		{"_id":2,"item":"b","qty":1,"price":20,"tags":["y"]},
		{"_id":3,"item":"a","qty":5,"price":10,"tags":[]},
		{"_id":4,"item":"c","qty":3,"price":5.5},
		{"_id":5,"item":"b","qty":4,"price":20,"tags":["z","x"]}
	]`)
	return coll
}

func testAggregateStages(t *testing.T, env EnvFunc) {
	_, db, _ := setup(t, env)
	coll := seedSales(t, db)

	requireDocs(t, `[{"_id":3,"item":"a"},{"_id":5,"item":"b"}]`,
		aggregate(t, coll, `[{"$match":{"qty":{"$gte":3}}},{"$sort":{"qty":-1}},{"$limit":2},{"$project":{"item":1}}]`),
		"$match $sort $limit $project")
	requireDocs(t, `[{"_id":2},{"_id":3}]`,
		aggregate(t, coll, `[{"$sort":{"_id":1}},{"$skip":1},{"$limit":2},{"$project":{"_id":1}}]`), "$skip")
	requireDocs(t, `[{"item":"a","total":20}]`,
		aggregate(t, coll, `[{"$match":{"_id":1}},{"$project":{"_id":0,"item":1,"total":{"$multiply":["$qty","$price"]}}}]`),
		"$project with a computed field")
	requireDocs(t, `[{"n":3}]`, aggregate(t, coll, `[{"$match":{"qty":{"$gt":1}}},{"$match":{"price":{"$lt":20}}},{"$count":"n"}]`), "$count")
	requireDocs(t, `[]`, aggregate(t, coll, `[{"$match":{"qty":100}},{"$count":"n"}]`), "$count of nothing returns no document")
	requireDocs(t, `[{"_id":1,"tags":"x"},{"_id":1,"tags":"y"},{"_id":2,"tags":"y"},{"_id":5,"tags":"z"},{"_id":5,"tags":"x"}]`,
		aggregate(t, coll, `[{"$sort":{"_id":1}},{"$unwind":"$tags"},{"$project":{"tags":1}}]`),
		"$unwind drops missing and empty arrays, keeps array order")
	requireDocs(t, `[{"_id":3,"i":null},{"_id":4,"i":null}]`,
		aggregate(t, coll, `[{"$unwind":{"path":"$tags","preserveNullAndEmptyArrays":true,"includeArrayIndex":"i"}},{"$match":{"_id":{"$in":[3,4]}}},{"$project":{"tags":1,"i":1}},{"$sort":{"_id":1}}]`),
		"$unwind with preserveNullAndEmptyArrays (an empty array is removed) and includeArrayIndex")
}

func testGroupAccumulators(t *testing.T, env EnvFunc) {
	_, db, _ := setup(t, env)
	coll := seedSales(t, db)

	got := aggregate(t, coll, `[
		{"$sort":{"_id":1}},
		{"$group":{
			"_id":"$item",
			"n":{"$sum":1},
			"qty":{"$sum":"$qty"},
			"avg":{"$avg":"$qty"},
			"min":{"$min":"$qty"},
			"max":{"$max":"$qty"},
			"first":{"$first":"$_id"},
			"last":{"$last":"$_id"},
			"ids":{"$push":"$_id"},
			"prices":{"$addToSet":"$price"}
		}},
		{"$sort":{"_id":1}}
	]`)
	requireDocs(t, `[
		{"_id":"a","n":2,"qty":7,"avg":3.5,"min":2,"max":5,"first":1,"last":3,"ids":[1,3],"prices":[10]},
		{"_id":"b","n":2,"qty":5,"avg":2.5,"min":1,"max":4,"first":2,"last":5,"ids":[2,5],"prices":[20]},
		{"_id":"c","n":1,"qty":3,"avg":3.0,"min":3,"max":3,"first":4,"last":4,"ids":[4],"prices":[5.5]}
	]`, got, "$group accumulators (field order as in the $group spec, $avg is a double)")

	requireDocs(t, `[{"_id":null,"total":{"$numberDouble":"186.5"},"n":5}]`,
		aggregate(t, coll, `[{"$group":{"_id":null,"total":{"$sum":{"$multiply":["$qty","$price"]}},"n":{"$sum":1}}}]`),
		"$group by null over every document; int and double sums give a double")

	requireDocs(t, `[{"_id":{"item":"a","price":10},"n":2}]`,
		aggregate(t, coll, `[{"$match":{"item":"a"}},{"$group":{"_id":{"item":"$item","price":"$price"},"n":{"$sum":1}}}]`),
		"$group by a compound key")

	requireDocs(t, `[{"_id":"x","n":2},{"_id":"y","n":2},{"_id":"z","n":1}]`,
		aggregate(t, coll, `[{"$unwind":"$tags"},{"$group":{"_id":"$tags","n":{"$sum":1}}},{"$sort":{"_id":1}}]`),
		"$unwind then $group")

	requireDocs(t, `[{"_id":null,"s":0,"a":null,"m":null}]`,
		aggregate(t, coll, `[{"$group":{"_id":null,"s":{"$sum":"$missing"},"a":{"$avg":"$missing"},"m":{"$max":"$missing"}}}]`),
		"accumulators over a missing field: $sum 0, $avg and $max null")
}

func testAggregateGetMore(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	seedNumbers(t, db, 30)
	cl, log := monitoredClient(t, e)
	coll := cl.Database(db.Name()).Collection("nums")
	cur, err := coll.Aggregate(ctx, Ds(`[{"$match":{"g":0}},{"$sort":{"v":1}}]`), options.Aggregate().SetBatchSize(3))
	require.NoError(t, err)
	got := all(t, ctx, cur, nil)
	require.Len(t, got, 10)
	require.GreaterOrEqual(t, log.count("getMore"), 3, "10 results in batches of 3 need getMores")

	// The aggregate command's raw reply has the cursor shape.
	raw, err := db.RunCommand(ctx, D(`{"aggregate":"nums","pipeline":[{"$limit":1}],"cursor":{}}`)).Raw()
	require.NoError(t, err)
	c, ok := raw.Lookup("cursor").DocumentOK()
	require.True(t, ok, "reply has cursor: %s", raw)
	ns, _ := c.Lookup("ns").StringValueOK()
	require.Equal(t, db.Name()+".nums", ns, "cursor.ns: %s", raw)
	_, ok = c.Lookup("firstBatch").ArrayOK()
	require.True(t, ok, "cursor.firstBatch: %s", raw)

	// Aggregating a missing collection returns nothing.
	requireDocs(t, `[]`, aggregate(t, db.Collection("missing"), `[{"$match":{}}]`))
}

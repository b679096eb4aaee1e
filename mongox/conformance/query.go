package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func queryCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"NumericEqualityAcrossTypes", testNumericEquality},
		{"Operators", testQueryOperators},
		{"SortMixedTypes", testSortMixedTypes},
		{"SortArrays", testSortArrays},
		{"InvalidQueries", testInvalidQueries},
		{"ExprTypesNestedArrays", testQueryMisc},
		{"ReturnKeyShowRecordID", testReturnKey},
	})
}

// idList renders _id values the way ids does.
func idList(v ...int32) string {
	a := bson.A{}
	for _, x := range v {
		a = append(a, x)
	}
	return js(a)
}

// filterCase is one filter and the _ids it selects.
type filterCase struct {
	filter string
	want   []int32
}

func runFilters(t *testing.T, coll *mongo.Collection, cases []filterCase) {
	t.Helper()
	ctx := testCtx(t)
	for _, c := range cases {
		t.Run(c.filter, func(t *testing.T) {
			require.Equal(t, idList(c.want...), ids(t, ctx, coll, D(c.filter)), "filter %s", c.filter)
		})
	}
}

func testNumericEquality(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[
		{"_id":1,"v":1},
		{"_id":2,"v":{"$numberLong":"1"}},
		{"_id":3,"v":1.0},
		{"_id":4,"v":{"$numberDecimal":"1"}},
		{"_id":5,"v":"1"},
		{"_id":6,"v":2},
		{"_id":7,"v":{"$numberDecimal":"1.00"}},
		{"_id":8,"v":0.5}
	]`)
	ones := []int32{1, 2, 3, 4, 7}
	runFilters(t, coll, []filterCase{
		{`{"v":1}`, ones},
		{`{"v":{"$numberLong":"1"}}`, ones},
		{`{"v":1.0}`, ones},
		{`{"v":{"$numberDecimal":"1.0"}}`, ones},
		{`{"v":{"$in":[{"$numberLong":"1"}]}}`, ones},
		{`{"v":{"$gt":1}}`, []int32{6}},
		{`{"v":{"$gte":{"$numberDecimal":"1"}}}`, []int32{1, 2, 3, 4, 6, 7}},
		{`{"v":{"$lt":1}}`, []int32{8}},
		{`{"v":{"$lt":"2"}}`, []int32{5}},
		{`{"v":{"$ne":1}}`, []int32{5, 6, 8}},
	})
}

func testQueryOperators(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[
		{"_id":1,"a":1,"tags":["x","y"],"s":"apple","sub":{"k":1},"arr":[{"k":1,"v":"a"},{"k":2,"v":"b"}]},
		{"_id":2,"a":2,"tags":["y"],"s":"Banana","sub":{"k":2},"arr":[{"k":2,"v":"a"}]},
		{"_id":3,"a":null,"tags":[],"s":"cherry"},
		{"_id":4,"tags":["x","y","z"],"s":"date","arr":[{"k":1,"v":"b"}]},
		{"_id":5,"a":"str","tags":"x","s":"apple pie","sub":{}}
	]`)
	runFilters(t, coll, []filterCase{
		{`{}`, []int32{1, 2, 3, 4, 5}},
		{`{"a":{"$in":[1,2]}}`, []int32{1, 2}},
		{`{"a":{"$in":[null]}}`, []int32{3, 4}},
		{`{"a":{"$nin":[1,2]}}`, []int32{3, 4, 5}},
		{`{"a":{"$in":[{"$regularExpression":{"pattern":"^s","options":""}}]}}`, []int32{5}},
		{`{"a":{"$exists":true}}`, []int32{1, 2, 3, 5}},
		{`{"a":{"$exists":false}}`, []int32{4}},
		{`{"a":null}`, []int32{3, 4}},
		{`{"a":{"$ne":null}}`, []int32{1, 2, 5}},
		{`{"a":{"$exists":true,"$eq":null}}`, []int32{3}},
		{`{"sub.k":null}`, []int32{3, 4, 5}},
		{`{"a":{"$type":"number"}}`, []int32{1, 2}},
		{`{"a":{"$type":"string"}}`, []int32{5}},
		{`{"a":{"$type":10}}`, []int32{3}},
		{`{"a":{"$type":["null","string"]}}`, []int32{3, 5}},
		{`{"tags":{"$type":"array"}}`, []int32{1, 2, 3, 4}},
		{`{"$and":[{"a":{"$gte":1}},{"a":{"$lte":1}}]}`, []int32{1}},
		{`{"$or":[{"a":1},{"s":"date"}]}`, []int32{1, 4}},
		{`{"$nor":[{"a":1},{"tags":"x"}]}`, []int32{2, 3}},
		{`{"a":{"$not":{"$gt":1}}}`, []int32{1, 3, 4, 5}},
		{`{"a":{"$gt":1}}`, []int32{2}},
		{`{"a":{"$mod":[2,0]}}`, []int32{2}},
		{`{"_id":{"$gte":2,"$lt":4}}`, []int32{2, 3}},
		{`{"s":{"$regex":"^a"}}`, []int32{1, 5}},
		{`{"s":{"$regex":"^b","$options":"i"}}`, []int32{2}},
		{`{"s":{"$regularExpression":{"pattern":"an","options":""}}}`, []int32{2}},
		{`{"s":{"$not":{"$regularExpression":{"pattern":"^a","options":""}}}}`, []int32{2, 3, 4}},
		{`{"tags":"y"}`, []int32{1, 2, 4}},
		{`{"tags":["y"]}`, []int32{2}},
		{`{"tags":{"$size":2}}`, []int32{1}},
		{`{"tags":{"$size":0}}`, []int32{3}},
		{`{"tags":{"$all":["x","y"]}}`, []int32{1, 4}},
		{`{"tags":{"$elemMatch":{"$gte":"y"}}}`, []int32{1, 2, 4}},
		{`{"tags":{"$in":["z","q"]}}`, []int32{4}},
		{`{"tags":{"$nin":["x"]}}`, []int32{2, 3}},
		{`{"arr":{"$elemMatch":{"k":1,"v":"b"}}}`, []int32{4}},
		{`{"arr.k":1,"arr.v":"b"}`, []int32{1, 4}},
		{`{"arr.k":2}`, []int32{1, 2}},
		{`{"arr.0.k":1}`, []int32{1, 4}},
		{`{"arr":{"k":2,"v":"a"}}`, []int32{2}},
		{`{"arr":{"v":"a","k":2}}`, []int32{}},
		{`{"sub.k":{"$gt":1}}`, []int32{2}},
		{`{"sub":{"k":1}}`, []int32{1}},
	})
}

func testSortMixedTypes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[
		{"_id":1,"v":{"$maxKey":1}},
		{"_id":2,"v":true},
		{"_id":3,"v":"b"},
		{"_id":4,"v":2.5},
		{"_id":5,"v":null},
		{"_id":6},
		{"_id":7,"v":{"x":1}},
		{"_id":8,"v":{"$date":"2020-01-01T00:00:00Z"}},
		{"_id":9,"v":{"$oid":"5f1d7f0e0000000000000000"}},
		{"_id":10,"v":{"$minKey":1}},
		{"_id":11,"v":{"$numberLong":"1"}},
		{"_id":12,"v":{"$binary":{"base64":"AQI=","subType":"00"}}},
		{"_id":13,"v":{"$timestamp":{"t":1,"i":1}}},
		{"_id":14,"v":"a"},
		{"_id":15,"v":false},
		{"_id":16,"v":{"$numberDecimal":"1.5"}},
		{"_id":17,"v":{"$regularExpression":{"pattern":"x","options":""}}}
	]`)
	// MongoDB's order: MinKey < null = missing < numbers < strings < objects
	// < arrays < binData < ObjectId < bool < date < timestamp < regex < MaxKey.
	asc := []int32{10, 5, 6, 11, 16, 4, 14, 3, 7, 12, 9, 15, 2, 8, 13, 17, 1}
	got := find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"v":1,"_id":1}`)))
	require.Equal(t, idList(asc...), idsOf(got), "ascending sort across BSON types")

	desc := []int32{1, 17, 13, 8, 2, 15, 9, 12, 7, 3, 14, 4, 16, 11, 5, 6, 10}
	got = find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"v":-1,"_id":1}`)))
	require.Equal(t, idList(desc...), idsOf(got), "descending sort across BSON types (null and missing tie, then _id)")
}

func testSortArrays(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"v":[3,1]},{"_id":2,"v":2},{"_id":3,"v":[5]},{"_id":4,"v":[]}]`)
	got := find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"v":1}`)))
	require.Equal(t, idList(4, 1, 2, 3), idsOf(got), "ascending sort uses an array's smallest element; [] sorts before numbers")
	got = find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"v":-1}`)))
	require.Equal(t, idList(3, 1, 2, 4), idsOf(got), "descending sort uses an array's largest element")
}

func testInvalidQueries(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	for _, f := range []string{`{"a":{"$bogus":1}}`, `{"$bogus":[{"a":1}]}`, `{"a":{"$in":1}}`, `{"$and":[]}`, `{"a":{"$size":"x"}}`} {
		_, err := coll.Find(ctx, D(f))
		se := serverError(t, err)
		require.NotEmpty(t, se.ErrorCodes(), "filter %s must be rejected with a code", f)
	}
	_, err := coll.Find(ctx, D(`{"a":{"$bogus":1}}`))
	requireCode(t, err, 2, "unknown operator is BadValue")
	require.Contains(t, err.Error(), "$bogus", "the error names the operator")
}

// idsOf returns the _id values of docs as ids does.
func idsOf(docs []bson.D) string {
	a := bson.A{}
	for _, d := range docs {
		a = append(a, get(d, "_id"))
	}
	return js(a)
}

// testReturnKey: find's returnKey returns the index key the plan found each
// document by ({} after a collection scan) and ignores the projection;
// showRecordId adds $recordId, increasing in insertion order.
// https://www.mongodb.com/docs/v7.0/reference/command/find/
// https://www.mongodb.com/docs/v7.0/reference/method/cursor.returnKey/
func testReturnKey(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":3,"a":30,"b":"x"},{"_id":1,"a":10,"b":"y"},{"_id":2,"a":20,"b":"x"}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":-1}`)})
	require.NoError(t, err)

	requireDocs(t, `[{"_id":1},{"_id":2},{"_id":3}]`,
		find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"_id":1}`)).SetReturnKey(true).SetShowRecordID(true)),
		"the _id index provides the sort; returnKey wins over showRecordId")
	requireDocs(t, `[{"a":30},{"a":20}]`,
		find(t, ctx, coll, D(`{"a":{"$gte":20}}`), options.Find().SetReturnKey(true).SetProjection(D(`{"b":1}`))),
		"the a_-1 index bounds the filter")
	requireDocs(t, `[{},{}]`,
		find(t, ctx, coll, D(`{"b":"x"}`), options.Find().SetReturnKey(true).SetSort(D(`{"b":1}`))),
		"a collection scan has no key")

	got := find(t, ctx, coll, D(`{"b":"x"}`), options.Find().SetShowRecordID(true).SetProjection(D(`{"b":0}`)).SetSort(D(`{"_id":-1}`)))
	require.Len(t, got, 2)
	var rids []int64
	for _, d := range got {
		require.Len(t, d, 3, "_id, a and $recordId: %s", js(d))
		rid, ok := get(d, "$recordId").(int64)
		require.True(t, ok, "$recordId is a long: %s", js(d))
		rids = append(rids, rid)
	}
	require.Greater(t, rids[1], rids[0], "_id 2 was inserted after _id 3: %v", rids)
}

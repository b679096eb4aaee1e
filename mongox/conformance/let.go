package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// letCases cover the let parameter (MongoDB 5.0+) of find, aggregate,
// update, delete and findAndModify: variables visible as $$name in
// aggregation expressions ($expr filters, pipelines, update pipelines).
func letCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"FindAndAggregate", testLetFindAggregate},
		{"UpdateDelete", testLetUpdateDelete},
		{"FindAndModify", testLetFindAndModify},
		{"Errors", testLetErrors},
	})
}

func testLetFindAggregate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":"a"},{"_id":2,"x":"b"},{"_id":3,"x":"c"}]`)
	got := find(t, ctx, coll, D(`{"$expr":{"$in":["$x","$$wanted"]}}`),
		options.Find().SetLet(D(`{"wanted":["a","c"]}`)).SetSort(D(`{"_id":1}`)))
	requireDocs(t, `[{"_id":1,"x":"a"},{"_id":3,"x":"c"}]`, got, "find: $$wanted in $expr")

	cur, err := coll.Aggregate(ctx, Ds(`[
		{"$match":{"$expr":{"$gte":["$_id","$$min"]}}},
		{"$project":{"_id":1,"tag":{"$concat":["$x","$$suffix"]},"n":{"$let":{"vars":{"min":100},"in":"$$min"}}}}
	]`), options.Aggregate().SetLet(D(`{"min":2,"suffix":{"$toUpper":"-z"}}`)))
	requireDocs(t, `[{"_id":2,"tag":"b-Z","n":100},{"_id":3,"tag":"c-Z","n":100}]`, all(t, ctx, cur, err),
		"aggregate: let values are expressions evaluated once; an inner $let shadows them")
}

func testLetUpdateDelete(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"n":1},{"_id":2,"n":2},{"_id":3,"n":3}]`)
	res, err := coll.UpdateMany(ctx, D(`{"$expr":{"$lte":["$n","$$limit"]}}`), Ds(`[{"$set":{"n":{"$add":["$n","$$step"]}}}]`),
		options.UpdateMany().SetLet(D(`{"limit":2,"step":10}`)))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.ModifiedCount)
	dres, err := coll.DeleteOne(ctx, D(`{"$expr":{"$eq":["$n","$$gone"]}}`), options.DeleteOne().SetLet(D(`{"gone":12}`)))
	require.NoError(t, err)
	require.Equal(t, int64(1), dres.DeletedCount)
	requireDocs(t, `[{"_id":1,"n":11},{"_id":3,"n":3}]`, find(t, ctx, coll, bson.D{}))
}

func testLetFindAndModify(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"n":1},{"_id":2,"n":2}]`)
	var got bson.D
	err := coll.FindOneAndUpdate(ctx, D(`{"$expr":{"$eq":["$_id","$$id"]}}`), Ds(`[{"$set":{"n":"$$v"}}]`),
		options.FindOneAndUpdate().SetLet(D(`{"id":2,"v":"set"}`)).SetReturnDocument(options.After)).Decode(&got)
	require.NoError(t, err)
	requireDoc(t, `{"_id":2,"n":"set"}`, got)
	err = coll.FindOneAndDelete(ctx, D(`{"$expr":{"$eq":["$_id","$$id"]}}`), options.FindOneAndDelete().SetLet(D(`{"id":1}`))).Decode(&got)
	require.NoError(t, err)
	requireDoc(t, `{"_id":1,"n":1}`, got)
}

func testLetErrors(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	_, err := coll.Find(ctx, D(`{"$expr":{"$eq":["$_id","$$nope"]}}`))
	requireCode(t, err, 17276, "an undefined variable fails")
	_, err = coll.Find(ctx, D(`{"$expr":{"$eq":["$_id","$$Bad"]}}`), options.Find().SetLet(D(`{"Bad":1}`)))
	var se mongo.ServerError
	require.ErrorAs(t, err, &se, "a variable name must start with a lowercase letter")
}

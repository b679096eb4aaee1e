package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// updatePipelineCases cover pipeline-style updates (MongoDB 4.2+) and the
// field names MongoDB 5.0+ stores ('$'-prefixed and dotted).
func updatePipelineCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"UpdateWithPipeline", testUpdatePipeline},
		{"UpsertWithPipeline", testUpsertPipeline},
		{"FindOneAndUpdateWithPipeline", testFindAndModifyPipeline},
		{"BulkWriteWithPipeline", testBulkWritePipeline},
		{"PipelineStageNotAllowed", testUpdatePipelineBadStage},
		{"PipelineUnknownStage", testUpdatePipelineUnknownStage},
		{"DollarAndDottedFieldNames", testDollarFieldNames},
		{"PositionalOperator", testPositionalOperator},
	})
}

func testUpdatePipeline(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":1,"b":2,"c":{"d":3}},{"_id":2,"a":10,"b":20}]`)
	res, err := coll.UpdateMany(ctx, bson.D{}, Ds(`[
		{"$set":{"sum":{"$add":["$a","$b"]}}},
		{"$unset":["b"]},
		{"$addFields":{"a":{"$multiply":["$a",2]}}}
	]`))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.MatchedCount)
	require.Equal(t, int64(2), res.ModifiedCount)
	requireDocs(t, `[{"_id":1,"a":2,"c":{"d":3},"sum":3},{"_id":2,"a":20,"sum":30}]`, find(t, ctx, coll, bson.D{}),
		"the stages run in order on each document; fields keep their place and new ones are appended")

	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), Ds(`[{"$replaceWith":{"$mergeObjects":["$c",{"_id":"$_id","x":"$$ROOT.a"}]}}]`))
	require.NoError(t, err)
	requireDocs(t, `[{"_id":1,"d":3,"x":2}]`, find(t, ctx, coll, D(`{"_id":1}`)), "$replaceWith replaces the document, _id kept")

	_, err = coll.UpdateOne(ctx, D(`{"_id":2}`), Ds(`[{"$project":{"a":1}}]`))
	require.NoError(t, err)
	requireDocs(t, `[{"_id":2,"a":20}]`, find(t, ctx, coll, D(`{"_id":2}`)), "$project keeps _id and the named fields")
}

func testUpsertPipeline(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	res, err := coll.UpdateOne(ctx, D(`{"_id":7,"k":"x"}`), Ds(`[{"$set":{"n":{"$ifNull":["$n",0]},"k2":{"$concat":["$k","y"]}}}]`),
		options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int32(7), res.UpsertedID)
	requireDocs(t, `[{"_id":7,"k":"x","n":0,"k2":"xy"}]`, find(t, ctx, coll, bson.D{}),
		"the pipeline runs on the document seeded from the filter's equalities")
}

func testFindAndModifyPipeline(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	var got bson.D
	err := coll.FindOneAndUpdate(ctx, D(`{"_id":1}`), Ds(`[{"$set":{"x":{"$add":["$x",1]},"y":"$x"}}]`),
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&got)
	require.NoError(t, err)
	requireDoc(t, `{"_id":1,"x":2,"y":1}`, got, "expressions in one $set see the document before the stage")
}

func testBulkWritePipeline(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":1},{"_id":2,"x":2}]`)
	res, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewUpdateOneModel().SetFilter(D(`{"_id":1}`)).SetUpdate(Ds(`[{"$set":{"x":{"$multiply":["$x",10]}}}]`)),
		mongo.NewUpdateManyModel().SetFilter(bson.D{}).SetUpdate(Ds(`[{"$set":{"seen":true}}]`)),
	})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.MatchedCount)
	requireDocs(t, `[{"_id":1,"x":10,"seen":true},{"_id":2,"x":2,"seen":true}]`, find(t, ctx, coll, bson.D{}))
}

func testUpdatePipelineBadStage(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), Ds(`[{"$group":{"_id":null}}]`))
	require.Error(t, err)
	require.Contains(t, err.Error(), "$group", "the error names the stage that updates do not allow")
}

// testUpdatePipelineUnknownStage: a stage name MongoDB does not have fails
// the whole update command with 40324 (an ok:0 reply, not a write error),
// even when no document matches: mongod parses every statement's pipeline
// with the command, before any statement runs.
func testUpdatePipelineUnknownStage(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"x":11}]`)
	raw, err := db.RunCommand(ctx, D(`{"update":"c","updates":[{"q":{"x":1},"u":[{"$invalidOperator":true}]}]}`)).Raw()
	requireCode(t, err, 40324, raw)
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce, "a command error, not a write error")
	requireDocs(t, `[{"_id":1,"x":11}]`, find(t, ctx, coll, bson.D{}))
}

// testDollarFieldNames: MongoDB 5.0+ stores '$'-prefixed and dotted field
// names (inserted as is, or set through $setField in a pipeline update),
// but not '$'-prefixed names inside _id.
func testDollarFieldNames(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.InsertOne(ctx, D(`{"_id":1,"$a":1,"b.c":2,"d":{"$e":3}}`))
	require.NoError(t, err, "top-level '$' and '.' field names are allowed since 5.0")
	requireDocs(t, `[{"_id":1,"$a":1,"b.c":2,"d":{"$e":3}}]`, find(t, ctx, coll, bson.D{}))

	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), Ds(`[{"$replaceWith":{"$setField":{"field":{"$literal":"$x"},"value":5,"input":"$$ROOT"}}}]`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), Ds(`[{"$replaceWith":{"$unsetField":{"field":"b.c","input":"$$ROOT"}}}]`))
	require.NoError(t, err)
	requireDocs(t, `[{"_id":1,"$a":1,"d":{"$e":3},"$x":5}]`, find(t, ctx, coll, bson.D{}), "$setField appends, $unsetField removes")

	var got bson.D
	require.NoError(t, coll.FindOne(ctx, bson.D{}, options.FindOne().SetProjection(
		D(`{"_id":0,"v":{"$getField":{"$literal":"$a"}}}`))).Decode(&got))
	requireDoc(t, `{"v":1}`, got, "$getField reads a '$' field")

	_, err = coll.InsertOne(ctx, D(`{"_id":{"$k":1}}`))
	require.Error(t, err, "'$'-prefixed names inside _id are refused")
}

// testPositionalOperator: $ in an update path is the index of the array
// element the query matched.
func testPositionalOperator(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"items":[{"sku":"a","qty":1},{"sku":"b","qty":2}],"grades":[80,90]}]`)
	_, err := coll.UpdateOne(ctx, D(`{"items.sku":"b"}`), D(`{"$set":{"items.$.qty":5}}`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1,"grades":{"$gte":85}}`), D(`{"$inc":{"grades.$":1}}`))
	require.NoError(t, err)
	var got bson.D
	require.NoError(t, coll.FindOneAndUpdate(ctx, D(`{"items":{"$elemMatch":{"sku":"a","qty":1}}}`), D(`{"$set":{"items.$.seen":true}}`),
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&got))
	requireDoc(t, `{"_id":1,"items":[{"sku":"a","qty":1,"seen":true},{"sku":"b","qty":5}],"grades":[80,91]}`, got)

	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"items.$.qty":0}}`))
	requireCode(t, err, 2, "a query without a predicate on the array gives $ nothing to stand for")
	_, err = coll.UpdateOne(ctx, D(`{"items.sku":"zz"}`), D(`{"$set":{"items.$.qty":0}}`), options.UpdateOne().SetUpsert(true))
	require.Error(t, err, "an upsert's insert cannot use $")
}

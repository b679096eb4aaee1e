package conformance

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Manual pages of the index specification cases.
const (
	// manualPartial: a partialFilterExpression may use equality ($eq or a
	// value), $exists: true, $gt, $gte, $lt, $lte, $type, $and, $or and $in.
	manualPartial = "https://www.mongodb.com/docs/v7.0/core/index-partial/"
	// manualTTL: TTL indexes are single-field indexes.
	manualTTL = "https://www.mongodb.com/docs/v7.0/core/index-ttl/"
	// manualCollMod: since 5.1 collMod can make a single-field index a TTL
	// index; an index is named by name or by a key pattern that must be
	// unambiguous.
	manualCollMod = "https://www.mongodb.com/docs/v7.0/reference/command/collMod/"
	// manualCreateIndexes: the index specification fields and their types.
	manualCreateIndexes = "https://www.mongodb.com/docs/v7.0/reference/command/createIndexes/"
	// manualTimestamps: an empty Timestamp in a top-level field of an
	// inserted or replacing document gets the current timestamp.
	manualTimestamps = "https://www.mongodb.com/docs/v7.0/reference/bson-types/#timestamps"
)

func indexRuleCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"PartialFilterRefused", testPartialFilterRefused},
		{"PartialFilterAccepted", testPartialFilterAccepted},
		{"SpecRules", testIndexSpecRules},
		{"TTLSingleFieldOnly", testTTLSingleField},
		{"CollModTTL", testCollModTTL},
		{"AmbiguousKeyPattern", testAmbiguousKeyPattern},
		{"ReplacementFillsEmptyTimestamp", testReplaceFillsTimestamp},
	})
}

// createIndexErr creates one index and returns the error.
func createIndexErr(t *testing.T, coll *mongo.Collection, keys, opts string) error {
	t.Helper()
	spec := D(`{"key":` + keys + `,"name":"i"}`)
	if opts != "" {
		spec = append(spec, D(opts)...)
	}
	return coll.Database().RunCommand(testCtx(t), bson.D{{Key: "createIndexes", Value: coll.Name()}, {Key: "indexes", Value: bson.A{spec}}}).Err()
}

// requireNoIndex asserts that coll has no index but _id_ (or no
// collection): none of the refused ones was created.
func requireNoIndex(t *testing.T, coll *mongo.Collection) {
	t.Helper()
	specs, err := coll.Indexes().ListSpecifications(testCtx(t))
	require.NoError(t, err)
	require.LessOrEqual(t, len(specs), 1, "no refused index was created")
}

func testPartialFilterRefused(t *testing.T, env EnvFunc) {
	_, db, _ := setup(t, env)
	coll := db.Collection("c")
	for _, c := range []struct{ filter string }{
		{`{"a":{"$exists":false}}`},
		{`{"a":{"$ne":1}}`},
		{`{"a":{"$nin":[1,2]}}`},
		{`{"a":{"$not":{"$gt":1}}}`},
		{`{"a":{"$regex":"^x"}}`},
		{`{"a":{"$regularExpression":{"pattern":"^x","options":""}}}`},
		{`{"$nor":[{"a":1}]}`},
		{`{"a":{"$elemMatch":{"b":1}}}`},
		{`{"a":{"$size":2}}`},
		{`{"a":{"$mod":[2,0]}}`},
		{`{"$or":[{"a":1},{"b":{"$ne":2}}]}`},
		{`{"$and":[{"$and":[{"$and":[{"$and":[{"a":3}]}]}]}]}`}, // five levels deep
	} {
		err := createIndexErr(t, coll, `{"x":1}`, `{"partialFilterExpression":`+c.filter+`}`)
		requireCode(t, err, 67, "partial filter "+c.filter+" is CannotCreateIndex ("+manualPartial+")")
	}
	err := createIndexErr(t, coll, `{"x":1}`, `{"partialFilterExpression":{"$expr":{"$eq":["$a",1]}}}`)
	requireCode(t, err, 224, "$expr is parsed out of a partial filter before its operators are checked: QueryFeatureNotAllowed")
	requireNoIndex(t, coll)
}

func testPartialFilterAccepted(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	for i, filter := range []string{
		`{"a":1}`,
		`{"a":null}`,
		`{"a":{"$eq":1}}`,
		`{"a":{"$exists":true}}`,
		`{"a":{"$gt":1,"$lte":9}}`,
		`{"a":{"$gte":1},"b":{"$lt":2}}`,
		`{"a":{"$type":"string"}}`,
		`{"a":{"$in":[1,2]}}`,
		`{"$or":[{"a":1},{"b":{"$gt":2}}]}`,
		`{"$and":[{"a":1},{"$or":[{"b":1},{"c":{"$exists":true}}]}]}`,
		`{"$and":[{"$and":[{"$and":[{"a":3}]}]}]}`, // four levels deep
	} {
		_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: fmt.Sprintf("k%d", i), Value: 1}},
			Options: options.Index().SetPartialFilterExpression(D(filter))})
		require.NoError(t, err, "partial filter %s is accepted (%s)", filter, manualPartial)
	}
}

func testIndexSpecRules(t *testing.T, env EnvFunc) {
	_, db, _ := setup(t, env)
	coll := db.Collection("c")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"partialFilterExpression":{"b":1},"sparse":true}`), 67,
		"partialFilterExpression and sparse do not mix ("+manualPartial+")")
	requireCode(t, createIndexErr(t, coll, `{"a":0}`, ``), 67, "a key pattern value of 0 ("+manualCreateIndexes+")")
	requireCode(t, createIndexErr(t, coll, `{"$a":1}`, ``), 67, "a key field starting with $")
	requireCode(t, createIndexErr(t, coll, `{"a..b":1}`, ``), 67, "a key path with an empty part")
	requireCode(t, createIndexErr(t, coll, `{"a":true}`, ``), 67, "a key pattern value that is not a number or a plugin name")
	dup := bson.D{{Key: "createIndexes", Value: "c"}, {Key: "indexes", Value: bson.A{bson.D{
		{Key: "key", Value: bson.D{{Key: "a", Value: 1}, {Key: "a", Value: -1}}}, {Key: "name", Value: "dup"}}}}}
	requireCode(t, db.RunCommand(testCtx(t), dup).Err(), 2, "a field twice in the key pattern is BadValue")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"unique":"yes"}`), 14, "unique must be a boolean or a number")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"v":3}`), 67, "index version 3 does not exist")
	err := db.RunCommand(testCtx(t), D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"_id_"}]}`)).Err()
	requireCode(t, err, 2, "the name _id_ is reserved for {_id: 1}")
	err = db.RunCommand(testCtx(t), D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"*"}]}`)).Err()
	requireCode(t, err, 2, "the name * is not valid")
	err = db.RunCommand(testCtx(t), D(`{"createIndexes":"c","indexes":[{"key":{"_id":1},"name":"_id_","expireAfterSeconds":10}]}`)).Err()
	requireCode(t, err, 197, "an _id index specification takes no expireAfterSeconds")
	err = db.RunCommand(testCtx(t), D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"a_1","bogus":1}]}`)).Err()
	requireCode(t, err, 197, "an unknown index option is InvalidIndexSpecificationOption")

	// At most 64 indexes, _id_ included.
	many := bson.A{}
	for i := range 63 {
		many = append(many, bson.D{{Key: "key", Value: bson.D{{Key: fmt.Sprintf("f%d", i), Value: 1}}}, {Key: "name", Value: fmt.Sprintf("f%d_1", i)}})
	}
	require.NoError(t, db.RunCommand(testCtx(t), bson.D{{Key: "createIndexes", Value: "many"}, {Key: "indexes", Value: many}}).Err())
	requireCode(t, createIndexErr(t, db.Collection("many"), `{"g":1}`, ``), 67, "a 65th index")
}

func testTTLSingleField(t *testing.T, env EnvFunc) {
	_, db, _ := setup(t, env)
	coll := db.Collection("c")
	requireCode(t, createIndexErr(t, coll, `{"a":1,"b":1}`, `{"expireAfterSeconds":60}`), 67,
		"TTL indexes are single-field indexes ("+manualTTL+")")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"expireAfterSeconds":-1}`), 67, "a negative expireAfterSeconds")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"expireAfterSeconds":"60"}`), 67, "a string expireAfterSeconds")
	requireCode(t, createIndexErr(t, coll, `{"a":1}`, `{"expireAfterSeconds":{"$numberLong":"4294967296"}}`), 67,
		"an expireAfterSeconds beyond 32 bits")
	requireNoIndex(t, coll)
}

func testCollModTTL(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{{Keys: D(`{"at":1}`)}, {Keys: D(`{"a":1,"b":1}`)}})
	require.NoError(t, err)
	raw, err := db.RunCommand(ctx, D(`{"collMod":"c","index":{"keyPattern":{"at":1},"expireAfterSeconds":60}}`)).Raw()
	require.NoError(t, err, "since 5.1 collMod makes a single-field index a TTL index ("+manualCollMod+")")
	require.Equal(t, "60", num(raw.Lookup("expireAfterSeconds_new")), "reply: %s", raw)
	_, hasOld := raw.Lookup("expireAfterSeconds_old").AsInt64OK()
	require.False(t, hasOld, "the index had no expireAfterSeconds before: %s", raw)
	byName := map[string]bson.D{}
	cur, err := coll.Indexes().List(ctx)
	for _, s := range all(t, ctx, cur, err) {
		byName[get(s, "name").(string)] = s
	}
	require.Equal(t, "60", fmt.Sprint(get(byName["at_1"], "expireAfterSeconds")), "listIndexes shows the TTL: %s", js(byName["at_1"]))

	raw, err = db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"at_1","expireAfterSeconds":30}}`)).Raw()
	require.NoError(t, err)
	require.Equal(t, "60", num(raw.Lookup("expireAfterSeconds_old")), "reply: %s", raw)
	require.Equal(t, "30", num(raw.Lookup("expireAfterSeconds_new")), "reply: %s", raw)

	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"a_1_b_1","expireAfterSeconds":60}}`)).Err(), 72,
		"a compound index cannot become a TTL index")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"_id_","expireAfterSeconds":60}}`)).Err(), 72,
		"the _id index cannot become a TTL index")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"at_1","keyPattern":{"at":1},"expireAfterSeconds":60}}`)).Err(), 72,
		"name and keyPattern together")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"expireAfterSeconds":60}}`)).Err(), 72,
		"neither name nor keyPattern")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"at_1"}}`)).Err(), 72,
		"no modification")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"at_1","expireAfterSeconds":-5}}`)).Err(), 72,
		"a negative expireAfterSeconds")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"name":"nope","expireAfterSeconds":60}}`)).Err(), 27,
		"a missing index is IndexNotFound")
}

func testAmbiguousKeyPattern(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: D(`{"x":1}`), Options: options.Index().SetName("low").SetPartialFilterExpression(D(`{"a":{"$lt":5}}`))},
		{Keys: D(`{"x":1}`), Options: options.Index().SetName("high").SetPartialFilterExpression(D(`{"a":{"$gte":5}}`))},
	})
	require.NoError(t, err, "two partial indexes may share a key pattern")
	requireCode(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"keyPattern":{"x":1},"expireAfterSeconds":60}}`)).Err(), 181,
		"collMod by a key pattern two indexes share is AmbiguousIndexKeyPattern ("+manualCollMod+")")
	requireCode(t, coll.Indexes().DropWithKey(ctx, D(`{"x":1}`)), 181, "so is dropIndexes by that key pattern")
	require.NoError(t, coll.Indexes().DropOne(ctx, "high"), "by name it works")
	require.NoError(t, db.RunCommand(ctx, D(`{"collMod":"c","index":{"keyPattern":{"x":1},"expireAfterSeconds":60}}`)).Err())
}

func testReplaceFillsTimestamp(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	zero := bson.Timestamp{}
	insert(t, ctx, coll, `[{"_id":1},{"_id":2}]`)
	_, err := coll.ReplaceOne(ctx, D(`{"_id":1}`), bson.D{{Key: "ts", Value: zero}})
	require.NoError(t, err)
	_, err = coll.ReplaceOne(ctx, D(`{"_id":3}`), bson.D{{Key: "ts", Value: zero}}, options.Replace().SetUpsert(true))
	require.NoError(t, err)
	require.NoError(t, coll.FindOneAndReplace(ctx, D(`{"_id":2}`), bson.D{{Key: "ts", Value: zero}}).Err())
	for _, d := range find(t, ctx, coll, bson.D{}) {
		ts, ok := get(d, "ts").(bson.Timestamp)
		require.True(t, ok, "ts is a Timestamp: %s", js(d))
		require.False(t, ts.IsZero(), "a replacement's top-level Timestamp(0, 0) gets the current timestamp, as an insert's does (%s): %s", manualTimestamps, js(d))
	}
}

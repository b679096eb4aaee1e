package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func crudCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"InsertManyOrderedDuplicate", testInsertManyOrderedDuplicate},
		{"InsertManyUnorderedDuplicate", testInsertManyUnorderedDuplicate},
		{"InsertOneDuplicate", testInsertOneDuplicate},
		{"InsertIDFirstAndGenerated", testInsertIDFirst},
		{"UpdateOperators", testUpdateOperators},
		{"UpdateFieldOrder", testUpdateFieldOrder},
		{"UpdateOneVsMany", testUpdateOneVsMany},
		{"Upsert", testUpsert},
		{"UpsertIDFirst", testUpsertIDFirst},
		{"InsertManyIDFirst", testInsertManyIDFirst},
		{"ReplaceOne", testReplaceOne},
		{"Delete", testDelete},
		{"FindOptions", testFindOptions},
		{"FindBatchesAndGetMore", testFindGetMore},
		{"CursorCloseKillsCursor", testCursorClose},
		{"FindOneAndModify", testFindOneAndModify},
		{"Counts", testCounts},
		{"Distinct", testDistinct},
		{"BulkWrite", testBulkWrite},
		{"UnacknowledgedWrite", testUnacknowledgedWrite},
		{"RoundTripAllTypes", testRoundTripTypes},
		{"LargeInsertMany", testLargeInsertMany},
		{"Projection", testProjection},
	})
}

func testInsertManyOrderedDuplicate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.InsertMany(ctx, Ds(`[{"_id":1},{"_id":2},{"_id":2},{"_id":3}]`))
	var bwe mongo.BulkWriteException
	require.ErrorAs(t, err, &bwe, "ordered insert with a duplicate must fail with a BulkWriteException")
	require.Len(t, bwe.WriteErrors, 1, "ordered insert stops at the first error")
	require.Equal(t, 2, bwe.WriteErrors[0].Index, "writeErrors[0].index is the duplicate's position")
	require.Equal(t, 11000, bwe.WriteErrors[0].Code)
	require.True(t, mongo.IsDuplicateKeyError(err))
	require.Equal(t, `[{"$numberInt":"1"},{"$numberInt":"2"}]`, ids(t, ctx, coll, bson.D{}),
		"ordered: the documents before the duplicate are inserted, none after")
}

func testInsertManyUnorderedDuplicate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.InsertMany(ctx, Ds(`[{"_id":1},{"_id":2},{"_id":2},{"_id":3},{"_id":1}]`), options.InsertMany().SetOrdered(false))
	var bwe mongo.BulkWriteException
	require.ErrorAs(t, err, &bwe)
	require.Len(t, bwe.WriteErrors, 2, "unordered insert reports every failed document")
	require.Equal(t, 2, bwe.WriteErrors[0].Index)
	require.Equal(t, 4, bwe.WriteErrors[1].Index)
	for _, we := range bwe.WriteErrors {
		require.Equal(t, 11000, we.Code)
	}
	require.Equal(t, `[{"$numberInt":"1"},{"$numberInt":"2"},{"$numberInt":"3"}]`, ids(t, ctx, coll, bson.D{}),
		"unordered: every non-duplicate document is inserted")
}

func testInsertOneDuplicate(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.InsertOne(ctx, D(`{"_id":"a","v":1}`))
	require.NoError(t, err)
	_, err = coll.InsertOne(ctx, D(`{"_id":"a","v":2}`))
	var we mongo.WriteException
	require.ErrorAs(t, err, &we)
	require.Len(t, we.WriteErrors, 1)
	require.Equal(t, 11000, we.WriteErrors[0].Code)
	require.Contains(t, we.WriteErrors[0].Message, "E11000 duplicate key error", "mongod's message prefix, matched by user code")
	require.True(t, mongo.IsDuplicateKeyError(err))
	requireDocs(t, `[{"_id":"a","v":1}]`, find(t, ctx, coll, bson.D{}))
}

func testInsertIDFirst(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	// A raw insert command with _id not first: the server stores _id first.
	err := db.RunCommand(ctx, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{D(`{"a":1,"_id":5}`)}}}).Err()
	require.NoError(t, err)
	requireDocs(t, `[{"_id":5,"a":1}]`, find(t, ctx, coll, bson.D{}), "the server moves _id to the front")

	res, err := coll.InsertOne(ctx, D(`{"b":2}`))
	require.NoError(t, err)
	oid, ok := res.InsertedID.(bson.ObjectID)
	require.True(t, ok, "driver-generated _id is an ObjectID, got %T", res.InsertedID)
	got := find(t, ctx, coll, bson.D{{Key: "b", Value: 2}})
	require.Len(t, got, 1)
	require.Equal(t, "_id", got[0][0].Key)
	require.Equal(t, oid, got[0][0].Value)
}

// updateCase is one update applied to one document.
type updateCase struct {
	name     string
	doc      string
	update   string
	want     string
	modified int64
}

func testUpdateOperators(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	cases := []updateCase{
		{"set", `{"_id":1,"a":1}`, `{"$set":{"a":2,"b.c":3}}`, `{"_id":1,"a":2,"b":{"c":3}}`, 1},
		{"setSameValueIsNoop", `{"_id":1,"a":1}`, `{"$set":{"a":1}}`, `{"_id":1,"a":1}`, 0},
		{"unset", `{"_id":1,"a":1,"b":2,"c":{"d":1,"e":2}}`, `{"$unset":{"a":"","c.d":1,"zz":""}}`, `{"_id":1,"b":2,"c":{"e":2}}`, 1},
		{"incInt", `{"_id":1,"a":1}`, `{"$inc":{"a":2,"n":1}}`, `{"_id":1,"a":3,"n":1}`, 1},
		{"incDouble", `{"_id":1,"a":1}`, `{"$inc":{"a":0.5}}`, `{"_id":1,"a":1.5}`, 1},
		{"incLongOverflowPromotes", `{"_id":1,"a":2147483647}`, `{"$inc":{"a":1}}`, `{"_id":1,"a":{"$numberLong":"2147483648"}}`, 1},
		{"min", `{"_id":1,"a":5,"b":5}`, `{"$min":{"a":3,"b":7,"c":1}}`, `{"_id":1,"a":3,"b":5,"c":1}`, 1},
		{"max", `{"_id":1,"a":5,"b":5}`, `{"$max":{"a":3,"b":7}}`, `{"_id":1,"a":5,"b":7}`, 1},
		{"mul", `{"_id":1,"a":5,"d":1.5}`, `{"$mul":{"a":2,"d":2,"m":3}}`, `{"_id":1,"a":10,"d":3.0,"m":0}`, 1},
		{"rename", `{"_id":1,"a":1,"b":2}`, `{"$rename":{"a":"c"}}`, `{"_id":1,"b":2,"c":1}`, 1},
		{"renameMissingIsNoop", `{"_id":1,"b":2}`, `{"$rename":{"a":"c"}}`, `{"_id":1,"b":2}`, 0},
		{"setOnInsertIgnoredOnUpdate", `{"_id":1,"a":1}`, `{"$set":{"a":2},"$setOnInsert":{"x":1}}`, `{"_id":1,"a":2}`, 1},
		{"pushEach", `{"_id":1,"a":[1]}`, `{"$push":{"a":{"$each":[2,3]},"n":4}}`, `{"_id":1,"a":[1,2,3],"n":[4]}`, 1},
		{"pushEachSlicePosition", `{"_id":1,"a":[1,2]}`, `{"$push":{"a":{"$each":[0],"$position":0,"$slice":2}}}`, `{"_id":1,"a":[0,1]}`, 1},
		{"addToSet", `{"_id":1,"a":[1,2]}`, `{"$addToSet":{"a":{"$each":[2,3,3]},"b":"x"}}`, `{"_id":1,"a":[1,2,3],"b":["x"]}`, 1},
		{"addToSetNumericEquality", `{"_id":1,"a":[1]}`, `{"$addToSet":{"a":1.0}}`, `{"_id":1,"a":[1]}`, 0},
		{"pullValue", `{"_id":1,"a":[1,2,3,2]}`, `{"$pull":{"a":2}}`, `{"_id":1,"a":[1,3]}`, 1},
		{"pullCondition", `{"_id":1,"a":[1,2,3,4]}`, `{"$pull":{"a":{"$gte":3}}}`, `{"_id":1,"a":[1,2]}`, 1},
		{"pullSubdocument", `{"_id":1,"a":[{"k":1,"v":1},{"k":2,"v":2}]}`, `{"$pull":{"a":{"k":2}}}`, `{"_id":1,"a":[{"k":1,"v":1}]}`, 1},
		{"setArrayElement", `{"_id":1,"a":[1,2,3]}`, `{"$set":{"a.1":20}}`, `{"_id":1,"a":[1,20,3]}`, 1},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			coll := db.Collection("u" + c.name)
			_ = i
			_, err := coll.InsertOne(ctx, D(c.doc))
			require.NoError(t, err)
			res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(c.update))
			require.NoError(t, err, "update %s", c.update)
			require.Equal(t, int64(1), res.MatchedCount, "matchedCount")
			require.Equal(t, c.modified, res.ModifiedCount, "modifiedCount (0 when the update changes nothing)")
			got := find(t, ctx, coll, bson.D{})
			require.Len(t, got, 1)
			requireDoc(t, c.want, got[0], "document after %s", c.update)
		})
	}

	t.Run("currentDate", func(t *testing.T) {
		coll := db.Collection("ucurrentDate")
		_, err := coll.InsertOne(ctx, D(`{"_id":1}`))
		require.NoError(t, err)
		before := time.Now().Add(-2 * time.Second)
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$currentDate":{"d":true,"ts":{"$type":"timestamp"},"d2":{"$type":"date"}}}`))
		require.NoError(t, err)
		after := time.Now().Add(2 * time.Second)
		got := find(t, ctx, coll, bson.D{})[0]
		d, ok := get(got, "d").(bson.DateTime)
		require.True(t, ok, "$currentDate true sets a date, got %s", js(got))
		require.True(t, d.Time().After(before) && d.Time().Before(after), "date %v is now", d.Time())
		_, ok = get(got, "d2").(bson.DateTime)
		require.True(t, ok, "$type date sets a date, got %s", js(got))
		ts, ok := get(got, "ts").(bson.Timestamp)
		require.True(t, ok, "$type timestamp sets a timestamp, got %s", js(got))
		require.InDelta(t, float64(time.Now().Unix()), float64(ts.T), 5)
	})

	t.Run("invalidUpdates", func(t *testing.T) {
		coll := db.Collection("uinvalid")
		_, err := coll.InsertOne(ctx, D(`{"_id":1,"a":"x","arr":1}`))
		require.NoError(t, err)
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$inc":{"a":1}}`))
		requireCode(t, err, 14, "$inc on a string is TypeMismatch")
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$push":{"arr":1}}`))
		requireCode(t, err, 2, "$push on a non-array is BadValue")
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$set":{"_id":2}}`))
		requireCode(t, err, 66, "changing _id is ImmutableField")
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$set":{"a":1},"$unset":{"a":""}}`))
		requireCode(t, err, 40, "two operators on one path is ConflictingUpdateOperators")
		_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$bogus":{"a":1}}`))
		requireCode(t, err, 9, "unknown update operator is FailedToParse")
	})
}

func testUpdateFieldOrder(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"m":1}]`)
	// Since MongoDB 5.0, update operators add new fields in lexicographic
	// order of their names, whatever the order in the update document.
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, D(`{"$set":{"z":1,"b":2,"a":3,"m":4}}`))
	require.NoError(t, err)
	requireDocs(t, `[{"_id":1,"m":4,"a":3,"b":2,"z":1}]`, find(t, ctx, coll, bson.D{}),
		"existing fields keep their place; new fields are appended in lexicographic order")
}

func testUpdateOneVsMany(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":1},{"_id":2,"a":2},{"_id":3,"a":3},{"_id":4,"a":4},{"_id":5,"a":5}]`)

	res, err := coll.UpdateOne(ctx, D(`{"a":{"$gt":2}}`), D(`{"$set":{"one":true}}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.MatchedCount)
	require.Equal(t, int64(1), res.ModifiedCount)
	n, err := coll.CountDocuments(ctx, D(`{"one":true}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "UpdateOne changes one document even when several match")

	res, err = coll.UpdateMany(ctx, D(`{"a":{"$gt":2}}`), D(`{"$set":{"big":true}}`))
	require.NoError(t, err)
	require.Equal(t, int64(3), res.MatchedCount)
	require.Equal(t, int64(3), res.ModifiedCount)
	require.Nil(t, res.UpsertedID)
	require.Equal(t, `[{"$numberInt":"3"},{"$numberInt":"4"},{"$numberInt":"5"}]`, ids(t, ctx, coll, D(`{"big":true}`)))

	res, err = coll.UpdateMany(ctx, D(`{"a":{"$gt":2}}`), D(`{"$set":{"big":true}}`))
	require.NoError(t, err)
	require.Equal(t, int64(3), res.MatchedCount)
	require.Equal(t, int64(0), res.ModifiedCount, "no-op updates match but do not modify")

	res, err = coll.UpdateMany(ctx, D(`{"a":{"$gt":100}}`), D(`{"$set":{"x":1}}`))
	require.NoError(t, err)
	require.Equal(t, int64(0), res.MatchedCount)
}

func testUpsert(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")

	res, err := coll.UpdateOne(ctx, D(`{"name":"x","n":{"$gt":1},"tags":"t"}`),
		D(`{"$set":{"v":1},"$setOnInsert":{"created":true}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int64(0), res.MatchedCount)
	require.Equal(t, int64(1), res.UpsertedCount)
	oid, ok := res.UpsertedID.(bson.ObjectID)
	require.True(t, ok, "an upsert without _id in the filter generates an ObjectID, got %T", res.UpsertedID)
	got := find(t, ctx, coll, bson.D{})
	require.Len(t, got, 1)
	require.Equal(t, oid, get(got[0], "_id"))
	requireDoc(t, `{"name":"x","tags":"t","created":true,"v":1}`, got[0][1:],
		"seeded from the filter's equality fields (not $gt), then the update; $setOnInsert applies; new fields in lexicographic order")

	res, err = coll.UpdateOne(ctx, D(`{"_id":7}`), D(`{"$inc":{"c":1}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int32(7), res.UpsertedID, "UpsertedID is the filter's _id")
	res, err = coll.UpdateOne(ctx, D(`{"_id":7}`), D(`{"$inc":{"c":1}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.MatchedCount)
	require.Nil(t, res.UpsertedID, "no upsert when a document matches")
	requireDocs(t, `[{"_id":7,"c":2}]`, find(t, ctx, coll, D(`{"_id":7}`)))

	_, err = coll.UpdateOne(ctx, D(`{"$and":[{"k":1},{"x.y":"z"}],"e":{"$eq":5}}`), D(`{"$set":{"s":1}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	n, err := coll.CountDocuments(ctx, D(`{"k":1,"x":{"y":"z"},"e":5,"s":1}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "$and, dotted paths and $eq seed the upserted document: %s", js(find(t, ctx, coll, D(`{"k":1}`))))

	res2, err := coll.UpdateMany(ctx, D(`{"many":1}`), D(`{"$set":{"m":true}}`), options.UpdateMany().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int64(1), res2.UpsertedCount, "UpdateMany upserts one document")
}

// testUpsertIDFirst: a document an upsert creates is stored with _id first,
// wherever _id comes from (a filter that names it after other fields, a
// document _id, $setOnInsert, a replacement that has it last) and whatever
// the update sets.
func testUpsertIDFirst(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")

	// As the framework's inbox notes a failure: filter on _id and a flag,
	// $set and $inc of other fields.
	_, err := coll.UpdateOne(ctx, D(`{"handled":false,"_id":"k1"}`),
		D(`{"$set":{"parked":true},"$inc":{"attempts":1}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	var got bson.D
	err = coll.FindOneAndUpdate(ctx, D(`{"_id":{"topic":"t","key":"k2"},"handled":false}`),
		D(`{"$set":{"parked":true,"last_error":"boom"},"$setOnInsert":{"partition":1}}`),
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&got)
	require.NoError(t, err)
	requireDoc(t, `{"_id":{"topic":"t","key":"k2"},"handled":false,"last_error":"boom","parked":true,"partition":1}`, got,
		"findAndModify returns the upserted document as stored")
	_, err = coll.UpdateOne(ctx, D(`{"name":"k3"}`), D(`{"$set":{"a":1},"$setOnInsert":{"_id":"k3"}}`), options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	_, err = coll.ReplaceOne(ctx, D(`{"_id":"k4"}`), D(`{"z":1,"_id":"k4"}`), options.Replace().SetUpsert(true))
	require.NoError(t, err)

	requireDocs(t, `[
		{"_id":"k1","handled":false,"attempts":1,"parked":true},
		{"_id":{"topic":"t","key":"k2"},"handled":false,"last_error":"boom","parked":true,"partition":1},
		{"_id":"k3","name":"k3","a":1},
		{"_id":"k4","z":1}
	]`, find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"$natural":1}`))),
		"_id first, then the filter's equality fields, then the update's new fields in lexicographic order")
}

// testInsertManyIDFirst: documents inserted with _id after other fields (the
// driver sends them as given) and documents $merge inserts are stored with
// _id first.
func testInsertManyIDFirst(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.InsertMany(ctx, Ds(`[{"a":1,"_id":1},{"b":{"y":1,"_id":2},"_id":2}]`))
	require.NoError(t, err)
	requireDocs(t, `[{"_id":1,"a":1},{"_id":2,"b":{"y":1,"_id":2}}]`, find(t, ctx, coll, bson.D{}),
		"top-level _id moves first; an embedded _id keeps its place")

	src := db.Collection("src")
	insert(t, ctx, src, `[{"_id":1,"k":"a"}]`)
	cur, err := src.Aggregate(ctx, Ds(`[{"$project":{"k":1,"_id":{"$literal":9}}},{"$replaceWith":{"k":"$k","_id":"$_id"}},{"$merge":{"into":"dst"}}]`))
	require.NoError(t, err)
	require.NoError(t, cur.Close(ctx))
	requireDocs(t, `[{"_id":9,"k":"a"}]`, find(t, ctx, db.Collection("dst"), bson.D{}), "$merge inserts with _id first")
}

func testReplaceOne(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":1,"b":2}]`)

	res, err := coll.ReplaceOne(ctx, D(`{"_id":1}`), D(`{"c":3}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.ModifiedCount)
	requireDocs(t, `[{"_id":1,"c":3}]`, find(t, ctx, coll, bson.D{}), "replacement keeps _id, drops other fields")

	_, err = coll.ReplaceOne(ctx, D(`{"_id":1}`), D(`{"_id":2,"c":4}`))
	requireCode(t, err, 66, "a replacement may not change _id (ImmutableField)")

	res, err = coll.ReplaceOne(ctx, D(`{"_id":9}`), D(`{"z":1}`), options.Replace().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int32(9), res.UpsertedID)
	requireDocs(t, `[{"_id":9,"z":1}]`, find(t, ctx, coll, D(`{"_id":9}`)))

	_, err = coll.ReplaceOne(ctx, D(`{"_id":1}`), D(`{"$set":{"a":1}}`))
	require.Error(t, err, "the driver rejects an operator document as a replacement")
}

func testDelete(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"g":1},{"_id":2,"g":1},{"_id":3,"g":2},{"_id":4,"g":2},{"_id":5,"g":3}]`)

	res, err := coll.DeleteOne(ctx, D(`{"g":1}`))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.DeletedCount)
	res, err = coll.DeleteMany(ctx, D(`{"g":2}`))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.DeletedCount)
	res, err = coll.DeleteOne(ctx, D(`{"g":99}`))
	require.NoError(t, err)
	require.Equal(t, int64(0), res.DeletedCount)
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	res, err = coll.DeleteMany(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.DeletedCount)
}

// seedNumbers inserts n documents {_id: i, g: i%3, v: i}.
func seedNumbers(t *testing.T, db *mongo.Database, n int) *mongo.Collection {
	t.Helper()
	coll := db.Collection("nums")
	docs := make([]any, n)
	for i := range n {
		docs[i] = bson.D{{Key: "_id", Value: int32(i)}, {Key: "g", Value: int32(i % 3)}, {Key: "v", Value: int32(i)}}
	}
	_, err := coll.InsertMany(testCtx(t), docs)
	require.NoError(t, err)
	return coll
}

func testFindOptions(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := seedNumbers(t, db, 25)

	got := find(t, ctx, coll, D(`{"g":1}`), options.Find().
		SetSort(D(`{"v":-1}`)).SetProjection(D(`{"v":1,"_id":0}`)).SetSkip(1).SetLimit(3))
	requireDocs(t, `[{"v":19},{"v":16},{"v":13}]`, got, "filter g=1, sort v desc, skip 1, limit 3, inclusion projection without _id")

	got = find(t, ctx, coll, D(`{"v":{"$lt":4}}`), options.Find().SetSort(D(`{"g":1,"v":-1}`)).SetProjection(D(`{"g":0}`)))
	requireDocs(t, `[{"_id":3,"v":3},{"_id":0,"v":0},{"_id":1,"v":1},{"_id":2,"v":2}]`, got, "compound sort, exclusion projection")

	got = find(t, ctx, coll, D(`{"v":{"$lt":3}}`), options.Find().SetSort(D(`{"v":1}`)).SetProjection(D(`{"v":1}`)))
	requireDocs(t, `[{"_id":0,"v":0},{"_id":1,"v":1},{"_id":2,"v":2}]`, got, "inclusion projection keeps _id by default")

	one := coll.FindOne(ctx, D(`{"g":2}`), options.FindOne().SetSort(D(`{"v":-1}`)))
	var d bson.D
	require.NoError(t, one.Decode(&d))
	requireDoc(t, `{"_id":23,"g":2,"v":23}`, d)
	require.ErrorIs(t, coll.FindOne(ctx, D(`{"g":7}`)).Err(), mongo.ErrNoDocuments)

	got = find(t, ctx, coll, bson.D{}, options.Find().SetSort(D(`{"v":1}`)).SetLimit(-2))
	require.Len(t, got, 2, "a negative limit returns that many documents in one batch")
}

func testFindGetMore(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	seedNumbers(t, db, 25)
	cl, log := monitoredClient(t, e)
	coll := cl.Database(db.Name()).Collection("nums")
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(2).SetSort(D(`{"_id":1}`)))
	require.NoError(t, err)
	var got []int32
	for cur.Next(ctx) {
		v, ok := cur.Current.Lookup("_id").Int32OK()
		require.True(t, ok, "document %s", cur.Current)
		got = append(got, v)
	}
	require.NoError(t, cur.Err())
	require.NoError(t, cur.Close(ctx))
	require.Len(t, got, 25)
	for i, v := range got {
		require.Equal(t, int32(i), v)
	}
	require.Equal(t, 12, log.count("getMore"), "25 documents in batches of 2: 1 find + 12 getMores")
	require.Equal(t, 0, log.count("killCursors"), "an exhausted cursor (id 0) needs no killCursors")
}

func testCursorClose(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	seedNumbers(t, db, 10)
	cl, log := monitoredClient(t, e)
	coll := cl.Database(db.Name()).Collection("nums")
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
	require.NoError(t, err)
	id := cur.ID()
	require.NotZero(t, id, "a cursor with more results has a non-zero id")
	require.True(t, cur.Next(ctx))
	require.NoError(t, cur.Close(ctx))
	require.Equal(t, 1, log.count("killCursors"))
	reply := log.reply("killCursors")
	require.NotNil(t, reply, "killCursors succeeded")
	killed, ok := reply.Lookup("cursorsKilled").ArrayOK()
	require.True(t, ok, "killCursors reply has cursorsKilled: %s", reply)
	vals, err := killed.Values()
	require.NoError(t, err)
	require.Len(t, vals, 1)
	killedID, ok := vals[0].Int64OK()
	require.True(t, ok, "cursorsKilled holds int64 ids: %s", reply)
	require.Equal(t, id, killedID)

	err = db.RunCommand(ctx, bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "nums"}}).Err()
	requireCode(t, err, 43, "getMore on a killed cursor is CursorNotFound")
}

func testFindOneAndModify(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"v":1,"g":"a"},{"_id":2,"v":2,"g":"a"}]`)
	decode := func(r *mongo.SingleResult) bson.D {
		t.Helper()
		var d bson.D
		require.NoError(t, r.Decode(&d))
		return d
	}

	d := decode(coll.FindOneAndUpdate(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`)))
	requireDoc(t, `{"_id":1,"v":1,"g":"a"}`, d, "default ReturnDocument is Before")
	d = decode(coll.FindOneAndUpdate(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`), options.FindOneAndUpdate().SetReturnDocument(options.After)))
	requireDoc(t, `{"_id":1,"v":21,"g":"a"}`, d)
	d = decode(coll.FindOneAndUpdate(ctx, D(`{"g":"a"}`), D(`{"$set":{"top":true}}`),
		options.FindOneAndUpdate().SetSort(D(`{"v":-1}`)).SetReturnDocument(options.After).SetProjection(D(`{"_id":1,"top":1}`))))
	requireDoc(t, `{"_id":1,"top":true}`, d, "sort picks the document, projection shapes the result")

	err := coll.FindOneAndUpdate(ctx, D(`{"_id":3}`), D(`{"$set":{"v":3}}`), options.FindOneAndUpdate().SetUpsert(true)).Err()
	require.ErrorIs(t, err, mongo.ErrNoDocuments, "upsert with ReturnDocument Before returns no document")
	d = decode(coll.FindOneAndUpdate(ctx, D(`{"_id":4}`), D(`{"$set":{"v":4}}`), options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)))
	requireDoc(t, `{"_id":4,"v":4}`, d)
	require.ErrorIs(t, coll.FindOneAndUpdate(ctx, D(`{"_id":99}`), D(`{"$set":{"v":3}}`)).Err(), mongo.ErrNoDocuments)

	d = decode(coll.FindOneAndReplace(ctx, D(`{"_id":2}`), D(`{"r":1}`), options.FindOneAndReplace().SetReturnDocument(options.After)))
	requireDoc(t, `{"_id":2,"r":1}`, d)
	d = decode(coll.FindOneAndReplace(ctx, D(`{"_id":5}`), D(`{"r":5}`), options.FindOneAndReplace().SetUpsert(true).SetReturnDocument(options.After)))
	requireDoc(t, `{"_id":5,"r":5}`, d)

	d = decode(coll.FindOneAndDelete(ctx, D(`{"_id":2}`)))
	requireDoc(t, `{"_id":2,"r":1}`, d, "FindOneAndDelete returns the deleted document")
	require.ErrorIs(t, coll.FindOneAndDelete(ctx, D(`{"_id":2}`)).Err(), mongo.ErrNoDocuments)
	require.Equal(t, `[{"$numberInt":"1"},{"$numberInt":"3"},{"$numberInt":"4"},{"$numberInt":"5"}]`, ids(t, ctx, coll, bson.D{}))

	// The raw findAndModify reply carries lastErrorObject.
	var raw bson.Raw
	raw, err = db.RunCommand(ctx, D(`{"findAndModify":"c","query":{"_id":6},"update":{"$set":{"v":6}},"upsert":true,"new":true}`)).Raw()
	require.NoError(t, err)
	leo, ok := raw.Lookup("lastErrorObject").DocumentOK()
	require.True(t, ok, "findAndModify reply has lastErrorObject: %s", raw)
	requireDoc(t, `{"n":1,"updatedExisting":false,"upserted":6}`, rawDoc(t, bson.Raw(leo)), "lastErrorObject of an upsert")
}

func testCounts(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := seedNumbers(t, db, 25)
	n, err := coll.CountDocuments(ctx, D(`{"g":1}`))
	require.NoError(t, err)
	require.Equal(t, int64(8), n)
	n, err = coll.CountDocuments(ctx, D(`{"g":1}`), options.Count().SetSkip(2).SetLimit(3))
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	n, err = coll.CountDocuments(ctx, D(`{"g":1}`), options.Count().SetSkip(7))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	n, err = coll.EstimatedDocumentCount(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(25), n)
	n, err = db.Collection("missing").EstimatedDocumentCount(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), n, "a missing collection counts 0")
	n, err = db.Collection("missing").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(0), n)
}

func testDistinct(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"k":"b","t":["x","y"],"s":{"n":1}},{"_id":2,"k":"a","t":"y","s":{"n":2}},{"_id":3,"k":"b","s":{"n":1.0}},{"_id":4,"k":1}]`)
	var vals bson.A
	require.NoError(t, coll.Distinct(ctx, "k", bson.D{}).Decode(&vals))
	require.ElementsMatch(t, bson.A{"a", "b", int32(1)}, vals)
	vals = nil
	require.NoError(t, coll.Distinct(ctx, "t", bson.D{}).Decode(&vals))
	require.ElementsMatch(t, bson.A{"x", "y"}, vals, "arrays are unwound")
	vals = nil
	require.NoError(t, coll.Distinct(ctx, "s.n", D(`{"k":"b"}`)).Decode(&vals))
	require.Len(t, vals, 1, "1 and 1.0 are the same distinct value: %v", vals)
	vals = nil
	err := coll.Distinct(ctx, "nothing", bson.D{}).Decode(&vals)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		require.NoError(t, err)
	}
	require.Empty(t, vals)
}

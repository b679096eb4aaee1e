package conformance

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// EnvSlow is the environment variable that enables cases which take more
// than a minute against a real MongoDB (the TTL monitor runs every 60 s).
const EnvSlow = "OUTBOX_TEST_SLOW"

func indexCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"UniqueViolation", testUniqueViolation},
		{"UniqueIndexOnExistingDuplicates", testUniqueOnExistingDuplicates},
		{"CompoundUnique", testCompoundUnique},
		{"UniqueMultikey", testUniqueMultikey},
		{"ConcurrentUpsertsOnUniqueKey", testConcurrentUpserts},
		{"PartialUnique", testPartialUnique},
		{"ListIndexes", testListIndexes},
		{"DropIndexes", testDropIndexes},
		{"CreateSameIndexTwice", testCreateIndexTwice},
		{"ConflictingIndexes", testConflictingIndexes},
		{"TTLPartial", testTTL},
	})
}

func testUniqueViolation(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"email":1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	require.Equal(t, "email_1", name, "default index name is <field>_<direction>")
	insert(t, ctx, coll, `[{"_id":1,"email":"a"},{"_id":2,"email":"b"}]`)

	_, err = coll.InsertOne(ctx, D(`{"_id":3,"email":"a"}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "want a duplicate key error, got %v", err)
	var we mongo.WriteException
	require.ErrorAs(t, err, &we)
	require.Len(t, we.WriteErrors, 1)
	require.Equal(t, 11000, we.WriteErrors[0].Code)
	require.Contains(t, we.WriteErrors[0].Message, "email_1", "the message names the index")
	raw := we.WriteErrors[0].Raw
	kp, ok := raw.Lookup("keyPattern").DocumentOK()
	require.True(t, ok, "the write error has keyPattern: %s", raw)
	requireDoc(t, `{"email":1}`, rawDoc(t, bson.Raw(kp)))
	kv, ok := raw.Lookup("keyValue").DocumentOK()
	require.True(t, ok, "the write error has keyValue: %s", raw)
	requireDoc(t, `{"email":"a"}`, rawDoc(t, bson.Raw(kv)))

	_, err = coll.UpdateOne(ctx, D(`{"_id":2}`), D(`{"$set":{"email":"a"}}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "an update creating a duplicate fails too, got %v", err)
	_, err = coll.ReplaceOne(ctx, D(`{"_id":2}`), D(`{"email":"a"}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "a replacement creating a duplicate fails too, got %v", err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":9}`), D(`{"$set":{"email":"b"}}`), options.UpdateOne().SetUpsert(true))
	require.True(t, mongo.IsDuplicateKeyError(err), "an upsert creating a duplicate fails too, got %v", err)
	requireDocs(t, `[{"_id":1,"email":"a"},{"_id":2,"email":"b"}]`, find(t, ctx, coll, bson.D{}), "failed writes leave no trace")

	_, err = coll.InsertOne(ctx, D(`{"_id":1,"email":"z"}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "duplicate _id")
	require.Contains(t, err.Error(), "_id_")
}

func testUniqueOnExistingDuplicates(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"k":1},{"_id":2,"k":1}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"k":1}`), Options: options.Index().SetUnique(true)})
	requireCode(t, err, 11000, "building a unique index over duplicates fails with DuplicateKey")
	specs, err := coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 1, "the failed index is not created")
}

func testCompoundUnique(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	name, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1,"b":-1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	require.Equal(t, "a_1_b_-1", name)
	insert(t, ctx, coll, `[{"_id":1,"a":1,"b":1},{"_id":2,"a":1,"b":2},{"_id":3,"a":2,"b":1},{"_id":4}]`)
	_, err = coll.InsertOne(ctx, D(`{"_id":5,"a":1,"b":1}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "same (a,b) pair, got %v", err)
	_, err = coll.InsertOne(ctx, D(`{"_id":6,"a":1,"b":1.0}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "1 and 1.0 are the same key, got %v", err)
	_, err = coll.InsertOne(ctx, D(`{"_id":7,"a":null}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "missing fields index as null: {a:null} collides with {}, got %v", err)
	_, err = coll.InsertOne(ctx, D(`{"_id":8,"a":2,"b":2}`))
	require.NoError(t, err)
}

func testPartialUnique(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"k":1}`),
		Options: options.Index().SetUnique(true).SetPartialFilterExpression(D(`{"active":true}`))})
	require.NoError(t, err)
	insert(t, ctx, coll, `[{"_id":1,"k":1,"active":true},{"_id":2,"k":1,"active":false},{"_id":3,"k":1},{"_id":4,"k":1,"active":false}]`)
	_, err = coll.InsertOne(ctx, D(`{"_id":5,"k":1,"active":true}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "two documents inside the partial filter collide, got %v", err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":2}`), D(`{"$set":{"active":true}}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "an update moving a document into the filter collides, got %v", err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"active":false}}`))
	require.NoError(t, err, "moving out of the filter frees the key")
	_, err = coll.UpdateOne(ctx, D(`{"_id":2}`), D(`{"$set":{"active":true}}`))
	require.NoError(t, err)
}

func testListIndexes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	names, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: D(`{"a":1}`)},
		{Keys: D(`{"b":-1}`), Options: options.Index().SetUnique(true)},
		{Keys: D(`{"c":1,"d":1}`), Options: options.Index().SetName("custom").SetPartialFilterExpression(D(`{"c":{"$gt":0}}`))},
		{Keys: D(`{"t":1}`), Options: options.Index().SetExpireAfterSeconds(3600)},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"a_1", "b_-1", "custom", "t_1"}, names)

	cur, err := coll.Indexes().List(ctx)
	specs := all(t, ctx, cur, err)
	byName := map[string]bson.D{}
	for _, s := range specs {
		byName[get(s, "name").(string)] = s
	}
	require.Len(t, byName, 5, "listIndexes returns _id_ and the four created: %s", js(specs))
	requireDoc(t, `{"v":2,"key":{"_id":1},"name":"_id_"}`, byName["_id_"])
	requireDoc(t, `{"v":2,"key":{"a":1},"name":"a_1"}`, byName["a_1"])
	requireDoc(t, `{"v":2,"key":{"b":-1},"name":"b_-1","unique":true}`, byName["b_-1"])
	requireDoc(t, `{"v":2,"key":{"c":1,"d":1},"name":"custom","partialFilterExpression":{"c":{"$gt":0}}}`, byName["custom"])
	requireDoc(t, `{"v":2,"key":{"t":1},"name":"t_1","expireAfterSeconds":3600}`, byName["t_1"])

	ls, err := coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, ls, 5)

	// The server answers NamespaceNotFound; the Go driver turns that into an
	// empty cursor (as it does against mongod), so check both layers.
	err = db.RunCommand(ctx, bson.D{{Key: "listIndexes", Value: "missing"}}).Err()
	requireCode(t, err, 26, "listIndexes on a missing collection is NamespaceNotFound")
	cur, err = db.Collection("missing").Indexes().List(ctx)
	require.Empty(t, all(t, ctx, cur, err), "the driver lists no indexes of a missing collection")
}

func testDropIndexes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{{Keys: D(`{"a":1}`)}, {Keys: D(`{"b":1}`)}, {Keys: D(`{"c":1}`)}})
	require.NoError(t, err)
	require.NoError(t, coll.Indexes().DropOne(ctx, "a_1"))
	require.NoError(t, coll.Indexes().DropWithKey(ctx, D(`{"b":1}`)))
	err = coll.Indexes().DropOne(ctx, "nope_1")
	requireCode(t, err, 27, "dropping a missing index is IndexNotFound")
	err = db.RunCommand(ctx, D(`{"dropIndexes":"c","index":"_id_"}`)).Err()
	require.Error(t, err, "the _id index cannot be dropped")
	specs, err := coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 2)
	require.NoError(t, coll.Indexes().DropAll(ctx))
	specs, err = coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 1, "DropAll keeps _id_")
	require.Equal(t, "_id_", specs[0].Name)
}

func testCreateIndexTwice(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	model := mongo.IndexModel{Keys: D(`{"a":1}`), Options: options.Index().SetUnique(true)}
	_, err := coll.Indexes().CreateOne(ctx, model)
	require.NoError(t, err)
	name, err := coll.Indexes().CreateOne(ctx, model)
	require.NoError(t, err, "creating an identical index again succeeds")
	require.Equal(t, "a_1", name)
	raw, err := db.RunCommand(ctx, D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"a_1","unique":true}]}`)).Raw()
	require.NoError(t, err)
	require.Equal(t, "2", num(raw.Lookup("numIndexesBefore")), "reply: %s", raw)
	require.Equal(t, "2", num(raw.Lookup("numIndexesAfter")), "reply: %s", raw)
	specs, err := coll.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 2)
}

func testConflictingIndexes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)

	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`), Options: options.Index().SetName("other")})
	requireCode(t, err, 85, "same keys under another name is IndexOptionsConflict")
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"b":1}`), Options: options.Index().SetName("a_1")})
	requireCode(t, err, 86, "same name with other keys is IndexKeySpecsConflict")
	_, err = coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`), Options: options.Index().SetUnique(true)})
	se := serverError(t, err)
	require.True(t, se.HasErrorCode(85) || se.HasErrorCode(86), "same name and keys with other options is 85 or 86, got %v", se.ErrorCodes())
}

func testTTL(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env, mongotest.ServerOptions(mongofake.TTLInterval(50*time.Millisecond)))
	wait := 5 * time.Second
	if e.Real {
		if os.Getenv(EnvSlow) == "" {
			t.Skipf("against a real MongoDB the TTL monitor runs every 60 s; set %s=1 to run this case", EnvSlow)
		}
		wait = 90 * time.Second
		ctx = t.Context()
	}
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"at":1}`),
		Options: options.Index().SetExpireAfterSeconds(1).SetPartialFilterExpression(D(`{"kind":"temp"}`))})
	require.NoError(t, err)
	past := bson.NewDateTimeFromTime(time.Now().Add(-time.Hour))
	future := bson.NewDateTimeFromTime(time.Now().Add(time.Hour))
	_, err = coll.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: 1}, {Key: "at", Value: past}, {Key: "kind", Value: "temp"}},
		bson.D{{Key: "_id", Value: 2}, {Key: "at", Value: past}, {Key: "kind", Value: "keep"}},
		bson.D{{Key: "_id", Value: 3}, {Key: "at", Value: future}, {Key: "kind", Value: "temp"}},
		bson.D{{Key: "_id", Value: 4}, {Key: "at", Value: "not a date"}, {Key: "kind", Value: "temp"}},
		bson.D{{Key: "_id", Value: 5}, {Key: "at", Value: bson.A{future, past}}, {Key: "kind", Value: "temp"}},
		bson.D{{Key: "_id", Value: 6}, {Key: "kind", Value: "temp"}},
	})
	require.NoError(t, err)
	eventually(t, wait, "TTL monitor deletes expired documents matching the partial filter", func() bool {
		n, err := coll.CountDocuments(ctx, D(`{"_id":{"$in":[1,5]}}`))
		return err == nil && n == 0
	})
	require.Equal(t, idList(2, 3, 4, 6), ids(t, ctx, coll, bson.D{}),
		"kept: outside the partial filter, not yet expired, not a date, no field; an array expires on its earliest date")
}

package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/event-outbox/outbox/mongox/mongofake"
)

func testBulkWrite(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"v":1},{"_id":2,"v":2},{"_id":3,"v":3}]`)
	res, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewInsertOneModel().SetDocument(D(`{"_id":4,"v":4}`)),
		mongo.NewUpdateOneModel().SetFilter(D(`{"_id":1}`)).SetUpdate(D(`{"$inc":{"v":10}}`)),
		mongo.NewUpdateManyModel().SetFilter(D(`{"v":{"$gte":3}}`)).SetUpdate(D(`{"$set":{"big":true}}`)),
		mongo.NewReplaceOneModel().SetFilter(D(`{"_id":2}`)).SetReplacement(D(`{"r":1}`)),
		mongo.NewDeleteManyModel().SetFilter(D(`{"_id":3}`)),
		mongo.NewUpdateOneModel().SetFilter(D(`{"_id":9}`)).SetUpdate(D(`{"$set":{"v":9}}`)).SetUpsert(true),
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.InsertedCount)
	require.Equal(t, int64(5), res.MatchedCount, "1 + 3 + 1 matched")
	require.Equal(t, int64(5), res.ModifiedCount)
	require.Equal(t, int64(1), res.DeletedCount)
	require.Equal(t, int64(1), res.UpsertedCount)
	require.Equal(t, map[int64]any{5: int32(9)}, res.UpsertedIDs, "upserted ids keyed by the model's index")
	requireDocs(t, `[{"_id":1,"v":11,"big":true},{"_id":2,"r":1},{"_id":4,"v":4,"big":true},{"_id":9,"v":9}]`, find(t, ctx, coll, bson.D{}))

	_, err = coll.BulkWrite(ctx, []mongo.WriteModel{
		mongo.NewInsertOneModel().SetDocument(D(`{"_id":10}`)),
		mongo.NewInsertOneModel().SetDocument(D(`{"_id":1}`)),
		mongo.NewDeleteOneModel().SetFilter(D(`{"_id":10}`)),
	})
	var bwe mongo.BulkWriteException
	require.ErrorAs(t, err, &bwe)
	require.Len(t, bwe.WriteErrors, 1)
	require.Equal(t, 1, bwe.WriteErrors[0].Index)
	require.Equal(t, idList(1, 2, 4, 9, 10), ids(t, ctx, coll, bson.D{}), "an ordered bulk write stops at the failed model")
}

func testUnacknowledgedWrite(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	res, err := coll.InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err, "w:0 writes get no reply")
	require.False(t, res.Acknowledged)
	eventually(t, 5*time.Second, "the w:0 insert is applied", func() bool {
		n, err := db.Collection("c").CountDocuments(ctx, bson.D{})
		return err == nil && n == 1
	})
	// The connection stays usable after a moreToCome message.
	_, err = coll.InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err, "a failing w:0 write reports nothing")
	require.NoError(t, db.Client().Ping(ctx, nil))
}

func testRoundTripTypes(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	doc := `{"_id":{"$oid":"5f1d7f0e0000000000000001"},
		"i32":{"$numberInt":"-7"},"i64":{"$numberLong":"9007199254740993"},"dbl":{"$numberDouble":"1.5"},
		"nan":{"$numberDouble":"NaN"},"inf":{"$numberDouble":"-Infinity"},"negz":{"$numberDouble":"-0.0"},
		"dec":{"$numberDecimal":"1.10"},"str":"héllo\u0000x","t":true,"f":false,"n":null,
		"date":{"$date":{"$numberLong":"-1000"}},"ts":{"$timestamp":{"t":4,"i":5}},
		"bin":{"$binary":{"base64":"AAEC","subType":"00"}},"uuid":{"$binary":{"base64":"c//SZESzTGmQ6OfR38A11A==","subType":"04"}},
		"re":{"$regularExpression":{"pattern":"a.c","options":"im"}},"min":{"$minKey":1},"max":{"$maxKey":1},
		"code":{"$code":"function(){}"},"undef":{"$undefined":true},"sym":{"$symbol":"s"},
		"sub":{"z":1,"a":{"b":[1,[2,[3]],{"c":null}]}},"arr":[],"empty":{}}`
	_, err := coll.InsertOne(ctx, D(doc))
	require.NoError(t, err)
	var got bson.Raw
	got, err = coll.FindOne(ctx, bson.D{}).Raw()
	require.NoError(t, err)
	want, err := bson.Marshal(D(doc))
	require.NoError(t, err)
	require.Equal(t, bson.Raw(want).String(), got.String(), "every BSON type and the field order survive a round trip byte for byte")
}

func testLargeInsertMany(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	const n = 5000
	docs := make([]any, n)
	pad := strings.Repeat("x", 1000)
	for i := range n {
		docs[i] = bson.D{{Key: "_id", Value: int32(i)}, {Key: "pad", Value: pad}}
	}
	_, err := coll.InsertMany(ctx, docs)
	require.NoError(t, err, "about 5 MB in one InsertMany (the driver splits it by maxMessageSizeBytes)")
	cnt, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(n), cnt)
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetProjection(D(`{"pad":0}`)))
	require.Len(t, all(t, ctx, cur, err), n, "the default find batches (101, then up to 16 MiB) return every document")
}

func testProjection(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":{"b":1,"c":2},"arr":[{"k":1,"v":"a"},{"k":2,"v":"b"},{"k":3,"v":"c"}],"n":[1,2,3,4]}]`)
	cases := []struct{ proj, want string }{
		{`{"a.b":1}`, `{"_id":1,"a":{"b":1}}`},
		{`{"a.b":0,"arr":0,"n":0}`, `{"_id":1,"a":{"c":2}}`},
		{`{"arr.k":1,"_id":0}`, `{"arr":[{"k":1},{"k":2},{"k":3}]}`},
		{`{"n":{"$slice":2},"a":0,"arr":0}`, `{"_id":1,"n":[1,2]}`},
		{`{"n":{"$slice":-1},"_id":0,"a":0,"arr":0}`, `{"n":[4]}`},
		{`{"n":{"$slice":[1,2]},"_id":0,"a":0,"arr":0}`, `{"n":[2,3]}`},
		{`{"arr":{"$elemMatch":{"k":{"$gte":2}}}}`, `{"_id":1,"arr":[{"k":2,"v":"b"}]}`},
		{`{"missing":1}`, `{"_id":1}`},
		{`{"x":{"$literal":5}}`, `{"_id":1,"x":5}`},
		{`{"s":{"$add":["$a.b","$a.c"]},"_id":0}`, `{"s":3}`},
	}
	for _, c := range cases {
		t.Run(c.proj, func(t *testing.T) {
			got := find(t, ctx, coll, bson.D{}, options.Find().SetProjection(D(c.proj)))
			require.Len(t, got, 1)
			requireDoc(t, c.want, got[0], "projection %s", c.proj)
		})
	}
	_, err := coll.Find(ctx, bson.D{}, options.Find().SetProjection(D(`{"a":1,"n":0}`)))
	requireCode(t, err, 31254, "mixing inclusion and exclusion is rejected")
	t.Run("positional", func(t *testing.T) {
		got := find(t, ctx, coll, D(`{"arr.k":2}`), options.Find().SetProjection(D(`{"arr.$":1}`)))
		require.Len(t, got, 1)
		requireDoc(t, `{"_id":1,"arr":[{"k":2,"v":"b"}]}`, got[0], "positional projection returns the first matching element")
	})
}

func testQueryMisc(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[
		{"_id":1,"a":5,"b":3,"i":{"$numberInt":"1"},"arr":[[1,2],[3]]},
		{"_id":2,"a":1,"b":3,"i":{"$numberLong":"1"},"arr":[1,2]},
		{"_id":3,"a":3,"b":3,"i":{"$numberDouble":"1"},"arr":[{"x":[{"y":1},{"y":2}]}]},
		{"_id":4,"a":null,"b":0,"i":{"$numberDecimal":"1"},"arr":[{"x":{"y":2}}]}
	]`)
	runFilters(t, coll, []filterCase{
		{`{"$expr":{"$gt":["$a","$b"]}}`, []int32{1}},
		{`{"$expr":{"$eq":["$a","$b"]}}`, []int32{3}},
		{`{"i":{"$type":"int"}}`, []int32{1}},
		{`{"i":{"$type":"long"}}`, []int32{2}},
		{`{"i":{"$type":"double"}}`, []int32{3}},
		{`{"i":{"$type":"decimal"}}`, []int32{4}},
		{`{"i":{"$type":18}}`, []int32{2}},
		{`{"arr":[1,2]}`, []int32{1, 2}},
		{`{"arr":[3]}`, []int32{1}},
		{`{"arr":2}`, []int32{2}},
		{`{"arr.x.y":2}`, []int32{3, 4}},
		{`{"arr.x.y":{"$all":[1,2]}}`, []int32{3}},
		{`{"arr.x":{"$elemMatch":{"y":1}}}`, []int32{3}},
		{`{"a":{"$gte":null}}`, []int32{4}},
		{`{"b":0,"a":{"$type":"null"}}`, []int32{4}},
		{`{"$or":[{"a":{"$lt":2}},{"a":{"$gt":4}}],"b":3}`, []int32{1, 2}},
		{`{"arr":{"$size":2}}`, []int32{1, 2}},
		{`{"_id":{"$not":{"$in":[1,2]}}}`, []int32{3, 4}},
	})
}

func testUniqueMultikey(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"tags":1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	insert(t, ctx, coll, `[{"_id":1,"tags":[1,2,2]}]`)
	_, err = coll.InsertOne(ctx, D(`{"_id":2,"tags":[3,2]}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "array elements are index keys: 2 is taken, got %v", err)
	_, err = coll.InsertOne(ctx, D(`{"_id":3,"tags":1}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "a scalar collides with an array element, got %v", err)
	_, err = coll.InsertOne(ctx, D(`{"_id":4,"tags":[3,4]}`))
	require.NoError(t, err)
}

func testMoreStages(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := seedSales(t, db)
	requireDocs(t, `[{"_id":1,"total":20},{"_id":2,"total":20}]`,
		aggregate(t, coll, `[{"$match":{"_id":{"$lte":2}}},{"$addFields":{"total":{"$multiply":["$qty","$price"]}}},{"$project":{"total":1}}]`), "$addFields")
	requireDocs(t, `[{"_id":1,"item":"a","qty":2}]`,
		aggregate(t, coll, `[{"$match":{"_id":1}},{"$unset":["price","tags"]}]`), "$unset stage")
	requireDocs(t, `[{"x":"a","q":2}]`,
		aggregate(t, coll, `[{"$match":{"_id":1}},{"$replaceRoot":{"newRoot":{"x":"$item","q":"$qty"}}}]`), "$replaceRoot")
	requireDocs(t, `[{"_id":"a","count":2},{"_id":"b","count":2},{"_id":"c","count":1}]`,
		aggregate(t, coll, `[{"$sortByCount":"$item"},{"$sort":{"count":-1,"_id":1}}]`), "$sortByCount")
	requireDocs(t, `[{"n":[{"c":5}],"top":[{"_id":3}]}]`,
		aggregate(t, coll, `[{"$facet":{"n":[{"$count":"c"}],"top":[{"$sort":{"qty":-1}},{"$limit":1},{"$project":{"_id":1}}]}}]`), "$facet")

	insert(t, ctx, db.Collection("items"), `[{"_id":"a","name":"apple"},{"_id":"b","name":"banana"}]`)
	cur, err := coll.Aggregate(ctx, Ds(`[{"$match":{"_id":{"$in":[1,2,4]}}},{"$sort":{"_id":1}},{"$lookup":{"from":"items","localField":"item","foreignField":"_id","as":"it"}},{"$project":{"it.name":1}}]`))
	if err != nil && !e.Real {
		require.Contains(t, err.Error(), "$lookup", "an unsupported $lookup must be named in the error")
		t.Logf("embedded server does not support $lookup: %v", err)
		return
	}
	requireDocs(t, `[{"_id":1,"it":[{"name":"apple"}]},{"_id":2,"it":[{"name":"banana"}]},{"_id":4,"it":[]}]`, all(t, ctx, cur, err), "$lookup")
}

func testTxnImplicitCreate(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := db.Collection("fresh").InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err, "since MongoDB 4.4 an insert in a transaction may create its collection")
	names, err := db.ListCollectionNames(ctx, bson.D{})
	require.NoError(t, err)
	require.NotContains(t, names, "fresh", "the collection is not visible before commit")
	require.NoError(t, sess.CommitTransaction(ctx))
	require.Equal(t, idList(1), ids(t, ctx, db.Collection("fresh"), bson.D{}))
}

func testCSResumeOnNetworkError(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cl, log, app := failPointClient(t, e)
	cs := watch(t, ctx, cl.Database(db.Name()).Collection("c"), nil)
	insert(t, ctx, coll, `[{"_id":1}]`)
	requireField(t, nextEvent(t, cs), "documentKey", `{"_id":1}`)

	setFailPoint(t, ctx, e, `{"times":1}`, `{"failCommands":["getMore"],"appName":"`+app+`","closeConnection":true}`)
	insert(t, ctx, coll, `[{"_id":2},{"_id":3}]`)
	evs := nextEvents(t, cs, 2)
	requireField(t, evs[0], "documentKey", `{"_id":2}`)
	requireField(t, evs[1], "documentKey", `{"_id":3}`)
	require.GreaterOrEqual(t, log.count("aggregate"), 2, "the driver resumed with a new aggregate after the network error")
	requireNoEvent(t, ctx, cs, "no event is delivered twice after the resume")
}

func testGoFaultAPI(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	embeddedOnly(t, e, "the Go fault API belongs to the embedded server")
	coll := db.Collection("c")
	cancel := e.Server.FailCommand(mongofake.FailPoint{Commands: []string{"insert"}, Times: 1, ErrorCode: 112})
	defer cancel()
	_, err := coll.InsertOne(ctx, D(`{"_id":1}`))
	requireCode(t, err, 112, "FailCommand fails the next insert")
	_, err = coll.InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err, "Times: 1")

	cancel2 := e.Server.FailCommand(mongofake.FailPoint{Commands: []string{"find"}, ErrorCode: 96})
	require.Error(t, coll.FindOne(ctx, bson.D{}).Err())
	cancel2()
	require.NoError(t, coll.FindOne(ctx, bson.D{}).Err(), "cancel disarms the fail point")

	before := e.Server.ConnectionCount()
	require.Positive(t, before)
	e.Server.DropConnections()
	ctx2, cancel3 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel3()
	require.NoError(t, coll.FindOne(ctx2, bson.D{}).Err(), "the driver reconnects after DropConnections (retryable read)")
}

func testConcurrentUpserts(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"key":1}`), Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	const workers = 16
	errs := make(chan error, workers)
	start := make(chan struct{})
	for range workers {
		go func() {
			<-start
			_, err := coll.UpdateOne(ctx, D(`{"key":"k"}`), D(`{"$inc":{"n":1},"$setOnInsert":{"first":true}}`), options.UpdateOne().SetUpsert(true))
			errs <- err
		}()
	}
	close(start)
	for range workers {
		require.NoError(t, <-errs, "concurrent upserts with an equality filter on a unique index all succeed (MongoDB 4.2+ retries the duplicate key internally)")
	}
	got := find(t, ctx, coll, bson.D{}, options.Find().SetProjection(D(`{"_id":0}`)))
	requireDocs(t, `[{"key":"k","first":true,"n":16}]`, got, "one document, every increment applied once")
}

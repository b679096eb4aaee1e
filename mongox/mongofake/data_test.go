package mongofake

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func coll(t *testing.T, client *mongo.Client) *mongo.Collection {
	t.Helper()
	return client.Database("test").Collection("c")
}

func TestCRUD(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)

	res, err := c.InsertMany(ctx, []any{
		bson.D{{Key: "a", Value: 1}, {Key: "_id", Value: 1}},
		bson.D{{Key: "_id", Value: 2}, {Key: "a", Value: 2}, {Key: "tags", Value: bson.A{"x", "y"}}},
		bson.D{{Key: "_id", Value: 3}, {Key: "a", Value: 3}, {Key: "tags", Value: bson.A{"y"}}},
	})
	require.NoError(t, err)
	require.Len(t, res.InsertedIDs, 3)

	var got bson.D
	require.NoError(t, c.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&got))
	require.Equal(t, "_id", got[0].Key, "_id is stored first")

	cur, err := c.Find(ctx, bson.D{{Key: "a", Value: bson.D{{Key: "$gte", Value: 2}}}},
		options.Find().SetSort(bson.D{{Key: "a", Value: -1}}).SetProjection(bson.D{{Key: "a", Value: 1}}))
	require.NoError(t, err)
	var docs []bson.D
	require.NoError(t, cur.All(ctx, &docs))
	require.Equal(t, []bson.D{
		{{Key: "_id", Value: int32(3)}, {Key: "a", Value: int32(3)}},
		{{Key: "_id", Value: int32(2)}, {Key: "a", Value: int32(2)}},
	}, docs)

	up, err := c.UpdateMany(ctx, bson.D{{Key: "tags", Value: "y"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "a", Value: 10}}}})
	require.NoError(t, err)
	require.Equal(t, int64(2), up.MatchedCount)
	require.Equal(t, int64(2), up.ModifiedCount)

	up, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 9}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 9}}}}, options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)
	require.Equal(t, int32(9), up.UpsertedID)

	up, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}})
	require.NoError(t, err)
	require.Equal(t, int64(1), up.MatchedCount)
	require.Equal(t, int64(0), up.ModifiedCount)

	n, err := c.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(4), n)

	vals, err := c.Distinct(ctx, "tags", bson.D{}).Raw()
	require.NoError(t, err)
	require.Contains(t, vals.String(), `"x"`)

	var after bson.M
	err = c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "b", Value: true}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&after)
	require.NoError(t, err)
	require.Equal(t, true, after["b"])

	err = c.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: 404}}).Err()
	require.ErrorIs(t, err, mongo.ErrNoDocuments)

	del, err := c.DeleteMany(ctx, bson.D{{Key: "a", Value: bson.D{{Key: "$gt", Value: 5}}}})
	require.NoError(t, err)
	require.Equal(t, int64(3), del.DeletedCount)

	_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.True(t, mongo.IsDuplicateKeyError(err), "%v", err)
	var we mongo.WriteException
	require.ErrorAs(t, err, &we)
	require.Contains(t, we.WriteErrors[0].Message, "E11000 duplicate key error collection: test.c index: _id_ dup key: { _id: 1 }")

	// Unordered insert continues after an error.
	_, err = c.InsertMany(ctx, []any{bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 50}}}, options.InsertMany().SetOrdered(false))
	require.Error(t, err)
	n, err = c.CountDocuments(ctx, bson.D{{Key: "_id", Value: 50}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestCursorBatches(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	docs := make([]any, 250)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}}
	}
	_, err := c.InsertMany(ctx, docs)
	require.NoError(t, err)
	cur, err := c.Find(ctx, bson.D{}, options.Find().SetBatchSize(7))
	require.NoError(t, err)
	var out []bson.D
	require.NoError(t, cur.All(ctx, &out))
	require.Len(t, out, 250)
	require.Equal(t, int32(249), out[249][0].Value)

	cur, err = c.Find(ctx, bson.D{}, options.Find().SetLimit(-3))
	require.NoError(t, err)
	require.NoError(t, cur.All(ctx, &out))
	require.Len(t, out, 3)

	cur, err = c.Find(ctx, bson.D{}, options.Find().SetSkip(240).SetLimit(5))
	require.NoError(t, err)
	require.NoError(t, cur.All(ctx, &out))
	require.Len(t, out, 5)
	require.Equal(t, int32(240), out[0][0].Value)

	agg, err := c.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$lt", Value: 10}}}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	require.NoError(t, err)
	var grp []bson.M
	require.NoError(t, agg.All(ctx, &grp))
	require.Len(t, grp, 1)
	require.EqualValues(t, 10, grp[0]["n"])
}

func TestIndexes(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	name, err := c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "k", Value: 1}},
		Options: options.Index().SetUnique(true).SetPartialFilterExpression(bson.D{{Key: "live", Value: true}}),
	})
	require.NoError(t, err)
	require.Equal(t, "k_1", name)
	_, err = c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetExpireAfterSeconds(60),
	})
	require.NoError(t, err)
	// Same again: no-op.
	_, err = c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetExpireAfterSeconds(60),
	})
	require.NoError(t, err)
	// Same keys, other options: conflict.
	_, err = c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "at", Value: 1}}, Options: options.Index().SetExpireAfterSeconds(30),
	})
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(85), ce.Code)

	cur, err := c.Indexes().List(ctx)
	require.NoError(t, err)
	var specs []bson.M
	require.NoError(t, cur.All(ctx, &specs))
	require.Len(t, specs, 3)
	require.Equal(t, "k_1", specs[1]["name"])
	require.Equal(t, true, specs[1]["unique"])

	_, err = c.InsertOne(ctx, bson.D{{Key: "k", Value: 1}, {Key: "live", Value: true}})
	require.NoError(t, err)
	_, err = c.InsertOne(ctx, bson.D{{Key: "k", Value: 1}, {Key: "live", Value: false}})
	require.NoError(t, err)
	_, err = c.InsertOne(ctx, bson.D{{Key: "k", Value: 1}, {Key: "live", Value: true}})
	require.True(t, mongo.IsDuplicateKeyError(err))

	// collMod changes the TTL.
	var res bson.M
	require.NoError(t, client.Database("test").RunCommand(ctx, bson.D{
		{Key: "collMod", Value: "c"},
		{Key: "index", Value: bson.D{{Key: "name", Value: "at_1"}, {Key: "expireAfterSeconds", Value: 10}}},
	}).Decode(&res))
	require.EqualValues(t, 60, res["expireAfterSeconds_old"])

	require.NoError(t, c.Indexes().DropOne(ctx, "at_1"))
	err = c.Indexes().DropOne(ctx, "nope")
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(27), ce.Code)

	names, err := client.Database("test").ListCollectionNames(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, names)
	dbs, err := client.ListDatabaseNames(ctx, bson.D{{Key: "name", Value: "test"}})
	require.NoError(t, err)
	require.Equal(t, []string{"test"}, dbs)
	require.NoError(t, c.Drop(ctx))
	require.NoError(t, c.Drop(ctx), "dropping a missing collection is fine")
}

func TestTransactions(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	_, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "acc"}, {Key: "bal", Value: 100}})
	require.NoError(t, err)

	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)

	// Commit: writes (including an implicitly created collection) appear together.
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "acc"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "bal", Value: -10}}}}); err != nil {
			return nil, err
		}
		if _, err := client.Database("test").Collection("new").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
			return nil, err
		}
		// Not visible outside yet.
		n, err := client.Database("test").Collection("new").CountDocuments(context.Background(), bson.D{})
		if err != nil {
			return nil, err
		}
		if n != 0 {
			return nil, errors.New("uncommitted write visible")
		}
		// Visible inside.
		n, err = client.Database("test").Collection("new").CountDocuments(ctx, bson.D{})
		if err != nil {
			return nil, err
		}
		if n != 1 {
			return nil, errors.New("own write not visible")
		}
		return nil, nil
	})
	require.NoError(t, err)
	var acc bson.M
	require.NoError(t, c.FindOne(ctx, bson.D{{Key: "_id", Value: "acc"}}).Decode(&acc))
	require.EqualValues(t, 90, acc["bal"])

	// Abort: nothing applied.
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = c.UpdateOne(sctx, bson.D{{Key: "_id", Value: "acc"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "bal", Value: 0}}}})
	require.NoError(t, err)
	require.NoError(t, sess.AbortTransaction(ctx))
	require.NoError(t, c.FindOne(ctx, bson.D{{Key: "_id", Value: "acc"}}).Decode(&acc))
	require.EqualValues(t, 90, acc["bal"])

	// Write conflict between two transactions: TransientTransactionError.
	s2, err := client.StartSession()
	require.NoError(t, err)
	defer s2.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	require.NoError(t, s2.StartTransaction())
	_, err = c.UpdateOne(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "_id", Value: "acc"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "bal", Value: 1}}}})
	require.NoError(t, err)
	_, err = c.UpdateOne(mongo.NewSessionContext(ctx, s2), bson.D{{Key: "_id", Value: "acc"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "bal", Value: 1}}}})
	require.Error(t, err)
	var le mongo.LabeledError
	require.ErrorAs(t, err, &le)
	require.True(t, le.HasErrorLabel("TransientTransactionError"), "%v", err)
	require.NoError(t, sess.CommitTransaction(ctx))
	require.Error(t, s2.CommitTransaction(ctx))
	_ = s2.AbortTransaction(ctx)

	// Concurrent WithTransaction increments: all applied exactly once.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := client.StartSession()
			if err != nil {
				t.Error(err)
				return
			}
			defer s.EndSession(ctx)
			for range 10 {
				_, err := s.WithTransaction(ctx, func(ctx context.Context) (any, error) {
					return c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "acc"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "bal", Value: 1}}}})
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, c.FindOne(ctx, bson.D{{Key: "_id", Value: "acc"}}).Decode(&acc))
	require.EqualValues(t, 91+80, acc["bal"])
}

func TestRetryableWriteAppliedOnce(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	db := client.Database("test")
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	cmd := bson.D{
		{Key: "update", Value: "c"},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: 1}}},
			{Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}},
			{Key: "upsert", Value: true},
		}}},
		{Key: "lsid", Value: lsid},
		{Key: "txnNumber", Value: int64(5)},
	}
	for range 3 {
		require.NoError(t, db.RunCommand(ctx, cmd).Err())
	}
	var d bson.M
	require.NoError(t, db.Collection("c").FindOne(ctx, bson.D{}).Decode(&d))
	require.EqualValues(t, 1, d["n"])
	cmd[3].Value = int64(4)
	err := db.RunCommand(ctx, cmd).Err()
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(225), ce.Code)
}

func TestNonTxnWriteWaitsForTransaction(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	_, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: 0}})
	require.NoError(t, err)
	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	_, err = c.UpdateOne(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 10}}}})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("write did not wait: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, sess.CommitTransaction(ctx))
	require.NoError(t, <-done)
	var d bson.M
	require.NoError(t, c.FindOne(ctx, bson.D{}).Decode(&d))
	require.EqualValues(t, 11, d["v"])
}

func TestChangeStream(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	require.NoError(t, client.Database("test").CreateCollection(ctx, "c"))
	cs, err := c.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup))
	require.NoError(t, err)
	defer cs.Close(ctx)

	_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: 1}})
	require.NoError(t, err)
	_, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 2}}}, {Key: "$unset", Value: bson.D{{Key: "zz", Value: ""}}}})
	require.NoError(t, err)
	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}}); err != nil {
			return nil, err
		}
		return c.DeleteOne(ctx, bson.D{{Key: "_id", Value: 1}})
	})
	require.NoError(t, err)

	next := func() bson.M {
		t.Helper()
		require.True(t, cs.Next(ctx), "%v", cs.Err())
		var ev bson.M
		require.NoError(t, cs.Decode(&ev))
		return ev
	}
	ev := next()
	require.Equal(t, "insert", ev["operationType"])
	require.Equal(t, bson.D{{Key: "_id", Value: int32(1)}, {Key: "a", Value: int32(1)}}, ev["fullDocument"])
	require.Equal(t, bson.D{{Key: "db", Value: "test"}, {Key: "coll", Value: "c"}}, ev["ns"])
	ev = next()
	require.Equal(t, "update", ev["operationType"])
	require.Equal(t, bson.D{
		{Key: "updatedFields", Value: bson.D{{Key: "a", Value: int32(2)}}},
		{Key: "removedFields", Value: bson.A{}},
		{Key: "truncatedArrays", Value: bson.A{}},
	}, ev["updateDescription"])
	require.Nil(t, ev["fullDocument"], "updateLookup of a document deleted since")
	resumeAfterUpdate := cs.ResumeToken()
	ev1 := next()
	ev2 := next()
	require.Equal(t, "insert", ev1["operationType"])
	require.Equal(t, "delete", ev2["operationType"])
	require.Equal(t, ev1["clusterTime"], ev2["clusterTime"])
	require.NotNil(t, ev1["lsid"])
	require.EqualValues(t, ev1["txnNumber"], ev2["txnNumber"])
	tok1 := ev1["_id"].(bson.D)[0].Value.(string)
	tok2 := ev2["_id"].(bson.D)[0].Value.(string)
	require.Less(t, tok1, tok2)

	// Resume after the update: the transaction's events again.
	cs2, err := c.Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "delete"}}}}},
		options.ChangeStream().SetResumeAfter(resumeAfterUpdate))
	require.NoError(t, err)
	defer cs2.Close(ctx)
	require.True(t, cs2.Next(ctx))
	var ev3 bson.M
	require.NoError(t, cs2.Decode(&ev3))
	require.Equal(t, "delete", ev3["operationType"])

	// Drop: drop then invalidate, and the stream ends.
	require.NoError(t, c.Drop(ctx))
	ev = next()
	require.Equal(t, "drop", ev["operationType"])
	ev = next()
	require.Equal(t, "invalidate", ev["operationType"])
	invTok := cs.ResumeToken()
	require.False(t, cs.Next(ctx))

	_, err = c.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(invTok))
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(260), ce.Code)
	cs3, err := c.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetStartAfter(invTok))
	require.NoError(t, err)
	defer cs3.Close(ctx)
	_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: 7}})
	require.NoError(t, err)
	require.True(t, cs3.Next(ctx))
	require.Equal(t, "insert", cs3.Current.Lookup("operationType").StringValue())
}

func TestChangeStreamHistoryLost(t *testing.T) {
	t.Parallel()
	_, client := setup(t, OplogSize(3))
	ctx := testCtx(t)
	c := coll(t, client)
	_, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 0}})
	require.NoError(t, err)
	cs, err := c.Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	tok := cs.ResumeToken()
	require.NoError(t, cs.Close(ctx))
	for i := 1; i <= 10; i++ {
		_, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: i}})
		require.NoError(t, err)
	}
	_, err = c.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(tok))
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(286), ce.Code)
}

func TestDatabaseAndClusterChangeStreams(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	dbs, err := client.Database("test").Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	defer dbs.Close(ctx)
	all, err := client.Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	defer all.Close(ctx)
	_, err = client.Database("other").Collection("x").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	_, err = client.Database("test").Collection("y").InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	require.NoError(t, err)
	require.True(t, dbs.Next(ctx))
	require.Equal(t, "y", dbs.Current.Lookup("ns", "coll").StringValue())
	require.True(t, all.Next(ctx))
	require.Equal(t, "x", all.Current.Lookup("ns", "coll").StringValue())
	require.True(t, all.Next(ctx))
	require.Equal(t, "y", all.Current.Lookup("ns", "coll").StringValue())
}

func TestTTLThroughServer(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	_, err := c.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "at", Value: 1}},
		Options: options.Index().SetExpireAfterSeconds(1).
			SetPartialFilterExpression(bson.D{{Key: "done", Value: true}}),
	})
	require.NoError(t, err)
	old := time.Now().Add(-time.Hour)
	_, err = c.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: 1}, {Key: "at", Value: old}, {Key: "done", Value: true}},
		bson.D{{Key: "_id", Value: 2}, {Key: "at", Value: old}, {Key: "done", Value: false}},
	})
	require.NoError(t, err)
	require.Equal(t, 1, srv.engine.RunTTL())
	n, err := c.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestUnsupportedFailsClearly(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	c := coll(t, client)
	_, err := c.Find(ctx, bson.D{}, options.Find().SetCollation(&options.Collation{Locale: "fr", Strength: 4}))
	require.ErrorContains(t, err, "collation strength 4")
	_, err = c.Find(ctx, bson.D{{Key: "x", Value: bson.Regex{Pattern: "a"}}}, options.Find().SetCollation(&options.Collation{Locale: "fr"}))
	require.ErrorContains(t, err, "regular expression with a non-simple collation")
	_, err = c.Aggregate(ctx, mongo.Pipeline{{{Key: "$graphLookup", Value: bson.D{}}}})
	require.ErrorContains(t, err, "$graphLookup")
	err = client.Database("test").RunCommand(ctx, bson.D{{Key: "find", Value: "c"}, {Key: "bogus", Value: 1}}).Err()
	require.ErrorContains(t, err, "bogus")
}

// BenchmarkDriverInsert measures single-document inserts through the
// driver from concurrent goroutines (SetParallelism(8): 8 per GOMAXPROCS,
// so 16 on 2 cores).
func BenchmarkDriverInsert(b *testing.B) {
	_, client := setup(b)
	c := client.Database("bench").Collection("c")
	ctx := context.Background()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.InsertOne(ctx, bson.D{{Key: "v", Value: "x"}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "inserts/s")
}

// BenchmarkDriverTxn measures small transactions (two inserts and a
// commit) through the driver from concurrent goroutines
// (SetParallelism(8), as BenchmarkDriverInsert).
func BenchmarkDriverTxn(b *testing.B) {
	_, client := setup(b)
	c := client.Database("bench").Collection("t")
	ctx := context.Background()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s, err := client.StartSession()
		if err != nil {
			b.Error(err)
			return
		}
		defer s.EndSession(ctx)
		for pb.Next() {
			_, err := s.WithTransaction(ctx, func(ctx context.Context) (any, error) {
				if _, err := c.InsertOne(ctx, bson.D{{Key: "v", Value: 1}}); err != nil {
					return nil, err
				}
				return c.InsertOne(ctx, bson.D{{Key: "v", Value: 2}})
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "txns/s")
}

func TestChangeStreamPostBatchResumeTokenAdvances(t *testing.T) {
	t.Parallel()
	_, client := setup(t)
	ctx := testCtx(t)
	cs, err := coll(t, client).Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(10*time.Millisecond))
	require.NoError(t, err)
	defer cs.Close(ctx)
	require.False(t, cs.TryNext(ctx))
	tok1 := cs.ResumeToken().Lookup("_data").StringValue()
	_, err = client.Database("test").Collection("other").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	require.False(t, cs.TryNext(ctx))
	require.NoError(t, cs.Err())
	tok2 := cs.ResumeToken().Lookup("_data").StringValue()
	require.Less(t, tok1, tok2)
}

func TestTransactionCommandRules(t *testing.T) {
	t.Parallel()
	_, client := setup(t, TransactionLifetime(300*time.Millisecond))
	ctx := testCtx(t)
	admin := client.Database("admin")
	db := client.Database("test")
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}}}
	ins := func(n int64, start bool, id int) error {
		cmd := bson.D{
			{Key: "insert", Value: "c"},
			{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: id}}}},
			{Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: n}, {Key: "autocommit", Value: false},
		}
		if start {
			cmd = append(cmd, bson.E{Key: "startTransaction", Value: true})
		}
		return db.RunCommand(ctx, cmd).Err()
	}
	txnCmd := func(name string, n int64) error {
		return admin.RunCommand(ctx, bson.D{{Key: name, Value: 1}, {Key: "lsid", Value: lsid},
			{Key: "txnNumber", Value: n}, {Key: "autocommit", Value: false}}).Err()
	}
	code := func(err error) int32 {
		var ce mongo.CommandError
		if errors.As(err, &ce) {
			return ce.Code
		}
		return -1
	}
	require.NoError(t, ins(1, true, 1))
	require.NoError(t, txnCmd("commitTransaction", 1))
	require.NoError(t, txnCmd("commitTransaction", 1), "commit is idempotent")
	require.Equal(t, int32(256), code(txnCmd("abortTransaction", 1)))

	require.NoError(t, ins(2, true, 2))
	require.NoError(t, txnCmd("abortTransaction", 2))
	require.Equal(t, int32(251), code(txnCmd("commitTransaction", 2)))
	require.Equal(t, int32(251), code(ins(3, false, 3)), "no such transaction")
	require.Equal(t, int32(225), code(ins(1, true, 4)), "older txnNumber")

	// The lifetime limit aborts an idle transaction.
	require.NoError(t, ins(5, true, 5))
	require.Eventually(t, func() bool { return code(ins(5, false, 6)) == 251 }, 5*time.Second, 10*time.Millisecond)

	// endSessions aborts the open transaction.
	require.NoError(t, ins(6, true, 7))
	require.NoError(t, admin.RunCommand(ctx, bson.D{{Key: "endSessions", Value: bson.A{lsid}}}).Err())
	n, err := db.Collection("c").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

package conformance

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func changeStreamCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"CollectionEvents", testCSCollectionEvents},
		{"DatabaseLevel", testCSDatabase},
		{"ClusterLevel", testCSCluster},
		{"UpdateLookup", testCSUpdateLookup},
		{"MatchStage", testCSMatch},
		{"ResumeAfter", testCSResumeAfter},
		{"StartAfterInvalidate", testCSStartAfter},
		{"StartAtOperationTime", testCSStartAtOperationTime},
		{"TransactionEvents", testCSTransaction},
		{"TryNextEmpty", testCSTryNext},
		{"HistoryLost", testCSHistoryLost},
		{"ResumeOnNetworkError", testCSResumeOnNetworkError},
	})
}

// watchAwait is the await time used by the cases' change streams.
const watchAwait = 200 * time.Millisecond

// nextEvent returns the next event of cs, failing after 10 s.
func nextEvent(t *testing.T, cs *mongo.ChangeStream) bson.D {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !cs.Next(ctx) {
		t.Fatalf("no change event within 10 s (stream error: %v)", cs.Err())
	}
	return rawDoc(t, cs.Current)
}

// nextEvents returns the next n events.
func nextEvents(t *testing.T, cs *mongo.ChangeStream, n int) []bson.D {
	t.Helper()
	out := make([]bson.D, 0, n)
	for range n {
		out = append(out, nextEvent(t, cs))
	}
	return out
}

// requireNoEvent asserts that TryNext finds nothing now.
func requireNoEvent(t *testing.T, ctx context.Context, cs *mongo.ChangeStream, why string) {
	t.Helper()
	if cs.TryNext(ctx) {
		t.Fatalf("%s: unexpected event %s", why, cs.Current)
	}
	require.NoError(t, cs.Err())
}

// opTypes lists the operationType of events.
func opTypes(evs []bson.D) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i], _ = get(ev, "operationType").(string)
	}
	return out
}

// watch opens a change stream on w (a client, database or collection),
// closed in t.Cleanup.
func watch(t *testing.T, ctx context.Context, w interface {
	Watch(context.Context, any, ...options.Lister[options.ChangeStreamOptions]) (*mongo.ChangeStream, error)
}, pipeline any, opts ...*options.ChangeStreamOptionsBuilder) *mongo.ChangeStream {
	t.Helper()
	if pipeline == nil {
		pipeline = mongo.Pipeline{}
	}
	all := []options.Lister[options.ChangeStreamOptions]{options.ChangeStream().SetMaxAwaitTime(watchAwait)}
	for _, o := range opts {
		all = append(all, o)
	}
	cs, err := w.Watch(ctx, pipeline, all...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close(context.Background()) })
	return cs
}

// requireField asserts one top-level field of an event.
func requireField(t *testing.T, ev bson.D, key, want string) {
	t.Helper()
	v := get(ev, key)
	require.NotNil(t, v, "event has %s: %s", key, js(ev))
	require.Equal(t, js(bson.D{{Key: key, Value: D(`{"v":` + want + `}`)[0].Value}}), js(bson.D{{Key: key, Value: v}}), "event field %s in %s", key, js(ev))
}

func testCSCollectionEvents(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, nil)

	_, err := coll.InsertOne(ctx, D(`{"_id":1,"a":1,"b":1,"arr":[1,2,3]}`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"a":2,"s.t":1},"$unset":{"b":""}}`))
	require.NoError(t, err)
	_, err = coll.ReplaceOne(ctx, D(`{"_id":1}`), D(`{"c":1}`))
	require.NoError(t, err)
	_, err = coll.DeleteOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	require.NoError(t, coll.Drop(ctx))

	evs := nextEvents(t, cs, 6)
	require.Equal(t, []string{"insert", "update", "replace", "delete", "drop", "invalidate"}, opTypes(evs))
	ns := fmt.Sprintf(`{"db":%q,"coll":"c"}`, db.Name())

	var prev bson.Timestamp
	for i, ev := range evs {
		id, ok := get(ev, "_id").(bson.D)
		require.True(t, ok, "event %d has a resume token document _id: %s", i, js(ev))
		_, ok = get(id, "_data").(string)
		require.True(t, ok, "resume token has a string _data: %s", js(ev))
		ct, ok := get(ev, "clusterTime").(bson.Timestamp)
		require.True(t, ok, "event %d has a timestamp clusterTime: %s", i, js(ev))
		if i > 0 && i < 5 { // drop and invalidate may share a time
			require.True(t, ct.After(prev), "clusterTime increases between separate writes: %v then %v", prev, ct)
		}
		prev = ct
		if i < 5 {
			requireField(t, ev, "ns", ns)
		}
	}
	requireField(t, evs[0], "documentKey", `{"_id":1}`)
	requireField(t, evs[0], "fullDocument", `{"_id":1,"a":1,"b":1,"arr":[1,2,3]}`)
	requireField(t, evs[1], "documentKey", `{"_id":1}`)
	requireField(t, evs[1], "updateDescription", `{"updatedFields":{"a":2,"s":{"t":1}},"removedFields":["b"],"truncatedArrays":[]}`)
	require.Nil(t, get(evs[1], "fullDocument"), "update events carry no fullDocument by default")
	requireField(t, evs[2], "fullDocument", `{"_id":1,"c":1}`)
	requireField(t, evs[3], "documentKey", `{"_id":1}`)
	require.Nil(t, get(evs[4], "documentKey"), "drop has no documentKey")

	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.False(t, cs.Next(ctx2), "the stream ends after invalidate")
	require.NoError(t, cs.Err())
}

func testCSDatabase(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	a, b := createColl(t, ctx, db, "a"), createColl(t, ctx, db, "b")
	cs := watch(t, ctx, db, nil)
	_, err := a.InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	_, err = b.InsertOne(ctx, D(`{"_id":2}`))
	require.NoError(t, err)
	require.NoError(t, a.Drop(ctx))
	_, err = b.InsertOne(ctx, D(`{"_id":3}`))
	require.NoError(t, err)
	evs := nextEvents(t, cs, 4)
	require.Equal(t, []string{"insert", "insert", "drop", "insert"}, opTypes(evs), "a collection drop does not invalidate a database stream")
	requireField(t, evs[0], "ns", fmt.Sprintf(`{"db":%q,"coll":"a"}`, db.Name()))
	requireField(t, evs[1], "ns", fmt.Sprintf(`{"db":%q,"coll":"b"}`, db.Name()))

	require.NoError(t, db.Drop(ctx))
	evs = nextEvents(t, cs, 3)
	require.Equal(t, []string{"drop", "dropDatabase", "invalidate"}, opTypes(evs))
	requireField(t, evs[1], "ns", fmt.Sprintf(`{"db":%q}`, db.Name()))
}

func testCSCluster(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	other := e.DB(t)
	cs := watch(t, ctx, e.Client, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "ns.db", Value: bson.D{{Key: "$in", Value: bson.A{db.Name(), other.Name()}}}}}}}})
	_, err := db.Collection("x").InsertOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	_, err = other.Collection("y").InsertOne(ctx, D(`{"_id":2}`))
	require.NoError(t, err)
	evs := nextEvents(t, cs, 2)
	requireField(t, evs[0], "ns", fmt.Sprintf(`{"db":%q,"coll":"x"}`, db.Name()))
	requireField(t, evs[1], "ns", fmt.Sprintf(`{"db":%q,"coll":"y"}`, other.Name()))
}

func testCSUpdateLookup(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"a":1,"b":1}]`)
	cs := watch(t, ctx, coll, nil, options.ChangeStream().SetFullDocument(options.UpdateLookup))
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"a":1}}`))
	require.NoError(t, err)
	ev := nextEvent(t, cs)
	requireField(t, ev, "fullDocument", `{"_id":1,"a":2,"b":1}`)
	requireField(t, ev, "updateDescription", `{"updatedFields":{"a":2},"removedFields":[],"truncatedArrays":[]}`)

	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"a":1}}`))
	require.NoError(t, err)
	_, err = coll.DeleteOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	evs := nextEvents(t, cs, 2)
	require.Equal(t, []string{"update", "delete"}, opTypes(evs))
	fd, present := lookupField(evs[0], "fullDocument")
	require.True(t, present, "updateLookup of a since-deleted document gives fullDocument null: %s", js(evs[0]))
	require.Nil(t, fd)
}

// lookupField reports a field's value and whether it is present.
func lookupField(d bson.D, key string) (any, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

func testCSMatch(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, Ds(`[{"$match":{"operationType":"insert","fullDocument.keep":true}},{"$project":{"fullDocument":1,"operationType":1}}]`))
	insert(t, ctx, coll, `[{"_id":1,"keep":false},{"_id":2,"keep":true}]`)
	_, err := coll.UpdateOne(ctx, D(`{"_id":2}`), D(`{"$set":{"x":1}}`))
	require.NoError(t, err)
	insert(t, ctx, coll, `[{"_id":3,"keep":true}]`)
	evs := nextEvents(t, cs, 2)
	requireField(t, evs[0], "fullDocument", `{"_id":2,"keep":true}`)
	requireField(t, evs[1], "fullDocument", `{"_id":3,"keep":true}`)
	require.Nil(t, get(evs[0], "ns"), "$project removed ns")
	require.NotNil(t, get(evs[0], "_id"), "the resume token stays")
}

func testCSResumeAfter(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, nil)
	insert(t, ctx, coll, `[{"_id":1},{"_id":2}]`)
	first := nextEvent(t, cs)
	token := cs.ResumeToken()
	require.NotNil(t, token)
	require.NoError(t, cs.Close(ctx))
	insert(t, ctx, coll, `[{"_id":3}]`)

	cs2 := watch(t, ctx, coll, nil, options.ChangeStream().SetResumeAfter(token))
	evs := nextEvents(t, cs2, 2)
	requireField(t, first, "documentKey", `{"_id":1}`)
	requireField(t, evs[0], "documentKey", `{"_id":2}`)
	requireField(t, evs[1], "documentKey", `{"_id":3}`)
	requireNoEvent(t, ctx, cs2, "resume delivers each later event once")

	_, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(D(`{"_data":"zz-not-a-token"}`)))
	require.Error(t, err, "a malformed resume token is rejected")
}

func testCSStartAfter(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, nil)
	insert(t, ctx, coll, `[{"_id":1}]`)
	require.NoError(t, coll.Drop(ctx))
	evs := nextEvents(t, cs, 3)
	require.Equal(t, []string{"insert", "drop", "invalidate"}, opTypes(evs))
	invalidate := get(evs[2], "_id")

	insert(t, ctx, coll, `[{"_id":2}]`)
	_, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(invalidate))
	requireCode(t, err, 260, "resumeAfter an invalidate token is InvalidResumeToken")

	cs2 := watch(t, ctx, coll, nil, options.ChangeStream().SetStartAfter(invalidate))
	ev := nextEvent(t, cs2)
	require.Equal(t, "insert", get(ev, "operationType"))
	requireField(t, ev, "documentKey", `{"_id":2}`)
}

func testCSStartAtOperationTime(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":0}]`)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	opTime := sess.OperationTime()
	require.NotNil(t, opTime, "the session records the operationTime of the write")
	_, err = coll.InsertOne(ctx, D(`{"_id":2}`))
	require.NoError(t, err)

	cs := watch(t, ctx, coll, nil, options.ChangeStream().SetStartAtOperationTime(opTime))
	evs := nextEvents(t, cs, 2)
	requireField(t, evs[0], "documentKey", `{"_id":1}`)
	requireField(t, evs[1], "documentKey", `{"_id":2}`)
	require.Equal(t, *opTime, get(evs[0], "clusterTime"), "startAtOperationTime is inclusive: the write at that time comes first")
}

func testCSTransaction(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	other := createColl(t, ctx, db, "other")
	cs := watch(t, ctx, db, nil)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	_, err = other.InsertOne(sctx, D(`{"_id":2}`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$set":{"x":1}}`))
	require.NoError(t, err)
	requireNoEvent(t, ctx, cs, "events of an open transaction are not visible")
	require.NoError(t, sess.CommitTransaction(ctx))

	evs := nextEvents(t, cs, 3)
	require.Equal(t, []string{"insert", "insert", "update"}, opTypes(evs), "transaction events in statement order")
	requireField(t, evs[0], "documentKey", `{"_id":1}`)
	requireField(t, evs[1], "documentKey", `{"_id":2}`)
	ct := get(evs[0], "clusterTime")
	for _, ev := range evs {
		require.Equal(t, ct, get(ev, "clusterTime"), "events of one transaction share clusterTime")
		require.NotNil(t, get(ev, "lsid"), "transaction events carry lsid: %s", js(ev))
		require.NotNil(t, get(ev, "txnNumber"), "transaction events carry txnNumber: %s", js(ev))
	}
	tokens := map[string]bool{}
	for _, ev := range evs {
		tokens[js(get(ev, "_id"))] = true
	}
	require.Len(t, tokens, 3, "every event has its own resume token")
}

func testCSTryNext(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(time.Second))
	require.NoError(t, err)
	defer cs.Close(ctx)
	start := time.Now()
	require.False(t, cs.TryNext(ctx), "no event")
	require.NoError(t, cs.Err())
	require.Less(t, time.Since(start), 5*time.Second, "TryNext returns after about one await period")
	require.NotNil(t, cs.ResumeToken(), "an empty batch still carries a postBatchResumeToken")

	insert(t, ctx, coll, `[{"_id":1}]`)
	eventually(t, 10*time.Second, "TryNext returns the event", func() bool { return cs.TryNext(ctx) })
	op, _ := cs.Current.Lookup("operationType").StringValueOK()
	require.Equal(t, "insert", op)
}

func testCSHistoryLost(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env, mongotest.ServerOptions(mongofake.OplogSize(10)))
	embeddedOnly(t, e, "a real oplog cannot be shrunk to lose history on demand")
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, nil)
	insert(t, ctx, coll, `[{"_id":0}]`)
	nextEvent(t, cs)
	token := cs.ResumeToken()
	require.NoError(t, cs.Close(ctx))
	for i := 1; i <= 50; i++ {
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}})
		require.NoError(t, err)
	}
	cs2, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(token).SetMaxAwaitTime(watchAwait))
	if err == nil {
		defer cs2.Close(ctx)
		ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.False(t, cs2.Next(ctx2), "resuming past the oplog's oldest entry returns no event")
		err = cs2.Err()
	}
	requireCode(t, err, 286, "resuming from a point no longer in the oplog is ChangeStreamHistoryLost")
}

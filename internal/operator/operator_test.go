package operator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testID stands for the root's outbox.InboxID: the same _id subdocument.
type testID struct {
	Topic          string `bson:"topic"`
	ContentSchema  string `bson:"content_schema"`
	IdempotencyKey string `bson:"idempotency_key"`
}

func (id testID) String() string { return id.Topic + "/" + id.ContentSchema + "/" + id.IdempotencyKey }

func idOf(topic, key string) testID {
	return testID{Topic: topic, ContentSchema: "s", IdempotencyKey: key}
}

// parkedDoc is a parked inbox document of id at offset under partition
// key pk; heldBy, when not nil, makes it a held event.
func parkedDoc(id testID, pk string, offset int64, at time.Time, heldBy *testID) bson.D {
	d := bson.D{{Key: store.InboxID, Value: id}, {Key: store.InboxHandled, Value: false},
		{Key: store.InboxParked, Value: true}, {Key: store.InboxParkedAt, Value: at},
		{Key: store.InboxPartition, Value: int32(0)}, {Key: store.InboxOffset, Value: offset},
		{Key: store.InboxPartitionKey, Value: pk}, {Key: store.InboxReceivedAt, Value: at}}
	if heldBy != nil {
		d = append(d, bson.E{Key: store.InboxHeldBy, Value: *heldBy})
	}
	return d
}

func newInbox(t *testing.T, docs ...bson.D) Inbox[testID] {
	t.Helper()
	coll := mongotest.Start(t).DB(t).Collection("inbox")
	if len(docs) > 0 {
		_, err := coll.InsertMany(context.Background(), docs)
		require.NoError(t, err)
	}
	return Inbox[testID]{Coll: coll}
}

func rawOf(t *testing.T, coll *mongo.Collection, id testID) bson.M {
	t.Helper()
	var m bson.M
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: store.InboxID, Value: id}}).Decode(&m))
	return m
}

// A held event is listed with the head of its key now, which may differ
// from the head it was held behind; the head itself has none.
func TestListGivesHeldEventsTheirKeysHeadNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	gone, head, a, b := idOf("t", "gone"), idOf("t", "head"), idOf("t", "a"), idOf("t", "b")
	lone, behind := idOf("t", "lone"), idOf("t", "behind")
	in := newInbox(t,
		parkedDoc(head, "k", 1, t0, nil),
		parkedDoc(a, "k", 2, t0.Add(time.Second), &gone),
		parkedDoc(b, "k", 3, t0.Add(2*time.Second), &gone),
		parkedDoc(lone, "j", 4, t0.Add(3*time.Second), &gone), // its head was purged: it heads key j now
		parkedDoc(behind, "j", 5, t0.Add(4*time.Second), &gone),
	)
	got, err := in.List(ctx, ParkedFilter[testID]{})
	require.NoError(t, err)
	require.Len(t, got, 5)
	require.Equal(t, head, got[0].Doc.ID)
	require.False(t, got[0].Held())
	require.Nil(t, got[0].Head)
	for _, p := range got[1:3] {
		require.True(t, p.Held())
		require.NotNil(t, p.Head, "%s waits", p.Doc.ID)
		require.Equal(t, head, *p.Head, "%s waits for its key's head now, not the one it was held behind", p.Doc.ID)
	}
	require.True(t, got[3].Held())
	require.Nil(t, got[3].Head, "the head of its key itself: released next")
	require.True(t, got[4].Held())
	require.NotNil(t, got[4].Head, "listed after its key's held head, it still waits for it")
	require.Equal(t, lone, *got[4].Head)

	got, err = in.List(ctx, ParkedFilter[testID]{Limit: 1, ParkedBefore: t0.Add(time.Second)})
	require.NoError(t, err)
	require.Len(t, got, 1)
	got, err = in.List(ctx, ParkedFilter[testID]{IDs: []testID{b, lone}, Topic: "t", ContentSchema: "s"})
	require.NoError(t, err)
	require.Len(t, got, 2)
}

func TestGetRefusesWhatCannotBeRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ok, handled, bad := idOf("t", "ok"), idOf("t", "handled"), idOf("t", "bad")
	handledDoc := parkedDoc(handled, "k", 2, time.Now(), nil)
	handledDoc[2].Value = false // parked: false
	in := newInbox(t, parkedDoc(ok, "k", 1, time.Now(), nil), handledDoc,
		append(parkedDoc(bad, "k", 3, time.Now(), nil), bson.E{Key: store.InboxUnreadable, Value: true}))
	d, err := in.Get(ctx, ok)
	require.NoError(t, err)
	require.Equal(t, ok, d.ID)
	_, err = in.Get(ctx, handled)
	require.ErrorIs(t, err, ErrNotParked)
	_, err = in.Get(ctx, idOf("t", "none"))
	require.ErrorIs(t, err, ErrNotParked)
	_, err = in.Get(ctx, bad)
	require.ErrorIs(t, err, ErrNotRedrivable)
	require.ErrorContains(t, err, bad.String())
}

// A request naming an unreadable record is refused whole; a selection
// without ids requests the heads only, leaving out unreadable records and
// held events.
func TestRequestRedrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	head, held, bad := idOf("t", "head"), idOf("t", "held"), idOf("t", "bad")
	in := newInbox(t, parkedDoc(head, "k", 1, now, nil), parkedDoc(held, "k", 2, now, &head),
		append(parkedDoc(bad, "b", 3, now, nil), bson.E{Key: store.InboxUnreadable, Value: true}))

	_, err := in.RequestRedrive(ctx, ParkedFilter[testID]{IDs: []testID{head, bad}}, false, now)
	require.ErrorIs(t, err, ErrNotRedrivable)
	require.NotContains(t, rawOf(t, in.Coll, head), store.InboxRedriveRequestedAt, "refused whole: nothing marked")

	n, err := in.RequestRedrive(ctx, ParkedFilter[testID]{}, true, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the head only")
	require.NotContains(t, rawOf(t, in.Coll, head), store.InboxRedriveRequestedAt, "a dry run changes nothing")

	_, err = in.Coll.UpdateOne(ctx, bson.D{{Key: store.InboxID, Value: head}},
		bson.D{{Key: "$set", Value: bson.D{{Key: store.InboxRedriveDeferred, Value: "infra: x"}, {Key: store.InboxRedriveNotBefore, Value: now}}}})
	require.NoError(t, err)
	n, err = in.RequestRedrive(ctx, ParkedFilter[testID]{}, false, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	m := rawOf(t, in.Coll, head)
	require.Contains(t, m, store.InboxRedriveRequestedAt)
	require.NotContains(t, m, store.InboxRedriveDeferred, "a new request starts afresh")
	require.NotContains(t, m, store.InboxRedriveNotBefore)

	n, err = in.RequestRedrive(ctx, ParkedFilter[testID]{IDs: []testID{held}}, false, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "named, a held event is requested (and dropped when served)")

	_, err = in.RequestRedrive(ctx, ParkedFilter[testID]{IDs: []testID{idOf("t", "none")}}, false, now)
	require.ErrorIs(t, err, ErrNotParked)
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	head, held := idOf("t", "head"), idOf("t", "held")
	in := newInbox(t, append(parkedDoc(head, "k", 1, now, nil), bson.E{Key: store.InboxRedriveRequestedAt, Value: now}),
		parkedDoc(held, "k", 2, now, &head))
	n, err := in.Purge(ctx, ParkedFilter[testID]{}, true, now)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, true, rawOf(t, in.Coll, head)[store.InboxParked], "a dry run changes nothing")

	n, err = in.Purge(ctx, ParkedFilter[testID]{IDs: []testID{head}}, false, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	m := rawOf(t, in.Coll, head)
	require.Equal(t, false, m[store.InboxParked])
	require.Equal(t, true, m[store.InboxHandled])
	require.Contains(t, m, store.InboxDiscardedAt)
	require.NotContains(t, m, store.InboxRedriveRequestedAt)

	_, err = in.Purge(ctx, ParkedFilter[testID]{IDs: []testID{head}}, false, now)
	require.ErrorIs(t, err, ErrNotParked, "purged already")
}

// One claim wins; the settle of a request leaves a request made again
// meanwhile alone, keeps a deferred one with why, and gives a stopped one
// back.
func TestClaimAndSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	req := time.Now().UTC().Truncate(time.Millisecond)
	id := idOf("t", "e")
	in := newInbox(t, append(parkedDoc(id, "k", 1, req, nil), bson.E{Key: store.InboxRedriveRequestedAt, Value: req}))

	ok, err := in.Claim(ctx, id, req, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = in.Claim(ctx, id, req, time.Now(), time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "claimed already")

	require.NoError(t, in.Settle(ctx, id, req.Add(-time.Second), Outcome{}))
	require.Contains(t, rawOf(t, in.Coll, id), store.InboxRedriveRequestedAt, "another request's settle leaves this one")

	require.NoError(t, in.Settle(ctx, id, req, Outcome{Deferred: true, Why: "locked: held", RetryAfter: time.Hour}))
	m := rawOf(t, in.Coll, id)
	require.Equal(t, "locked: held", m[store.InboxRedriveDeferred])
	require.WithinDuration(t, time.Now().Add(time.Hour), m[store.InboxRedriveNotBefore].(bson.DateTime).Time(), time.Minute)
	ok, err = in.Claim(ctx, id, req, time.Now(), time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "deferred: not due before its next try")

	require.NoError(t, in.Settle(ctx, id, req, Outcome{Stopped: true}))
	require.NotContains(t, rawOf(t, in.Coll, id), store.InboxRedriveNotBefore, "given back at once")
	ok, err = in.Claim(ctx, id, req, time.Now(), time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, in.Settle(ctx, id, req, Outcome{}))
	m = rawOf(t, in.Coll, id)
	require.NotContains(t, m, store.InboxRedriveRequestedAt, "done")
	require.NotContains(t, m, store.InboxRedriveDeferred)
	require.NotContains(t, m, store.InboxRedriveNotBefore)
}

// The loop serves what this process can, leaves the rest, settles each
// served request by its outcome, and returns when its context ends.
func TestRequestsServeAndStop(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	mine, theirs, later := idOf("mine", "e"), idOf("theirs", "e"), idOf("mine", "later")
	in := newInbox(t,
		append(parkedDoc(mine, "k", 1, now, nil), bson.E{Key: store.InboxRedriveRequestedAt, Value: now}),
		append(parkedDoc(theirs, "k", 2, now, nil), bson.E{Key: store.InboxRedriveRequestedAt, Value: now}),
		append(parkedDoc(later, "j", 3, now, nil), bson.E{Key: store.InboxRedriveRequestedAt, Value: now}))
	var mu sync.Mutex
	served := map[testID]int{}
	var failed []error
	r := &Requests[testID]{
		Inbox: in,
		Every: 10 * time.Millisecond,
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Bound: func(d *store.InboxDoc[testID]) (time.Duration, bool) { return time.Second, d.ID.Topic == "mine" },
		Redrive: func(_ context.Context, d *store.InboxDoc[testID]) Outcome {
			mu.Lock()
			defer mu.Unlock()
			served[d.ID]++
			if d.ID == later {
				return Outcome{Deferred: true, Why: "snoozed: later", RetryAfter: time.Hour}
			}
			return Outcome{}
		},
		Failed: func(err error) { mu.Lock(); failed = append(failed, err); mu.Unlock() },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	testkit.Eventually(t, 10*time.Second, "both requests of this process served", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return served[mine] == 1 && served[later] == 1
	})
	testkit.Eventually(t, 10*time.Second, "the served request settled", func() bool {
		var m bson.M
		err := in.Coll.FindOne(context.Background(), bson.D{{Key: store.InboxID, Value: mine}}).Decode(&m)
		_, pending := m[store.InboxRedriveRequestedAt]
		return err == nil && !pending
	})
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, served[theirs], "no handler here: left to another replica")
	require.Contains(t, rawOf(t, in.Coll, theirs), store.InboxRedriveRequestedAt)
	require.Equal(t, "snoozed: later", rawOf(t, in.Coll, later)[store.InboxRedriveDeferred])
	require.Equal(t, 1, served[later], "deferred: not served again before its next try")
	require.Empty(t, failed)
}

// A failed event that cannot be decoded is listed with what can be read;
// retry and discard select by topic and ids and refuse a bad id.
func TestFailedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	coll := mongotest.Start(t).DB(t).Collection("outbox")
	o := Outbox{Coll: coll}
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	good, odd := bson.NewObjectID(), bson.NewObjectID()
	_, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: store.OutboxID, Value: good}, {Key: store.OutboxTopic, Value: "a"}, {Key: store.OutboxPartition, Value: int32(1)},
			{Key: store.OutboxKey, Value: "k"}, {Key: store.OutboxPayload, Value: "{}"}, {Key: store.OutboxPublished, Value: false},
			{Key: store.OutboxFailed, Value: true}, {Key: store.OutboxFailedAt, Value: at}, {Key: store.OutboxError, Value: "too large"}},
		bson.D{{Key: store.OutboxID, Value: odd}, {Key: store.OutboxTopic, Value: "b"}, {Key: store.OutboxPartition, Value: int32(2)},
			{Key: store.OutboxKey, Value: "k"}, {Key: store.OutboxPayload, Value: int32(7)}, {Key: store.OutboxPublished, Value: false},
			{Key: store.OutboxFailed, Value: true}, {Key: store.OutboxFailedAt, Value: at.Add(time.Second)}, {Key: store.OutboxError, Value: "unreadable"}},
	})
	require.NoError(t, err)
	got, err := o.Failed(ctx, FailedFilter{})
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, Failed{ID: good.Hex(), Topic: "a", Partition: 1, PartitionKey: "k", FailedAt: at, Error: "too large", PayloadSize: 2}, got[0])
	require.Equal(t, odd.Hex(), got[1].ID)
	require.Equal(t, "b", got[1].Topic)
	require.Equal(t, "unreadable", got[1].Error, "read field by field")
	got, err = o.Failed(ctx, FailedFilter{Topic: "b", Limit: 5})
	require.NoError(t, err)
	require.Len(t, got, 1)
	none, err := Outbox{Coll: coll.Database().Collection("empty")}.Failed(ctx, FailedFilter{})
	require.NoError(t, err)
	require.NotNil(t, none, "an empty list, not null")

	_, err = o.Retry(ctx, FailedFilter{}, []string{"nope"}, false)
	require.ErrorContains(t, err, `"nope" is not a hex ObjectID`)
	n, err := o.Retry(ctx, FailedFilter{Topic: "a"}, nil, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = o.Retry(ctx, FailedFilter{}, []string{good.Hex()}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = o.Discard(ctx, FailedFilter{}, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the retried one is no longer failed")
	left, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.EqualValues(t, 1, left)
}

// A failed event holds its key's pending events in its partition; a
// keyless one holds nothing.
func TestHeldCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	coll := mongotest.Start(t).DB(t).Collection("outbox")
	doc := func(topic string, p int32, key string, failed bool) bson.D {
		return bson.D{{Key: store.OutboxTopic, Value: topic}, {Key: store.OutboxPartition, Value: p}, {Key: store.OutboxKey, Value: key},
			{Key: store.OutboxPublished, Value: false}, {Key: store.OutboxFailed, Value: failed}}
	}
	_, err := coll.InsertMany(ctx, []any{
		doc("a", 0, "k", true), doc("a", 0, "k", true), doc("a", 0, "k", false), doc("a", 0, "k", false),
		doc("a", 1, "k", false), // another partition: not held
		doc("a", 0, "j", false), // another key: not held
		doc("b", 0, "x", true), doc("b", 0, "x", false),
		doc("c", 0, "", true), doc("c", 0, "", false), // keyless: holds nothing
	})
	require.NoError(t, err)
	all, byTopic, err := Outbox{Coll: coll}.Held(ctx)
	require.NoError(t, err)
	require.Equal(t, Held{Keys: 2, Events: 3}, all)
	require.Equal(t, map[string]Held{"a": {Keys: 1, Events: 2}, "b": {Keys: 1, Events: 1}}, byTopic)
}

// A failed event whose payload is stored out of band is listed with the
// payload's length (its payload_size), not that of its empty payload
// field, whether or not the rest of the document can be decoded.
func TestFailedEventsOutOfBandSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	coll := mongotest.Start(t).DB(t).Collection("outbox")
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	good, odd := bson.NewObjectID(), bson.NewObjectID()
	_, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: store.OutboxID, Value: good}, {Key: store.OutboxTopic, Value: "a"}, {Key: store.OutboxPayload, Value: ""},
			{Key: store.OutboxPayloadRef, Value: good}, {Key: store.OutboxPayloadSize, Value: int64(3 << 20)},
			{Key: store.OutboxPublished, Value: false}, {Key: store.OutboxFailed, Value: true}, {Key: store.OutboxFailedAt, Value: at}},
		bson.D{{Key: store.OutboxID, Value: odd}, {Key: store.OutboxTopic, Value: "a"}, {Key: store.OutboxPartition, Value: "not a number"},
			{Key: store.OutboxPayloadRef, Value: odd}, {Key: store.OutboxPayloadSize, Value: int64(5 << 20)},
			{Key: store.OutboxPublished, Value: false}, {Key: store.OutboxFailed, Value: true}, {Key: store.OutboxFailedAt, Value: at.Add(time.Second)}},
	})
	require.NoError(t, err)
	got, err := Outbox{Coll: coll}.Failed(ctx, FailedFilter{})
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, good.Hex(), got[0].ID)
	require.Equal(t, 3<<20, got[0].PayloadSize)
	require.Equal(t, odd.Hex(), got[1].ID)
	require.Equal(t, 5<<20, got[1].PayloadSize, "read field by field")
}

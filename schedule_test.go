package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/liveness"
	"github.com/event-outbox/outbox/internal/schedule"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// recordAt records one orderPlaced of key with seq, scheduled at due (zero:
// immediate), under idempotency key id.
func recordAt(t *testing.T, c *Client, run, key string, seq int, id string, due time.Time) {
	t.Helper()
	require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: run, OrderID: key, Amount: 1, Seq: seq}, WithIdempotencyKey(id), WithPublishAt(due))
	}))
}

// seqsOf returns the seq of each record of key, in Kafka order.
func seqsOf(t *testing.T, recs []*kgo.Record, key string) []int {
	t.Helper()
	var out []int
	for _, r := range recs {
		if string(r.Key) != key {
			continue
		}
		_, payload, err := decodeRecord(r)
		require.NoError(t, err)
		var e orderPlaced
		require.NoError(t, json.Unmarshal(payload, &e))
		out = append(out, e.Seq)
	}
	return out
}

// A scheduled event waits outside the outbox and is published at its due
// time, counting as recorded then: per key, scheduled events go by due
// time, and an immediate event is never held behind a scheduled one.
func TestScheduledPublishedAtDueTimeInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	runPub(t, c, publisherOptions{})

	now := time.Now()
	dueLate, dueEarly := now.Add(2500*time.Millisecond), now.Add(1500*time.Millisecond)
	recordAt(t, c, b.run, "k", 0, "e0", time.Time{})
	recordAt(t, c, b.run, "k", 1, "e1", dueLate)
	recordAt(t, c, b.run, "k", 2, "e2", dueEarly) // recorded later, due earlier
	recordAt(t, c, b.run, "k", 3, "e3", time.Time{})

	// The scheduled ones wait outside the outbox.
	require.Equal(t, int64(2), count(t, c.outbox, bson.D{}))
	require.Equal(t, int64(2), count(t, c.scheduled, bson.D{{Key: store.ScheduledPromoted, Value: false}}))

	recs := b.kafkaEvents(t, ordersTopic, 4)
	require.Equal(t, []int{0, 3, 2, 1}, seqsOf(t, recs, "k"))
	eventually(t, "all marked published", func() bool { return b.published(t, Config{}) == 4 })
	for _, id := range []string{"e1", "e2"} {
		var d outboxDoc
		require.NoError(t, c.outbox.FindOne(context.Background(), bson.D{{Key: store.OutboxIdempotencyKey, Value: id}}).Decode(&d))
		want := dueLate
		if id == "e2" {
			want = dueEarly
		}
		require.NotNil(t, d.PublishedAt)
		require.False(t, d.PublishedAt.Before(want.Truncate(time.Millisecond)), "%s published at %v, before its due time %v", id, d.PublishedAt, want)
	}
	require.Equal(t, int64(2), count(t, c.scheduled, bson.D{{Key: store.ScheduledPromoted, Value: true}}))
}

func TestCancelScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	ctx := context.Background()
	cancelIn := func(key string) error {
		return c.Transact(ctx, func(ctx context.Context) error { return CancelScheduled(ctx, ordersTopic, key) })
	}

	require.ErrorIs(t, CancelScheduled(ctx, ordersTopic, "x"), ErrNoTransaction)
	require.ErrorIs(t, cancelIn("never"), ErrNotScheduled)
	require.ErrorIs(t, c.Transact(ctx, func(ctx context.Context) error { return CancelScheduled(ctx, "nope", "x") }), ErrUnknownTopic)

	// Cancelled before due: deleted, never promoted; a second cancel finds
	// nothing.
	recordAt(t, c, b.run, "a", 0, "later", time.Now().Add(time.Hour))
	require.NoError(t, cancelIn("later"))
	require.Equal(t, int64(0), count(t, c.scheduled, bson.D{}))
	require.ErrorIs(t, cancelIn("later"), ErrNotScheduled)

	// Scheduled and cancelled in one transaction: nothing is inserted.
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		if err := Record(ctx, orderPlaced{Run: b.run, OrderID: "a", Amount: 1}, WithIdempotencyKey("same"), WithDelay(time.Hour)); err != nil {
			return err
		}
		return CancelScheduled(ctx, ordersTopic, "same")
	}))
	require.Equal(t, int64(0), count(t, c.scheduled, bson.D{}))

	// An aborted cancel leaves the event scheduled.
	recordAt(t, c, b.run, "a", 0, "kept", time.Now().Add(time.Hour))
	boom := errors.New("boom")
	require.ErrorIs(t, c.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, CancelScheduled(ctx, ordersTopic, "kept"))
		return boom
	}), boom)
	require.Equal(t, int64(1), count(t, c.scheduled, bson.D{}))

	// After its due time, once promoted: too late.
	recordAt(t, c, b.run, "a", 1, "soon", time.Now().Add(300*time.Millisecond))
	runPub(t, c, publisherOptions{})
	eventually(t, "promoted", func() bool {
		return count(t, c.outbox, bson.D{{Key: store.OutboxIdempotencyKey, Value: "soon"}}) == 1
	})
	require.ErrorIs(t, cancelIn("soon"), ErrTooLate)
	b.kafkaEvents(t, ordersTopic, 1)
	require.ErrorIs(t, cancelIn("soon"), ErrTooLate)
}

// An operator's cancellation (Admin, outside the service's transactions)
// has the outcomes of CancelScheduled: deleted before due, ErrTooLate
// once promoted, ErrNotScheduled when there is none.
func TestAdminCancelScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	ctx := context.Background()
	require.NoError(t, c.EnsureIndexes(ctx))
	admin := NewAdmin(b.db, "", "")

	cancel := func(topic, key string, dry bool) (int64, error) { return admin.CancelScheduled(ctx, topic, key, dry) }
	_, err := cancel(ordersTopic, "never", true)
	require.ErrorIs(t, err, ErrNotScheduled)
	recordAt(t, c, b.run, "a", 0, "later", time.Now().Add(time.Hour))
	recordAt(t, c, b.run, "a", 1, "kept", time.Now().Add(time.Hour))
	n, err := cancel(ordersTopic, "later", true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, int64(2), count(t, c.scheduled, bson.D{}), "a dry run deletes nothing")
	n, err = cancel(ordersTopic, "later", false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, int64(1), count(t, c.scheduled, bson.D{}), "only the cancelled event is deleted")
	_, err = cancel(ordersTopic, "later", false)
	require.ErrorIs(t, err, ErrNotScheduled)
	_, err = cancel(paymentsTopic, "kept", false)
	require.ErrorIs(t, err, ErrNotScheduled, "another topic's key")

	recordAt(t, c, b.run, "a", 2, "soon", time.Now().Add(300*time.Millisecond))
	runPub(t, c, publisherOptions{})
	eventually(t, "promoted", func() bool {
		return count(t, c.outbox, bson.D{{Key: store.OutboxIdempotencyKey, Value: "soon"}}) == 1
	})
	for _, dry := range []bool{true, false} {
		_, err = cancel(ordersTopic, "soon", dry)
		require.ErrorIs(t, err, ErrTooLate)
	}
	require.Equal(t, int64(1), count(t, c.outbox, bson.D{{Key: store.OutboxIdempotencyKey, Value: "soon"}}), "still published")
}

// Scheduled events survive their publisher: those due while none runs
// are published when one starts, and of two publishers splitting and
// handing over partitions, each event is promoted once.
func TestScheduledAcrossRestartsAndHandover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c1 := b.client(t, cfg)
	require.NoError(t, c1.EnsureIndexes(context.Background()))
	const n = 60
	var firstDue time.Time
	for i := range n {
		// A third due while no publisher runs, the rest spread over the
		// 1.8 s after the next second.
		due := time.Now().Add(300 * time.Millisecond)
		if i < n/3 {
			firstDue = due
		} else {
			due = due.Add(time.Second + time.Duration(i)*30*time.Millisecond)
		}
		recordAt(t, c1, b.run, fmt.Sprintf("k%d", i%7), i, fmt.Sprintf("s%d", i), due)
	}
	require.Equal(t, int64(0), count(t, c1.outbox, bson.D{}), "an event was recorded after its due time: the test ran too slowly")
	time.Sleep(time.Until(firstDue))
	stop1 := runPub(t, c1, publisherOptions{})
	c2 := b.client(t, cfg)
	runPub(t, c2, publisherOptions{})
	eventually(t, "some promoted", func() bool { return count(t, c1.outbox, bson.D{}) >= n/2 })
	stop1() // c2 takes over c1's partitions
	recs := b.kafkaEvents(t, ordersTopic, n)
	seen := map[string]int{}
	for _, r := range recs {
		env, _, err := decodeRecord(r)
		require.NoError(t, err)
		seen[env.IdempotencyKey]++
	}
	require.Len(t, seen, n)
	// Each event promoted once: one outbox document per idempotency key.
	require.Equal(t, int64(n), count(t, c1.outbox, bson.D{}))
	require.Equal(t, int64(n), count(t, c1.scheduled, bson.D{{Key: store.ScheduledPromoted, Value: true}}))
}

// Two promoters of one partition at once (a rebalance, a zombie) promote
// each event once: the second one's transaction meets the first one's
// writes.
func TestPromotionRaceOnePromoterWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	const n = 40
	due := time.Now().Add(time.Second)
	require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
		for i := range n {
			e := orderPlaced{Run: b.run, OrderID: "same", Amount: 1, Seq: i}
			if err := Record(ctx, e, WithIdempotencyKey(fmt.Sprintf("r%d", i)), WithPublishAt(due)); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Equal(t, int64(n), count(t, c.scheduled, bson.D{}), "recorded after the due time: the test ran too slowly")
	var d outboxDoc
	require.NoError(t, c.scheduled.FindOne(context.Background(), bson.D{}).Decode(&d))
	tp := schedule.TopicPartition{Topic: ordersTopic, Partition: d.Partition}
	st := schedule.Mongo{Client: c.cfg.Mongo, Scheduled: c.scheduled, Outbox: c.outbox}
	time.Sleep(time.Until(due))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				left, err := c.scheduled.CountDocuments(context.Background(), bson.D{{Key: store.ScheduledPromoted, Value: false}})
				if err != nil || left == 0 {
					return
				}
				_, _ = st.Promote(context.Background(), tp, time.Now(), 7)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(n), count(t, c.outbox, bson.D{}))
}

// How scheduling crosses Record's other rules: validation and size checks
// apply at Record as for any event; unique idempotency keys span the
// outbox and the scheduled events; a FormatEventOutbox topic publishes a
// scheduled event in its format (the Python library never reads the
// scheduled events' collection: only the record reaches it).
func TestScheduledCrossings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	recordOne := func(c *Client, e Event, opts ...RecordOption) error {
		return c.Transact(ctx, func(ctx context.Context) error { return Record(ctx, e, opts...) })
	}

	t.Run("validation and size", func(t *testing.T) {
		cfg := pubConfig(b)
		cfg.Service += "-size"
		cfg.OutboxCollection = "outbox_size"
		c := b.client(t, cfg)
		require.NoError(t, c.EnsureIndexes(ctx))
		c.topics.Apply(ctx, map[string]int{ordersTopic: 3}, map[string]int{ordersTopic: 300000})
		err := recordOne(c, orderPlaced{Run: b.run}, WithDelay(time.Hour))
		require.ErrorIs(t, err, ErrInvalidEvent)
		big := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: "k", Amount: 1}, Pad: pad(400000)}
		var tooLarge *EventTooLargeError
		require.ErrorAs(t, recordOne(c, big, WithDelay(time.Hour)), &tooLarge)
		require.Equal(t, int64(0), count(t, c.scheduled, bson.D{}))
	})

	t.Run("unique idempotency keys", func(t *testing.T) {
		cfg := pubConfig(b)
		cfg.Service += "-unique"
		cfg.OutboxCollection = "outbox_unique"
		cfg.UniqueIdempotencyKeys = true
		c := b.client(t, cfg)
		require.NoError(t, c.EnsureIndexes(ctx))
		e := orderPlaced{Run: b.run, OrderID: "u", Amount: 1}
		require.NoError(t, recordOne(c, e, WithIdempotencyKey("X"), WithDelay(time.Hour)))
		require.ErrorIs(t, recordOne(c, e, WithIdempotencyKey("X"), WithDelay(time.Hour)), ErrDuplicateEvent)
		require.ErrorIs(t, recordOne(c, e, WithIdempotencyKey("X")), ErrDuplicateEvent)
		require.NoError(t, recordOne(c, e, WithIdempotencyKey("Y")))
		require.ErrorIs(t, recordOne(c, e, WithIdempotencyKey("Y"), WithDelay(time.Hour)), ErrDuplicateEvent)

		// Two transactions racing, one scheduling Z and one recording it
		// for now, both commit (no index spans both collections): the
		// promotion meets the outbox's unique index and marks Z failed,
		// visible with its reason, while the partition's other events
		// are promoted.
		due := time.Now().Add(200 * time.Millisecond)
		require.NoError(t, recordOne(c, e, WithIdempotencyKey("Z"), WithPublishAt(due)))
		require.NoError(t, recordOne(c, e, WithIdempotencyKey("W"), WithPublishAt(due.Add(time.Millisecond))))
		var z store.ScheduledDoc
		require.NoError(t, c.scheduled.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: "Z"}}).Decode(&z))
		twin := z.OutboxDoc
		twin.ID = bson.NewObjectID()
		_, err := c.outbox.InsertOne(ctx, &twin)
		require.NoError(t, err)
		time.Sleep(time.Until(due.Add(time.Millisecond)))
		st := schedule.Mongo{Client: c.cfg.Mongo, Scheduled: c.scheduled, Outbox: c.outbox}
		n, err := st.Promote(ctx, schedule.TopicPartition{Topic: ordersTopic, Partition: z.Partition}, time.Now(), 10)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.NoError(t, c.scheduled.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: "Z"}}).Decode(&z))
		require.True(t, z.Failed)
		require.False(t, z.Promoted)
		require.Contains(t, z.Error, "already in the outbox")
		require.Equal(t, int64(1), count(t, c.outbox, bson.D{{Key: store.OutboxIdempotencyKey, Value: "W"}}))
		// A failed one is cancelled like a waiting one: it was never
		// published.
		require.NoError(t, c.Transact(ctx, func(ctx context.Context) error { return CancelScheduled(ctx, ordersTopic, "Z") }))
	})

	t.Run("event-outbox format", func(t *testing.T) {
		cfg := pubConfig(b)
		cfg.Service += "-eo"
		cfg.PublishTopics = []string{paymentsTopic}
		cfg.WireFormats = map[string]Format{paymentsTopic: FormatEventOutbox}
		c := b.client(t, cfg)
		require.NoError(t, c.EnsureIndexes(ctx))
		require.NoError(t, recordOne(c, paymentDone{Run: b.run, OrderID: "p"}, WithIdempotencyKey("eo1"), WithDelay(300*time.Millisecond)))
		require.Equal(t, int64(1), count(t, c.scheduled, bson.D{}))
		runPub(t, c, publisherOptions{})
		recs := b.kafkaEvents(t, paymentsTopic, 1)
		env, _, err := decodeRecord(recs[0])
		require.NoError(t, err)
		require.Equal(t, FormatEventOutbox, env.Format)
		require.Equal(t, "eo1", env.IdempotencyKey)
	})
}

// Status counts the scheduled events waiting and their next due time, per
// topic and in all.
func TestStatusCountsScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	first := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	recordAt(t, c, b.run, "a", 0, "s1", first.Add(time.Minute))
	recordAt(t, c, b.run, "b", 0, "s2", first)
	st, err := c.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Scheduled)
	require.Equal(t, int64(0), st.Pending)
	require.True(t, st.NextDue.Equal(first), "next due %v, want %v", st.NextDue, first)
	require.Len(t, st.Topics, 1)
	require.Equal(t, int64(2), st.Topics[0].Scheduled)
	require.True(t, st.Topics[0].NextDue.Equal(first))
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"scheduled":2`)
	require.Contains(t, string(raw), `"next_due":"`+first.Format(time.RFC3339Nano))
}

// The scheduled events' stream, opened and then failing at each getMore,
// backs off as its failures repeat instead of reopening at the shortest
// delay each time.
func TestScheduledStreamFailuresBackOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fail points")
	}
	c := b.client(t, pubConfig(b))
	set := schedule.NewSet(schedule.Config{Store: schedule.Mongo{Client: c.cfg.Mongo, Scheduled: c.scheduled, Outbox: c.outbox}})
	defer set.Close()
	var mu sync.Mutex
	opened := 0
	w := &schedule.Watch{Coll: c.scheduled, Set: set, Backoff: c.cfg.backoff(), MaxAwait: 50 * time.Millisecond,
		Opened: func() { mu.Lock(); opened++; mu.Unlock() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	reopens := func() int { mu.Lock(); defer mu.Unlock(); return opened }
	eventually(t, "stream open", func() bool { return reopens() >= 1 })

	before := reopens()
	stop := b.mongo.Server.FailCommand(mongofake.FailPoint{Commands: []string{"getMore"}, ErrorCode: 286, ErrorMessage: "ChangeStreamHistoryLost (test)"})
	time.Sleep(1500 * time.Millisecond) // the failing window
	stop()
	n := reopens() - before
	t.Logf("%d reopens in a 1.5 s failing window (backoff %v to %v)", n, c.cfg.RetryMinBackoff, c.cfg.RetryMaxBackoff)
	// At the shortest delay (20 ms) it would reopen about 60 times; backing
	// off to 100 ms, about 16.
	require.Less(t, n, 30, "reopened without backing off")
}

// A process killed in the middle of a promotion leaves its transaction
// open, its writes on the scheduled events it read; MongoDB would end it
// only at its transaction lifetime (ten minutes here), and until then the
// next owner of the partition meets a write conflict at every promotion.
// The promotion's session is in the dead process's liveness record, so the
// next owner ends it (a reap of the publisher group) and promotes.
func TestTakeoverEndsADeadPromotersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(10*time.Minute)))
	if b.mongo.Real {
		t.Skip("needs the embedded server's crash points and long transaction lifetime")
	}
	ctx := context.Background()
	cfg := pubConfig(b)
	cfg.DrainTimeout = time.Second

	// The events, recorded by a Client that never runs: the dying one's
	// first insert is its promotion's.
	rec := b.client(t, cfg)
	require.NoError(t, rec.EnsureIndexes(ctx))
	due := time.Now().Add(time.Second)
	const n = 3
	for i := range n {
		recordAt(t, rec, b.run, "k", i, fmt.Sprintf("e%d", i), due)
	}

	// The promoter that dies: at the outbox insert of its promotion, after
	// it marked the events promoted in its open transaction.
	netA := &cutNet{}
	mA := b.mongo.NewClient(t, options.Client().SetDialer(netA).SetAppName("dying-promoter"))
	crashed, err := b.mongo.Server.Crash(mongofake.Crash{AppName: "dying-promoter", Commands: []string{"insert"}, At: 1})
	require.NoError(t, err)
	cfgA := cfg
	cfgA.Mongo = mA
	cfgA.KafkaOptions = []kgo.Opt{kgo.Dialer(netA.DialContext)}
	a := b.client(t, cfgA)
	ctxA, stopA := context.WithCancel(ctx)
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		_ = a.Run(ctxA) // killed: whatever it returns
	}()
	t.Cleanup(func() {
		stopA()
		<-doneA
	})
	select {
	case <-crashed.Fired():
	case <-time.After(30 * time.Second):
		t.Fatal("the promoter never reached the outbox insert of its promotion")
	}
	// kill -9: connections closed, nothing more reaches the servers.
	netA.kill()
	stopA()

	// The dead promoter's transaction holds the events.
	probe, err := b.mongo.Client.StartSession()
	require.NoError(t, err)
	require.NoError(t, probe.StartTransaction())
	_, err = rec.scheduled.UpdateMany(mongo.NewSessionContext(ctx, probe), bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "probe", Value: true}}}})
	require.True(t, store.IsWriteConflict(err), "the dead promoter's transaction holds the scheduled events: %v", err)
	require.NoError(t, probe.AbortTransaction(ctx))
	probe.EndSession(ctx)
	_, replicas, err := liveness.Read(ctx, rec.meta)
	require.NoError(t, err)
	var deadID string
	for _, r := range replicas {
		if r.SessionPool == liveness.SessionPool(mA) {
			deadID = r.ID[len(liveness.IDPrefix):]
		}
	}
	require.NotEmpty(t, deadID, "the dead promoter's liveness record")

	var mu sync.Mutex
	var reaped []string
	survivor := b.client(t, cfg)
	survivor.test.reapedHook = func(_ context.Context, id string) {
		mu.Lock()
		defer mu.Unlock()
		reaped = append(reaped, id)
	}
	start(t, survivor)
	eventually(t, "the events promoted by the next owner", func() bool {
		return count(t, rec.outbox, bson.D{{Key: store.OutboxKey, Value: "k"}}) == n
	})
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, reaped, deadID, "the next owner ended the dead promoter's sessions")
	require.Equal(t, int64(n), count(t, rec.scheduled, bson.D{{Key: store.ScheduledPromoted, Value: true}}))
}

// A scheduled event counts as recorded once, when the transaction that
// recorded it commits (a cancelled one too), and as promoted when the
// owner of its partition moves it into the outbox; its promotion is never
// counted as a second recording.
func TestScheduledEventsCountAtRecordAndAtPromotion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	ctx := context.Background()
	require.NoError(t, c.EnsureIndexes(ctx))
	topic := itel.AttrTopic.String(ordersTopic)
	recordAt(t, c, b.run, "k", 0, "now", time.Time{})
	recordAt(t, c, b.run, "k", 1, "soon", time.Now().Add(300*time.Millisecond))
	recordAt(t, c, b.run, "k", 2, "cancelled", time.Now().Add(time.Hour))
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error { return CancelScheduled(ctx, ordersTopic, "cancelled") }))
	m := o.collect(t)
	require.EqualValues(t, 3, sumOf(m["outbox.events.recorded"], topic), "every event counts at its commit, scheduled or not")
	require.Zero(t, sumOf(m["outbox.scheduled.promoted"], topic))

	runPub(t, c, publisherOptions{})
	eventually(t, "the scheduled event promoted", func() bool {
		return sumOf(o.collect(t)["outbox.scheduled.promoted"], topic) == 1
	})
	b.kafkaEvents(t, ordersTopic, 2)
	m = o.collect(t)
	require.EqualValues(t, 3, sumOf(m["outbox.events.recorded"], topic), "a promotion is not a second recording")
	require.EqualValues(t, 1, sumOf(m["outbox.scheduled.promoted"], topic))
}

package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// Tests of the consumer's corner cases around held keys, re-drives and the
// Python library's records: each reproduces a scenario and checks what the
// consumer must do in it.

// A record without an idempotency key (its envelope unreadable) that arrives
// behind a held key is held, and when its turn comes it is parked for good:
// never handled under the key invented from its position, never re-driven.
func TestHeldRecordWithoutIdempotencyKeyIsNeverHandled(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	h.setFailing("a1")
	start(t, c)
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	eventually(t, "a1 parked", func() bool { return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 1 })
	// The same key-less record delivered twice (a producer retry), then a
	// good event of the key.
	for range 2 {
		noKey := encodeRecord(&Envelope{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", PartitionKey: "A", OccurredAt: time.Now()},
			b.payload(t, "ghost", 2))
		for i := range noKey.Headers {
			if noKey.Headers[i].Key == HeaderIdempotencyKey {
				noKey.Headers = append(noKey.Headers[:i], noKey.Headers[i+1:]...)
				break
			}
		}
		b.produceRaw(t, noKey)
	}
	b.produce(t, b.keyed("a3", "A"), b.payload(t, "a3", 3))
	eventually(t, "three events held", func() bool { return h.held(t) == 3 })
	require.EqualValues(t, 2, count(t, c.inbox, bson.D{{Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}, {Key: "unreadable", Value: true}}),
		"a held record keeps its unreadable flag")

	h.setFailing()
	require.NoError(t, c.Redrive(ctx, InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a1"}))
	// The release reaches the first key-less record and parks it for good:
	// a3 waits behind it.
	eventually(t, "the key-less record parked as the head", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}, {Key: "unreadable", Value: true},
			{Key: "held_by", Value: bson.D{{Key: "$exists", Value: false}}}}) == 1
	})
	require.Equal(t, []string{"a1"}, h.effectKeys(t, "A"))
	h.mu.Lock()
	require.Zero(t, h.calls["ghost"], "the key-less record never runs")
	h.mu.Unlock()
	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	for _, p := range parked {
		if p.State == ParkedStateParked {
			require.ErrorIs(t, c.Redrive(ctx, p.ID), ErrNotRedrivable)
			require.Contains(t, p.LastError, "idempotency-key")
		}
	}
	// Purging the key-less records lets a3 go.
	_, err = c.Admin().PurgeParked(ctx, ParkedFilter{IDs: unreadableIDs(t, c)}, false)
	require.NoError(t, err)
	eventually(t, "a3 released", func() bool { return len(h.effectKeys(t, "A")) == 2 })
	require.Equal(t, []string{"a1", "a3"}, h.effectKeys(t, "A"))
	h.mu.Lock()
	require.Zero(t, h.calls["ghost"])
	h.mu.Unlock()
}

func unreadableIDs(t *testing.T, c *Client) []InboxID {
	t.Helper()
	cur, err := c.inbox.Find(context.Background(), bson.D{{Key: "unreadable", Value: true}})
	require.NoError(t, err)
	var docs []struct {
		ID InboxID `bson:"_id"`
	}
	require.NoError(t, cur.All(context.Background(), &docs))
	ids := make([]InboxID, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids
}

// A re-drive whose context ends while a released event's handler runs leaves
// that event held as it was (no attempt, no error): the cancellation is not a
// failure of the event. The partition's consumer goes on with the release.
func TestCancelledReleaseLeavesTheHeldEventWaiting(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	c := h.c
	// The first run of a2's handler waits until the test cancelled the
	// re-drive; the next runs go through. That first run is the re-drive's
	// inline release in most runs; on a loaded machine the partition's
	// consumer (rechecking its held keys every 20 ms) may release a2 first:
	// then the re-drive meets its lock and is cancelled while it waits, and
	// the consumer's run goes on once the test cancelled (before, it
	// waited for its own context, which nothing cancels, and the test timed
	// out: 2 runs in 15 under load).
	entered, canceled := make(chan struct{}), make(chan struct{})
	var first sync.Once
	MustHandle(c, func(ctx context.Context, e paymentDone, m Metadata) error { return nil }) // a second topic, unused
	h.blockOnce = func(ctx context.Context, id string) {
		if id != "a2" {
			return
		}
		first.Do(func() {
			close(entered)
			<-canceled
		})
	}
	head := h.heldChain(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Redrive(ctx, head) }()
	<-entered
	cancel()
	close(canceled)
	require.NoError(t, <-done, "the head itself was handled")
	var a2 inboxDoc
	require.NoError(t, c.inbox.FindOne(context.Background(), bson.D{{Key: "_id.idempotency_key", Value: "a2"}}).Decode(&a2))
	if a2.Parked { // not released by the partition's consumer yet
		require.NotNil(t, a2.HeldBy, "still held, not parked as a new head")
		require.Zero(t, a2.Attempts, "a cancellation is no attempt")
		require.NotContains(t, a2.LastError, "context canceled")
	}
	eventually(t, "a2 and a3 released by the partition's consumer", func() bool { return len(h.effectKeys(t, "A")) == 3 })
	require.Equal(t, []string{"a1", "a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
}

// With more than a thousand keys held, a key whose head was purged is still
// released: releases are the partition owner's, read from every held key of
// its partition, not a capped sweep. The held keys are seeded in the inbox as
// the consumer stores them.
func TestReleaseNotStarvedByThousandsOfHeldKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "many")
	c := b.client(t, cfg)
	c.test.redriveEvery = 100 * time.Millisecond
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	ctx := context.Background()
	require.NoError(t, c.EnsureIndexes(ctx))
	const keys = 1100
	now := time.Now().UTC()
	doc := func(id, key string, partition int32, offset int64, heldBy *InboxID) bson.D {
		d := bson.D{{Key: "_id", Value: InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: id}},
			{Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "parked_at", Value: now},
			{Key: "partition", Value: partition}, {Key: "offset", Value: offset}, {Key: "partition_key", Value: key},
			{Key: "received_at", Value: now}, {Key: "attempts", Value: int32(0)},
			{Key: "payload", Value: string(b.payload(t, id, 1))}}
		if heldBy != nil {
			return append(d, bson.E{Key: "held_by", Value: *heldBy}, bson.E{Key: "last_error", Value: "held behind " + heldBy.String()})
		}
		return append(d, bson.E{Key: "park_reason", Value: "handler_error"}, bson.E{Key: "last_error", Value: "down"}, bson.E{Key: "attempts", Value: int32(10)})
	}
	docs := make([]any, 0, keys+2)
	for i := range keys {
		docs = append(docs, doc(fmt.Sprintf("poison-%d", i), fmt.Sprintf("key-%04d", i), int32(i%3), int64(i), nil))
	}
	z1 := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "z1"}
	docs = append(docs, doc("z1", "Z", 1, 5000, nil), doc("z2", "Z", 1, 5001, &z1))
	_, err := c.inbox.InsertMany(ctx, docs)
	require.NoError(t, err)

	start(t, c)
	_, err = c.Admin().PurgeParked(ctx, ParkedFilter{IDs: []InboxID{z1}}, false)
	require.NoError(t, err)
	eventually(t, "z2 released while 1100 keys stay held", func() bool {
		return count(t, effects, bson.D{{Key: "key", Value: "z2"}}) == 1
	})
	require.EqualValues(t, keys, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
}

// libraryBody is a Python event-outbox library record's body.
func libraryBody(b *bundle, topic, idemKey string, partKey int, orderID string) []byte {
	body := `{"topic":"` + topic + `","content_schema":"OrderPlaced.v1",`
	if idemKey != "" {
		body += `"idempotency_key":"` + idemKey + `",`
	}
	return []byte(body + `"partition_key":` + itoa(partKey) + `,"occurred_at":"2026-01-02T03:04:05.123456Z",` +
		`"run":"` + b.run + `","order_id":"` + orderID + `","amount":1}`)
}

// The library writes the Kafka topic it produced to in its body,
// Config.TopicPrefix included: such a record is handled, not parked as
// unreadable.
func TestPythonRecordOnPrefixedTopicIsHandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "py"))
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: libraryBody(b, b.kafkaTopic(ordersTopic), "py-1", 7, "o-1")})
	eventually(t, "handled", func() bool { return calls.Load() == 1 })
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
	var d inboxDoc
	require.NoError(t, c.inbox.FindOne(context.Background(), bson.D{}).Decode(&d))
	require.Equal(t, InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "py-1"}, d.ID)
	require.Equal(t, "7", d.PartitionKey)
}

// A library record without an idempotency key is parked under its partition
// key, so that the later events of its key wait behind it instead of
// overtaking it.
func TestPythonRecordWithoutIdempotencyKeyHoldsItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "py"))
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: libraryBody(b, ordersTopic, "", 7, "o-1")})
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: libraryBody(b, ordersTopic, "py-2", 7, "o-2")})
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: libraryBody(b, ordersTopic, "py-3", 8, "o-3")})
	eventually(t, "the other key handled", func() bool { return calls.Load() == 1 })
	eventually(t, "the later event of key 7 held", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "py-2"}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}) == 1
	})
	var head inboxDoc
	require.NoError(t, c.inbox.FindOne(context.Background(), bson.D{{Key: "unreadable", Value: true}}).Decode(&head))
	require.Equal(t, "7", head.PartitionKey)
	require.Contains(t, head.LastError, "idempotency_key")
}

// A service that took over a Python event-outbox database keeps the library's
// published documents, which have no top-level identity: with
// UniqueIdempotencyKeys it must still start, and still refuse a duplicate of
// its own events. An index of the earlier, non-partial definition is replaced.
func TestMigratedServiceWithUniqueIdempotencyKeysStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedLibraryDatabase(t, b.db)
	ctx := context.Background()
	lib := b.db.Collection(libOutbox)
	// A second published library document: two without top-level fields.
	_, err := lib.InsertOne(ctx, bson.D{{Key: "payload", Value: bson.D{{Key: "topic", Value: paymentsTopic}, {Key: "idempotency_key", Value: "lib-published-2"}}},
		{Key: "published", Value: true}, {Key: "published_at", Value: time.Now().UTC()}})
	require.NoError(t, err)
	admin := NewAdmin(b.db, libOutbox, libInbox)
	_, err = admin.MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, false)
	require.NoError(t, err)
	// The earlier definition of the index, as a service of the previous
	// version would have left it.
	_, err = lib.Indexes().CreateOne(ctx, mongoIndex(store.OutboxIdempotencyKeys(), store.IndexOutboxIdempotency, true))
	require.Error(t, err, "the library's documents collide in a full unique index")

	cfg := b.config("migrated")
	cfg.OutboxCollection, cfg.InboxCollection = libOutbox, libInbox
	cfg.UniqueIdempotencyKeys = true
	c := b.client(t, cfg)
	require.NoError(t, c.EnsureIndexes(ctx))
	rec := func() error {
		return c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, paymentDone{Run: b.run, OrderID: "o-9"}, WithIdempotencyKey("dup"))
		})
	}
	require.NoError(t, rec())
	require.ErrorIs(t, rec(), ErrDuplicateEvent)
}

// mongoIndex is a plain index model.
func mongoIndex(keys bson.D, name string, unique bool) mongo.IndexModel {
	return mongo.IndexModel{Keys: keys, Options: options.Index().SetName(name).SetUnique(unique)}
}

// A shutdown does not wait for a release of held events
// to finish: the release stops between two transactions, and the
// partition's consumer goes on with it after the restart.
func TestShutdownDoesNotWaitForAWholeRelease(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	const held = 40
	h.setFailing("a0")
	stop := start(t, c)
	for i := range held + 1 {
		id := fmt.Sprintf("a%d", i)
		b.produce(t, b.keyed(id, "A"), b.payload(t, id, i))
	}
	eventually(t, "40 held", func() bool { return h.held(t) == held })
	h.setFailing()
	var released atomic.Int64
	h.blockOnce = func(ctx context.Context, id string) {
		released.Add(1)
		time.Sleep(50 * time.Millisecond) // each held event takes a while
	}
	_, err := c.Admin().RequestRedrive(context.Background(), ParkedFilter{IDs: []InboxID{{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a0"}}}, false)
	require.NoError(t, err)
	eventually(t, "the release under way", func() bool { return released.Load() >= 3 })
	stop()
	require.Less(t, len(h.effectKeys(t, "A")), held+1, "Run returned only once the whole release was done")

	// Restarted, the consumer goes on with the release, in order.
	c2 := b.client(t, c.cfg)
	c2.test.redriveEvery = 20 * time.Millisecond
	h.c = c2
	h.register(c2)
	start(t, c2)
	eventually(t, "every event released", func() bool { return len(h.effectKeys(t, "A")) == held+1 })
	want := make([]string, held+1)
	for i := range want {
		want[i] = fmt.Sprintf("a%d", i)
	}
	require.Equal(t, want, h.effectKeys(t, "A"))
}

// The held events of the earlier storage (chains of held_by pointers to an
// anchor, the anchor closed with released_at once its chain moved) are read as
// key sequences without any conversion: a chain whose anchor was handled
// before its release finished (the orphan the old sweep looked for) is
// released, in order, by the partition's consumer; a chain whose anchor is
// still parked stays held behind it.
func TestEarlierHeldChainsAreReleasedInOrder(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	require.NoError(t, c.EnsureIndexes(ctx))
	now := time.Now().UTC()
	id := func(k string) InboxID {
		return InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: k}
	}
	doc := func(k, key string, offset int64, extra ...bson.E) bson.D {
		d := bson.D{{Key: "_id", Value: id(k)}, {Key: "handled", Value: false}, {Key: "parked", Value: true},
			{Key: "parked_at", Value: now}, {Key: "partition", Value: int32(0)}, {Key: "offset", Value: offset},
			{Key: "partition_key", Value: key}, {Key: "received_at", Value: now}, {Key: "attempts", Value: int32(0)},
			{Key: "payload", Value: string(b.payload(t, k, int(offset)))}}
		return append(d, extra...)
	}
	anchorA, anchorB := id("a1"), id("b1")
	_, err := c.inbox.InsertMany(ctx, []any{
		// Key A: the anchor was handled and closed; two events still held
		// behind it (a release cut short).
		bson.D{{Key: "_id", Value: anchorA}, {Key: "handled", Value: true}, {Key: "handled_at", Value: now}, {Key: "parked", Value: false},
			{Key: "partition", Value: int32(0)}, {Key: "offset", Value: int64(1)}, {Key: "partition_key", Value: "A"},
			{Key: "received_at", Value: now}, {Key: "released_at", Value: now}, {Key: "held_tail", Value: int64(3)}},
		doc("a2", "A", 2, bson.E{Key: "held_by", Value: anchorA}, bson.E{Key: "last_error", Value: "held behind " + anchorA.String()}),
		doc("a3", "A", 3, bson.E{Key: "held_by", Value: anchorA}, bson.E{Key: "last_error", Value: "held behind " + anchorA.String()}),
		// Key B: the anchor is still parked, one event held behind it.
		doc("b1", "B", 4, bson.E{Key: "last_error", Value: "down"}, bson.E{Key: "attempts", Value: int32(2)}),
		doc("b2", "B", 5, bson.E{Key: "held_by", Value: anchorB}, bson.E{Key: "last_error", Value: "held behind " + anchorB.String()}),
	})
	require.NoError(t, err)
	start(t, c)
	eventually(t, "key A's held events released", func() bool { return len(h.effectKeys(t, "A")) == 2 })
	require.Equal(t, []string{"a2", "a3"}, h.effectKeys(t, "A"))
	require.Empty(t, h.effectKeys(t, "B"), "B still waits behind its parked anchor")
	require.EqualValues(t, 1, h.held(t))
	require.NoError(t, c.Redrive(ctx, anchorB))
	require.Equal(t, []string{"b1", "b2"}, h.effectKeys(t, "B"))
}

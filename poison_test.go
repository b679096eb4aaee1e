package outbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// holdEnv is a consumer (default PoisonPolicy: HoldKey), started by
// holdSetup, whose handler fails for the order ids in failing, and records
// the order of the effects.
type holdEnv struct {
	b       *bundle
	c       *Client
	mu      sync.Mutex
	failing map[string]bool
	// failOnce fails the next run of an order id only.
	failOnce map[string]bool
	calls    map[string]int
	// blockOnce, when set, runs at the start of every run of the handler
	// (a test hook that blocks or slows chosen events).
	blockOnce func(ctx context.Context, orderID string)
}

func holdSetup(t *testing.T, tweak func(*Config)) *holdEnv {
	t.Helper()
	b := setup(t)
	cfg := consumerConfig(b, "hold")
	cfg.MaxAttempts = 2
	if tweak != nil {
		tweak(&cfg)
	}
	c := b.client(t, cfg)
	c.test.redriveEvery = 20 * time.Millisecond
	h := &holdEnv{b: b, c: c, failing: map[string]bool{}, failOnce: map[string]bool{}, calls: map[string]int{}}
	h.register(c)
	return h
}

// register registers the environment's handler on c.
func (h *holdEnv) register(c *Client) {
	b := h.b
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		if f := h.blockOnce; f != nil {
			f(ctx, e.OrderID)
		}
		h.mu.Lock()
		fail := h.failing[e.OrderID] || h.failOnce[e.OrderID]
		delete(h.failOnce, e.OrderID)
		h.calls[e.OrderID]++
		h.mu.Unlock()
		if fail {
			return errors.New("downstream down for " + e.OrderID)
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "pk", Value: m.PartitionKey}, {Key: "seq", Value: e.Seq}})
		return err
	})
}

func (h *holdEnv) setFailing(ids ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.failing)
	for _, id := range ids {
		h.failing[id] = true
	}
}

// heldChain starts the consumer with a1 failing, records a1, a2 and a3 of
// key A, waits until a2 and a3 are held behind the parked a1, heals the
// handler and returns a1's id.
func (h *holdEnv) heldChain(t *testing.T) InboxID {
	t.Helper()
	h.setFailing("a1")
	start(t, h.c)
	for i, id := range []string{"a1", "a2", "a3"} {
		h.b.produce(t, h.b.keyed(id, "A"), h.b.payload(t, id, i))
	}
	eventually(t, "two held", func() bool { return h.held(t) == 2 })
	h.setFailing()
	return InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a1"}
}

// effectKeys returns the idempotency keys of the effects of partition key
// pk, in the order they were written.
func (h *holdEnv) effectKeys(t *testing.T, pk string) []string {
	t.Helper()
	cur, err := h.b.db.Collection("effects").Find(context.Background(), bson.D{{Key: "pk", Value: pk}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, err)
	var docs []struct {
		Key string `bson:"key"`
	}
	require.NoError(t, cur.All(context.Background(), &docs))
	keys := make([]string, len(docs))
	for i, d := range docs {
		keys[i] = d.Key
	}
	return keys
}

func (h *holdEnv) held(t *testing.T) int64 {
	return count(t, h.c.inbox, bson.D{{Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}})
}

// A parked event holds its key: the later events of the key are parked behind
// it, in order, other keys move on, and re-driving it releases them in order.
// The key is free afterwards.
func TestHoldKeyParksLaterEventsAndRedriveReleasesThem(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	h.setFailing("a1")
	start(t, c)
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	b.produce(t, b.keyed("a2", "A"), b.payload(t, "a2", 2))
	b.produce(t, b.keyed("b1", "B"), b.payload(t, "b1", 1))
	b.produce(t, b.keyed("a3", "A"), b.payload(t, "a3", 3))
	b.produce(t, b.keyed("b2", "B"), b.payload(t, "b2", 2))
	eventually(t, "key B handled", func() bool { return len(h.effectKeys(t, "B")) == 2 })
	eventually(t, "a2 and a3 held", func() bool { return h.held(t) == 2 })
	require.Empty(t, h.effectKeys(t, "A"))

	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 3)
	states := map[string]ParkedEvent{}
	for _, p := range parked {
		states[p.ID.IdempotencyKey] = p
	}
	head := states["a1"].ID
	require.Equal(t, ParkedStateParked, states["a1"].State)
	require.Nil(t, states["a1"].HeldBy)
	require.EqualValues(t, 2, states["a1"].Attempts)
	for _, k := range []string{"a2", "a3"} {
		require.Equal(t, ParkedStateHeld, states[k].State, k)
		require.Equal(t, &head, states[k].HeldBy, k)
		require.Zero(t, states[k].Attempts, "held events never ran")
	}
	st, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Parked)
	require.EqualValues(t, 2, st.Held)

	// A held event is not re-driven on its own.
	require.ErrorIs(t, c.Redrive(ctx, states["a2"].ID), ErrHeld)

	// The head is re-driven: it and its held events are handled, in order.
	h.setFailing()
	require.NoError(t, c.Redrive(ctx, head))
	require.Equal(t, []string{"a1", "a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
	require.EqualValues(t, 0, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))

	// The key is free: a later event is handled at once.
	b.produce(t, b.keyed("a4", "A"), b.payload(t, "a4", 4))
	eventually(t, "a4 handled", func() bool { return len(h.effectKeys(t, "A")) == 4 })
	require.Equal(t, []string{"a1", "a2", "a3", "a4"}, h.effectKeys(t, "A"))
}

// A held event that fails while released becomes the new head; the rest stay
// held behind it; a re-drive request served by the consumer releases them.
func TestHoldKeyFailingHeldEventBecomesHead(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	h.setFailing("a1")
	start(t, c)
	for i, id := range []string{"a1", "a2", "a3", "a4"} {
		b.produce(t, b.keyed(id, "A"), b.payload(t, id, i))
	}
	eventually(t, "three held", func() bool { return h.held(t) == 3 })
	h.setFailing("a2")
	head := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a1"}
	require.NoError(t, c.Redrive(ctx, head))
	require.Equal(t, []string{"a1"}, h.effectKeys(t, "A"))
	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 3)
	newHead := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a2"}
	for _, p := range parked {
		switch p.ID.IdempotencyKey {
		case "a2":
			require.Equal(t, ParkedStateParked, p.State)
			require.Contains(t, p.LastError, "downstream down for a2")
		default:
			require.Equal(t, ParkedStateHeld, p.State)
			require.Equal(t, &newHead, p.HeldBy)
		}
	}
	// While the chain waits, a new event of the key is held behind the new
	// head (the worker learns the move from the closed anchor).
	b.produce(t, b.keyed("a5", "A"), b.payload(t, "a5", 5))
	eventually(t, "a5 held", func() bool { return h.held(t) == 3 })
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "a5"}, {Key: "held_by", Value: newHead}}))

	h.setFailing()
	n, err := c.Admin().RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{newHead}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "the rest released", func() bool { return len(h.effectKeys(t, "A")) == 5 })
	require.Equal(t, []string{"a1", "a2", "a3", "a4", "a5"}, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
}

// A held event whose handler fails once while released runs again, as a
// delivered event would, instead of parking at its first failure and
// waiting for another re-drive.
func TestHoldKeyReleaseRetriesTransientFailure(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	c := h.c
	// Redrive alone releases the chain: the re-drive loop's orphan-chain
	// sweep would release it too, concurrently, and could handle a2 while
	// the failed run's attempt is being counted (that race is covered by
	// TestInterruptedReleaseIsResumed and the chaos runs).
	c.test.redriveEvery = time.Hour
	ctx := context.Background()
	head := h.heldChain(t)
	h.mu.Lock()
	h.failOnce["a2"] = true
	h.mu.Unlock()
	require.NoError(t, c.Redrive(ctx, head))
	require.Equal(t, []string{"a1", "a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
	require.EqualValues(t, 0, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "a2"}, {Key: "attempts", Value: 1}, {Key: "handled", Value: true}}),
		"the failed run is counted")
}

// An event parked by an earlier owner of the partition after this worker
// loaded its held keys (a replica still retrying it when it lost the
// partition) reaches the worker as already parked: the worker must hold its
// key from then on. Skipping the event as a duplicate would handle the later
// events of the key out of order (694 handled after 697 once re-driven).
func TestEventParkedByEarlierOwnerHoldsItsKey(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	start(t, c)
	b.produce(t, b.keyed("a0", "A"), b.payload(t, "a0", 0))
	eventually(t, "a0 handled", func() bool { return len(h.effectKeys(t, "A")) == 1 })
	var a0 struct {
		Partition int32 `bson:"partition"`
		Offset    int64 `bson:"offset"`
	}
	require.NoError(t, c.inbox.FindOne(ctx, bson.D{{Key: "_id.idempotency_key", Value: "a0"}}).Decode(&a0))

	// a1 as the earlier owner parks it: after its attempts, before this
	// worker gets its record.
	a1 := InboxID{Topic: ordersTopic, ContentSchema: orderPlaced{}.ContentSchema(), IdempotencyKey: "a1"}
	_, err := c.inbox.InsertOne(ctx, bson.D{
		{Key: "_id", Value: a1}, {Key: "handled", Value: false}, {Key: "parked", Value: true},
		{Key: "parked_at", Value: time.Now().UTC()}, {Key: "attempts", Value: int32(2)},
		{Key: "last_error", Value: "downstream down for a1"}, {Key: "partition", Value: a0.Partition},
		{Key: "offset", Value: a0.Offset + 1}, {Key: "partition_key", Value: "A"},
		{Key: "received_at", Value: time.Now().UTC()}, {Key: "payload", Value: string(b.payload(t, "a1", 1))},
	})
	require.NoError(t, err)
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	b.produce(t, b.keyed("a2", "A"), b.payload(t, "a2", 2))
	b.produce(t, b.keyed("b1", "B"), b.payload(t, "b1", 1))
	eventually(t, "b1 handled", func() bool { return len(h.effectKeys(t, "B")) == 1 })
	eventually(t, "a2 held behind a1", func() bool { return h.held(t) == 1 })
	require.Equal(t, []string{"a0"}, h.effectKeys(t, "A"), "a later event of the key overtook the parked one")
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "a2"}, {Key: "held_by", Value: a1}}))

	require.NoError(t, c.Redrive(ctx, a1))
	require.Equal(t, []string{"a0", "a1", "a2"}, h.effectKeys(t, "A"))
}

// Purging the head releases the events held behind it,
// in order.
func TestHoldKeyPurgeReleasesHeld(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b, c := h.b, h.c
	ctx := context.Background()
	head := h.heldChain(t)
	n, err := c.Admin().PurgeParked(ctx, ParkedFilter{IDs: []InboxID{head}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "held events released", func() bool { return len(h.effectKeys(t, "A")) == 2 })
	require.Equal(t, []string{"a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
	require.EqualValues(t, 0, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
	b.produce(t, b.keyed("a4", "A"), b.payload(t, "a4", 4))
	eventually(t, "a4 handled", func() bool { return len(h.effectKeys(t, "A")) == 3 })
}

// A release cut short (the process died after the head was handled or
// purged, before its held events were released) is finished by a running
// consumer: the held events are handled, in order, without an operator.
func TestInterruptedReleaseIsResumed(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	c := h.c
	ctx := context.Background()
	head := h.heldChain(t)
	// What a purge or a re-drive of the head writes before it releases the
	// chain; the release itself never runs.
	_, err := c.inbox.UpdateOne(ctx, bson.D{{Key: "_id", Value: head}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "parked", Value: false}, {Key: "handled", Value: true}, {Key: "handled_at", Value: time.Now()}}}})
	require.NoError(t, err)
	eventually(t, "held events released", func() bool { return len(h.effectKeys(t, "A")) == 2 })
	require.Equal(t, []string{"a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
}

// Batching respects held keys, and a restarted consumer
// knows the held keys of its partitions.
func TestHoldKeyBatchesAndRestart(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	b, c := h.b, h.c
	h.setFailing("a0")
	// A backlog that arrives in one poll: batches of mixed keys.
	b.produce(t, b.keyed("a0", "A"), b.payload(t, "a0", 0))
	for i := 1; i <= 20; i++ {
		key, id := "B", "b"+itoa(i)
		if i%2 == 0 {
			key, id = "A", "a"+itoa(i)
		}
		b.produce(t, b.keyed(id, key), b.payload(t, id, i))
	}
	stop := start(t, c)
	eventually(t, "key B handled", func() bool { return len(h.effectKeys(t, "B")) == 10 })
	eventually(t, "key A held", func() bool { return h.held(t) == 10 })
	require.Empty(t, h.effectKeys(t, "A"))
	stop()

	// A new consumer of the group loads the held keys.
	c2 := b.client(t, c.cfg)
	effects := b.db.Collection("effects")
	var calls atomic.Int64
	MustHandle(c2, func(ctx context.Context, e orderPlaced, m Metadata) error {
		calls.Add(1)
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "pk", Value: m.PartitionKey}})
		return err
	})
	start(t, c2)
	b.produce(t, b.keyed("a22", "A"), b.payload(t, "a22", 22))
	b.produce(t, b.keyed("b23", "B"), b.payload(t, "b23", 23))
	eventually(t, "b23 handled", func() bool { return len(h.effectKeys(t, "B")) == 11 })
	eventually(t, "a22 held", func() bool { return h.held(t) == 11 })
	require.Empty(t, h.effectKeys(t, "A"))
	require.NoError(t, c2.Redrive(context.Background(), InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a0"}))
	want := []string{"a0"}
	for i := 2; i <= 20; i += 2 {
		want = append(want, "a"+itoa(i))
	}
	want = append(want, "a22")
	require.Equal(t, want, h.effectKeys(t, "A"))
}

// SkipEvent, the opt-out: the later events of a parked event's key go on.
func TestSkipEventPolicyDoesNotHold(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, func(cfg *Config) { cfg.PoisonPolicy = SkipEvent })
	b, c := h.b, h.c
	h.setFailing("a1")
	start(t, c)
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	b.produce(t, b.keyed("a2", "A"), b.payload(t, "a2", 2))
	eventually(t, "a2 handled", func() bool { return len(h.effectKeys(t, "A")) == 1 })
	require.Zero(t, h.held(t))
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
}

// Park parks at once; Snooze retries without using an
// attempt, within Config.MaxSnoozes.
func TestHandlerParkAndSnooze(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "steer")
	cfg.MaxAttempts = 5
	cfg.MaxSnoozes = 3
	c := b.client(t, cfg)
	var mu sync.Mutex
	calls := map[string]int{}
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		mu.Lock()
		calls[e.OrderID]++
		n := calls[e.OrderID]
		mu.Unlock()
		switch {
		case e.OrderID == "park":
			return Park(errors.New("will never work"))
		case e.OrderID == "snooze" && n <= 3:
			return Snooze(time.Millisecond)
		case e.OrderID == "forever":
			return Snooze(time.Millisecond)
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "attempt", Value: m.Attempt}})
		return err
	})
	start(t, c)
	b.produce(t, b.keyed("park", "P"), b.payload(t, "park", 0))
	b.produce(t, b.keyed("snooze", "S"), b.payload(t, "snooze", 1))
	b.produce(t, b.keyed("forever", "F"), b.payload(t, "forever", 2))
	b.produce(t, b.keyed("last", "L"), b.payload(t, "last", 3))
	eventually(t, "last handled", func() bool { return count(t, effects, bson.D{{Key: "key", Value: "last"}}) == 1 })
	// Other keys do not wait for a key that retries.
	eventually(t, "park and forever parked", func() bool { return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 2 })
	ctx := context.Background()
	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	byKey := map[string]ParkedEvent{}
	for _, p := range parked {
		byKey[p.ID.IdempotencyKey] = p
	}
	require.Len(t, byKey, 2)
	require.EqualValues(t, 1, byKey["park"].Attempts, "parked at the first attempt")
	require.Contains(t, byKey["park"].LastError, "will never work")
	require.EqualValues(t, 5, byKey["forever"].Attempts, "snoozes beyond MaxSnoozes count")
	mu.Lock()
	defer mu.Unlock()
	// park: one run (plus one in a rolled-back batch at most).
	require.LessOrEqual(t, calls["park"], 2)
	// snooze: three snoozes, then handled, without a failure noted.
	var doc inboxDoc
	require.NoError(t, c.inbox.FindOne(ctx, bson.D{{Key: "_id.idempotency_key", Value: "snooze"}}).Decode(&doc))
	require.True(t, doc.Handled)
	require.Zero(t, doc.Attempts)
	require.EqualValues(t, 1, count(t, effects, bson.D{{Key: "key", Value: "snooze"}, {Key: "attempt", Value: 1}}))
	require.GreaterOrEqual(t, calls["forever"], 3+5)
}

func TestPoisonConfig(t *testing.T) {
	t.Parallel()
	for field, mutate := range map[string]func(*Config){
		"HandlerTimeout": func(c *Config) { c.HandlerTimeout = -time.Second },
		"MaxSnoozes":     func(c *Config) { c.MaxSnoozes = -1 },
	} {
		cfg := validConfig(t)
		mutate(&cfg)
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, field)
		require.Contains(t, err.Error(), field)
	}
	c, err := New(validConfig(t))
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, c.cfg.HandlerTimeout)
	require.Equal(t, 100, c.cfg.MaxSnoozes)
	require.Equal(t, HoldKey, c.cfg.PoisonPolicy)
}

// The index of held keys is created idempotently and serves the chain
// queries.
func TestInboxHoldIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "idx"))
	ctx := context.Background()
	require.NoError(t, store.EnsureIndexes(ctx, c.inbox, c.inboxIndexes()...))
	require.NoError(t, store.EnsureIndexes(ctx, c.inbox, c.inboxIndexes()...))
	specs, err := c.inbox.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	found := false
	for _, s := range specs {
		found = found || s.Name == store.IndexInboxParkedPartition
	}
	require.True(t, found)
}

// Events of a held key keep arriving while its head is re-driven: each is
// either released by the re-drive or, once the chain is closed, handled by
// the consumer; none is left behind and the key's order holds.
func TestHoldKeyRedriveWhileEventsArrive(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	b, c := h.b, h.c
	h.setFailing("a0")
	start(t, c)
	b.produce(t, b.keyed("a0", "A"), b.payload(t, "a0", 0))
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	eventually(t, "a1 held", func() bool { return h.held(t) == 1 })
	h.setFailing()
	const n = 40
	redriven := make(chan error, 1)
	go func() {
		redriven <- c.Redrive(context.Background(), InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a0"})
	}()
	for i := 2; i < n; i++ {
		b.produce(t, b.keyed("a"+itoa(i), "A"), b.payload(t, "a"+itoa(i), i))
	}
	require.NoError(t, <-redriven)
	eventually(t, "every event of the key handled", func() bool { return len(h.effectKeys(t, "A")) == n })
	want := make([]string, n)
	for i := range want {
		want[i] = "a" + itoa(i)
	}
	require.Equal(t, want, h.effectKeys(t, "A"))
	require.Zero(t, h.held(t))
}

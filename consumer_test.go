package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
)

// effects records one document per handled event in the test's database,
// keyed by the idempotency key: a second effect for the same event fails
// with a duplicate key, so the tests count effects, not attempts.
func effectHandler(b *bundle, calls *atomic.Int64) HandlerFunc[orderPlaced] {
	effects := b.db.Collection("effects")
	return func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		calls.Add(1)
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "order", Value: e.OrderID}, {Key: "seq", Value: e.Seq}})
		return err
	}
}

func (b *bundle) envelope(key string) Envelope {
	return Envelope{Topic: ordersTopic, ContentSchema: orderPlaced{}.ContentSchema(), IdempotencyKey: key, PartitionKey: "k"}
}

func (b *bundle) payload(t *testing.T, orderID string, seq int) []byte {
	t.Helper()
	return []byte(`{"run":"` + b.run + `","order_id":"` + orderID + `","amount":1,"seq":` + itoa(seq) + `}`)
}

func itoa(i int) string { return strconv.Itoa(i) }

func consumerConfig(b *bundle, service string) Config {
	cfg := b.config(service)
	cfg.PublishTopics = nil // consume only: these tests produce records themselves
	return cfg
}

func TestConsumerHandlesDuplicateDeliveryOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "pay"))
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)

	for range 3 {
		b.produce(t, b.envelope("dup-1"), b.payload(t, "o-1", 0))
	}
	b.produce(t, b.envelope("other"), b.payload(t, "o-2", 0))
	effects := b.db.Collection("effects")
	eventually(t, "both events handled", func() bool { return count(t, effects, bson.D{}) == 2 })
	eventually(t, "inbox documents handled", func() bool {
		return count(t, c.inbox, bson.D{{Key: "handled", Value: true}}) == 2
	})
	eventually(t, "offsets committed past all four records", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 4
	})
	require.EqualValues(t, 1, count(t, effects, bson.D{{Key: "key", Value: "dup-1"}}))
}

// committed returns group's committed offset of partition of the test's
// Kafka topic of topic, -1 when there is none.
func committed(t *testing.T, b *bundle, group, topic string, partition int32) int64 {
	t.Helper()
	offs, err := b.kafka.Admin().FetchOffsets(context.Background(), group)
	if err != nil {
		return -1
	}
	o, ok := offs.Lookup(b.kafkaTopic(topic), partition)
	if !ok {
		return -1
	}
	return o.At
}

// The last commit before a partition goes quiet fails (a broker error):
// the committed offset stayed behind until the next record came, for ever
// on a quiet partition (lag shown, records redelivered at the next
// assignment; seen as a stalled partition in a chaos run). A failed commit
// is retried while the worker waits.
func TestConsumerRetriesFailedCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "commit-retry")
	c := b.client(t, cfg)
	var handled atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run == b.run {
			handled.Add(1)
		}
		return nil
	})
	b.cluster(t, "fail one offset commit of the group").Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: c.cfg.ConsumerGroup, Count: 1})
	start(t, c)
	b.produce(t, b.envelope("c1"), b.payload(t, "c1", 1))
	eventually(t, "c1 handled", func() bool { return handled.Load() == 1 })
	eventually(t, "the offset committed past c1", func() bool { return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 1 })
}

func TestConsumerConcurrentHandlersCommitOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Two services with different consumer groups both receive every record
	// and share one inbox: the optimistic lock lets one handling commit.
	// Run refuses this configuration (ErrInboxOwned: an inbox belongs to
	// one group); the test hands the stamp over to the second group once
	// the first has passed its check, to race two handlers on every entry.
	var calls atomic.Int64
	effects := b.db.Collection("effects")
	for _, name := range []string{"a", "b"} {
		c := b.client(t, consumerConfig(b, name))
		MustHandle(c, effectHandler(b, &calls))
		_, err := c.meta.DeleteMany(context.Background(), bson.D{})
		require.NoError(t, err)
		start(t, c)
		eventually(t, name+" past its inbox check", func() bool {
			_, ok := indexSpecs(t, c.inbox)[store.IndexInboxTTL]
			return ok
		})
	}
	const n = 20
	for i := range n {
		b.produce(t, b.envelope("e-"+itoa(i)), b.payload(t, "o", i))
	}
	eventually(t, "all events handled", func() bool { return count(t, effects, bson.D{}) == n })
	eventually(t, "both consumers passed every record", func() bool {
		return count(t, b.db.Collection("inbox"), bson.D{{Key: "handled", Value: true}}) == n
	})
	require.EqualValues(t, n, count(t, effects, bson.D{}))
}

func TestConsumerRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "pay"))
	var calls atomic.Int64
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if calls.Add(1) <= 2 {
			// Written, then the attempt fails: the write must be rolled back.
			if _, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: "rolled-back"}}); err != nil {
				return err
			}
			return errors.New("transient failure")
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "attempt", Value: m.Attempt}})
		return err
	})
	start(t, c)
	b.produce(t, b.envelope("retry-1"), b.payload(t, "o-1", 0))
	eventually(t, "handled after retries", func() bool { return count(t, effects, bson.D{}) == 1 })
	var inbox inboxDoc
	require.NoError(t, c.inbox.FindOne(context.Background(), bson.D{}).Decode(&inbox))
	require.True(t, inbox.Handled)
	require.False(t, inbox.Parked)
	require.EqualValues(t, 2, inbox.Attempts)
	require.Contains(t, inbox.LastError, "transient failure")
	require.Zero(t, count(t, effects, bson.D{{Key: "key", Value: "rolled-back"}}))
}

func TestConsumerParksPoisonAndMovesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "pay")
	cfg.MaxAttempts = 3
	// The opt-out: the later events of the poison's key (all these share
	// one) go on without it. TestHoldKey* cover the default.
	cfg.PoisonPolicy = SkipEvent
	c := b.client(t, cfg)
	var calls atomic.Int64
	var fixed atomic.Bool
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		calls.Add(1)
		if e.OrderID == "poison" && !fixed.Load() {
			panic("cannot handle poison")
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	start(t, c)
	b.produce(t, b.envelope("p-1"), b.payload(t, "poison", 0))
	b.produce(t, b.envelope("ok-1"), b.payload(t, "fine", 1))
	eventually(t, "event after the poison handled", func() bool { return count(t, effects, bson.D{}) == 1 })

	parked, err := c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "p-1", parked[0].ID.IdempotencyKey)
	require.EqualValues(t, 3, parked[0].Attempts)
	require.Contains(t, parked[0].LastError, "cannot handle poison")
	require.Contains(t, parked[0].Payload, `"order_id":"poison"`)

	// A redelivery of a parked event is skipped, not retried.
	before := calls.Load()
	b.produce(t, b.envelope("p-1"), b.payload(t, "poison", 0))
	b.produce(t, b.envelope("ok-2"), b.payload(t, "fine", 2))
	eventually(t, "later event handled", func() bool { return count(t, effects, bson.D{}) == 2 })
	require.Equal(t, before+1, calls.Load(), "only ok-2 ran")

	// Re-driving while the cause is still there keeps it parked.
	ctx := context.Background()
	id := parked[0].ID
	require.ErrorIs(t, c.Redrive(ctx, id), ErrHandlerPanic)
	parked, err = c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)

	// After the fix, re-driving handles it once and unparks it.
	fixed.Store(true)
	require.NoError(t, c.Redrive(ctx, id))
	require.EqualValues(t, 1, count(t, effects, bson.D{{Key: "key", Value: "p-1"}}))
	parked, err = c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Empty(t, parked)
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: true}, {Key: "parked", Value: false}}))
	require.ErrorIs(t, c.Redrive(ctx, id), ErrNotParked)
	require.ErrorIs(t, c.Redrive(ctx, InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "nope"}), ErrNotParked)
}

func TestConsumerParksMalformedRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "pay")
	cfg.PoisonPolicy = SkipEvent // these records share a key; see TestHoldKeyMalformed
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: []byte("no headers at all")})
	b.produce(t, b.envelope("bad-json"), []byte(`{"order_id": 12`))
	b.produce(t, b.envelope("invalid"), []byte(`{"run":"`+b.run+`","order_id":""}`))
	b.produce(t, Envelope{Topic: ordersTopic, ContentSchema: "Unknown.v9", IdempotencyKey: "u", PartitionKey: "k"}, []byte(`{}`))
	b.produce(t, b.envelope("good"), b.payload(t, "o-1", 0))
	eventually(t, "good event handled", func() bool { return calls.Load() == 1 })
	eventually(t, "three malformed records and one without a handler parked", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 4
	})
	parked, err := c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	require.NoError(t, err)
	keys := map[string]string{}
	for _, p := range parked {
		keys[p.ID.IdempotencyKey] = p.LastError
	}
	require.Contains(t, keys["malformed:0:0"], "missing header outbox-version")
	require.Contains(t, keys["bad-json"], "decode")
	require.Contains(t, keys["invalid"], "OrderID")
	require.Contains(t, keys["u"], "no handler")
	eventually(t, "offsets committed past every record", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 5
	})
}

func TestConsumerCommitsOffsetOnlyAfterTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "pay")
	c := b.client(t, cfg)
	entered := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int64
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	stop := start(t, c)
	b.produce(t, b.envelope("slow"), b.payload(t, "o-1", 0))
	<-entered
	// The handler is mid-transaction: nothing may be committed yet.
	require.Never(t, func() bool { return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) >= 0 }, 300*time.Millisecond, 50*time.Millisecond)
	close(release)
	eventually(t, "effect committed", func() bool { return count(t, effects, bson.D{}) == 1 })
	eventually(t, "offset committed after the transaction", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 1
	})
	stop()

	// A restarted consumer of the same group does not handle it again.
	c2 := b.client(t, cfg)
	var calls2 atomic.Int64
	MustHandle(c2, effectHandler(b, &calls2))
	start(t, c2)
	b.produce(t, b.envelope("next"), b.payload(t, "o-2", 1))
	eventually(t, "next event handled", func() bool { return count(t, effects, bson.D{}) == 2 })
	require.EqualValues(t, 1, calls2.Load())
}

func TestHandlerRecordsEventsInItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "pay")
	cfg.PublishTopics = []string{paymentsTopic}
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if err := Record(ctx, paymentDone{Run: e.Run, OrderID: e.OrderID}); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("fail after recording")
		}
		return nil
	})
	start(t, c)
	b.produce(t, b.envelope("h-1"), b.payload(t, "o-1", 0))
	eventually(t, "event handled", func() bool { return count(t, c.inbox, bson.D{{Key: "handled", Value: true}}) == 1 })
	// The failed attempt's event was rolled back with it: exactly one.
	eventually(t, "one payment event recorded", func() bool {
		return count(t, c.outbox, bson.D{{Key: "topic", Value: paymentsTopic}}) == 1
	})
	require.EqualValues(t, 2, calls.Load())
}

func TestRunStopsOnFatalGroupError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "pay")
	// A session timeout the client sends is the classic protocol's; under
	// KIP-848 the broker's own applies.
	cfg.GroupProtocol = GroupClassic
	// Brokers refuse session timeouts under group.min.session.timeout.ms
	// (6 s by default, kfake included; test brokers lower it): retrying
	// cannot help. Half the broker's own minimum is refused by any broker.
	cfg.SessionTimeout = b.minSessionTimeout(t) / 2
	cfg.HeartbeatInterval = cfg.SessionTimeout / 10
	cfg.FenceMargin = cfg.SessionTimeout / 2
	err := runRefusedByGroup(t, b, cfg)
	require.ErrorIs(t, err, kerr.InvalidSessionTimeout)
}

// minSessionTimeout returns the broker's group.min.session.timeout.ms.
func (b *bundle) minSessionTimeout(t *testing.T) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := b.kafka.Admin()
	brokers, err := adm.ListBrokers(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, brokers)
	configs, err := adm.DescribeBrokerConfigs(ctx, brokers[0].NodeID)
	require.NoError(t, err)
	for _, rc := range configs {
		for _, c := range rc.Configs {
			if c.Key == "group.min.session.timeout.ms" {
				ms, err := strconv.Atoi(c.MaybeValue())
				require.NoError(t, err, "group.min.session.timeout.ms")
				return time.Duration(ms) * time.Millisecond
			}
		}
	}
	t.Fatal("the broker does not report group.min.session.timeout.ms")
	return 0
}

func TestConsumerBatchesAndFallsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "pay"))
	effects := b.db.Collection("effects")
	var failOnce atomic.Bool
	failOnce.Store(true)
	var keepMu sync.Mutex
	var keep []*txState
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.OrderID == "flaky" && failOnce.CompareAndSwap(true, false) {
			return errors.New("flaky once")
		}
		// Which transaction attempt this ran in (kept alive so that no
		// address is reused).
		keepMu.Lock()
		keep = append(keep, txFrom(ctx))
		keepMu.Unlock()
		tx := fmt.Sprintf("%p", txFrom(ctx))
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "seq", Value: e.Seq}, {Key: "tx", Value: tx}})
		return err
	})
	// A backlog before the consumer starts arrives in one poll: the events
	// before the flaky one roll back with the batch and are handled again,
	// once; a redelivered duplicate in the middle of a later batch is
	// skipped.
	const n = 20
	for i := range n {
		order := "o"
		if i == 5 {
			order = "flaky"
		}
		b.produce(t, b.envelope("b-"+itoa(i)), b.payload(t, order, i))
		if i == 12 {
			b.produce(t, b.envelope("b-3"), b.payload(t, "o", 3))
		}
	}
	start(t, c)
	eventually(t, "every event handled", func() bool { return count(t, effects, bson.D{}) == n })
	eventually(t, "offsets committed past every record", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == n+1
	})
	for i := range n {
		require.EqualValues(t, 1, count(t, effects, bson.D{{Key: "key", Value: "b-" + itoa(i)}}), "event %d", i)
	}
	// Handled in order within the partition.
	cur, err := effects.Find(context.Background(), bson.D{})
	require.NoError(t, err)
	var docs []struct {
		Seq int
		Tx  string
	}
	require.NoError(t, cur.All(context.Background(), &docs))
	txs := map[string]bool{}
	for i, d := range docs {
		require.Equal(t, i, d.Seq)
		txs[d.Tx] = true
	}
	require.Less(t, len(txs), n, "some events committed in a shared transaction")
}

// TestRunRefusesAGroupOfAnotherAssignor: a group whose members offer only
// another assignor (aiokafka's default "roundrobin", as a Python
// event-outbox service's consumer) makes the broker refuse our joiner with
// INCONSISTENT_GROUP_PROTOCOL; Run returns that with an explanation
// instead of running without ever being assigned a partition. Under
// KIP-848 the broker answers our joiner GROUP_ID_NOT_FOUND while the
// classic members hold the group, and Run returns that.
func TestRunRefusesAGroupOfAnotherAssignor(t *testing.T) {
	t.Parallel()
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if b.protocol == GroupConsumer && b.kafka.Real {
			t.Skip("Apache Kafka converts a classic group to a KIP-848 group when a consumer-protocol member joins " +
				"(group.consumer.migration.policy, bidirectional by default) and shares its partitions with the classic member: " +
				"nothing refuses the joiner (docs/real-servers.md); kfake refuses it")
		}
		cfg := consumerConfig(b, "pay")
		cfg.ConsumerGroup = "pay-" + b.run
		// The other member joins (and heartbeats) on its own once created.
		_ = b.kafka.Client(t, kgo.ConsumerGroup(cfg.ConsumerGroup), kgo.ConsumeTopics(b.kafkaTopic(ordersTopic)),
			kgo.Balancers(kgo.RoundRobinBalancer()), kgo.DisableAutoCommit())
		eventually(t, "the other member joined", func() bool {
			gs, err := b.kafka.Admin().DescribeGroups(context.Background(), cfg.ConsumerGroup)
			return err == nil && gs[cfg.ConsumerGroup].State == "Stable"
		})
		err := runRefusedByGroup(t, b, cfg)
		if b.protocol == GroupConsumer {
			require.ErrorIs(t, err, kerr.GroupIDNotFound)
			require.ErrorContains(t, err, "classic-protocol members hold")
			return
		}
		require.ErrorIs(t, err, kerr.InconsistentGroupProtocol)
		require.ErrorContains(t, err, "roundrobin")
	})
}

// runRefusedByGroup runs a handling Client with cfg and requires that Run
// returns ErrKafkaGroup on its own, well before its one-minute deadline.
func runRefusedByGroup(t *testing.T, b *bundle, cfg Config) error {
	t.Helper()
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Run(ctx)
	require.ErrorIs(t, err, ErrKafkaGroup)
	require.NoError(t, ctx.Err(), "Run returned because of the error, not the deadline")
	return err
}

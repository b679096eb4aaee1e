package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/wire/wiretest"
)

// paymentRequested is an event of a topic shared with Python event-outbox
// services: an integer partition key, as the library's partition_key.
type paymentRequested struct {
	Run     string  `json:"run,omitempty"`
	OrderID string  `json:"order_id" validate:"required"`
	Account int     `json:"account"`
	Amount  float64 `json:"amount"`
	Note    string  `json:"note,omitempty"`
}

func (paymentRequested) Topic() string          { return paymentsTopic }
func (paymentRequested) ContentSchema() string  { return "PaymentRequested" }
func (e paymentRequested) PartitionKey() string { return strconv.Itoa(e.Account) }

func TestWireFormatNames(t *testing.T) {
	t.Parallel()
	for _, f := range []Format{FormatNative, FormatEventOutbox, FormatCloudEvents} {
		got, err := ParseFormat(f.String())
		require.NoError(t, err)
		require.Equal(t, f, got)
	}
	_, err := ParseFormat("avro")
	require.ErrorIs(t, err, ErrConfig)
}

func TestConfigValidatesWireFormats(t *testing.T) {
	t.Parallel()
	base := Config{Mongo: nil, Database: "d", Brokers: []string{"b"}, Service: "s", PublishTopics: []string{"t"}}
	cfg := base
	cfg.WireFormats = map[string]Format{"u": FormatCloudEvents}
	require.ErrorContains(t, cfg.withDefaults().validate(), "WireFormats names topic \"u\"")
	cfg = base
	cfg.WireFormats = map[string]Format{"t": Format(9)}
	require.ErrorContains(t, cfg.withDefaults().validate(), "unknown format")
	cfg = base
	cfg.EventOutboxPartitioning = []string{"u"}
	require.ErrorContains(t, cfg.withDefaults().validate(), "EventOutboxPartitioning names topic \"u\"")
	require.Equal(t, "/s", base.withDefaults().CloudEventsSource)
}

// collidingEvent has a field named like an event-outbox envelope field.
type collidingEvent struct {
	OrderID string `json:"order_id"`
	Topic_  string `json:"topic"`
}

func (collidingEvent) Topic() string         { return paymentsTopic }
func (collidingEvent) ContentSchema() string { return "Colliding" }
func (collidingEvent) PartitionKey() string  { return "1" }

// listEvent's JSON is an array, which has no place in a flat body.
type listEvent []int

func (listEvent) Topic() string         { return paymentsTopic }
func (listEvent) ContentSchema() string { return "List" }
func (listEvent) PartitionKey() string  { return "1" }

func wireConfig(b *bundle, service string) Config {
	cfg := b.config(service)
	cfg.WireFormats = map[string]Format{paymentsTopic: FormatEventOutbox, ordersTopic: FormatCloudEvents}
	cfg.EventOutboxPartitioning = []string{paymentsTopic}
	return cfg
}

func TestRecordRefusesWhatTheEventOutboxFormatCannotCarry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, wireConfig(b, "orders"))
	ctx := context.Background()
	record := func(e Event) error {
		return c.Transact(ctx, func(ctx context.Context) error { return Record(ctx, e) })
	}
	err := record(collidingEvent{OrderID: "o-1"})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorIs(t, err, ErrEnvelopeCollision)
	require.ErrorContains(t, err, `field "topic"`)
	err = record(listEvent{1, 2})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorIs(t, err, ErrPayloadNotObject)
	err = record(badKeyPayment{OrderID: "o-1"})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorContains(t, err, "integer partition key")
	err = c.Transact(ctx, func(ctx context.Context) error {
		return Record(ctx, paymentRequested{OrderID: "o-1", Account: 7}, WithIdempotencyKey("k-\xff"))
	})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorContains(t, err, "UTF-8 idempotency key")
	require.Zero(t, count(t, c.outbox, bson.D{}), "nothing recorded")
	// The same event types are fine on a native topic... of which they have
	// none here, so check a good event goes through.
	require.NoError(t, record(paymentRequested{OrderID: "o-1", Account: 7}))
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "format", Value: "event-outbox"}, {Key: "partition", Value: 1}}))
}

// badKeyPayment is on an event-outbox partitioned topic with a key that is
// not an integer.
type badKeyPayment struct {
	OrderID string `json:"order_id"`
}

func (badKeyPayment) Topic() string          { return paymentsTopic }
func (badKeyPayment) ContentSchema() string  { return "BadKey" }
func (e badKeyPayment) PartitionKey() string { return e.OrderID }

// TestEventOutboxExchange: a Go service publishes event-outbox records the
// library's way (flat body, partition = key % partitions) and a Go consumer
// handles both those and records written byte for byte as the Python
// library writes them, each once however often it is delivered.
func TestEventOutboxExchange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	producer := b.client(t, wireConfig(b, "orders"))
	ctx := context.Background()
	for i, acct := range []int{7, 8, 9, 10} {
		require.NoError(t, producer.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, paymentRequested{Run: b.run, OrderID: "go-" + itoa(i), Account: acct, Amount: 2.5, Note: "<&>"})
		}))
	}
	start(t, producer)
	recs := b.kafkaEvents(t, paymentsTopic, 4)
	for _, rec := range recs {
		var body map[string]any
		env, _, err := decodeRecord(rec)
		require.NoError(t, err)
		require.Equal(t, FormatEventOutbox, env.Format)
		acct, _ := strconv.Atoi(env.PartitionKey)
		require.Equal(t, int32(acct%3), rec.Partition, "the library's partitioning")
		require.NoError(t, json.Unmarshal(rec.Value, &body))
		require.Equal(t, paymentsTopic, body["topic"])
		require.Equal(t, float64(acct), body["partition_key"])
		require.Contains(t, string(rec.Value), `"note":"<&>"`, "no HTML escaping, as pydantic")
	}

	consumer := b.client(t, consumerConfig(b, "pay"))
	var mu sync.Mutex
	seen := map[string]int{}
	metas := map[string]Metadata{}
	MustHandle(consumer, func(ctx context.Context, e paymentRequested, m Metadata) error {
		mu.Lock()
		defer mu.Unlock()
		seen[e.OrderID]++
		metas[e.OrderID] = m
		return nil
	})
	for range 2 { // every Python record delivered twice
		for _, pr := range wiretest.PythonRecords(t) {
			b.produceRaw(t, &kgo.Record{Topic: paymentsTopic, Partition: 0, Value: []byte(pr.Value)})
		}
	}
	start(t, consumer)
	eventually(t, "Go and Python events handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 6
	})
	eventually(t, "every record committed", func() bool {
		var total int64
		for p := range int32(3) {
			total += max(committed(t, b, consumer.cfg.ConsumerGroup, paymentsTopic, p), 0)
		}
		return total == 8
	})
	mu.Lock()
	defer mu.Unlock()
	for id, n := range seen {
		require.Equal(t, 1, n, "%s handled once", id)
	}
	require.Equal(t, "6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3", metas["o-1"].IdempotencyKey)
	require.Equal(t, FormatEventOutbox, metas["o-1"].Format)
	require.Equal(t, "7", metas["o-1"].PartitionKey)
	require.EqualValues(t, 1, count(t, consumer.inbox, bson.D{{Key: "_id", Value: bson.D{
		{Key: "topic", Value: paymentsTopic}, {Key: "content_schema", Value: "PaymentRequested"},
		{Key: "idempotency_key", Value: "6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3"}}}, {Key: "handled", Value: true}}),
		"the inbox _id the library would write")
}

// TestCloudEventsExchange: events of a CloudEvents topic are published in
// binary mode and handled by a Go consumer.
func TestCloudEventsExchange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	producer := b.client(t, wireConfig(b, "orders"))
	ctx := context.Background()
	require.NoError(t, producer.Transact(ctx, func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1", Amount: 3}, WithIdempotencyKey("ce-1"))
	}))
	start(t, producer)
	recs := b.kafkaEvents(t, ordersTopic, 1)
	src, _ := header(recs[0], "ce_source")
	require.Equal(t, "/orders-"+b.run, src)
	id, _ := header(recs[0], "ce_id")
	require.Equal(t, "ce-1", id)

	consumer := b.client(t, consumerConfig(b, "pay"))
	var calls int
	var mu sync.Mutex
	MustHandle(consumer, func(ctx context.Context, e orderPlaced, m Metadata) error {
		mu.Lock()
		defer mu.Unlock()
		if m.IdempotencyKey == "ce-1" && m.Format == FormatCloudEvents && e.OrderID == "o-1" {
			calls++
		}
		return nil
	})
	start(t, consumer)
	eventually(t, "CloudEvents event handled", func() bool { mu.Lock(); defer mu.Unlock(); return calls == 1 })
}

// TestUniqueIdempotencyKeys: with the option's index, recording an event
// twice with the same key fails clearly instead of publishing it twice.
func TestUniqueIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("orders")
	cfg.UniqueIdempotencyKeys = true
	c := b.client(t, cfg)
	ctx := context.Background()
	require.NoError(t, c.EnsureIndexes(ctx))
	record := func(key string, twice bool) error {
		return c.Transact(ctx, func(ctx context.Context) error {
			if err := Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"}, WithIdempotencyKey(key)); err != nil {
				return err
			}
			if twice {
				return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"}, WithIdempotencyKey(key))
			}
			return nil
		})
	}
	require.NoError(t, record("k-1", false))
	err := record("k-1", false)
	require.ErrorIs(t, err, ErrDuplicateEvent)
	require.ErrorContains(t, err, "UniqueIdempotencyKeys")
	require.ErrorIs(t, record("k-2", true), ErrDuplicateEvent, "twice in one transaction")
	require.NoError(t, record("k-3", false))
	require.EqualValues(t, 2, count(t, c.outbox, bson.D{}), "k-1 and k-3 only; the failed transactions recorded nothing")

}

func TestFlushErrorOtherwiseUnchanged(t *testing.T) {
	t.Parallel()
	err := flushError(3, errors.New("boom"))
	require.NotErrorIs(t, err, ErrDuplicateEvent)
	require.EqualError(t, err, "outbox: insert 3 events: boom")
}

// TestParkedStructuredCloudEventKeepsItsData: a structured-mode CloudEvent
// whose data fails validation is parked with its data as the payload (what
// a re-drive decodes), not the whole CloudEvents envelope.
func TestParkedStructuredCloudEventKeepsItsData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "pay"))
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	data := `{"run":"` + b.run + `","order_id":""}`
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Key: []byte("o-1"),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}},
		Value:   []byte(`{"specversion":"1.0","id":"ce-bad","source":"/x","type":"OrderPlaced.v1","data":` + data + `}`)})
	start(t, c)
	eventually(t, "the invalid event parked", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 1
	})
	parked, err := c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "ce-bad", parked[0].ID.IdempotencyKey)
	require.Equal(t, data, parked[0].Payload)
	require.Contains(t, parked[0].LastError, "OrderID")
	require.Zero(t, calls.Load())
}

// TestUniqueIdempotencyKeysBeforeEnsureIndexes: recording before
// EnsureIndexes or Run still refuses a duplicate: the first transaction
// makes the index, and one that cannot make it records nothing.
func TestUniqueIdempotencyKeysBeforeEnsureIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("orders")
	cfg.UniqueIdempotencyKeys = true
	c := b.client(t, cfg)
	ctx := context.Background()
	record := func(c *Client) error {
		return c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"}, WithIdempotencyKey("k-1"))
		})
	}
	require.NoError(t, record(c))
	require.ErrorIs(t, record(c), ErrDuplicateEvent)
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{}))

	// An index that cannot be made (a conflicting one under its name):
	// nothing is recorded, and the error says why.
	cfg.OutboxCollection = "outbox_conflict"
	d := b.client(t, cfg)
	_, err := d.outbox.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "topic", Value: 1}},
		Options: options.Index().SetName(store.IndexOutboxIdempotency)})
	require.NoError(t, err)
	err = record(d)
	require.ErrorIs(t, err, ErrIndexConflict)
	require.ErrorContains(t, err, "UniqueIdempotencyKeys")
	require.Zero(t, count(t, d.outbox, bson.D{}))
}

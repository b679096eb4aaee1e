package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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

// Records exactly as the Python event-outbox library (v0.4.0,
// github.com/returnnullptr/event-outbox at commit cee2b7c,
// event_outbox/outbox.py) writes them: _EventPublisher._publish sends
// event.model_dump_json().encode() with an explicit partition
// (partition_key % partitions), no key and no headers. The Event model's
// fields come first (topic, content_schema, partition_key, idempotency_key,
// occurred_at; a subclass's own fields, or the extra fields of
// extra="allow", after them). The bytes below were printed by
// model_dump_json() of a model with the same fields under pydantic 2.13.4:
// compact JSON, non-ASCII and <>& unescaped, an aware UTC datetime with
// microseconds and "Z", and no fraction at all on a whole second.
var pythonRecords = []struct {
	name                      string
	value                     string
	schema, key, partitionKey string
	occurredAt                time.Time
}{
	{
		name:         "subclass fields after the envelope",
		value:        `{"topic":"payments","content_schema":"PaymentRequested","partition_key":7,"idempotency_key":"6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3","occurred_at":"2026-01-02T03:04:05.123456Z","order_id":"o-1","account":7,"amount":12.5}`,
		schema:       "PaymentRequested",
		key:          "6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3",
		partitionKey: "7",
		occurredAt:   time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC),
	},
	{
		name:         "default partition key, whole second, unicode note",
		value:        `{"topic":"payments","content_schema":"PaymentRequested","partition_key":0,"idempotency_key":"0a9e7b1c2d3f4a5b8c6d7e8f90a1b2c3","occurred_at":"2026-01-02T03:04:05Z","order_id":"o-2","account":0,"amount":1.0,"note":"é\"<>&"}`,
		schema:       "PaymentRequested",
		key:          "0a9e7b1c2d3f4a5b8c6d7e8f90a1b2c3",
		partitionKey: "0",
		occurredAt:   time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	},
}

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

func TestDecodePythonLibraryRecords(t *testing.T) {
	t.Parallel()
	for _, pr := range pythonRecords {
		rec := &kgo.Record{Topic: paymentsTopic, Partition: 1, Value: []byte(pr.value)}
		env, payload, err := decodeRecord(rec)
		require.NoError(t, err, pr.name)
		require.Equal(t, Envelope{Topic: paymentsTopic, ContentSchema: pr.schema, IdempotencyKey: pr.key,
			PartitionKey: pr.partitionKey, Partition: 1, OccurredAt: pr.occurredAt, Format: FormatEventOutbox}, env, pr.name)
		require.Equal(t, pr.value, string(payload), pr.name)
	}
}

func TestEventOutboxRecordIsTheLibrarysLayout(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: paymentsTopic, ContentSchema: "PaymentRequested", IdempotencyKey: "6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3",
		PartitionKey: "7", Partition: 1, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 123000000, time.UTC), Format: FormatEventOutbox,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	rec := encodeRecord(&env, []byte(`{"order_id":"o-1","account":7,"amount":12.5}`))
	// What model_dump_json() writes for the same event (pydantic 2.13.4):
	// MongoDB keeps milliseconds, so the microseconds end in 000.
	require.Equal(t, `{"topic":"payments","content_schema":"PaymentRequested","partition_key":7,"idempotency_key":"6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3","occurred_at":"2026-01-02T03:04:05.123000Z","order_id":"o-1","account":7,"amount":12.5}`, string(rec.Value))
	require.Equal(t, []byte("7"), rec.Key)
	require.Equal(t, int32(1), rec.Partition)
	got, payload, err := decodeRecord(rec)
	require.NoError(t, err)
	require.Equal(t, env, got, "native headers kept, so native consumers read it too")
	require.Equal(t, rec.Value, payload)
	// Without its headers (as a Python producer would forward it), the body
	// alone gives the same identity.
	bare := &kgo.Record{Topic: rec.Topic, Partition: rec.Partition, Value: rec.Value}
	got, _, err = decodeRecord(bare)
	require.NoError(t, err)
	require.Equal(t, env.IdempotencyKey, got.IdempotencyKey)
	require.Equal(t, env.ContentSchema, got.ContentSchema)
	require.Equal(t, "7", got.PartitionKey)
	require.True(t, env.OccurredAt.Equal(got.OccurredAt))

	// Edge layouts: an empty object, a key that is not an integer (left out:
	// the library reads 0), a whole second.
	env2 := Envelope{Topic: "t", ContentSchema: "S", IdempotencyKey: "k", PartitionKey: "o-1", OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Format: FormatEventOutbox}
	require.Equal(t, `{"topic":"t","content_schema":"S","idempotency_key":"k","occurred_at":"2026-01-02T03:04:05Z"}`, string(encodeRecord(&env2, []byte(` { } `)).Value))
}

func TestCloudEventsBinaryRecord(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-1", PartitionKey: "o-1", Partition: 2,
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Format: FormatCloudEvents, Source: "/orders",
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "a=b"}
	rec := encodeRecord(&env, []byte(`{"order_id":"o-1"}`))
	require.Equal(t, []byte("o-1"), rec.Key)
	require.Equal(t, `{"order_id":"o-1"}`, string(rec.Value))
	got := map[string]string{}
	for _, h := range rec.Headers {
		got[h.Key] = string(h.Value)
	}
	require.Equal(t, map[string]string{
		"ce_specversion": "1.0", "ce_id": "k-1", "ce_source": "/orders", "ce_type": "OrderPlaced.v1",
		"ce_time": "2026-01-02T03:04:05.006Z", "content-type": "application/json", "ce_partitionkey": "o-1",
		"ce_traceparent": env.TraceParent, "ce_tracestate": "a=b",
	}, got)
	back, payload, err := decodeRecord(rec)
	require.NoError(t, err)
	require.Equal(t, env, back)
	require.Equal(t, rec.Value, payload)
}

func TestCloudEventsStructuredRecord(t *testing.T) {
	t.Parallel()
	rec := &kgo.Record{Topic: ordersTopic, Partition: 0,
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}},
		Value: []byte(`{"specversion":"1.0","id":"A234-1234-1234","source":"https://example.com/orders","type":"OrderPlaced.v1",` +
			`"time":"2018-04-05T17:31:00Z","partitionkey":"o-9","datacontenttype":"application/json","data":{"order_id":"o-9","amount":3}}`)}
	env, payload, err := decodeRecord(rec)
	require.NoError(t, err)
	require.Equal(t, Envelope{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "A234-1234-1234", PartitionKey: "o-9",
		OccurredAt: time.Date(2018, 4, 5, 17, 31, 0, 0, time.UTC), Format: FormatCloudEvents, Source: "https://example.com/orders"}, env)
	require.Equal(t, `{"order_id":"o-9","amount":3}`, string(payload))

	rec.Value = []byte(`{"specversion":"1.0","id":"b64","source":"s","type":"T","data_base64":"eyJhIjoxfQ=="}`)
	_, payload, err = decodeRecord(rec)
	require.NoError(t, err)
	require.Equal(t, `{"a":1}`, string(payload))
}

// TestDecodeNeverInventsKeys: a record of any format that does not carry an
// idempotency key (or another identity field) is malformed, and the error
// names the missing field. The Python library would invent a random key
// for a body without one, which silently turns every redelivery into a new
// event.
func TestDecodeNeverInventsKeys(t *testing.T) {
	t.Parallel()
	ceHeaders := func(skip string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for _, kv := range [][2]string{{"ce_specversion", "1.0"}, {"ce_id", "x"}, {"ce_source", "/s"}, {"ce_type", "T"}} {
			if kv[0] != skip {
				hs = append(hs, kgo.RecordHeader{Key: kv[0], Value: []byte(kv[1])})
			}
		}
		return hs
	}
	structured := []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}
	cases := []struct {
		name    string
		rec     kgo.Record
		wantErr string
	}{
		{"event-outbox without idempotency_key", kgo.Record{Value: []byte(`{"topic":"t","content_schema":"S","partition_key":0,"occurred_at":"2026-01-02T03:04:05Z"}`)}, "missing field idempotency_key"},
		{"event-outbox with a null idempotency_key", kgo.Record{Value: []byte(`{"topic":"t","content_schema":"S","idempotency_key":null}`)}, "missing field idempotency_key"},
		{"event-outbox without content_schema", kgo.Record{Value: []byte(`{"topic":"t","idempotency_key":"k"}`)}, "missing field content_schema"},
		{"event-outbox without topic", kgo.Record{Value: []byte(`{"content_schema":"S","idempotency_key":"k"}`)}, "missing field topic"},
		{"event-outbox of another topic", kgo.Record{Value: []byte(`{"topic":"u","content_schema":"S","idempotency_key":"k"}`)}, `field topic "u" differs`},
		{"event-outbox with a numeric key", kgo.Record{Value: []byte(`{"topic":"t","content_schema":"S","idempotency_key":5}`)}, "field idempotency_key is not a string"},
		{"event-outbox with a bad partition_key", kgo.Record{Value: []byte(`{"topic":"t","content_schema":"S","idempotency_key":"k","partition_key":"o-1"}`)}, "partition_key"},
		{"event-outbox with a naive occurred_at", kgo.Record{Value: []byte(`{"topic":"t","content_schema":"S","idempotency_key":"k","occurred_at":"2026-01-02T03:04:05"}`)}, "occurred_at"},
		{"CloudEvents without ce_id", kgo.Record{Headers: ceHeaders("ce_id")}, "missing header ce_id"},
		{"CloudEvents without ce_type", kgo.Record{Headers: ceHeaders("ce_type")}, "missing header ce_type"},
		{"CloudEvents 0.3", kgo.Record{Headers: append(ceHeaders("ce_specversion"), kgo.RecordHeader{Key: "ce_specversion", Value: []byte("0.3")})}, "unsupported ce_specversion"},
		{"CloudEvents not JSON", kgo.Record{Headers: append(ceHeaders(""), kgo.RecordHeader{Key: "content-type", Value: []byte("application/avro")})}, "is not JSON"},
		{"structured without id", kgo.Record{Headers: structured, Value: []byte(`{"specversion":"1.0","source":"s","type":"T","data":{}}`)}, "missing attribute id"},
		{"structured not JSON", kgo.Record{Headers: structured, Value: []byte(`{"specversion":`)}, "CloudEvents structured record"},
		{"structured batch", kgo.Record{Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents-batch+json")}}, Value: []byte(`[]`)}, "unsupported CloudEvents content-type"},
		{"no format at all", kgo.Record{Value: []byte(`{"order_id":"o-1"}`)}, "missing header outbox-version"},
		{"text", kgo.Record{Value: []byte(`hello`)}, "unknown format"},
	}
	for _, tc := range cases {
		rec := tc.rec
		rec.Topic = "t"
		env, _, err := decodeRecord(&rec)
		require.ErrorIs(t, err, ErrMalformedRecord, tc.name)
		require.ErrorContains(t, err, tc.wantErr, tc.name)
		if tc.wantErr == "missing field idempotency_key" || tc.wantErr == "missing header ce_id" || tc.wantErr == "missing attribute id" {
			require.Empty(t, env.IdempotencyKey, tc.name)
		}
	}
}

// FuzzDecodeAnyFormat feeds arbitrary values and format headers to the
// detecting decoder: never a panic; every failure wraps ErrMalformedRecord;
// every success has an identity.
func FuzzDecodeAnyFormat(f *testing.F) {
	f.Add([]byte(pythonRecords[0].value), "", "", "")
	f.Add([]byte(`{"specversion":"1.0","id":"i","type":"T","data":[1]}`), "application/cloudevents+json", "", "")
	f.Add([]byte(`{}`), "application/json", "1.0", "id")
	f.Add([]byte(`{"topic":"t","content_schema":"S","idempotency_key":"k","partition_key":"9"}`), "", "", "")
	f.Fuzz(func(t *testing.T, value []byte, contentType, specversion, id string) {
		rec := &kgo.Record{Topic: "t", Value: value}
		if contentType != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte(contentType)})
		}
		if specversion != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "ce_specversion", Value: []byte(specversion)},
				kgo.RecordHeader{Key: "ce_type", Value: []byte("T")}, kgo.RecordHeader{Key: "ce_id", Value: []byte(id)})
		}
		env, _, err := decodeRecord(rec)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedRecord)
			return
		}
		require.NotEmpty(t, env.ContentSchema)
		require.NotEmpty(t, env.IdempotencyKey)
	})
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
		for _, pr := range pythonRecords {
			b.produceRaw(t, &kgo.Record{Topic: paymentsTopic, Partition: 0, Value: []byte(pr.value)})
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

// FuzzEventOutboxRoundTrip: an event-outbox record, stripped of its headers
// as the Python library would see it, decodes to the identity it was
// encoded with (for the UTF-8 envelopes Record lets through), or is
// malformed; never a panic.
func FuzzEventOutboxRoundTrip(f *testing.F) {
	f.Add("PaymentRequested", "k", "7", int64(1767323045123), `{"a":1}`)
	f.Add("S", "é\"<>&\u2028", "", int64(0), `{}`)
	f.Fuzz(func(t *testing.T, schema, key, pk string, ms int64, payload string) {
		if !utf8.ValidString(schema) || !utf8.ValidString(key) || !utf8.ValidString(pk) {
			return // refused by Record for an event-outbox topic
		}
		env := Envelope{Topic: paymentsTopic, ContentSchema: schema, IdempotencyKey: key, PartitionKey: pk,
			OccurredAt: time.UnixMilli(ms % (1 << 45)).UTC(), Format: FormatEventOutbox}
		rec := encodeRecord(&env, []byte(payload))
		bare := &kgo.Record{Topic: rec.Topic, Value: rec.Value}
		got, _, err := decodeRecord(bare)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedRecord)
			return
		}
		if _, isBody := header(rec, HeaderFormat); !isBody {
			return // not an object payload: encoded natively, no body identity
		}
		require.Equal(t, schema, got.ContentSchema)
		require.Equal(t, key, got.IdempotencyKey)
		require.True(t, env.OccurredAt.Equal(got.OccurredAt), "%v != %v", env.OccurredAt, got.OccurredAt)
	})
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
		Options: options.Index().SetName(indexOutboxIdempotency)})
	require.NoError(t, err)
	err = record(d)
	require.ErrorIs(t, err, ErrIndexConflict)
	require.ErrorContains(t, err, "UniqueIdempotencyKeys")
	require.Zero(t, count(t, d.outbox, bson.D{}))
}

package outbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// strictEvent is an event with typed, validated fields, for bad input.
type strictEvent struct {
	OrderID string   `json:"order_id" validate:"required,max=64"`
	Amount  int      `json:"amount" validate:"gte=1"`
	Tags    []string `json:"tags" validate:"max=3"`
	Note    string   `json:"note" validate:"max=1024"`
}

func (strictEvent) Topic() string          { return ordersTopic }
func (strictEvent) ContentSchema() string  { return "Strict.v1" }
func (e strictEvent) PartitionKey() string { return e.OrderID }

// logCapture is a slog handler that keeps every record, for tests that
// assert what is (or is not) logged.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{l}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type lockedWriter struct{ l *logCapture }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	return w.l.buf.Write(p)
}

// TestBadInputIsParkedOrReported sends every kind of bad record through the
// real consumer: each one is parked with a clear error (or, for an unknown
// content schema, acknowledged with a log line naming it), none crashes the
// consumer or blocks the partition, and a good event after all of them is
// handled.
func TestBadInputIsParkedOrReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &logCapture{}
	cfg := b.config("bad")
	cfg.Logger = logs.logger()
	// The records share a key: under HoldKey all but the first would be
	// held behind it, with no error of their own to check.
	cfg.PoisonPolicy = SkipEvent
	c := b.client(t, cfg)
	var handled sync.Map
	MustHandle(c, func(_ context.Context, e strictEvent, _ Metadata) error {
		handled.Store(e.OrderID, true)
		return nil
	})

	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	header := func(schema, key string) []kgo.RecordHeader {
		return []kgo.RecordHeader{
			{Key: HeaderVersion, Value: []byte(WireVersion)},
			{Key: HeaderContentSchema, Value: []byte(schema)},
			{Key: HeaderIdempotencyKey, Value: []byte(key)},
			{Key: HeaderOccurredAt, Value: []byte("2026-01-02T03:04:05.000Z")},
		}
	}
	cases := []struct {
		name    string
		headers []kgo.RecordHeader
		value   string
		wantErr string // in the parked event's last error
	}{
		{"invalid JSON", header("Strict.v1", "bad-json"), `{"order_id": "o1", `, "decode Strict.v1 payload"},
		{"not an object", header("Strict.v1", "bad-array"), `[1,2,3]`, "decode Strict.v1 payload"},
		{"wrong type", header("Strict.v1", "bad-type"), `{"order_id": 12, "amount": 1}`, "decode Strict.v1 payload"},
		{"wrong nested type", header("Strict.v1", "bad-tags"), `{"order_id": "o1", "amount": 1, "tags": "x"}`, "decode Strict.v1 payload"},
		{"missing required field", header("Strict.v1", "bad-missing"), `{"amount": 1}`, "OrderID"},
		{"failed validation", header("Strict.v1", "bad-amount"), `{"order_id": "o1", "amount": 0}`, "Amount"},
		{"empty payload", header("Strict.v1", "bad-empty"), ``, "decode Strict.v1 payload"},
		{"null payload", header("Strict.v1", "bad-null"), `null`, "OrderID"},
		{"oversized field", header("Strict.v1", "bad-big"), `{"order_id": "o1", "amount": 1, "note": "` + strings.Repeat("x", 512<<10) + `"}`, "Note"},
		{"too deeply nested", header("Strict.v1", "bad-deep"), `{"order_id": "o1", "amount": 1, "tags": ` + deep + `}`, "decode Strict.v1 payload"},
		{"invalid UTF-8 key", header("Strict.v1", "bad-utf8"), "{\"order_id\": \"\xff\xfe\", \"amount\": 1}", ""},
		{"missing version", header("Strict.v1", "bad-nover")[1:], `{}`, "missing header outbox-version"},
		{"unknown version", append([]kgo.RecordHeader{{Key: HeaderVersion, Value: []byte("2")}}, header("Strict.v1", "bad-ver")[1:]...), `{}`, "unsupported outbox-version"},
		{"missing idempotency key", slicesDelete(header("Strict.v1", ""), 2), `{}`, "missing header idempotency-key"},
		{"empty content schema", header("", "bad-schema"), `{}`, "missing header content-schema"},
		{"bad occurred-at", append(header("Strict.v1", "bad-time")[:3], kgo.RecordHeader{Key: HeaderOccurredAt, Value: []byte("yesterday")}), `{}`, "occurred-at"},
		{"oversized idempotency key", header("Strict.v1", strings.Repeat("k", 2000)), `{}`, "longer than"},
	}
	for _, tc := range cases {
		b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Key: []byte("o1"), Value: []byte(tc.value), Headers: tc.headers})
	}
	// Unknown content schema: no handler, parked as such.
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Key: []byte("o1"), Value: []byte(`{}`), Headers: header("Unknown.v9", "unknown-1")})
	// A good event after all of them.
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Key: []byte("good"), Value: []byte(`{"order_id": "good", "amount": 5}`), Headers: header("Strict.v1", "good-1")})

	start(t, c)
	eventually(t, "the good event after the bad ones", func() bool { _, ok := handled.Load("good"); return ok })
	// The invalid UTF-8 case decodes (encoding/json replaces bad bytes), so
	// it is handled, not parked.
	wantParked := len(cases) - 1 + 1
	eventually(t, "every bad record parked", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == int64(wantParked)
	})
	parked, err := c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	require.NoError(t, err)
	byKey := map[string]ParkedEvent{}
	for _, p := range parked {
		byKey[p.ID.IdempotencyKey] = p
	}
	for _, tc := range cases {
		if tc.wantErr == "" {
			continue
		}
		key := ""
		for _, h := range tc.headers {
			if h.Key == HeaderIdempotencyKey {
				key = string(h.Value)
			}
		}
		p, ok := byKey[key]
		if !ok {
			for k, v := range byKey {
				if strings.HasPrefix(k, "malformed:") && strings.Contains(v.LastError, tc.wantErr) {
					p = v
				}
			}
		}
		require.Contains(t, p.LastError, tc.wantErr, "case %q: parked with a clear error", tc.name)
		require.Contains(t, p.LastError, "malformed record", "case %q", tc.name)
	}
	require.Contains(t, logs.String(), "no handler for event")
	require.Contains(t, logs.String(), "Unknown.v9")
}

func slicesDelete(h []kgo.RecordHeader, i int) []kgo.RecordHeader {
	return append(h[:i:i], h[i+1:]...)
}

// fuzzClient returns a Client that does no I/O (its MongoDB client never
// connects), for decoders.
func fuzzClient(f *testing.F) *Client {
	mc, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1").SetServerSelectionTimeout(time.Millisecond))
	require.NoError(f, err)
	f.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	c, err := New(Config{Mongo: mc, Database: "fuzz", Brokers: []string{"127.0.0.1:1"}, Service: "fuzz"})
	require.NoError(f, err)
	MustHandle(c, func(context.Context, strictEvent, Metadata) error { return nil })
	return c
}

// FuzzHandlerDecode feeds arbitrary payloads to a typed handler's decoder:
// it never panics, every failure wraps ErrMalformedRecord (so the consumer
// parks it), and every success is a valid event.
func FuzzHandlerDecode(f *testing.F) {
	c := fuzzClient(f)
	h := c.handlerFor(ordersTopic, "Strict.v1")
	require.NotNil(f, h)
	for _, s := range []string{`{"order_id":"a","amount":1}`, `{}`, `null`, `[]`, `{"amount":"1"}`, `{"tags":[1]}`, ``, `{"order_id":"a","amount":1,"tags":["a","b","c","d"]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		evt, err := h.decode(c, payload)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedRecord)
			return
		}
		e, ok := evt.(strictEvent)
		require.True(t, ok)
		require.NoError(t, c.validateEvent("Strict.v1", e))
	})
}

// FuzzRecordRoundTrip: any envelope the publisher can produce (from any
// outbox document) decodes back to the same envelope, or, when it carries
// fields a consumer refuses, fails with ErrMalformedRecord; never a panic.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add("orders", "S.v1", "key", "pk", int32(0), int64(0), "{}")
	f.Add("", "", "", "", int32(-1), int64(-1<<62), "")
	f.Fuzz(func(t *testing.T, topic, schema, key, pk string, part int32, ms int64, payload string) {
		env := Envelope{Topic: topic, ContentSchema: schema, IdempotencyKey: key, PartitionKey: pk, Partition: part,
			OccurredAt: time.UnixMilli(ms % (1 << 45)).UTC()}
		got, _, err := decodeRecord(encodeRecord(&env, []byte(payload)))
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedRecord)
			return
		}
		require.Equal(t, env.ContentSchema, got.ContentSchema)
		require.Equal(t, env.IdempotencyKey, got.IdempotencyKey)
		require.Equal(t, env.PartitionKey, got.PartitionKey)
		require.True(t, env.OccurredAt.Equal(got.OccurredAt), "%v != %v", env.OccurredAt, got.OccurredAt)
	})
}

// FuzzStoredDocuments decodes arbitrary BSON as the stored outbox and inbox
// documents (what the publisher and ParkedEvents/Redrive read back from
// MongoDB): never a panic; a decoded outbox document always yields a
// record, and inbox ids survive a round trip.
func FuzzStoredDocuments(f *testing.F) {
	seedOutbox, _ := bson.Marshal(outboxDoc{ID: bson.NewObjectID(), Topic: "t", Schema: "S.v1", IdempotencyKey: "k", Payload: "{}"})
	seedInbox, _ := bson.Marshal(inboxDoc{ID: InboxID{Topic: "t", ContentSchema: "S.v1", IdempotencyKey: "k"}, Parked: true})
	f.Add(seedOutbox)
	f.Add(seedInbox)
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var od outboxDoc
		if err := bson.Unmarshal(raw, &od); err == nil {
			env := outboxEnvelope(&od)
			rec := encodeRecord(&env, []byte(od.Payload))
			require.Equal(t, od.Topic, rec.Topic)
			if _, _, err := decodeRecord(rec); err != nil {
				require.True(t, errors.Is(err, ErrMalformedRecord))
			}
		}
		var id InboxID
		if err := bson.Unmarshal(raw, &id); err == nil {
			again, err := bson.Marshal(id)
			require.NoError(t, err)
			var back InboxID
			require.NoError(t, bson.Unmarshal(again, &back))
			require.Equal(t, id, back)
		}
		var in inboxDoc
		_ = bson.Unmarshal(raw, &in)
	})
}

package wire

import (
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/wire/wiretest"
)

func TestDecodePythonLibraryRecords(t *testing.T) {
	t.Parallel()
	for _, pr := range wiretest.PythonRecords(t) {
		rec := &kgo.Record{Topic: "payments", Partition: 1, Value: []byte(pr.Value)}
		env, payload, err := Decode(rec, rec.Topic)
		require.NoError(t, err, pr.Name)
		require.Equal(t, Envelope{Topic: "payments", ContentSchema: pr.ContentSchema, IdempotencyKey: pr.IdempotencyKey,
			PartitionKey: pr.PartitionKey, Partition: 1, OccurredAt: pr.OccurredAt, Format: EventOutbox}, env, pr.Name)
		require.Equal(t, pr.Value, string(payload), pr.Name)
	}
}

func TestEventOutboxRecordIsTheLibrarysLayout(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: "payments", ContentSchema: "PaymentRequested", IdempotencyKey: "6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3",
		PartitionKey: "7", Partition: 1, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 123000000, time.UTC), Format: EventOutbox,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	rec := Encode(&env, []byte(`{"order_id":"o-1","account":7,"amount":12.5}`))
	// What model_dump_json() writes for the same event (pydantic 2.13.4):
	// MongoDB keeps milliseconds, so the microseconds end in 000.
	require.Equal(t, `{"topic":"payments","content_schema":"PaymentRequested","partition_key":7,"idempotency_key":"6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3","occurred_at":"2026-01-02T03:04:05.123000Z","order_id":"o-1","account":7,"amount":12.5}`, string(rec.Value))
	require.Equal(t, []byte("7"), rec.Key)
	require.Equal(t, int32(1), rec.Partition)
	got, payload, err := Decode(rec, rec.Topic)
	require.NoError(t, err)
	require.Equal(t, env, got, "native headers kept, so native consumers read it too")
	require.Equal(t, rec.Value, payload)
	// Without its headers (as a Python producer would forward it), the body
	// alone gives the same identity.
	bare := &kgo.Record{Topic: rec.Topic, Partition: rec.Partition, Value: rec.Value}
	got, _, err = Decode(bare, bare.Topic)
	require.NoError(t, err)
	require.Equal(t, env.IdempotencyKey, got.IdempotencyKey)
	require.Equal(t, env.ContentSchema, got.ContentSchema)
	require.Equal(t, "7", got.PartitionKey)
	require.True(t, env.OccurredAt.Equal(got.OccurredAt))

	// Edge layouts: an empty object, a key that is not an integer (left out:
	// the library reads 0), a whole second.
	env2 := Envelope{Topic: "t", ContentSchema: "S", IdempotencyKey: "k", PartitionKey: "o-1", OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Format: EventOutbox}
	require.Equal(t, `{"topic":"t","content_schema":"S","idempotency_key":"k","occurred_at":"2026-01-02T03:04:05Z"}`, string(Encode(&env2, []byte(` { } `)).Value))
}

func TestCloudEventsBinaryRecord(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-1", PartitionKey: "o-1", Partition: 2,
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Format: CloudEvents, Source: "/orders",
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "a=b"}
	rec := Encode(&env, []byte(`{"order_id":"o-1"}`))
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
	back, payload, err := Decode(rec, rec.Topic)
	require.NoError(t, err)
	require.Equal(t, env, back)
	require.Equal(t, rec.Value, payload)
}

func TestCloudEventsStructuredRecord(t *testing.T) {
	t.Parallel()
	rec := &kgo.Record{Topic: "orders", Partition: 0,
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}},
		Value: []byte(`{"specversion":"1.0","id":"A234-1234-1234","source":"https://example.com/orders","type":"OrderPlaced.v1",` +
			`"time":"2018-04-05T17:31:00Z","partitionkey":"o-9","datacontenttype":"application/json","data":{"order_id":"o-9","amount":3}}`)}
	env, payload, err := Decode(rec, rec.Topic)
	require.NoError(t, err)
	require.Equal(t, Envelope{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "A234-1234-1234", PartitionKey: "o-9",
		OccurredAt: time.Date(2018, 4, 5, 17, 31, 0, 0, time.UTC), Format: CloudEvents, Source: "https://example.com/orders"}, env)
	require.Equal(t, `{"order_id":"o-9","amount":3}`, string(payload))

	rec.Value = []byte(`{"specversion":"1.0","id":"b64","source":"s","type":"T","data_base64":"eyJhIjoxfQ=="}`)
	_, payload, err = Decode(rec, rec.Topic)
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
		env, _, err := Decode(&rec, rec.Topic)
		require.ErrorIs(t, err, ErrMalformed, tc.name)
		require.ErrorContains(t, err, tc.wantErr, tc.name)
		if tc.wantErr == "missing field idempotency_key" || tc.wantErr == "missing header ce_id" || tc.wantErr == "missing attribute id" {
			require.Empty(t, env.IdempotencyKey, tc.name)
		}
	}
}

// FuzzDecodeAnyFormat feeds arbitrary values and format headers to the
// detecting decoder: never a panic; every failure wraps ErrMalformed;
// every success has an identity.
func FuzzDecodeAnyFormat(f *testing.F) {
	for _, pr := range wiretest.PythonRecords(f) {
		f.Add([]byte(pr.Value), "", "", "")
	}
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
		requireIdentityOrMalformed(t, rec)
	})
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
		env := Envelope{Topic: "payments", ContentSchema: schema, IdempotencyKey: key, PartitionKey: pk,
			OccurredAt: time.UnixMilli(ms % (1 << 45)).UTC(), Format: EventOutbox}
		rec := Encode(&env, []byte(payload))
		bare := &kgo.Record{Topic: rec.Topic, Value: rec.Value}
		got, _, err := Decode(bare, bare.Topic)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
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

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: "orders", ContentSchema: "OrderCreated.v1", IdempotencyKey: "k1", PartitionKey: "o-1",
		Partition: 3, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	rec := Encode(&env, []byte(`{"order_id":"o-1"}`))
	require.Equal(t, []byte("o-1"), rec.Key)
	require.Equal(t, int32(3), rec.Partition)
	got, _, err := Decode(rec, rec.Topic)
	require.NoError(t, err)
	require.Equal(t, env, got)
}

func TestDecodeRecordRejectsBadHeaders(t *testing.T) {
	t.Parallel()
	good := func() []kgo.RecordHeader {
		return []kgo.RecordHeader{
			{Key: HeaderVersion, Value: []byte("1")},
			{Key: HeaderContentSchema, Value: []byte("S")},
			{Key: HeaderIdempotencyKey, Value: []byte("k")},
			{Key: HeaderOccurredAt, Value: []byte("2026-01-02T03:04:05.000Z")},
		}
	}
	without := func(key string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for _, h := range good() {
			if h.Key != key {
				out = append(out, h)
			}
		}
		return out
	}
	with := func(key, value string) []kgo.RecordHeader {
		out := without(key)
		return append(out, kgo.RecordHeader{Key: key, Value: []byte(value)})
	}
	long := make([]byte, MaxKeyLen+1)
	cases := map[string][]kgo.RecordHeader{
		"no headers":          nil,
		"no version":          without(HeaderVersion),
		"future version":      with(HeaderVersion, "2"),
		"no schema":           without(HeaderContentSchema),
		"empty schema":        with(HeaderContentSchema, ""),
		"no idempotency key":  without(HeaderIdempotencyKey),
		"long idempotency":    with(HeaderIdempotencyKey, string(long)),
		"bad occurred-at":     with(HeaderOccurredAt, "yesterday"),
		"garbage occurred-at": with(HeaderOccurredAt, "\xff\xfe"),
	}
	for name, headers := range cases {
		_, _, err := Decode(&kgo.Record{Topic: "t", Headers: headers}, "t")
		require.True(t, errors.Is(err, ErrMalformed), "%s: %v", name, err)
	}
	_, _, err := Decode(&kgo.Record{Topic: "t", Headers: good()}, "t")
	require.NoError(t, err)
}

// FuzzDecodeNative feeds arbitrary native headers to the decoder, with the
// same expectations as FuzzDecodeAnyFormat.
func FuzzDecodeNative(f *testing.F) {
	f.Add([]byte("1"), []byte("S"), []byte("k"), []byte("2026-01-02T03:04:05.000Z"), []byte(`{}`))
	f.Add([]byte(""), []byte(""), []byte(""), []byte(""), []byte(""))
	f.Fuzz(func(t *testing.T, version, schema, key, occurred, value []byte) {
		rec := &kgo.Record{Topic: "t", Value: value, Headers: []kgo.RecordHeader{
			{Key: HeaderVersion, Value: version},
			{Key: HeaderContentSchema, Value: schema},
			{Key: HeaderIdempotencyKey, Value: key},
			{Key: HeaderOccurredAt, Value: occurred},
		}}
		requireIdentityOrMalformed(t, rec)
	})
}

// requireIdentityOrMalformed decodes rec: it must fail with ErrMalformed
// or yield a content schema and an idempotency key.
func requireIdentityOrMalformed(t *testing.T, rec *kgo.Record) {
	t.Helper()
	env, _, err := Decode(rec, rec.Topic)
	if err != nil {
		require.ErrorIs(t, err, ErrMalformed)
		return
	}
	require.NotEmpty(t, env.ContentSchema)
	require.NotEmpty(t, env.IdempotencyKey)
}

// TestCheckEventOutboxPayload: only a JSON object can sit beside the
// envelope fields, and the first envelope field it has, in the library's
// order, is named.
func TestCheckEventOutboxPayload(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]struct {
		field    string
		isObject bool
	}{
		`{"order_id":"o-1"}`:            {"", true},
		` { } `:                         {"", true},
		`{"occurred_at":1,"topic":"x"}`: {"topic", true},
		`{"idempotency_key":"k"}`:       {"idempotency_key", true},
		`[1]`:                           {"", false},
		`null`:                          {"", false},
		`{"a":`:                         {"", false},
		``:                              {"", false},
	} {
		field, isObject := CheckEventOutboxPayload([]byte(payload))
		require.Equal(t, want.field, field, payload)
		require.Equal(t, want.isObject, isObject, payload)
	}
	b, err := MarshalUnescaped(map[string]string{"note": `é"<>&`})
	require.NoError(t, err)
	require.Equal(t, `{"note":"é\"<>&"}`, string(b))
}

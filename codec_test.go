package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	env := Envelope{Topic: "orders", ContentSchema: "OrderCreated.v1", IdempotencyKey: "k1", PartitionKey: "o-1",
		Partition: 3, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	rec := encodeRecord(&env, []byte(`{"order_id":"o-1"}`))
	require.Equal(t, []byte("o-1"), rec.Key)
	require.Equal(t, int32(3), rec.Partition)
	got, _, err := decodeRecord(rec)
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
	long := make([]byte, maxKeyLen+1)
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
		_, _, err := decodeRecord(&kgo.Record{Topic: "t", Headers: headers})
		require.True(t, errors.Is(err, ErrMalformedRecord), "%s: %v", name, err)
	}
	_, _, err := decodeRecord(&kgo.Record{Topic: "t", Headers: good()})
	require.NoError(t, err)
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte("1"), []byte("S"), []byte("k"), []byte("2026-01-02T03:04:05.000Z"), []byte(`{}`))
	f.Add([]byte(""), []byte(""), []byte(""), []byte(""), []byte(""))
	f.Fuzz(func(t *testing.T, version, schema, key, occurred, value []byte) {
		rec := &kgo.Record{Topic: "t", Value: value, Headers: []kgo.RecordHeader{
			{Key: HeaderVersion, Value: version},
			{Key: HeaderContentSchema, Value: schema},
			{Key: HeaderIdempotencyKey, Value: key},
			{Key: HeaderOccurredAt, Value: occurred},
		}}
		env, _, err := decodeRecord(rec)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedRecord)
			return
		}
		require.NotEmpty(t, env.ContentSchema)
		require.NotEmpty(t, env.IdempotencyKey)
	})
}

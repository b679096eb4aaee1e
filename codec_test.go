package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/wire"
)

// TestWireConstantsAreTheEncodersOwn: the public header names, version and
// formats are the values package wire encodes and detects (the root spells
// them again so that go doc shows them).
func TestWireConstantsAreTheEncodersOwn(t *testing.T) {
	t.Parallel()
	require.Equal(t, wire.Version, WireVersion)
	for root, w := range map[string]string{
		HeaderVersion: wire.HeaderVersion, HeaderContentSchema: wire.HeaderContentSchema,
		HeaderIdempotencyKey: wire.HeaderIdempotencyKey, HeaderOccurredAt: wire.HeaderOccurredAt,
		HeaderContentType: wire.HeaderContentType, HeaderTraceParent: wire.HeaderTraceParent,
		HeaderTraceState: wire.HeaderTraceState, HeaderFormat: wire.HeaderFormat,
	} {
		require.Equal(t, w, root)
	}
	for f, w := range map[Format]wire.Format{FormatNative: wire.Native, FormatEventOutbox: wire.EventOutbox, FormatCloudEvents: wire.CloudEvents} {
		require.Equal(t, uint8(w), uint8(f))
		require.Equal(t, w.String(), f.String())
	}
}

// TestRecordRoundTrip: every field of the envelope crosses the boundary
// with package wire both ways, in every format.
func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	for _, f := range []Format{FormatNative, FormatEventOutbox, FormatCloudEvents} {
		env := Envelope{Topic: "orders", ContentSchema: "OrderCreated.v1", IdempotencyKey: "k1", PartitionKey: "7",
			Partition: 3, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC), Format: f,
			TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "a=b"}
		if f == FormatCloudEvents {
			env.Source = "/orders"
		}
		rec := encodeRecord(&env, []byte(`{"order_id":"o-1"}`))
		require.Equal(t, []byte("7"), rec.Key, f.String())
		require.Equal(t, int32(3), rec.Partition, f.String())
		got, _, err := decodeRecord(rec)
		require.NoError(t, err, f.String())
		require.Equal(t, env, got, f.String())
	}
}

// TestDecodeRecordWrapsErrMalformedRecord: a record package wire refuses
// is malformed for the root's callers, with one prefix, and keeps what
// could be read of its identity.
func TestDecodeRecordWrapsErrMalformedRecord(t *testing.T) {
	t.Parallel()
	env, payload, err := decodeRecord(&kgo.Record{Topic: "t", Partition: 2, Key: []byte("k"), Value: []byte(`{}`),
		Headers: []kgo.RecordHeader{{Key: HeaderVersion, Value: []byte("2")}}})
	require.ErrorIs(t, err, ErrMalformedRecord)
	require.EqualError(t, err, `outbox: malformed record: unsupported outbox-version "2"`)
	require.Equal(t, Envelope{Topic: "t", Partition: 2, PartitionKey: "k"}, env)
	require.Equal(t, `{}`, string(payload))
}

// header returns the value of the record's first header named key.
func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

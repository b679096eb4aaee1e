package outbox

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/wire"
)

// Native wire format, version 1: the default of Config.WireFormats (see
// Format for the Python event-outbox and CloudEvents formats).
//
// A native Kafka record written by the publisher has:
//
//   - Key: the event's partition key (UTF-8 bytes), so tools and consumers
//     outside the framework see ordinary keyed records.
//   - Value: the event's JSON payload, exactly as encoding/json produced it
//     when the event was recorded.
//   - Headers (values are UTF-8 strings):
//     outbox-version   "1", the wire format version.
//     content-schema   the event's ContentSchema, e.g. "OrderCreated.v1".
//     idempotency-key  the event's idempotency key.
//     occurred-at      RFC 3339 time with milliseconds, UTC.
//     content-type     "application/json".
//     traceparent      W3C trace context, when the event was recorded under one.
//     tracestate       W3C trace state, when present.
//
// Consumers accept any record with a known outbox-version and the required
// headers; headers they do not know are ignored, so later versions may add
// headers without breaking older consumers.
const (
	WireVersion = "1"

	HeaderVersion        = "outbox-version"
	HeaderContentSchema  = "content-schema"
	HeaderIdempotencyKey = "idempotency-key"
	HeaderOccurredAt     = "occurred-at"
	HeaderContentType    = "content-type"
	HeaderTraceParent    = "traceparent"
	HeaderTraceState     = "tracestate"
)

// toWire is the envelope as package wire reads it.
func (env *Envelope) toWire() wire.Envelope {
	return wire.Envelope{Topic: env.Topic, ContentSchema: env.ContentSchema, IdempotencyKey: env.IdempotencyKey,
		PartitionKey: env.PartitionKey, Partition: env.Partition, OccurredAt: env.OccurredAt,
		TraceParent: env.TraceParent, TraceState: env.TraceState, Format: wire.Format(env.Format), Source: env.Source}
}

// envelopeOf is the public form of an envelope package wire decoded.
func envelopeOf(w *wire.Envelope) Envelope {
	return Envelope{Topic: w.Topic, ContentSchema: w.ContentSchema, IdempotencyKey: w.IdempotencyKey,
		PartitionKey: w.PartitionKey, Partition: w.Partition, OccurredAt: w.OccurredAt,
		TraceParent: w.TraceParent, TraceState: w.TraceState, Format: Format(w.Format), Source: w.Source}
}

// encodeRecord builds the Kafka record of an event in its format
// (env.Format; see Format).
func encodeRecord(env *Envelope, payload []byte) *kgo.Record {
	w := env.toWire()
	return wire.Encode(&w, payload)
}

// decodeRecord reads the envelope and the payload (the JSON a handler
// decodes) of a Kafka record, in whichever format it was written (see
// Format for the detection). It never panics; every failure wraps
// ErrMalformedRecord and names what is wrong; the payload is then the
// record's value.
func decodeRecord(r *kgo.Record) (Envelope, []byte, error) { return decodeRecordFrom(r, r.Topic) }

// decodeRecord is decodeRecord for a record of the client's consumer,
// whose topic is bare: the Python library writes the Kafka topic it
// produced to (Config.TopicPrefix included) in its body's topic field.
func (c *Client) decodeRecord(r *kgo.Record) (Envelope, []byte, error) {
	return decodeRecordFrom(r, c.cfg.kafkaTopic(r.Topic))
}

// decodeRecordFrom is decodeRecord for a record read from kafkaTopic.
func decodeRecordFrom(r *kgo.Record, kafkaTopic string) (Envelope, []byte, error) {
	w, payload, err := wire.Decode(r, kafkaTopic)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrMalformedRecord, err)
	}
	return envelopeOf(&w), payload, err
}

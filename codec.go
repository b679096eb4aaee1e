package outbox

import (
	"fmt"
	"mime"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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

	contentTypeJSON = "application/json"
	timeLayout      = "2006-01-02T15:04:05.000Z07:00"
)

// encodeRecord builds the Kafka record of an event in its format
// (env.Format; see Format).
func encodeRecord(env *Envelope, payload []byte) *kgo.Record {
	switch env.Format {
	case FormatEventOutbox:
		return encodeEventOutbox(env, payload)
	case FormatCloudEvents:
		return encodeCloudEvents(env, payload)
	}
	return encodeNative(env, payload)
}

// encodeNative builds the native (version 1) record of an event.
func encodeNative(env *Envelope, payload []byte) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, 7)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderVersion, Value: []byte(WireVersion)},
		kgo.RecordHeader{Key: HeaderContentSchema, Value: []byte(env.ContentSchema)},
		kgo.RecordHeader{Key: HeaderIdempotencyKey, Value: []byte(env.IdempotencyKey)},
		kgo.RecordHeader{Key: HeaderOccurredAt, Value: []byte(env.OccurredAt.UTC().Format(timeLayout))},
		kgo.RecordHeader{Key: HeaderContentType, Value: []byte(contentTypeJSON)},
	)
	if env.TraceParent != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderTraceParent, Value: []byte(env.TraceParent)})
	}
	if env.TraceState != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderTraceState, Value: []byte(env.TraceState)})
	}
	return &kgo.Record{
		Topic:     env.Topic,
		Partition: env.Partition,
		Key:       []byte(env.PartitionKey),
		Value:     payload,
		Headers:   headers,
	}
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
	if _, ok := header(r, HeaderVersion); ok {
		env, err := decodeNative(r)
		return env, r.Value, err
	}
	if _, ok := header(r, headerCESpecVersion); ok {
		return decodeCloudEventsBinary(r)
	}
	if ct, ok := header(r, HeaderContentType); ok {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && strings.HasPrefix(mt, "application/cloudevents") {
			if mt != contentTypeCEJSON {
				env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: FormatCloudEvents}
				return env, r.Value, malformed("unsupported CloudEvents content-type %q (want %s)", mt, contentTypeCEJSON)
			}
			return decodeCloudEventsStructured(r)
		}
	}
	env, looksLike, err := decodeEventOutbox(r, kafkaTopic)
	if !looksLike {
		env.Format = FormatNative
		return env, r.Value, malformed("unknown format: missing header %s (native), no %s header (CloudEvents), "+
			"and the value is not an event-outbox JSON object (no topic, content_schema or idempotency_key field)",
			HeaderVersion, headerCESpecVersion)
	}
	return env, r.Value, err
}

// decodeNative reads a native record, or an event-outbox record written by
// this framework (the native headers and outbox-format "event-outbox").
func decodeNative(r *kgo.Record) (Envelope, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key)}
	if f, _ := header(r, HeaderFormat); f == FormatEventOutbox.String() {
		env.Format = FormatEventOutbox
	}
	var version, occurred string
	var seen [3]bool
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderVersion:
			version = string(h.Value)
		case HeaderContentSchema:
			env.ContentSchema, seen[0] = string(h.Value), true
		case HeaderIdempotencyKey:
			env.IdempotencyKey, seen[1] = string(h.Value), true
		case HeaderOccurredAt:
			occurred, seen[2] = string(h.Value), true
		case HeaderTraceParent:
			env.TraceParent = string(h.Value)
		case HeaderTraceState:
			env.TraceState = string(h.Value)
		}
	}
	switch {
	case version == "":
		return env, fmt.Errorf("%w: missing header %s", ErrMalformedRecord, HeaderVersion)
	case version != WireVersion:
		return env, fmt.Errorf("%w: unsupported %s %s", ErrMalformedRecord, HeaderVersion, strconv.Quote(version))
	case !seen[0] || env.ContentSchema == "":
		return env, fmt.Errorf("%w: missing header %s", ErrMalformedRecord, HeaderContentSchema)
	case !seen[1] || env.IdempotencyKey == "":
		return env, fmt.Errorf("%w: missing header %s", ErrMalformedRecord, HeaderIdempotencyKey)
	case len(env.ContentSchema) > maxNameLen:
		return env, fmt.Errorf("%w: header %s longer than %d bytes", ErrMalformedRecord, HeaderContentSchema, maxNameLen)
	case len(env.IdempotencyKey) > maxKeyLen:
		return env, fmt.Errorf("%w: header %s longer than %d bytes", ErrMalformedRecord, HeaderIdempotencyKey, maxKeyLen)
	}
	if seen[2] {
		t, err := time.Parse(time.RFC3339Nano, occurred)
		if err != nil {
			return env, fmt.Errorf("%w: header %s: %w", ErrMalformedRecord, HeaderOccurredAt, err)
		}
		env.OccurredAt = t.UTC()
	}
	return env, nil
}

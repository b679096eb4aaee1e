package wire

import (
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// encodeNative builds the native (version 1) record of an event: the
// partition key as the record key, the payload as the value, and the
// identity in headers.
func encodeNative(env *Envelope, payload []byte) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, 7)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderVersion, Value: []byte(Version)},
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

// decodeNative reads a native record, or an event-outbox record written by
// this framework (the native headers and outbox-format "event-outbox").
// Headers it does not know are ignored, so that later versions may add
// headers without breaking older consumers.
func decodeNative(r *kgo.Record) (Envelope, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key)}
	if f, _ := header(r, HeaderFormat); f == EventOutbox.String() {
		env.Format = EventOutbox
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
		return env, malformed("missing header %s", HeaderVersion)
	case version != Version:
		return env, malformed("unsupported %s %s", HeaderVersion, strconv.Quote(version))
	case !seen[0] || env.ContentSchema == "":
		return env, malformed("missing header %s", HeaderContentSchema)
	case !seen[1] || env.IdempotencyKey == "":
		return env, malformed("missing header %s", HeaderIdempotencyKey)
	}
	if err := checkIdentity(&env, "header "+HeaderContentSchema, "header "+HeaderIdempotencyKey); err != nil {
		return env, err
	}
	if seen[2] {
		t, err := time.Parse(time.RFC3339Nano, occurred)
		if err != nil {
			return env, malformed("header %s: %w", HeaderOccurredAt, err)
		}
		env.OccurredAt = t.UTC()
	}
	return env, nil
}

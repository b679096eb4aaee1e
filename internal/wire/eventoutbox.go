package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// eventOutboxFields are the envelope fields of the Python library's Event
// model, in the order model_dump_json writes them.
var eventOutboxFields = [...]string{"topic", "content_schema", "partition_key", "idempotency_key", "occurred_at"}

// The layouts of an aware UTC datetime as pydantic 2 writes it.
const (
	pydanticTimeLayout   = "2006-01-02T15:04:05.000000Z07:00"
	pydanticSecondLayout = "2006-01-02T15:04:05Z07:00"
)

// CheckEventOutboxPayload checks an event's JSON for the flat event-outbox
// body, where the event's fields sit beside the envelope's: isObject is
// false when it is not a JSON object; envelopeField names the first
// envelope field it has (the body cannot hold a name twice), or is empty.
func CheckEventOutboxPayload(payload []byte) (envelopeField string, isObject bool) {
	var fields map[string]json.RawMessage
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &fields) != nil {
		return "", false
	}
	for _, name := range eventOutboxFields {
		if _, ok := fields[name]; ok {
			return name, true
		}
	}
	return "", true
}

// MarshalUnescaped encodes v as JSON without HTML escaping, as pydantic
// writes strings.
func MarshalUnescaped(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// appendJSONString appends s as a JSON string, without HTML escaping.
func appendJSONString(b []byte, s string) []byte {
	j, _ := MarshalUnescaped(s) // a string always encodes
	return append(b, j...)
}

// pydanticTime formats t as pydantic 2 serialises an aware UTC datetime:
// microseconds, none when they are zero, and "Z".
func pydanticTime(t time.Time) string {
	t = t.UTC()
	if t.Nanosecond()/1000 == 0 {
		return t.Format(pydanticSecondLayout)
	}
	return t.Format(pydanticTimeLayout)
}

// eventOutboxBody lays out the flat body of an event-outbox record: the
// envelope fields in the library's order, then the payload's fields. ok is
// false when the payload is not a JSON object (outbox.Record refuses those
// for an event-outbox topic, so only a hand-written outbox document can be
// one).
func eventOutboxBody(env *Envelope, payload []byte) (body []byte, ok bool) {
	rest := bytes.TrimSpace(payload)
	if len(rest) < 2 || rest[0] != '{' {
		return nil, false
	}
	rest = bytes.TrimSpace(rest[1:])
	b := make([]byte, 0, len(payload)+160)
	b = append(b, `{"topic":`...)
	b = appendJSONString(b, env.Topic)
	b = append(b, `,"content_schema":`...)
	b = appendJSONString(b, env.ContentSchema)
	if n, err := IntegerKey(env.PartitionKey); err == nil {
		b = append(b, `,"partition_key":`...)
		b = strconv.AppendInt(b, n, 10)
	}
	b = append(b, `,"idempotency_key":`...)
	b = appendJSONString(b, env.IdempotencyKey)
	b = append(b, `,"occurred_at":`...)
	b = appendJSONString(b, pydanticTime(env.OccurredAt))
	if rest[0] != '}' {
		b = append(b, ',')
	}
	return append(b, rest...), true
}

// encodeEventOutbox builds an event-outbox record: the flat body, and the
// native headers plus outbox-format, so that native consumers read it too.
func encodeEventOutbox(env *Envelope, payload []byte) *kgo.Record {
	body, ok := eventOutboxBody(env, payload)
	if !ok {
		return encodeNative(env, payload)
	}
	rec := encodeNative(env, body)
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderFormat, Value: []byte(EventOutbox.String())})
	return rec
}

// decodeEventOutbox reads a record without a known header as the Python
// library's flat body. The payload is the whole body (a handler's type
// ignores the envelope fields). looksLike is false when the value is not a
// JSON object with any of the library's identity fields: then it is no
// event-outbox record either. The body's topic must name the record's
// topic, bare or as read from Kafka (kafkaTopic: the library writes the
// topic it produced to, a topic prefix included).
//
// Every identity field is read before any is judged, so that a record
// parked as malformed keeps what could be read of its identity: above all
// its partition key, by which it holds the later events of its key.
func decodeEventOutbox(r *kgo.Record, kafkaTopic string) (env Envelope, looksLike bool, err error) {
	env = Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: EventOutbox}
	trimmed := bytes.TrimSpace(r.Value)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return env, false, nil
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &body); err != nil {
		return env, false, nil
	}
	_, hasTopic := body["topic"]
	_, hasSchema := body["content_schema"]
	_, hasKey := body["idempotency_key"]
	if !hasTopic && !hasSchema && !hasKey {
		return env, false, nil
	}
	str := func(field string) (string, error) {
		raw, ok := body[field]
		if !ok || string(raw) == "null" {
			return "", malformed("event-outbox record: missing field %s", field)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", malformed("event-outbox record: field %s is not a string", field)
		}
		if s == "" {
			return "", malformed("event-outbox record: empty field %s", field)
		}
		return s, nil
	}
	// The partition key first: it decides what a malformed record holds.
	var errs [6]error
	if r.Key == nil {
		n, err := eventOutboxPartitionKey(body["partition_key"])
		if err == nil {
			env.PartitionKey = strconv.FormatInt(n, 10)
		}
		errs[0] = err
	}
	topic, terr := str("topic")
	switch {
	case terr != nil:
		errs[1] = terr
	case topic != r.Topic && topic != kafkaTopic:
		errs[1] = malformed("event-outbox record: field topic %q differs from the record's topic %q", topic, kafkaTopic)
	}
	env.ContentSchema, errs[2] = str("content_schema")
	// The library would invent a random key for a missing one, which
	// makes every delivery a new event: refuse instead.
	env.IdempotencyKey, errs[3] = str("idempotency_key")
	if errs[2] == nil && errs[3] == nil {
		errs[4] = checkIdentity(&env, "field content_schema", "field idempotency_key")
	}
	if raw, ok := body["occurred_at"]; ok && string(raw) != "null" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			errs[5] = malformed("event-outbox record: field occurred_at is not a string")
		} else if t, err := time.Parse(time.RFC3339Nano, s); err != nil {
			errs[5] = malformed("event-outbox record: field occurred_at: %v", err)
		} else {
			env.OccurredAt = t.UTC()
		}
	}
	for _, err := range errs {
		if err != nil {
			return env, true, err
		}
	}
	return env, true, nil
}

// eventOutboxPartitionKey reads the library's integer partition_key: a JSON
// integer or a string holding one (pydantic's lax mode accepts both);
// absent means 0, the library's default.
func eventOutboxPartitionKey(raw json.RawMessage) (int64, error) {
	if raw == nil || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, malformed("event-outbox record: field partition_key %s is not an integer", raw)
	}
	return n, nil
}

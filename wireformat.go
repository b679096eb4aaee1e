package outbox

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/kafkax"
)

// Format is the wire format of the Kafka records of a topic's events.
//
// The publisher writes each event in the format Config.WireFormats gave its
// topic when the event was recorded (the choice is stored with the event, so
// a configuration change affects only later events). Consumers detect the
// format of every record on their own, whatever their configuration says:
// a topic may carry records of several formats, which is what a migration
// looks like.
//
// # Native (FormatNative, version 1)
//
// The default. Key: the partition key. Value: the event's JSON. Headers:
// outbox-version "1", content-schema, idempotency-key, occurred-at (RFC 3339,
// milliseconds, UTC), content-type "application/json", and traceparent and
// tracestate when the event was recorded under a trace.
//
// # Python event-outbox (FormatEventOutbox)
//
// The record of the Python library github.com/returnnullptr/event-outbox
// (v0.4.0): the value is one flat JSON object, the envelope fields first and
// the event's own fields after them, as pydantic's model_dump_json writes
// the library's Event model:
//
//	{"topic":"payments","content_schema":"PaymentRequested.v1","partition_key":42,
//	 "idempotency_key":"0f6c…","occurred_at":"2026-01-02T03:04:05.123000Z","order_id":"o-1"}
//
// partition_key is written when the partition key is a decimal integer (the
// library's type; it is left out otherwise, which the library reads as 0).
// occurred_at has microseconds, as pydantic writes them (MongoDB keeps
// milliseconds, so the last three digits are zero; a time on a whole second
// has no fraction, as in pydantic). The record also carries the native
// headers plus outbox-format "event-outbox" (the library reads only the
// value), so consumers of either kind read it. Record refuses, for such a
// topic, an event whose JSON is not an object or has a field named like an
// envelope field. The library's partitioning (partition = integer key modulo
// the partition count) is a separate choice: Config.EventOutboxPartitioning.
//
// # CloudEvents 1.0 (FormatCloudEvents)
//
// The CloudEvents Kafka protocol binding in binary content mode. Key: the
// partition key. Value: the event's JSON. Headers: ce_specversion "1.0",
// ce_id (the idempotency key), ce_source (Config.CloudEventsSource),
// ce_type (the content schema), ce_time (RFC 3339, milliseconds, UTC),
// content-type "application/json", ce_partitionkey (the partitioning
// extension, when the key is not empty) and ce_traceparent and ce_tracestate
// (the distributed tracing extension, when recorded under a trace).
//
// # Detection
//
// A consumer reads a record as native when it has an outbox-version header,
// as CloudEvents binary mode when it has a ce_specversion header, as
// CloudEvents structured mode when its content-type is
// application/cloudevents+json (the event's data is the payload), and as an
// event-outbox record when its value is a JSON object with the library's
// envelope fields. It never invents an idempotency key: a record that does
// not carry one (ce_id, idempotency_key, the idempotency-key header) is
// parked as malformed, with a message naming the missing field.
type Format uint8

const (
	// FormatNative is the framework's own format, version 1. The default.
	FormatNative Format = iota
	// FormatEventOutbox is the Python event-outbox library's flat JSON body.
	FormatEventOutbox
	// FormatCloudEvents is CloudEvents 1.0, Kafka binding, binary mode.
	FormatCloudEvents
)

// String returns "native", "event-outbox" or "cloudevents".
func (f Format) String() string {
	switch f {
	case FormatNative:
		return "native"
	case FormatEventOutbox:
		return "event-outbox"
	case FormatCloudEvents:
		return "cloudevents"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// ParseFormat returns the Format named s ("native", "event-outbox" or
// "cloudevents", as Format.String writes them).
func ParseFormat(s string) (Format, error) {
	for _, f := range []Format{FormatNative, FormatEventOutbox, FormatCloudEvents} {
		if s == f.String() {
			return f, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown wire format %q (want native, event-outbox or cloudevents)", ErrConfig, s)
}

// Header names of the non-native formats.
const (
	// HeaderFormat marks a record written in a format other than native
	// that also carries the native headers ("event-outbox").
	HeaderFormat = "outbox-format"

	headerCEPrefix      = "ce_"
	headerCESpecVersion = "ce_specversion"
	headerCEID          = "ce_id"
	headerCESource      = "ce_source"
	headerCEType        = "ce_type"
	headerCETime        = "ce_time"
	headerCEPartKey     = "ce_partitionkey"
	headerCETraceParent = "ce_traceparent"
	headerCETraceState  = "ce_tracestate"

	ceSpecVersion     = "1.0"
	contentTypeCEJSON = "application/cloudevents+json"

	pydanticTimeLayout   = "2006-01-02T15:04:05.000000Z07:00"
	pydanticSecondLayout = "2006-01-02T15:04:05Z07:00"
	ceTimeLayout         = timeLayout
)

// eventOutboxFields are the envelope fields of the Python library's Event
// model, in the order model_dump_json writes them.
var eventOutboxFields = []string{"topic", "content_schema", "partition_key", "idempotency_key", "occurred_at"}

// storedFormat is the outbox document's format field: empty for native.
func storedFormat(f Format) string {
	if f == FormatNative {
		return ""
	}
	return f.String()
}

// formatOfStored reads the outbox document's format field. An unknown value
// (written by a later version) is published natively.
func formatOfStored(s string) Format {
	f, err := ParseFormat(s)
	if err != nil {
		return FormatNative
	}
	return f
}

// wireDefaults fills the defaults of the wire-format fields of the config.
// The maps and slices are copied, so a caller changing them after New
// changes nothing.
func (c Config) wireDefaults() Config {
	if c.CloudEventsSource == "" && c.Service != "" {
		c.CloudEventsSource = "/" + url.PathEscape(c.Service)
	}
	c.WireFormats = maps.Clone(c.WireFormats)
	c.EventOutboxPartitioning = append([]string(nil), c.EventOutboxPartitioning...)
	return c
}

// validateWire checks the wire-format fields of the config.
func (c Config) validateWire() error {
	bad := func(field, why string) error { return fmt.Errorf("%w: %s %s", ErrConfig, field, why) }
	published := map[string]bool{}
	for _, t := range c.PublishTopics {
		published[t] = true
	}
	for t, f := range c.WireFormats {
		if !published[t] {
			return bad("WireFormats", fmt.Sprintf("names topic %q, which is not in PublishTopics", t))
		}
		if f > FormatCloudEvents {
			return bad("WireFormats", fmt.Sprintf("has an unknown format %d for topic %q", f, t))
		}
	}
	for _, t := range c.EventOutboxPartitioning {
		if !published[t] {
			return bad("EventOutboxPartitioning", fmt.Sprintf("names topic %q, which is not in PublishTopics", t))
		}
	}
	return nil
}

// wireChoice is what the wire format decides about an event being recorded.
type wireChoice struct {
	format    string // the outbox document's format field
	source    string // CloudEvents source, for FormatCloudEvents
	partition int32
	payload   []byte
}

// ErrPayloadNotObject and ErrEnvelopeCollision are wrapped (with
// ErrInvalidEvent) by Record for an event of an event-outbox topic whose
// JSON cannot be laid out flat beside the library's envelope fields.
var (
	ErrPayloadNotObject  = errors.New("outbox: event-outbox format needs a JSON object")
	ErrEnvelopeCollision = errors.New("outbox: event field collides with an event-outbox envelope field")
)

// wireFields applies the topic's wire format and partitioning to an event
// being recorded: it checks the payload, chooses the partition and returns
// the fields the outbox document stores.
func (c *Client) wireFields(e Event, topic, schema, key string, payload []byte, partitions int) (wireChoice, error) {
	w := wireChoice{payload: payload}
	format := c.cfg.WireFormats[topic]
	w.format = storedFormat(format)
	switch format {
	case FormatEventOutbox:
		p, err := eventOutboxPayload(e, schema, payload)
		if err != nil {
			return w, err
		}
		w.payload = p
	case FormatCloudEvents:
		w.source = c.cfg.CloudEventsSource
	}
	if c.moduloPartitioned(topic) {
		n, err := integerKey(key)
		if err != nil {
			return w, fmt.Errorf("%w: %s: topic %q uses event-outbox partitioning, which needs an integer partition key: %v", ErrInvalidEvent, schema, topic, err)
		}
		w.partition = int32(((n % int64(partitions)) + int64(partitions)) % int64(partitions))
		return w, nil
	}
	w.partition = kafkax.Partition([]byte(key), partitions)
	return w, nil
}

func (c *Client) moduloPartitioned(topic string) bool {
	for _, t := range c.cfg.EventOutboxPartitioning {
		if t == topic {
			return true
		}
	}
	return false
}

// integerKey reads a partition key as the library's integer partition_key:
// a decimal integer, the empty key being 0 (the library's default).
func integerKey(key string) (int64, error) {
	if key == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(key, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal integer", key)
	}
	return n, nil
}

// eventOutboxPayload checks and re-encodes an event's JSON for the flat
// event-outbox body: it must be an object, none of whose fields is named
// like an envelope field. It is encoded without HTML escaping, as pydantic
// writes strings.
func eventOutboxPayload(e Event, schema string, payload []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &fields) != nil {
		return nil, fmt.Errorf("%w: %w: %s encodes to %.40q", ErrInvalidEvent, ErrPayloadNotObject, schema, payload)
	}
	for _, name := range eventOutboxFields {
		if _, ok := fields[name]; ok {
			return nil, fmt.Errorf("%w: %w: %s has a field %q", ErrInvalidEvent, ErrEnvelopeCollision, schema, name)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, fmt.Errorf("%w: %s: encode JSON: %v", ErrInvalidEvent, schema, err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// appendJSONString appends s as a JSON string, without HTML escaping.
func appendJSONString(b []byte, s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimRight(buf.Bytes(), "\n")...)
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
// false when the payload is not a JSON object (Record refuses those for an
// event-outbox topic, so only a hand-written outbox document can be one).
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
	if n, err := integerKey(env.PartitionKey); err == nil {
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
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderFormat, Value: []byte(FormatEventOutbox.String())})
	return rec
}

// encodeCloudEvents builds a CloudEvents 1.0 binary-mode record.
func encodeCloudEvents(env *Envelope, payload []byte) *kgo.Record {
	source := env.Source
	if source == "" {
		source = "/outbox" // an outbox document written by hand; ce_source is required
	}
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	headers := make([]kgo.RecordHeader, 0, 9)
	headers = append(headers,
		h(headerCESpecVersion, ceSpecVersion),
		h(headerCEID, env.IdempotencyKey),
		h(headerCESource, source),
		h(headerCEType, env.ContentSchema),
		h(headerCETime, env.OccurredAt.UTC().Format(ceTimeLayout)),
		h(HeaderContentType, contentTypeJSON),
	)
	if env.PartitionKey != "" {
		headers = append(headers, h(headerCEPartKey, env.PartitionKey))
	}
	if env.TraceParent != "" {
		headers = append(headers, h(headerCETraceParent, env.TraceParent))
	}
	if env.TraceState != "" {
		headers = append(headers, h(headerCETraceState, env.TraceState))
	}
	return &kgo.Record{Topic: env.Topic, Partition: env.Partition, Key: []byte(env.PartitionKey), Value: payload, Headers: headers}
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformedRecord}, args...)...)
}

// checkIdentity checks the lengths of the fields that make the inbox _id.
func checkIdentity(env *Envelope, schemaField, keyField string) error {
	switch {
	case len(env.ContentSchema) > maxNameLen:
		return malformed("%s longer than %d bytes", schemaField, maxNameLen)
	case len(env.IdempotencyKey) > maxKeyLen:
		return malformed("%s longer than %d bytes", keyField, maxKeyLen)
	}
	return nil
}

// isJSONContentType reports whether a content type is JSON
// (application/json or any +json type).
func isJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == contentTypeJSON || strings.HasSuffix(mt, "+json")
}

// decodeCloudEventsBinary reads a CloudEvents binary-mode record.
func decodeCloudEventsBinary(r *kgo.Record) (Envelope, []byte, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: FormatCloudEvents}
	var specversion, ctime, partKey, contentType string
	var seenTime, seenCT bool
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case headerCESpecVersion:
			specversion = v
		case headerCEID:
			env.IdempotencyKey = v
		case headerCEType:
			env.ContentSchema = v
		case headerCESource:
			env.Source = v
		case headerCETime:
			ctime, seenTime = v, true
		case headerCEPartKey:
			partKey = v
		case headerCETraceParent, HeaderTraceParent:
			env.TraceParent = v
		case headerCETraceState, HeaderTraceState:
			env.TraceState = v
		case HeaderContentType:
			contentType, seenCT = v, true
		}
	}
	if r.Key == nil {
		env.PartitionKey = partKey
	}
	switch {
	case specversion != ceSpecVersion:
		return env, r.Value, malformed("unsupported %s %q (want %q)", headerCESpecVersion, specversion, ceSpecVersion)
	case env.IdempotencyKey == "":
		return env, r.Value, malformed("CloudEvents record: missing header %s (the idempotency key)", headerCEID)
	case env.ContentSchema == "":
		return env, r.Value, malformed("CloudEvents record: missing header %s (the content schema)", headerCEType)
	case seenCT && !isJSONContentType(contentType):
		return env, r.Value, malformed("CloudEvents record: content-type %q is not JSON", contentType)
	}
	if err := checkIdentity(&env, "header "+headerCEType, "header "+headerCEID); err != nil {
		return env, r.Value, err
	}
	if seenTime {
		t, err := time.Parse(time.RFC3339Nano, ctime)
		if err != nil {
			return env, r.Value, malformed("header %s: %v", headerCETime, err)
		}
		env.OccurredAt = t.UTC()
	}
	return env, r.Value, nil
}

// ceStructured is a CloudEvents structured-mode JSON event.
type ceStructured struct {
	SpecVersion     *string         `json:"specversion"`
	ID              *string         `json:"id"`
	Source          string          `json:"source"`
	Type            *string         `json:"type"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	PartitionKey    string          `json:"partitionkey"`
	TraceParent     string          `json:"traceparent"`
	TraceState      string          `json:"tracestate"`
	Data            json.RawMessage `json:"data"`
	DataBase64      *string         `json:"data_base64"`
}

// decodeCloudEventsStructured reads a CloudEvents structured-mode record:
// the payload is the event's data.
func decodeCloudEventsStructured(r *kgo.Record) (Envelope, []byte, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: FormatCloudEvents}
	var ev ceStructured
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		return env, r.Value, malformed("CloudEvents structured record: %v", err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	env.IdempotencyKey, env.ContentSchema, env.Source = str(ev.ID), str(ev.Type), ev.Source
	env.TraceParent, env.TraceState = ev.TraceParent, ev.TraceState
	if r.Key == nil {
		env.PartitionKey = ev.PartitionKey
	}
	switch {
	case str(ev.SpecVersion) != ceSpecVersion:
		return env, r.Value, malformed("unsupported CloudEvents specversion %q (want %q)", str(ev.SpecVersion), ceSpecVersion)
	case env.IdempotencyKey == "":
		return env, r.Value, malformed("CloudEvents structured record: missing attribute id (the idempotency key)")
	case env.ContentSchema == "":
		return env, r.Value, malformed("CloudEvents structured record: missing attribute type (the content schema)")
	case ev.DataContentType != "" && !isJSONContentType(ev.DataContentType):
		return env, r.Value, malformed("CloudEvents structured record: datacontenttype %q is not JSON", ev.DataContentType)
	}
	if err := checkIdentity(&env, "attribute type", "attribute id"); err != nil {
		return env, r.Value, err
	}
	if ev.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, ev.Time)
		if err != nil {
			return env, r.Value, malformed("CloudEvents attribute time: %v", err)
		}
		env.OccurredAt = t.UTC()
	}
	payload := []byte(ev.Data)
	if ev.DataBase64 != nil {
		b, err := base64.StdEncoding.DecodeString(*ev.DataBase64)
		if err != nil {
			return env, r.Value, malformed("CloudEvents attribute data_base64: %v", err)
		}
		payload = b
	}
	if payload == nil {
		payload = []byte("null")
	}
	return env, payload, nil
}

// decodeEventOutbox reads a record without a known header as the Python
// library's flat body. The payload is the whole body (a handler's type
// ignores the envelope fields). looksLike is false when the value is not a
// JSON object with any of the library's identity fields: then it is no
// event-outbox record either.
func decodeEventOutbox(r *kgo.Record) (env Envelope, looksLike bool, err error) {
	env = Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: FormatEventOutbox}
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
	topic, err := str("topic")
	if err != nil {
		return env, true, err
	}
	if topic != r.Topic {
		return env, true, malformed("event-outbox record: field topic %q differs from the record's topic %q", topic, r.Topic)
	}
	if env.ContentSchema, err = str("content_schema"); err != nil {
		return env, true, err
	}
	if env.IdempotencyKey, err = str("idempotency_key"); err != nil {
		// The library would invent a random key here, which makes every
		// delivery a new event: refuse instead.
		return env, true, err
	}
	if err := checkIdentity(&env, "field content_schema", "field idempotency_key"); err != nil {
		return env, true, err
	}
	if r.Key == nil {
		n, err := eventOutboxPartitionKey(body["partition_key"])
		if err != nil {
			return env, true, err
		}
		env.PartitionKey = strconv.FormatInt(n, 10)
	}
	if raw, ok := body["occurred_at"]; ok && string(raw) != "null" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return env, true, malformed("event-outbox record: field occurred_at is not a string")
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return env, true, malformed("event-outbox record: field occurred_at: %v", err)
		}
		env.OccurredAt = t.UTC()
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

// ErrDuplicateEvent is returned (wrapped) when recording an event whose
// topic, content schema and idempotency key are those of an event already in
// the outbox, with Config.UniqueIdempotencyKeys.
var ErrDuplicateEvent = errors.New("outbox: an event with this topic, content schema and idempotency key is already in the outbox")

// flushError wraps the error of the outbox insert of n events: a duplicate
// key error can only come from the idempotency index (the _id is new).
func flushError(n int, err error) error {
	if mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("%w (Config.UniqueIdempotencyKeys): insert %d events: %w", ErrDuplicateEvent, n, err)
	}
	return fmt.Errorf("outbox: insert %d events: %w", n, err)
}

// indexOutboxIdempotency is the name of the unique index of
// Config.UniqueIdempotencyKeys.
const indexOutboxIdempotency = "outbox_idempotency"

// outboxIdempotencyIndex is the unique index on the outbox's (topic,
// content schema, idempotency key) that Config.UniqueIdempotencyKeys adds,
// as the Python library's "idempotency" index does on its payload fields.
// It holds only while the first event's document is kept: published events
// expire after Config.OutboxRetention.
func outboxIdempotencyIndex() mongo.IndexModel {
	return mongo.IndexModel{
		Keys: bson.D{
			{Key: "topic", Value: 1},
			{Key: "schema", Value: 1},
			{Key: "idempotency_key", Value: 1},
		},
		Options: options.Index().SetName(indexOutboxIdempotency).SetUnique(true),
	}
}

// wireIndexes returns the outbox indexes the wire options need, for
// EnsureIndexes: the idempotency index when Config.UniqueIdempotencyKeys
// is set, none otherwise.
func (c *Client) wireIndexes() []mongo.IndexModel {
	if !c.cfg.UniqueIdempotencyKeys {
		return nil
	}
	return []mongo.IndexModel{outboxIdempotencyIndex()}
}

// withValue returns a copy of r whose value is payload: what the inbox keeps
// of a record whose payload (a structured CloudEvent's data) was decoded
// but refused, so that a re-drive decodes the payload, not the envelope.
func withValue(r *kgo.Record, payload []byte) *kgo.Record {
	c := *r
	c.Value = payload
	return &c
}

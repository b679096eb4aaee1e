package outbox

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"unicode/utf8"

	"github.com/event-outbox/outbox/internal/wire"
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
func (f Format) String() string { return wire.Format(f).String() }

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
)

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
func (c Config) validateWire() []error {
	var errs []error
	bad := func(field, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, field, why)) }
	published := map[string]bool{}
	for _, t := range c.PublishTopics {
		published[t] = true
	}
	for _, t := range slices.Sorted(maps.Keys(c.WireFormats)) {
		if !published[t] {
			bad("WireFormats", fmt.Sprintf("names topic %q, which is not in PublishTopics", t))
		}
		if f := c.WireFormats[t]; f > FormatCloudEvents {
			bad("WireFormats", fmt.Sprintf("has an unknown format %d for topic %q", f, t))
		}
	}
	for _, t := range c.EventOutboxPartitioning {
		if !published[t] {
			bad("EventOutboxPartitioning", fmt.Sprintf("names topic %q, which is not in PublishTopics", t))
		}
	}
	return errs
}

// wireChoice is what the wire format decides about an event being recorded.
type wireChoice struct {
	format    string // the outbox document's format field
	source    string // CloudEvents source, for FormatCloudEvents
	partition int32
	payload   []byte
}

// wireFields applies the topic's wire format and partitioning to an event
// being recorded: it checks the payload, chooses the partition and returns
// the fields the outbox document stores.
func (c *Client) wireFields(e Event, topic, schema, key, idemKey string, payload []byte, partitions int) (wireChoice, error) {
	w := wireChoice{payload: payload}
	format := c.cfg.WireFormats[topic]
	w.format = storedFormat(format)
	switch format {
	case FormatEventOutbox:
		// JSON strings hold only UTF-8: an invalid byte would be replaced,
		// and the body's identity would differ from the headers'.
		for _, f := range [...]struct{ name, v string }{{"topic", topic}, {"content schema", schema}, {"partition key", key}, {"idempotency key", idemKey}} {
			if !utf8.ValidString(f.v) {
				return w, fmt.Errorf("%w: %s: the event-outbox format needs a UTF-8 %s", ErrInvalidEvent, schema, f.name)
			}
		}
		p, err := eventOutboxPayload(e, schema, payload)
		if err != nil {
			return w, err
		}
		w.payload = p
	case FormatCloudEvents:
		w.source = c.cfg.CloudEventsSource
	}
	if c.moduloPartitioned(topic) {
		n, err := wire.IntegerKey(key)
		if err != nil {
			return w, fmt.Errorf("%w: %s: topic %q uses event-outbox partitioning, which needs an integer partition key: %w", ErrInvalidEvent, schema, topic, err)
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

// eventOutboxPayload checks and re-encodes an event's JSON for the flat
// event-outbox body: it must be an object, none of whose fields is named
// like an envelope field. It is encoded without HTML escaping, as pydantic
// writes strings.
func eventOutboxPayload(e Event, schema string, payload []byte) ([]byte, error) {
	field, isObject := wire.CheckEventOutboxPayload(payload)
	switch {
	case !isObject:
		return nil, fmt.Errorf("%w: %w: %s encodes to %.40q", ErrInvalidEvent, ErrPayloadNotObject, schema, payload)
	case field != "":
		return nil, fmt.Errorf("%w: %w: %s has a field %q", ErrInvalidEvent, ErrEnvelopeCollision, schema, field)
	}
	p, err := wire.MarshalUnescaped(e)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: encode JSON: %w", ErrInvalidEvent, schema, err)
	}
	return p, nil
}

package wire

import (
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Format is the wire format of a record. Its values are those of the root
// package's Format.
type Format uint8

const (
	// Native is the framework's own format, version 1.
	Native Format = iota
	// EventOutbox is the Python event-outbox library's flat JSON body.
	EventOutbox
	// CloudEvents is CloudEvents 1.0, Kafka binding.
	CloudEvents
)

// String returns "native", "event-outbox" or "cloudevents": the names
// configuration and stored outbox documents use, and the value of
// HeaderFormat for event-outbox.
func (f Format) String() string {
	switch f {
	case Native:
		return "native"
	case EventOutbox:
		return "event-outbox"
	case CloudEvents:
		return "cloudevents"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Native headers (version 1) and the format header. The root package
// exports the same names and values as its Header* constants.
const (
	Version              = "1"
	HeaderVersion        = "outbox-version"
	HeaderContentSchema  = "content-schema"
	HeaderIdempotencyKey = "idempotency-key"
	HeaderOccurredAt     = "occurred-at"
	HeaderContentType    = "content-type"
	HeaderTraceParent    = "traceparent"
	HeaderTraceState     = "tracestate"
	HeaderFormat         = "outbox-format"

	contentTypeJSON = "application/json"
	// timeLayout is RFC 3339 with milliseconds: MongoDB keeps milliseconds.
	timeLayout = "2006-01-02T15:04:05.000Z07:00"
)

// Limits on the identity fields, so that a record always fits Kafka headers
// and the inbox _id fits a MongoDB index key.
const (
	MaxNameLen = 249 // Kafka's topic name limit; also used for schema names
	MaxKeyLen  = 1024
)

// Envelope is the metadata of one event around its JSON payload. Its
// fields are those of the root package's Envelope.
type Envelope struct {
	Topic          string
	ContentSchema  string
	IdempotencyKey string
	PartitionKey   string
	Partition      int32
	OccurredAt     time.Time
	TraceParent    string
	TraceState     string
	Format         Format
	Source         string // CloudEvents source attribute
}

// ErrMalformed is wrapped by every error Decode returns. The text of those
// errors is the detail alone, so that a caller wraps them in its own
// sentinel without repeating a prefix.
var ErrMalformed = errors.New("malformed record")

type malformedError struct{ err error }

func (e *malformedError) Error() string        { return e.err.Error() }
func (e *malformedError) Unwrap() error        { return e.err }
func (e *malformedError) Is(target error) bool { return target == ErrMalformed }

func malformed(format string, args ...any) error {
	return &malformedError{fmt.Errorf(format, args...)}
}

// Encode builds the Kafka record of an event in env.Format.
func Encode(env *Envelope, payload []byte) *kgo.Record {
	switch env.Format {
	case EventOutbox:
		return encodeEventOutbox(env, payload)
	case CloudEvents:
		return encodeCloudEvents(env, payload)
	}
	return encodeNative(env, payload)
}

// Decode reads the envelope and the payload (the JSON a handler decodes)
// of a record in whichever format it was written; kafkaTopic is the topic
// the record was read from, which an event-outbox body's topic field may
// name instead of r.Topic. It never panics; every failure wraps
// ErrMalformed and names what is wrong, and the payload is then the
// record's value.
func Decode(r *kgo.Record, kafkaTopic string) (Envelope, []byte, error) {
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
				env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: CloudEvents}
				return env, r.Value, malformed("unsupported CloudEvents content-type %q (want %s)", mt, contentTypeCEJSON)
			}
			return decodeCloudEventsStructured(r)
		}
	}
	env, looksLike, err := decodeEventOutbox(r, kafkaTopic)
	if !looksLike {
		env.Format = Native
		return env, r.Value, malformed("unknown format: missing header %s (native), no %s header (CloudEvents), "+
			"and the value is not an event-outbox JSON object (no topic, content_schema or idempotency_key field)",
			HeaderVersion, headerCESpecVersion)
	}
	return env, r.Value, err
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// checkIdentity checks the lengths of the fields that make the inbox _id.
func checkIdentity(env *Envelope, schemaField, keyField string) error {
	switch {
	case len(env.ContentSchema) > MaxNameLen:
		return malformed("%s longer than %d bytes", schemaField, MaxNameLen)
	case len(env.IdempotencyKey) > MaxKeyLen:
		return malformed("%s longer than %d bytes", keyField, MaxKeyLen)
	}
	return nil
}

// IntegerKey reads a partition key as the Python library's integer
// partition_key: a decimal integer, the empty key being 0 (the library's
// default).
func IntegerKey(key string) (int64, error) {
	if key == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(key, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal integer", key)
	}
	return n, nil
}

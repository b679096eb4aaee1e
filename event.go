package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/event-outbox/outbox/internal/wire"
)

// Event is implemented by the Go structs a service declares as events.
//
// The three methods are part of the wire contract: Topic names the Kafka
// topic, ContentSchema is the event's stable type name on the wire (carried
// in the content-schema header; change it when the payload changes
// incompatibly, for example "OrderCreated.v2"), and PartitionKey chooses the
// Kafka partition and therefore the ordering scope: events with the same
// partition key are published and handled in commit order.
//
// The payload is the struct's JSON encoding. Fields are validated with
// go-playground/validator struct tags when the event is recorded.
type Event interface {
	Topic() string
	ContentSchema() string
	PartitionKey() string
}

// Envelope carries the framework's metadata of one event: what travels in
// the Kafka record's key and headers around the JSON payload.
type Envelope struct {
	// Topic is the Kafka topic.
	Topic string
	// ContentSchema is the event's type name on the wire.
	ContentSchema string
	// IdempotencyKey identifies the event for deduplication: together with
	// Topic and ContentSchema it is the inbox _id on the consuming side.
	IdempotencyKey string
	// PartitionKey is the Kafka record key.
	PartitionKey string
	// Partition is the Kafka partition, computed from PartitionKey with
	// Kafka's default partitioner when the event is recorded.
	Partition int32
	// OccurredAt is when the event happened (UTC, millisecond precision).
	OccurredAt time.Time
	// TraceParent and TraceState are the W3C trace context captured when the
	// event was recorded. Empty when there was none.
	TraceParent string
	TraceState  string
	// Format is the wire format of the record: the one the event is
	// published in, or the one a consumer detected in the record it
	// received. FormatNative unless Config.WireFormats says otherwise.
	Format Format
	// Source is the CloudEvents source attribute (FormatCloudEvents only;
	// Config.CloudEventsSource when recorded). Empty for other formats.
	Source string
}

// RecordOption adjusts the envelope of one recorded event.
type RecordOption func(*recordOptions)

type recordOptions struct {
	idempotencyKey string
	occurredAt     time.Time
	publishAt      time.Time // zero: publish once committed (schedule.go)
}

// WithIdempotencyKey sets a deterministic idempotency key instead of the
// random default. Use it when the same business fact may be recorded more
// than once (for example on a client retry) and must be handled once.
func WithIdempotencyKey(key string) RecordOption {
	return func(o *recordOptions) { o.idempotencyKey = key }
}

// WithOccurredAt sets the event's occurred-at time. Defaults to the time
// the event is recorded.
func WithOccurredAt(t time.Time) RecordOption {
	return func(o *recordOptions) { o.occurredAt = t }
}

// NewIdempotencyKey returns a random idempotency key: 16 random bytes
// (UUIDv4 layout) in hex.
func NewIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return hex.EncodeToString(b[:])
}

// Limits on envelope fields, so that a record always fits Kafka headers and
// MongoDB index keys.
const (
	maxNameLen = wire.MaxNameLen // Kafka's topic name limit; also used for schema names
	maxKeyLen  = wire.MaxKeyLen
)

func checkName(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidEvent, what)
	case len(v) > maxNameLen:
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalidEvent, what, maxNameLen)
	}
	return nil
}

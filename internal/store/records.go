package store

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// InboxKey is the _id of an inbox document, in this field order: the
// Python event-outbox library's, so mixed fleets and migrations share it.
// outbox.InboxID has the same fields and converts to and from it.
type InboxKey struct {
	Topic          string `bson:"topic"`
	ContentSchema  string `bson:"content_schema"`
	IdempotencyKey string `bson:"idempotency_key"`
}

// OutboxRecord is an outbox document as tools (the console, the chaos
// harness) read it: the fields they show, times as pointers (nil when
// absent).
type OutboxRecord struct {
	ID             bson.ObjectID `bson:"_id"`
	Topic          string        `bson:"topic"`
	Partition      int32         `bson:"partition"`
	Key            string        `bson:"key"`
	Schema         string        `bson:"schema"`
	IdempotencyKey string        `bson:"idempotency_key"`
	OccurredAt     *time.Time    `bson:"occurred_at"`
	Payload        string        `bson:"payload"`
	TraceParent    string        `bson:"traceparent"`
	CreatedAt      *time.Time    `bson:"created_at"`
	Published      bool          `bson:"published"`
	PublishedAt    *time.Time    `bson:"published_at"`
	Failed         bool          `bson:"failed"`
	FailedAt       *time.Time    `bson:"failed_at"`
	Error          string        `bson:"error"`
	Attempts       int32         `bson:"attempts"`
	// PayloadRef and PayloadSize are set on an event whose payload the
	// claim check stored out of band (OutboxPayloadRef).
	PayloadRef  *bson.ObjectID `bson:"payload_ref"`
	PayloadSize int64          `bson:"payload_size"`
}

// InboxRecord is an inbox document as tools read it, times as pointers
// (nil when absent). ID is the type the reader decodes the _id into (an
// InboxKey or an outbox.InboxID); HeldBy, the head a held event waits
// behind, has the same type.
type InboxRecord[ID any] struct {
	ID                 ID         `bson:"_id"`
	Handled            bool       `bson:"handled"`
	HandledAt          *time.Time `bson:"handled_at"`
	Parked             bool       `bson:"parked"`
	ParkedAt           *time.Time `bson:"parked_at"`
	HeldBy             *ID        `bson:"held_by"`
	Attempts           int32      `bson:"attempts"`
	Failures           int32      `bson:"failures"`
	LastError          string     `bson:"last_error"`
	ParkReason         string     `bson:"park_reason"`
	Partition          int32      `bson:"partition"`
	Offset             int64      `bson:"offset"`
	PartitionKey       string     `bson:"partition_key"`
	OccurredAt         *time.Time `bson:"occurred_at"`
	ReceivedAt         *time.Time `bson:"received_at"`
	TraceParent        string     `bson:"traceparent"`
	Payload            string     `bson:"payload"`
	RedriveRequestedAt *time.Time `bson:"redrive_requested_at"`
	// RedriveDeferred says why the last try of the pending re-drive
	// request could not run; RedriveNotBefore is its next try at the
	// latest.
	RedriveDeferred  string     `bson:"redrive_deferred"`
	RedriveNotBefore *time.Time `bson:"redrive_not_before"`
	// DiscardedAt is set when an operator purged the parked event: it is
	// then handled, so a redelivery is skipped.
	DiscardedAt *time.Time `bson:"discarded_at"`
	// Unreadable marks a record parked because its envelope could not be
	// read: it can never be re-driven.
	Unreadable bool `bson:"unreadable"`
	// PayloadRef is the claim-check reference of an event whose payload
	// its producer stored out of band (InboxPayloadRef); Payload is then
	// the resolved payload, or empty when it was not resolved.
	PayloadRef string `bson:"payload_ref"`
	// PayloadTruncated is set when Payload was cut to fit in the inbox;
	// PayloadSize is then the whole payload's length.
	PayloadTruncated bool  `bson:"payload_truncated"`
	PayloadSize      int64 `bson:"payload_size"`
}

// InventedKeyPrefix starts the idempotency key the consumer invents for a
// malformed record that had none, so that it can be parked and holds its
// key; such a record can never be re-driven.
const InventedKeyPrefix = "malformed:"

package store

import (
	"fmt"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// InboxDoc is the stored form of a received event, as the consumer writes
// and reads it. ID is the type of its _id (the root's outbox.InboxID);
// HeldBy, the head a held event waits behind, has the same type.
type InboxDoc[ID any] struct {
	ID        ID         `bson:"_id"`
	Handled   bool       `bson:"handled"`
	HandledAt *time.Time `bson:"handled_at,omitempty"`
	Parked    bool       `bson:"parked"`
	ParkedAt  *time.Time `bson:"parked_at,omitempty"`
	Attempts  int32      `bson:"attempts"`
	// Failures counts the runs whose handler failed; Attempts also counts
	// the runs that ended without a result (the process died or lost the
	// partition during them). Absent on documents of earlier versions.
	Failures  int32  `bson:"failures,omitempty"`
	LastError string `bson:"last_error,omitempty"`
	// The delivery, kept so that parked events can be inspected and
	// re-driven without Kafka.
	Partition    int32     `bson:"partition"`
	Offset       int64     `bson:"offset"`
	PartitionKey string    `bson:"partition_key"`
	OccurredAt   time.Time `bson:"occurred_at,omitzero"`
	TraceParent  string    `bson:"traceparent,omitempty"`
	TraceState   string    `bson:"tracestate,omitempty"`
	Payload      string    `bson:"payload,omitempty"`
	ReceivedAt   time.Time `bson:"received_at"`
	// HeldBy marks a held event: the head of its key when it was held.
	HeldBy *ID `bson:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store
	// whole (see StoredPayload).
	PayloadTruncated bool `bson:"payload_truncated,omitempty"`
	// Unreadable is set on a record parked because its envelope could not
	// be read; it can never be re-driven.
	Unreadable bool `bson:"unreadable,omitempty"`
	// ParkReason says why a parked event was parked.
	ParkReason string `bson:"park_reason,omitempty"`
	// Fault is why a held event cannot be handled (malformed), kept for
	// when it becomes its key's head.
	Fault string `bson:"fault,omitempty"`
	// PayloadRef is the claim-check reference of a record whose payload
	// was stored out of band (InboxPayloadRef).
	PayloadRef string `bson:"payload_ref,omitempty"`
}

// Park reasons stored in park_reason that the framework reads back.
const (
	ParkReasonNoHandler = "no_handler"
	ParkReasonMalformed = "malformed"
)

// Fields the inbox writes that no reader decodes: they explain a document
// to operators, or exist to make two transactions conflict.
const (
	InboxPayloadSize = "payload_size"
	InboxSkippedAt   = "skipped_at"
	InboxSkipReason  = "skip_reason"
	// InboxHeldTail is written on a key's head by every operation on the
	// key's sequence, so that two such operations always conflict.
	InboxHeldTail = "held_tail"
)

// Delivery is what an inbox document keeps of the record that delivered
// its event, written when the document is first inserted.
type Delivery struct {
	Partition    int32
	Offset       int64
	PartitionKey string
	OccurredAt   time.Time
	TraceParent  string
	TraceState   string
}

// Fields are the fields an inbox document gets when it is first inserted
// at now; payload, when not nil, is stored too (parked and failing
// events).
func (d Delivery) Fields(now time.Time, payload *string) bson.D {
	f := bson.D{
		{Key: InboxPartition, Value: d.Partition},
		{Key: InboxOffset, Value: d.Offset},
		{Key: InboxPartitionKey, Value: d.PartitionKey},
		{Key: InboxReceivedAt, Value: now},
	}
	if !d.OccurredAt.IsZero() {
		f = append(f, bson.E{Key: InboxOccurredAt, Value: d.OccurredAt})
	}
	if d.TraceParent != "" {
		f = append(f, bson.E{Key: InboxTraceParent, Value: d.TraceParent})
	}
	if d.TraceState != "" {
		f = append(f, bson.E{Key: InboxTraceState, Value: d.TraceState})
	}
	if payload != nil {
		f = append(f, bson.E{Key: InboxPayload, Value: *payload})
	}
	return f
}

// NotDone selects the inbox document of id while it is neither handled
// nor parked. A document without the parked field (the Python event-outbox
// library writes none) is not parked.
func NotDone(id any) bson.D {
	return bson.D{{Key: InboxID, Value: id}, {Key: InboxHandled, Value: false},
		{Key: InboxParked, Value: bson.D{{Key: "$ne", Value: true}}}}
}

// Claim is the filter and update of a claim: the event's document flips
// to handled, inserted when absent. On a document already handled or
// parked the filter does not match and the upsert collides with its _id: a
// duplicate key error, which aborts the transaction.
func Claim(id any, d Delivery, now time.Time) (filter, update bson.D) {
	return NotDone(id), bson.D{
		{Key: "$set", Value: bson.D{{Key: InboxHandled, Value: true}, {Key: InboxHandledAt, Value: now}}},
		{Key: "$setOnInsert", Value: d.Fields(now, nil)},
	}
}

// UnparkUpdate marks a parked event handled at now.
func UnparkUpdate(now time.Time) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: InboxHandled, Value: true}, {Key: InboxHandledAt, Value: now}, {Key: InboxParked, Value: false}}},
		{Key: "$unset", Value: bson.D{{Key: InboxParkedAt, Value: ""}, {Key: InboxHeldBy, Value: ""}}},
	}
}

// SkipUpdate takes a parked event off its key's sequence without running
// it: handled (so a redelivery is skipped as a duplicate, and the inbox TTL
// removes it), with skipped_at and skip_reason saying why.
func SkipUpdate(reason string, now time.Time) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: InboxHandled, Value: true}, {Key: InboxHandledAt, Value: now}, {Key: InboxParked, Value: false},
			{Key: InboxSkippedAt, Value: now}, {Key: InboxSkipReason, Value: reason}}},
		{Key: "$unset", Value: bson.D{{Key: InboxParkedAt, Value: ""}, {Key: InboxHeldBy, Value: ""}, {Key: InboxRedriveRequestedAt, Value: ""}}},
	}
}

// ParkHeadUpdate parks a sequence's head for good at now, for why, with
// inc more attempts and failures: it holds its key until an operator acts.
func ParkHeadUpdate(why string, inc int, reason string, unreadable bool, now time.Time) bson.D {
	set := bson.D{{Key: InboxLastError, Value: Truncate(why, MaxErrorLen)}, {Key: InboxParkReason, Value: reason}, {Key: InboxParkedAt, Value: now}}
	if unreadable {
		set = append(set, bson.E{Key: InboxUnreadable, Value: true})
	}
	return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: bson.D{{Key: InboxHeldBy, Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: InboxAttempts, Value: int32(inc)}, {Key: InboxFailures, Value: int32(inc)}}}}
}

// MaxErrorLen is the longest error text an inbox document stores.
const MaxErrorLen = 4096

// MaxStoredPayload is the largest payload an inbox document stores whole:
// MongoDB refuses documents over 16 MiB, and the document holds the last
// error and the delivery besides the payload.
const MaxStoredPayload = 16<<20 - 64<<10

// StoredPayload returns the payload as the inbox stores it: whole, or,
// when it is larger than MaxStoredPayload, cut to that size (at a UTF-8
// boundary) with a note saying so. A truncated payload cannot be
// re-driven; it is kept for inspection.
func StoredPayload(payload []byte) (stored, note string) {
	if len(payload) <= MaxStoredPayload {
		return string(payload), ""
	}
	n := MaxStoredPayload
	for n > 0 && !utf8.RuneStart(payload[n]) {
		n--
	}
	return string(payload[:n]), fmt.Sprintf("payload of %d bytes truncated to %d to fit in the inbox", len(payload), n)
}

// Truncate cuts s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Tally is the part of an inbox document that counts runs.
type Tally struct {
	Attempts int32 `bson:"attempts"`
	Failures int32 `bson:"failures"`
}

// TallyProjection reads a Tally.
func TallyProjection() bson.D {
	return bson.D{{Key: InboxAttempts, Value: 1}, {Key: InboxFailures, Value: 1}}
}

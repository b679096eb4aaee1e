package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// inboxDoc is the stored form of a received event. Field names are part of
// the storage format (indexes, outboxctl).
type inboxDoc struct {
	ID        InboxID    `bson:"_id"`
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
	// HeldBy marks a held event: the head of its key when it was held
	// (Config.PoisonPolicy HoldKey; see keyseq.go).
	HeldBy *InboxID `bson:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store
	// whole (see storedPayload).
	PayloadTruncated bool `bson:"payload_truncated,omitempty"`
	// Unreadable is set on a record parked because its envelope could not
	// be read; it cannot be re-driven (see redrive_unreadable.go).
	Unreadable bool `bson:"unreadable,omitempty"`
	// ParkReason says why a parked event was parked (keyseq.go).
	ParkReason string `bson:"park_reason,omitempty"`
	// Fault is why a held event cannot be handled (malformed), kept for
	// when it becomes its key's head.
	Fault string `bson:"fault,omitempty"`
}

// errAlreadyDone reports that an event's inbox document is handled or parked.
var errAlreadyDone = errors.New("outbox: event already handled or parked")

// claim flips the event's inbox document to handled inside the transaction
// of ctx, inserting it when absent: one round trip. When the document is
// already handled (or parked) the filter does not match, the upsert collides
// with the existing _id and MongoDB answers a duplicate key error, which
// aborts the transaction: claim returns errAlreadyDone. Of two concurrent
// claims one gets a write conflict and, retried, errAlreadyDone.
func (c *Client) claim(ctx context.Context, env *Envelope, offset int64, payload []byte, now time.Time) error {
	filter, update := claimUpdate(env, offset, payload, now)
	_, err := c.inbox.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return errAlreadyDone
	}
	return err
}

// claimUpdate is the filter and update of a claim (see claim).
func claimUpdate(env *Envelope, offset int64, payload []byte, now time.Time) (filter, update bson.D) {
	filter = bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false},
		// A document without the field (the Python event-outbox library
		// writes none) is not parked.
		{Key: "parked", Value: bson.D{{Key: "$ne", Value: true}}}}
	update = bson.D{
		{Key: "$set", Value: bson.D{{Key: "handled", Value: true}, {Key: "handled_at", Value: now}}},
		{Key: "$setOnInsert", Value: deliveryFields(env, offset, payload, now, false)},
	}
	return filter, update
}

// deliveryFields are the fields an inbox document gets when it is first
// inserted. withPayload keeps the payload (parked and failing events).
func deliveryFields(env *Envelope, offset int64, payload []byte, now time.Time, withPayload bool) bson.D {
	d := bson.D{
		{Key: "partition", Value: env.Partition},
		{Key: "offset", Value: offset},
		{Key: "partition_key", Value: env.PartitionKey},
		{Key: "received_at", Value: now},
	}
	if !env.OccurredAt.IsZero() {
		d = append(d, bson.E{Key: "occurred_at", Value: env.OccurredAt})
	}
	if env.TraceParent != "" {
		d = append(d, bson.E{Key: "traceparent", Value: env.TraceParent})
	}
	if env.TraceState != "" {
		d = append(d, bson.E{Key: "tracestate", Value: env.TraceState})
	}
	if withPayload {
		d = append(d, bson.E{Key: "payload", Value: string(payload)})
	}
	return d
}

// maxStoredPayload is the largest payload an inbox document stores whole:
// MongoDB refuses documents over 16 MiB, and the document holds the last
// error and the delivery besides the payload.
const maxStoredPayload = 16<<20 - 64<<10

// storedPayload returns the payload as the inbox stores it: whole, or,
// when it is larger than maxStoredPayload, cut to that size (at a UTF-8
// boundary) with a note saying so. A truncated payload cannot be
// re-driven; it is kept for inspection.
func storedPayload(payload []byte) (stored, note string) {
	if len(payload) <= maxStoredPayload {
		return string(payload), ""
	}
	n := maxStoredPayload
	for n > 0 && !utf8.RuneStart(payload[n]) {
		n--
	}
	return string(payload[:n]), fmt.Sprintf("payload of %d bytes truncated to %d to fit in the inbox", len(payload), n)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// envelope rebuilds the envelope of a stored event.
func (d *inboxDoc) envelope() Envelope {
	return Envelope{Topic: d.ID.Topic, ContentSchema: d.ID.ContentSchema, IdempotencyKey: d.ID.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, OccurredAt: d.OccurredAt,
		TraceParent: d.TraceParent, TraceState: d.TraceState}
}

// storedEvent decodes the stored payload of a parked event.
func (c *Client) storedEvent(h *handler, d *inboxDoc) (Event, error) {
	if d.PayloadTruncated {
		return nil, fmt.Errorf("%w: %s", ErrPayloadTruncated, d.ID)
	}
	return h.decode(c, []byte(d.Payload))
}

// unparkUpdate marks a parked event handled.
func unparkUpdate() bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: "handled", Value: true}, {Key: "handled_at", Value: time.Now().UTC()}, {Key: "parked", Value: false}}},
		{Key: "$unset", Value: bson.D{{Key: "parked_at", Value: ""}, {Key: "held_by", Value: ""}}},
	}
}

// safeRun runs a handler and turns a panic into an error wrapping
// ErrHandlerPanic and, when the panic's value is an error, that error.
func safeRun(ctx context.Context, h *handler, evt Event, meta Metadata) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if rerr, ok := r.(error); ok {
				err = fmt.Errorf("%w: %w", ErrHandlerPanic, rerr)
			} else {
				err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
			}
		}
	}()
	return h.run(ctx, evt, meta)
}

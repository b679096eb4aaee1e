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
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
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
	LastError string     `bson:"last_error,omitempty"`
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
	// HeldBy is the anchor of the chain a held event waits in
	// (Config.PoisonPolicy HoldKey; see poison.go).
	HeldBy *InboxID `bson:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store
	// whole (see storedPayload).
	PayloadTruncated bool `bson:"payload_truncated,omitempty"`
	// Unreadable is set on a record parked because its envelope could not
	// be read; it cannot be re-driven (see redrive_unreadable.go).
	Unreadable bool `bson:"unreadable,omitempty"`
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

// noteFailure records a failed handling attempt outside any transaction,
// with majority write concern (the offset is committed after it, so it must
// survive a failover): inc attempts more (0 when the attempt was counted
// before it ran, see noteAttempt), the last error, and the payload for
// inspection and re-drive. When park is true the event is parked: later
// deliveries skip it until it is re-driven. It returns the stored attempt
// count after the update, which includes the attempts of earlier processes
// (a partition that moved, a process that crashed), and whether the stored
// payload had to be truncated (see storedPayload).
func (c *Client) noteFailure(ctx context.Context, env *Envelope, offset int64, payload []byte, cause error, park bool, inc int) (int32, error) {
	now := time.Now().UTC()
	msg := truncate(cause.Error(), 4096)
	stored, note := storedPayload(payload)
	if note != "" {
		msg += " (" + note + ")"
	}
	set := bson.D{{Key: "last_error", Value: msg}, {Key: "payload", Value: stored}}
	if note != "" {
		set = append(set, bson.E{Key: "payload_truncated", Value: true}, bson.E{Key: "payload_size", Value: len(payload)})
	}
	if isUnreadable(cause) {
		set = append(set, bson.E{Key: "unreadable", Value: true})
	}
	if park {
		set = append(set, bson.E{Key: "parked", Value: true}, bson.E{Key: "parked_at", Value: now})
	}
	onInsert := deliveryFields(env, offset, nil, now, false)
	if !park {
		onInsert = append(onInsert, bson.E{Key: "parked", Value: false})
	}
	var got struct {
		Attempts int32 `bson:"attempts"`
	}
	err := c.inboxMajority().FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false}},
		bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: int32(inc)}}}, {Key: "$setOnInsert", Value: onInsert}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After).
			SetProjection(bson.D{{Key: "attempts", Value: 1}})).Decode(&got)
	if mongo.IsDuplicateKeyError(err) {
		return 0, errAlreadyDone // handled meanwhile by another consumer: nothing to note
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: note failure of %s: %w", inboxIDOf(env), err)
	}
	return got.Attempts, nil
}

// noteAttempt counts an attempt before it runs, outside any transaction and
// with majority write concern, and returns the stored count (the attempts
// of earlier processes included). The consumer does it for the first event
// a worker handles after its partition is assigned: if the previous owner
// crashed while handling it (a handler that brings the process down), the
// in-transaction state is lost, and only this count lets it reach
// Config.MaxAttempts. errAlreadyDone when the event is handled or parked.
func (c *Client) noteAttempt(ctx context.Context, env *Envelope, offset int64) (int32, error) {
	onInsert := append(deliveryFields(env, offset, nil, time.Now().UTC(), false), bson.E{Key: "parked", Value: false})
	var got struct {
		Attempts int32 `bson:"attempts"`
	}
	err := c.inboxMajority().FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false}, {Key: "parked", Value: bson.D{{Key: "$ne", Value: true}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int32(1)}}}, {Key: "$setOnInsert", Value: onInsert}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After).
			SetProjection(bson.D{{Key: "attempts", Value: 1}})).Decode(&got)
	if mongo.IsDuplicateKeyError(err) {
		return 0, errAlreadyDone // handled or parked: the upsert met its _id
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: count attempt of %s: %w", inboxIDOf(env), err)
	}
	return got.Attempts, nil
}

// inboxMajority is the inbox collection with majority write concern, for
// the writes made outside a transaction before an offset is committed
// (failure notes, parks, attempt counts).
func (c *Client) inboxMajority() *mongo.Collection {
	return c.inbox.Clone(options.Collection().SetWriteConcern(writeconcern.Majority()))
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

// transactWithin is Transact bounded by Config.HandlerTimeout, for runs of
// handlers outside the consumer (re-drives).
func (c *Client) transactWithin(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	return c.Transact(ctx, fn)
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

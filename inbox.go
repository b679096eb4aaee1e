package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// InboxID is the inbox document _id of an event: an ordered subdocument
// {topic, content_schema, idempotency_key}, the field names and order of
// the Python event-outbox library, so that services written with either
// share an inbox during a migration. Two deliveries of the same event (same
// topic, content schema and idempotency key) share it.
type InboxID struct {
	Topic          string `bson:"topic" json:"topic"`
	ContentSchema  string `bson:"content_schema" json:"content_schema"`
	IdempotencyKey string `bson:"idempotency_key" json:"idempotency_key"`
}

func inboxIDOf(env *Envelope) InboxID {
	return InboxID{Topic: env.Topic, ContentSchema: env.ContentSchema, IdempotencyKey: env.IdempotencyKey}
}

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
	filter = bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false}, {Key: "parked", Value: false}}
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

// noteFailure records a failed handling attempt outside any transaction:
// the attempt count and the last error, and the payload for inspection.
// When park is true the event is parked: later deliveries skip it until it
// is re-driven.
func (c *Client) noteFailure(ctx context.Context, env *Envelope, offset int64, payload []byte, cause error, park bool) error {
	now := time.Now().UTC()
	set := bson.D{{Key: "last_error", Value: truncate(cause.Error(), 4096)}, {Key: "payload", Value: string(payload)}}
	if park {
		set = append(set, bson.E{Key: "parked", Value: true}, bson.E{Key: "parked_at", Value: now})
	}
	onInsert := deliveryFields(env, offset, payload, now, false)
	if !park {
		onInsert = append(onInsert, bson.E{Key: "parked", Value: false})
	}
	_, err := c.inbox.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false}},
		bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}}, {Key: "$setOnInsert", Value: onInsert}},
		options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return nil // handled meanwhile by another consumer: nothing to note
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ParkedEvent is an event the consumer gave up on: its handler failed
// Config.MaxAttempts times, or its record was malformed.
type ParkedEvent struct {
	ID           InboxID   `json:"id"`
	Partition    int32     `json:"partition"`
	Offset       int64     `json:"offset"`
	PartitionKey string    `json:"partition_key"`
	Attempts     int32     `json:"attempts"`
	LastError    string    `json:"last_error"`
	ParkedAt     time.Time `json:"parked_at"`
	Payload      string    `json:"payload"`
	// OccurredAt is the event's occurred-at time, when it had one.
	OccurredAt time.Time `json:"occurred_at,omitzero"`
	// RedriveRequestedAt is when a re-drive was requested
	// (Admin.RequestRedrive) and not yet served; zero when none is pending.
	RedriveRequestedAt time.Time `json:"redrive_requested_at,omitzero"`
}

// ParkedEvents lists parked events, oldest first, at most limit of them
// (all when limit <= 0). Admin.ParkedEvents filters by topic, schema, time
// and id.
func (c *Client) ParkedEvents(ctx context.Context, limit int) ([]ParkedEvent, error) {
	return c.Admin().ParkedEvents(ctx, ParkedFilter{Limit: limit})
}

// ErrNotParked is returned by Redrive for an event that is not parked.
var ErrNotParked = errors.New("outbox: event is not parked")

// ErrNoHandler is returned by Redrive for an event no registered handler
// accepts.
var ErrNoHandler = errors.New("outbox: no handler for the event")

// Redrive runs the handler of a parked event now, from the payload stored in
// the inbox, in a transaction that also unparks it. On success the event is
// handled (exactly once, as for a delivery); on failure it stays parked with
// the new error, which Redrive returns.
func (c *Client) Redrive(ctx context.Context, id InboxID) error {
	var d inboxDoc
	err := c.inbox.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !d.Parked) {
		return fmt.Errorf("%w: %+v", ErrNotParked, id)
	}
	if err != nil {
		return fmt.Errorf("outbox: redrive: %w", err)
	}
	h := c.handlerFor(id.Topic, id.ContentSchema)
	if h == nil {
		return fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, id.Topic, id.ContentSchema)
	}
	env := Envelope{Topic: id.Topic, ContentSchema: id.ContentSchema, IdempotencyKey: id.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, OccurredAt: d.OccurredAt,
		TraceParent: d.TraceParent, TraceState: d.TraceState}
	payload := []byte(d.Payload)
	evt, err := h.decode(c, payload)
	if err != nil {
		return err
	}
	meta := Metadata{Envelope: env, Offset: d.Offset, Attempt: int(d.Attempts) + 1}
	err = c.Transact(ctx, func(ctx context.Context) error {
		res, err := c.inbox.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: false}, {Key: "parked", Value: true}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "handled", Value: true}, {Key: "handled_at", Value: time.Now().UTC()}, {Key: "parked", Value: false}}},
				{Key: "$unset", Value: bson.D{{Key: "parked_at", Value: ""}}}})
		if err != nil {
			return err
		}
		if res.MatchedCount == 0 {
			return fmt.Errorf("%w: %+v", ErrNotParked, id)
		}
		return safeRun(ctx, h, evt, meta)
	})
	if err != nil && !errors.Is(err, ErrNotParked) {
		_ = c.noteFailure(context.WithoutCancel(ctx), &env, d.Offset, payload, err, true)
	}
	return err
}

// safeRun runs a handler and turns a panic into an error.
func safeRun(ctx context.Context, h *handler, evt Event, meta Metadata) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
		}
	}()
	return h.run(ctx, evt, meta)
}

// ErrHandlerPanic wraps the value of a handler's panic.
var ErrHandlerPanic = errors.New("outbox: handler panicked")

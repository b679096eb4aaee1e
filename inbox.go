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

// ParkedEvent is an event the consumer set aside: its handler failed
// Config.MaxAttempts times or asked to park it (Park), its record was
// malformed, or (State ParkedStateHeld) it waits behind an earlier parked
// event of its partition key (Config.PoisonPolicy HoldKey).
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
	// State is ParkedStateParked for an event parked on its own (the head
	// of its key under Config.PoisonPolicy HoldKey) and ParkedStateHeld for
	// an event held behind another one of its key.
	State string `json:"state"`
	// HeldBy is the event a held event waits for (the head of its key's
	// chain when the chain started); nil unless State is ParkedStateHeld.
	HeldBy *InboxID `json:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store whole
	// (near MongoDB's 16 MiB document limit): Payload holds its first bytes
	// and the event cannot be re-driven.
	PayloadTruncated bool `json:"payload_truncated,omitempty"`
	// RedriveRequestedAt is when a re-drive was requested
	// (Admin.RequestRedrive) and not yet served; zero when none is pending.
	RedriveRequestedAt time.Time `json:"redrive_requested_at,omitzero"`
}

// States of a ParkedEvent.
const (
	// ParkedStateParked: parked on its own, after its attempts or at the
	// handler's request (Park), or malformed.
	ParkedStateParked = "parked"
	// ParkedStateHeld: parked behind an earlier parked event of its
	// partition key, to keep the key's order (Config.PoisonPolicy HoldKey).
	ParkedStateHeld = "held"
)

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

// ErrHeld is returned by Redrive for an event held behind a parked event
// of its key (Config.PoisonPolicy HoldKey): re-drive that one, and the held
// events follow in order.
var ErrHeld = errors.New("outbox: event is held behind a parked event of its key")

// Redrive runs the handler of a parked event now, from the payload stored in
// the inbox, in a transaction that also unparks it. On success the event is
// handled (exactly once, as for a delivery), then the events held behind it
// (Config.PoisonPolicy HoldKey) are handled the same way, one transaction
// each, in order; if one of them fails, it becomes the parked head of its
// key, the rest stay held behind it, and Redrive still returns nil (the
// failure is logged and listed by ParkedEvents). On failure of the event
// itself it stays parked with the new error, which Redrive returns.
//
// A held event is not re-driven on its own (ErrHeld), unless the event it
// is held behind is no longer parked (a release that was interrupted, by a
// crash for example): then the release goes on from it.
func (c *Client) Redrive(ctx context.Context, id InboxID) error {
	var d inboxDoc
	err := c.inbox.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !d.Parked) {
		return fmt.Errorf("%w: %+v", ErrNotParked, id)
	}
	if err != nil {
		return fmt.Errorf("outbox: redrive: %w", err)
	}
	if d.HeldBy != nil {
		n, err := c.inbox.CountDocuments(ctx, bson.D{{Key: "_id", Value: *d.HeldBy}, {Key: "parked", Value: true}})
		if err != nil {
			return fmt.Errorf("outbox: redrive: %w", err)
		}
		if n > 0 {
			return fmt.Errorf("%w: %s is held behind %s", ErrHeld, id, *d.HeldBy)
		}
		c.releaseHeld(ctx, *d.HeldBy, d.Partition)
		return nil
	}
	if d.unreadable() {
		return fmt.Errorf("%w: %s", ErrNotRedrivable, id)
	}
	h := c.handlerFor(id.Topic, id.ContentSchema)
	if h == nil {
		return fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, id.Topic, id.ContentSchema)
	}
	env := d.envelope()
	evt, err := c.storedEvent(h, &d)
	if err != nil {
		return err
	}
	meta := Metadata{Envelope: env, Offset: d.Offset, Attempt: int(d.Attempts) + 1}
	err = c.transactWithin(ctx, func(ctx context.Context) error {
		res, err := c.inbox.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: false}}}},
			unparkUpdate())
		if err != nil {
			return err
		}
		if res.MatchedCount == 0 {
			return fmt.Errorf("%w: %+v", ErrNotParked, id)
		}
		return safeRun(ctx, h, evt, meta)
	})
	if err != nil {
		if !errors.Is(err, ErrNotParked) {
			_, _ = c.noteFailure(context.WithoutCancel(ctx), &env, d.Offset, []byte(d.Payload), err, true, 1)
		}
		return err
	}
	c.releaseHeld(ctx, id, d.Partition)
	return nil
}

// envelope rebuilds the envelope of a stored event.
func (d *inboxDoc) envelope() Envelope {
	return Envelope{Topic: d.ID.Topic, ContentSchema: d.ID.ContentSchema, IdempotencyKey: d.ID.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, OccurredAt: d.OccurredAt,
		TraceParent: d.TraceParent, TraceState: d.TraceState}
}

// ErrPayloadTruncated is returned when a parked event whose payload was too
// large to store whole in the inbox is re-driven: only its first bytes are
// kept, for inspection. Purge it, and replay the record from Kafka if
// needed.
var ErrPayloadTruncated = errors.New("outbox: stored payload is truncated")

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

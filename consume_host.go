package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/inboxhost"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// consumeHost is the root package's side of internal/consume: the inbox,
// its key sequences and the handling transactions are internal/inboxhost's
// (the embedded Host, given a hostApp); the root adds decoding records,
// committing offsets and ending dead replicas' sessions, and observes the
// stages for metrics and logs.
type consumeHost struct {
	*inboxhost.Host
	c    *Client
	cons *consumer
}

// newConsumeHost returns the host of cons's workers.
func (c *Client) newConsumeHost(cons *consumer) *consumeHost {
	return &consumeHost{
		Host: inboxhost.New(inboxhost.Config{Inbox: c.inbox, App: hostApp{c}, SkipUnknown: c.cfg.SkipUnknownEvents}),
		c:    c, cons: cons,
	}
}

// delivery is a record as the root package decoded it (consume.Event.Data).
type delivery struct {
	env     Envelope
	payload []byte // the handler's payload; the record's value when unreadable
	h       *handler
	evt     Event
	// unreadable: the envelope could not be read (see redrive_unreadable.go).
	unreadable bool
	// ref is the claim-check reference of a record whose payload was
	// stored out of band; evt is nil until it is resolved (claimcheck.go).
	ref string
}

func deliveryOf(e *consume.Event) *delivery { return e.Data.(*delivery) }

// InboxID implements inboxhost.Delivery.
func (d *delivery) InboxID() inboxhost.ID { return inboxhost.ID(inboxIDOf(&d.env)) }

// At implements inboxhost.Delivery.
func (d *delivery) At(offset int64) store.Delivery { return deliveryAt(&d.env, offset) }

// Payload implements inboxhost.Delivery.
func (d *delivery) Payload() []byte { return d.payload }

// Unreadable implements inboxhost.Delivery.
func (d *delivery) Unreadable() bool { return d.unreadable }

// Ref implements inboxhost.Delivery.
func (d *delivery) Ref() string { return d.ref }

// Decode reads a record: its envelope, its handler and its payload.
func (h *consumeHost) Decode(rec *kgo.Record) *consume.Event {
	c := h.c
	env, payload, err := c.decodeRecord(rec)
	d := &delivery{env: env, payload: payload}
	e := &consume.Event{Key: env.PartitionKey, Data: d, Policy: c.defaultPolicy()}
	if err != nil {
		d.unreadable = true
		d.payload = rec.Value
		if d.env.ContentSchema == "" {
			d.env.ContentSchema = "unknown"
		}
		if d.env.IdempotencyKey == "" {
			// The record's position: the same for every delivery of it.
			d.env.IdempotencyKey = fmt.Sprintf("%s%d:%d", inventedKeyPrefix, rec.Partition, rec.Offset)
		}
		e.Fault = unreadable(err)
		return e
	}
	d.ref, _ = claimcheck.RefOf(rec)
	d.h = c.handlerFor(env.Topic, env.ContentSchema)
	if d.h == nil {
		e.NoHandler = true
		return e
	}
	e.Policy = d.h.policy(c)
	if d.ref != "" {
		return e // resolved by Handle, which may do I/O
	}
	evt, err := d.h.decode(c, payload)
	if err != nil {
		e.Fault = err
		return e
	}
	d.evt = evt
	return e
}

// defaultPolicy is the retry policy of handlers without options.
func (c *Client) defaultPolicy() consume.Policy {
	return consume.Policy{MaxAttempts: c.cfg.MaxAttempts, Backoff: c.cfg.backoff(), MaxSnoozes: c.cfg.MaxSnoozes}
}

// Commit commits a partition's offset.
func (h *consumeHost) Commit(ctx context.Context, tp consume.TopicPartition, offset int64, epoch int32) error {
	return h.cons.commit(ctx, tp, offset, epoch)
}

// Reap ends the sessions of replicas that died with transactions open
// (internal/liveness/takeover.go).
func (h *consumeHost) Reap() { h.c.reapDeadSessions(h.cons) }

// Observer.

func (h *consumeHost) Settled(tp consume.TopicPartition, e *consume.Event, how, reason string) {
	c := h.c
	env := &deliveryOf(e).env
	ctx := context.Background()
	switch how {
	case consume.SettledHandled:
		c.tel.ins.Handled.Add(ctx, 1, eventAttrs(env))
	case consume.SettledSkipped:
		c.tel.ins.Skipped.Add(ctx, 1, eventAttrs(env, itel.AttrReason.String(reason)))
		h.cons.log.Debug("event skipped", "reason", reason, "topic", env.Topic, "schema", env.ContentSchema, "idempotency_key", env.IdempotencyKey, "offset", e.Offset)
	case consume.SettledHeld:
		c.tel.ins.Parked.Add(ctx, 1, eventAttrs(env, itel.AttrReason.String("held")))
		h.cons.log.Debug("event held behind a parked event of its key", "topic", env.Topic, "schema", env.ContentSchema,
			"idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey, "offset", e.Offset)
	case consume.SettledParked:
		c.tel.ins.Parked.Add(ctx, 1, eventAttrs(env, itel.AttrReason.String(reason)))
		msg := "event parked"
		if reason == reasonNoHandler {
			msg = "no handler for event; parked (holding its key) until a replica with its handler releases it"
		}
		h.cons.log.Warn(msg, "reason", reason, "topic", env.Topic, "partition", tp.Partition, "offset", e.Offset,
			"schema", env.ContentSchema, "idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey, "attempts", e.Attempts)
		c.tel.setError(fmt.Errorf("event %s/%s (idempotency key %s, partition key %s) parked: %s", env.Topic, env.ContentSchema, env.IdempotencyKey, env.PartitionKey, reason))
	}
}

func (h *consumeHost) Retry(tp consume.TopicPartition, e *consume.Event, reason string, err error, delay time.Duration) {
	c := h.c
	env := &deliveryOf(e).env
	attrs := eventAttrs(env)
	if reason != "error" {
		attrs = eventAttrs(env, itel.AttrReason.String(reason))
	}
	c.tel.ins.Retried.Add(context.Background(), 1, attrs)
	log := h.cons.log.Debug
	if reason == "error" || reason == "infra" || reason == "locked" {
		log = h.cons.log.Warn
		c.tel.setError(fmt.Errorf("handle %s/%s (idempotency key %s, attempt %d): %s: %w", env.Topic, env.ContentSchema, env.IdempotencyKey, e.Attempts, reason, err))
	}
	log("handling failed; retrying", "reason", reason, "topic", env.Topic, "partition", tp.Partition, "offset", e.Offset,
		"schema", env.ContentSchema, "idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey,
		"attempts", e.Attempts, "retry_in", delay.Round(time.Millisecond).String(), "err", err)
}

func (h *consumeHost) Released(tp consume.TopicPartition, e *consume.Event) {
	env := &deliveryOf(e).env
	h.c.tel.ins.Handled.Add(context.Background(), 1, eventAttrs(env))
	h.cons.log.Debug("held event released", "topic", env.Topic, "partition", tp.Partition, "offset", e.Offset,
		"idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey)
}

func (h *consumeHost) Error(err error) { h.c.tel.setError(err) }

// hostApp is the root's side of internal/inboxhost: handlers, their
// spans, the public errors that steer them, and the transactions.
type hostApp struct{ c *Client }

// Begin starts a transaction (majority write concern) in a new session,
// whose id it first records for takeover (internal/liveness/takeover.go).
// Its context carries the state that collects the events the handlers
// record.
func (a hostApp) Begin(ctx context.Context) (*inboxhost.Tx, error) {
	c := a.c
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.ensureUniqueIndex(ctx); err != nil {
		return nil, err
	}
	sess, err := c.cfg.Mongo.StartSession()
	if err != nil {
		return nil, fmt.Errorf("outbox: start session: %w", err)
	}
	if err := c.sessions.Note(ctx, sess.ID()); err != nil {
		sess.EndSession(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := sess.StartTransaction(txnOptions()); err != nil {
		sess.EndSession(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("outbox: start transaction: %w", err)
	}
	st := &txState{client: c}
	return &inboxhost.Tx{
		Sess:      sess,
		Ctx:       context.WithValue(mongo.NewSessionContext(ctx, sess), txKey{}, st),
		Flush:     st.flush,
		Committed: func(ctx context.Context) { c.tel.ins.Committed(ctx, st.counts, st.claims) },
	}, nil
}

// Stored rebuilds the delivery of a stored inbox document, for a release
// or a re-drive; it comes back with an error when the payload does not
// decode or no handler accepts the event. A payload stored out of band
// that the inbox could not keep whole is resolved again, with ctx.
func (a hostApp) Stored(ctx context.Context, d *inboxhost.Doc) (*consume.Event, error) {
	c := a.c
	id := InboxID(d.ID)
	env := Envelope{Topic: id.Topic, ContentSchema: id.ContentSchema, IdempotencyKey: id.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, OccurredAt: d.OccurredAt,
		TraceParent: d.TraceParent, TraceState: d.TraceState}
	dl := &delivery{env: env, payload: []byte(d.Payload), unreadable: d.Unreadable, ref: d.PayloadRef}
	e := &consume.Event{Offset: d.Offset, Key: d.PartitionKey, Data: dl, Policy: c.defaultPolicy(), Attempts: int(d.Attempts), Failures: int(d.Failures)}
	if dl.unreadable {
		return e, fmt.Errorf("%w: %s", ErrNotRedrivable, id)
	}
	dl.h = c.handlerFor(id.Topic, id.ContentSchema)
	if dl.h == nil {
		e.NoHandler = true
		return e, fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, id.Topic, id.ContentSchema)
	}
	e.Policy = dl.h.policy(c)
	var evt Event
	var err error
	if dl.ref != "" && (d.Payload == "" || d.PayloadTruncated) {
		err = c.resolvePayload(ctx, dl)
		evt = dl.evt
	} else if d.PayloadTruncated {
		e.Fault = fmt.Errorf("%w: %s", ErrPayloadTruncated, id)
		return e, e.Fault
	} else {
		evt, err = dl.h.decode(c, dl.payload)
	}
	if err != nil {
		e.Fault = err
		return e, err
	}
	dl.evt = evt
	return e, nil
}

// Resolve resolves the payloads stored out of band (claimcheck.go).
func (a hostApp) Resolve(ctx, actx context.Context, evs []*consume.Event) (consume.Result, bool) {
	return a.c.resolveAll(ctx, actx, evs)
}

// Transient reports the claim-check store failing (claimcheck.go).
func (a hostApp) Transient(err error) bool { return transientPayloadError(err) }

// Timeout bounds one run of e's handler.
func (a hostApp) Timeout(e *consume.Event) time.Duration { return deliveryOf(e).h.timeout(a.c) }

// Run runs e's handler in a span of its own.
func (a hostApp) Run(ctx context.Context, e *consume.Event, attempt int, start time.Time) (func(error), error) {
	d := deliveryOf(e)
	meta := &Metadata{Envelope: d.env, Offset: e.Offset, Attempt: attempt}
	sctx, span := a.c.tel.startHandle(ctx, meta)
	end := func(err error) { a.c.tel.endHandle(sctx, span, &meta.Envelope, start, err) }
	return end, safeRun(sctx, d.h, d.evt, *meta)
}

// Steer reads a ParkError or a SnoozeError.
func (hostApp) Steer(err error) (park bool, snooze time.Duration, snoozed bool) {
	var perr *ParkError
	var serr *SnoozeError
	switch {
	case errors.As(err, &perr):
		return true, 0, false
	case errors.As(err, &serr):
		return false, serr.Duration, true
	}
	return false, 0, false
}

// Refused reports an event the outbox refuses: a duplicate idempotency key
// under Config.UniqueIdempotencyKeys, or an event-outbox collection not
// migrated.
func (hostApp) Refused(err error) bool {
	return errors.Is(err, ErrDuplicateEvent) || errors.Is(err, ErrEventOutboxNotMigrated)
}

// Releasable reports whether a head parked for want of a handler may be
// released here.
func (a hostApp) Releasable(id inboxhost.ID) bool { return a.c.noHandlerReleasable(InboxID(id)) }

// noHandlerReleasable reports whether a head parked for want of a handler
// may be released here: this process has its handler, or skips events
// without one (Config.SkipUnknownEvents: such an event is skipped wherever
// it meets its key, so a key it heads moves on).
func (c *Client) noHandlerReleasable(id InboxID) bool {
	return c.cfg.SkipUnknownEvents || c.handlerFor(id.Topic, id.ContentSchema) != nil
}

// releaseHead is the host's ReleaseHead for an operator's re-drive of want
// (Redrive).
func (c *Client) releaseHead(ctx context.Context, tp consume.TopicPartition, key string, want *InboxID) (*consume.Event, consume.Result) {
	return c.host().ReleaseHead(ctx, tp, key, (*inboxhost.ID)(want))
}

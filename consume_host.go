package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/trace"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/consume"
)

// consumeHost is the root package's side of internal/consume: it decodes
// records, runs the handlers in transactions, keeps the inbox and its key
// sequences (keyseq.go) and commits offsets. It observes the stages for
// metrics and logs too.
type consumeHost struct {
	c    *Client
	cons *consumer
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

// Handle runs evs in one transaction: one bulk claim of their inbox
// entries, then their handlers in order, then the events they recorded
// (one insertMany), then the commit; within the longest of their
// handlers' timeouts. It is one attempt: the driver does not retry it, so a
// write conflict comes back at once and the consumer decides what follows.
func (h *consumeHost) Handle(ctx context.Context, tp consume.TopicPartition, evs []*consume.Event) consume.Result {
	c := h.c
	timeout := time.Duration(0)
	for _, e := range evs {
		timeout = max(timeout, deliveryOf(e).h.timeout(c))
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if res, ok := c.resolveAll(ctx, actx, evs); !ok {
		return res
	}
	start := time.Now()
	type spanned struct {
		ctx  context.Context
		span trace.Span
		meta *Metadata
	}
	spans := make([]spanned, 0, len(evs))
	end := func(err error) {
		for _, s := range spans {
			c.tel.endHandle(s.ctx, s.span, &s.meta.Envelope, start, err)
		}
	}
	t, err := c.beginTx(actx)
	if err != nil {
		return infraResult(ctx, err)
	}
	defer t.end(actx)
	now := time.Now().UTC()
	if err := c.claimAll(t.ctx, evs, now); err != nil {
		var dup *duplicateAt
		if errors.As(err, &dup) {
			return consume.Result{Kind: consume.Duplicate, At: dup.index}
		}
		return infraResult(ctx, lockedOr(err))
	}
	for i, e := range evs {
		d := deliveryOf(e)
		meta := &Metadata{Envelope: d.env, Offset: e.Offset, Attempt: e.Attempt()}
		sctx, span := c.tel.startHandle(t.ctx, meta)
		spans = append(spans, spanned{sctx, span, meta})
		if err := safeRun(sctx, d.h, d.evt, *meta); err != nil {
			res := handlerResult(ctx, err)
			res.At = i
			end(&handlerError{err})
			return res
		}
	}
	if err := t.state.flush(t.ctx); err != nil {
		res := flushResult(ctx, actx, err)
		res.At = len(evs) - 1
		if res.Kind == consume.Failed {
			end(&handlerError{err})
		} else {
			end(err)
		}
		return res
	}
	if err := t.commit(actx); err != nil {
		end(&commitError{err})
		if ctx.Err() != nil {
			return consume.Result{Kind: consume.Canceled, Err: err}
		}
		return consume.Result{Kind: consume.CommitFailed, At: len(evs) - 1, Err: &commitError{err}}
	}
	end(nil)
	c.tel.committed(ctx, t.state)
	return consume.Result{Kind: consume.Handled}
}

// duplicateAt is a claim that met an event handled or parked already.
type duplicateAt struct{ index int }

func (d *duplicateAt) Error() string {
	return fmt.Sprintf("event %d of the batch is handled or parked", d.index)
}

// claimAll claims evs in the transaction of ctx: one update for one event,
// an ordered bulk of upserts for more (a handled or parked event stops it
// with a duplicate key error at its index: *duplicateAt).
func (c *Client) claimAll(ctx context.Context, evs []*consume.Event, now time.Time) error {
	if len(evs) == 1 {
		err := c.claim(ctx, &deliveryOf(evs[0]).env, evs[0].Offset, now)
		if errors.Is(err, errAlreadyDone) {
			return &duplicateAt{0}
		}
		return err
	}
	models := make([]mongo.WriteModel, len(evs))
	for i, e := range evs {
		filter, update := claimUpdate(&deliveryOf(e).env, e.Offset, now)
		models[i] = mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(true)
	}
	_, err := c.inbox.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
	if err != nil && mongo.IsDuplicateKeyError(err) {
		var bwe mongo.BulkWriteException
		if errors.As(err, &bwe) && len(bwe.WriteErrors) > 0 {
			return &duplicateAt{bwe.WriteErrors[0].Index}
		}
		return &duplicateAt{0}
	}
	return err
}

// handlerResult classifies a handler's error: ctx is the unit's context
// (its end is a stop, not the event's failure).
func handlerResult(ctx context.Context, err error) consume.Result {
	var perr *ParkError
	var snooze *SnoozeError
	switch {
	case ctx.Err() != nil:
		return consume.Result{Kind: consume.Canceled, Err: err}
	case errors.As(err, &perr):
		return consume.Result{Kind: consume.Failed, Err: err, Park: true}
	case errors.As(err, &snooze):
		return consume.Result{Kind: consume.Snoozed, Err: err, Snooze: snooze.Duration}
	case isTransientNotAborted(err):
		return consume.Result{Kind: consume.Conflict, Err: err}
	}
	return consume.Result{Kind: consume.Failed, Err: err}
}

// flushResult classifies a failure to insert the events the handlers
// recorded (txState.flush): ctx is the unit's context, hctx the handlers'
// (their timeout). The insert is the framework's own write, so its failure
// is the event's only when the handlers caused it: they recorded an event
// the outbox refuses (a duplicate idempotency key under
// Config.UniqueIdempotencyKeys, an event-outbox collection not migrated),
// they used up their time, or the server ended the transaction under them
// (NoSuchTransaction: most often a handler that outlived the transaction
// lifetime, which a commit would meet too and count, or every attempt of a
// slow handler would run for ever uncounted). A stop, a lock or a failure
// MongoDB or the driver calls transient (a network error, a timeout, an
// error labelled TransientTransactionError or RetryableWriteError) is not
// an attempt of the event: counting it would park an event that never
// failed (a re-drive cut short by its caller, a connection dropped). Any
// other error counts, as it did: one that comes back every time (a
// document validator of the outbox collection refusing the event, a
// document over MongoDB's size limit) must end parked, not retried for
// ever.
func flushResult(ctx, hctx context.Context, err error) consume.Result {
	var se mongo.ServerError
	switch {
	case ctx.Err() != nil:
		return consume.Result{Kind: consume.Canceled, Err: err}
	case errors.Is(err, ErrDuplicateEvent), errors.Is(err, ErrEventOutboxNotMigrated), hctx.Err() != nil,
		errors.As(err, &se) && se.HasErrorCode(codeNoSuchTransaction):
		return consume.Result{Kind: consume.Failed, Err: err}
	case errors.Is(lockedOr(err), consume.ErrLocked), mongo.IsNetworkError(err), mongo.IsTimeout(err),
		hasLabel(err, "TransientTransactionError"), hasLabel(err, "RetryableWriteError"):
		return infraResult(ctx, lockedOr(err))
	}
	return consume.Result{Kind: consume.Failed, Err: err}
}

// infraResult classifies a failure of the framework's own calls: a lock
// held by another session's transaction, MongoDB failing, or the unit's
// context ending.
func infraResult(ctx context.Context, err error) consume.Result {
	switch {
	case ctx.Err() != nil:
		return consume.Result{Kind: consume.Canceled, Err: err}
	case errors.Is(err, consume.ErrLocked):
		return consume.Result{Kind: consume.Locked, Err: err}
	}
	return consume.Result{Kind: consume.Infra, Err: err}
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
		c.tel.handled.Add(ctx, 1, eventAttrs(env))
	case consume.SettledSkipped:
		c.tel.skipped.Add(ctx, 1, eventAttrs(env, attrReason.String(reason)))
		h.cons.log.Debug("event skipped", "reason", reason, "topic", env.Topic, "schema", env.ContentSchema, "idempotency_key", env.IdempotencyKey, "offset", e.Offset)
	case consume.SettledHeld:
		c.tel.parked.Add(ctx, 1, eventAttrs(env, attrReason.String("held")))
		h.cons.log.Debug("event held behind a parked event of its key", "topic", env.Topic, "schema", env.ContentSchema,
			"idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey, "offset", e.Offset)
	case consume.SettledParked:
		c.tel.parked.Add(ctx, 1, eventAttrs(env, attrReason.String(reason)))
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
		attrs = eventAttrs(env, attrReason.String(reason))
	}
	c.tel.retried.Add(context.Background(), 1, attrs)
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
	h.c.tel.handled.Add(context.Background(), 1, eventAttrs(env))
	h.cons.log.Debug("held event released", "topic", env.Topic, "partition", tp.Partition, "offset", e.Offset,
		"idempotency_key", env.IdempotencyKey, "partition_key", env.PartitionKey)
}

func (h *consumeHost) Error(err error) { h.c.tel.setError(err) }

// storedDelivery rebuilds the delivery of a stored inbox document, for a
// release or a re-drive; evt is nil when the payload does not decode (err
// says why) or no handler accepts the event.
// A payload stored out of band that the inbox could not keep whole is
// resolved again, with ctx.
func (c *Client) storedDelivery(ctx context.Context, d *inboxDoc) (*consume.Event, error) {
	env := inboxEnvelope(d)
	dl := &delivery{env: env, payload: []byte(d.Payload), unreadable: d.Unreadable, ref: d.PayloadRef}
	e := &consume.Event{Offset: d.Offset, Key: d.PartitionKey, Data: dl, Policy: c.defaultPolicy(), Attempts: int(d.Attempts), Failures: int(d.Failures)}
	if dl.unreadable {
		return e, fmt.Errorf("%w: %s", ErrNotRedrivable, d.ID)
	}
	dl.h = c.handlerFor(d.ID.Topic, d.ID.ContentSchema)
	if dl.h == nil {
		e.NoHandler = true
		return e, fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, d.ID.Topic, d.ID.ContentSchema)
	}
	e.Policy = dl.h.policy(c)
	var evt Event
	var err error
	if dl.ref != "" && (d.Payload == "" || d.PayloadTruncated) {
		err = c.resolvePayload(ctx, dl)
		evt = dl.evt
	} else {
		evt, err = c.storedEvent(dl.h, d)
	}
	if err != nil {
		e.Fault = err
		return e, err
	}
	dl.evt = evt
	return e, nil
}

// handlerError marks an error that comes from the user's handler (or from
// the events it recorded), as opposed to the framework's own MongoDB calls.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// commitError marks a transaction that failed after the handler returned
// nil: its commit (or the insert of the events it recorded) failed, for
// example because the attempt outlived Config.HandlerTimeout or the
// server's transaction lifetime. It counts as an attempt: retrying it as an
// infrastructure failure would run a handler that always outlives the
// transaction for ever.
type commitError struct{ err error }

func (e *commitError) Error() string {
	return "transaction failed after the handler returned: " + e.err.Error()
}
func (e *commitError) Unwrap() error { return e.err }

// isTransientNotAborted reports an error labelled TransientTransactionError
// (a write conflict, a failover) other than NoSuchTransaction: that one
// means the server aborted the transaction under the handler, typically for
// its age, and retrying it for free would loop for ever on a handler that
// always outlives its transaction.
func isTransientNotAborted(err error) bool {
	if !hasLabel(err, "TransientTransactionError") {
		return false
	}
	var se mongo.ServerError
	return !errors.As(err, &se) || !se.HasErrorCode(codeNoSuchTransaction)
}

// codeNoSuchTransaction is MongoDB's NoSuchTransaction error code.
const codeNoSuchTransaction = 251

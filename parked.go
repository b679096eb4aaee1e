package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/operator"
	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// Parked events: the public types, Client.Redrive (run by the consumer
// host) and the glue of the operator's actions, whose mechanics live in
// internal/operator (see its doc.go):
//
//   - Client.Redrive runs its handler at once, in the calling process (which
//     must have the handler registered).
//   - Admin.RequestRedrive marks it for re-drive; a running consumer of the
//     service that has the handler serves the request within the loop's
//     period (operator.Requests, started by startRedriveRequests) as
//     Client.Redrive does. This is how tools without handlers (cmd/outboxctl)
//     re-drive.
//   - Admin.PurgeParked gives up on it: it is marked handled (discarded),
//     so a redelivery of the same event is skipped as a duplicate, and the
//     inbox TTL index deletes it after Config.InboxRetention.

// ParkedFilter selects parked events. The zero value selects all of them.
type ParkedFilter struct {
	// IDs keeps only these events. Defaults to any.
	IDs []InboxID
	// Topic keeps the events of one topic. Defaults to any.
	Topic string
	// ContentSchema keeps the events of one content schema. Defaults to any.
	ContentSchema string
	// ParkedBefore keeps the events parked before this time. Defaults to
	// any time.
	ParkedBefore time.Time
	// Limit caps the events listed (ParkedEvents only). Defaults to no
	// limit.
	Limit int

	// _ keeps ParkedFilter out of unkeyed literals, so that fields may be
	// added.
	_ [0]func()
}

// op is f as internal/operator selects.
func (f ParkedFilter) op() operator.ParkedFilter[InboxID] {
	return operator.ParkedFilter[InboxID]{IDs: f.IDs, Topic: f.Topic, ContentSchema: f.ContentSchema,
		ParkedBefore: f.ParkedBefore, Limit: f.Limit}
}

// parkedEvent is the public view of a listed parked document.
func parkedEvent(d *operator.Parked[InboxID]) ParkedEvent {
	p := ParkedEvent{ID: d.Doc.ID, Partition: d.Doc.Partition, Offset: d.Doc.Offset, PartitionKey: d.Doc.PartitionKey,
		Attempts: d.Doc.Attempts, Failures: d.Doc.Failures, LastError: d.Doc.LastError, Payload: d.Doc.Payload, OccurredAt: d.Doc.OccurredAt,
		State: ParkedStateParked, PayloadTruncated: d.Doc.PayloadTruncated}
	if d.Held() {
		p.State, p.HeldBy = ParkedStateHeld, d.Head
	}
	if d.Doc.ParkedAt != nil {
		p.ParkedAt = *d.Doc.ParkedAt
	}
	if d.RedriveRequestedAt != nil {
		p.RedriveRequestedAt = *d.RedriveRequestedAt
		p.RedriveDeferred = d.RedriveDeferred
		if d.RedriveDeferred != "" && d.RedriveNotBefore != nil {
			p.RedriveNextTry = *d.RedriveNotBefore
		}
	}
	return p
}

// ParkedEvent is an event the consumer set aside: its handler failed
// Config.MaxAttempts times or asked to park it (Park), its record was
// malformed, or (State ParkedStateHeld) it waits behind an earlier parked
// event of its partition key (Config.PoisonPolicy HoldKey).
type ParkedEvent struct {
	ID           InboxID `json:"id"`
	Partition    int32   `json:"partition"`
	Offset       int64   `json:"offset"`
	PartitionKey string  `json:"partition_key"`
	// Attempts counts the event's runs: those whose handler failed
	// (Failures) and those that ended without a result (the process died
	// or lost the partition during them).
	Attempts  int32     `json:"attempts"`
	Failures  int32     `json:"failures"`
	LastError string    `json:"last_error"`
	ParkedAt  time.Time `json:"parked_at"`
	Payload   string    `json:"payload"`
	// OccurredAt is the event's occurred-at time, when it had one.
	OccurredAt time.Time `json:"occurred_at,omitzero"`
	// State is ParkedStateParked for an event parked on its own (the head
	// of its key under Config.PoisonPolicy HoldKey) and ParkedStateHeld for
	// an event held behind another one of its key.
	State string `json:"state"`
	// HeldBy is the event a held event waits for: the head of its key when
	// listed. Nil unless State is ParkedStateHeld, and nil for a held event
	// that heads its key itself (the event it waited for was handled or
	// purged): it is released next.
	HeldBy *InboxID `json:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store whole
	// (near MongoDB's 16 MiB document limit): Payload holds its first bytes
	// and the event cannot be re-driven.
	PayloadTruncated bool `json:"payload_truncated,omitempty"`
	// RedriveRequestedAt is when a re-drive was requested
	// (Admin.RequestRedrive) and not yet served; zero when none is pending.
	RedriveRequestedAt time.Time `json:"redrive_requested_at,omitzero"`
	// RedriveDeferred says why the last try of a pending re-drive request
	// could not run ("snoozed", "conflict", "locked" or "infra", then the
	// error): a reason that is not the handler's failure, so nothing was
	// counted and the request stays until it runs; "" when none.
	RedriveDeferred string `json:"redrive_deferred,omitempty"`
	// RedriveNextTry is when a deferred request is tried again (at the
	// latest); zero unless RedriveDeferred is set.
	RedriveNextTry time.Time `json:"redrive_next_try,omitzero"`
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

// Redrive runs the handler of a parked event now, in the calling process
// (which must have the handler registered), from the payload stored in the
// inbox, in one transaction that also takes it off its key's sequence. On
// success the event is handled (exactly once, as for a delivery), then the
// events held behind it (Config.PoisonPolicy HoldKey) are handled the same
// way, one transaction each, in order, with the usual retries; one that
// still fails after its attempts (counting its stored ones) or asks to
// park becomes the parked head of its key, the rest stay held behind it,
// and Redrive still returns nil (the failure is logged and listed by
// Admin.ParkedEvents). When ctx ends or MongoDB fails during that release,
// Redrive returns and the partition's consumer goes on with it within
// seconds: every step is one transaction, so nothing is left half done. On
// failure of the event itself it stays parked with the new error (and one
// more attempt), which Redrive returns. When the event could not run for a
// reason that is not its handler's failure (the handler snoozed, a write
// conflict, a lock still held after a few tries and a request to end the
// sessions of dead replicas, MongoDB failing), nothing is counted, the
// event stays parked as it was, and the error is a *RedriveDeferredError
// (ErrRedriveDeferred): try again later. With Config.SkipUnknownEvents, an
// event no handler takes is skipped (marked handled, skip_reason
// no_handler) and the events held behind it are released.
//
// Only the head of a key (its oldest parked event in the partition) can be
// re-driven: another one returns ErrHeld. A held event that became the head
// (the event it waited for was handled or purged) is released with the rest.
func (c *Client) Redrive(ctx context.Context, id InboxID) error {
	d, err := c.Admin().parked().Get(ctx, id)
	if err != nil {
		return err
	}
	tp := consume.TopicPartition{Topic: id.Topic, Partition: d.Partition}
	key := d.PartitionKey
	if c.cfg.PoisonPolicy != HoldKey {
		key = "" // no sequences: the event alone
	}
	if d.HeldBy != nil && key != "" {
		head, ok, err := c.Admin().parked().First(ctx, tp.Topic, tp.Partition, key)
		if err != nil {
			return fmt.Errorf("outbox: redrive: %w", err)
		}
		if !ok || head.ID != id {
			return fmt.Errorf("%w: %s is held behind %s", ErrHeld, id, head.ID)
		}
		c.releaseKey(ctx, tp, key)
		return nil
	}
	if c.handlerFor(id.Topic, id.ContentSchema) == nil && !c.cfg.SkipUnknownEvents {
		return fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, id.Topic, id.ContentSchema)
	}
	// The partition's consumer may be adding events behind the head
	// meanwhile (a write conflict on the head), or a replica that died left
	// its transaction open on it (a lock, until its session is ended): try
	// again a few times, asking for a reap.
	e, res := c.releaseHead(ctx, tp, key, &id)
	for tries := 1; res.Kind == consume.Locked && tries <= redriveLockedTries; tries++ {
		c.host().Reap()
		if !retry.Sleep(ctx, nil, c.cfg.backoff().Delay(tries-1)) {
			break
		}
		e, res = c.releaseHead(ctx, tp, key, &id)
	}
	switch res.Kind {
	case consume.Handled:
		c.tel.ins.Handled.Add(ctx, 1, eventAttrs(&deliveryOf(e).env))
		if key != "" {
			c.releaseKey(ctx, tp, key)
		}
		return nil
	case consume.Skipped:
		c.tel.ins.Skipped.Add(ctx, 1, eventAttrs(&deliveryOf(e).env, itel.AttrReason.String(reasonNoHandler)))
		if key != "" {
			c.releaseKey(ctx, tp, key)
		}
		return nil
	case consume.Empty:
		return fmt.Errorf("%w: %+v", ErrNotParked, id)
	case consume.HeadParked:
		return res.Err
	case consume.Canceled:
		return fmt.Errorf("outbox: redrive %s: %w", id, cmp.Or(ctx.Err(), res.Err))
	case consume.Locked, consume.Infra:
		if res.Kind == consume.Locked {
			c.host().Reap()
		}
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: c.cfg.backoff().Delay(redriveLockedTries), Err: res.Err}
	case consume.Snoozed:
		// Not the handler's failure: the worker's own release does not
		// count a snooze either.
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: res.Snooze, Err: res.Err}
	case consume.Conflict:
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: c.cfg.backoff().Delay(0), Err: res.Err}
	}
	// The handler failed (or its commit did): the event stays parked with
	// the new error.
	reason := "handler_error"
	if res.Park {
		reason = "handler_parked"
	}
	if _, err := c.host().NoteReleaseFailure(context.WithoutCancel(ctx), tp, e, res.Err, 1, true, reason); err != nil {
		c.cfg.Logger.Warn("outbox: noting a failed re-drive failed", "id", id.String(), "err", err)
	}
	return res.Err
}

// redriveLockedTries is how many times Redrive tries again a head whose
// inbox entry another transaction is writing.
const redriveLockedTries = 5

// releaseKey releases the held events of key inline (Redrive), until one
// fails for good, MongoDB fails or ctx ends: the partition's consumer goes
// on from there.
func (c *Client) releaseKey(ctx context.Context, tp consume.TopicPartition, key string) {
	h := c.host()
	consume.ReleaseKey(ctx, h, h, c.cfg.backoff(), tp, key)
}

// host is a consumeHost for work outside the consumer (Redrive).
func (c *Client) host() *consumeHost {
	if cons := c.tel.cons.Load(); cons != nil {
		return c.newConsumeHost(cons)
	}
	return c.newConsumeHost(&consumer{c: c, log: c.cfg.Logger.With("outbox.component", "consumer"), errLog: itel.NewRateLog(itel.ErrorRelog)})
}

// ParkedEvents lists the parked events f selects, oldest first.
func (a *Admin) ParkedEvents(ctx context.Context, f ParkedFilter) ([]ParkedEvent, error) {
	docs, err := a.parked().List(ctx, f.op())
	if err != nil {
		return nil, err
	}
	out := make([]ParkedEvent, len(docs))
	for i := range docs {
		out[i] = parkedEvent(&docs[i])
	}
	return out, nil
}

// parked runs the operator's actions on the inbox.
func (a *Admin) parked() operator.Inbox[InboxID] { return operator.Inbox[InboxID]{Coll: a.inbox} }

// RequestRedrive asks the service's running consumers to re-drive the
// parked events f selects (Limit ignored): one replica that has the
// event's handler runs it within a few seconds, as Client.Redrive does. An
// event whose handler no replica has keeps its request (it shows in
// StoreStatus.RedriveRequested). A request whose re-drive could not run for
// a reason that is not the handler's failure (it snoozed, a conflict, a
// lock, MongoDB failing: see ErrRedriveDeferred) stays too, with the reason
// (ParkedEvent.RedriveDeferred, StoreStatus.RedriveDeferred), and is tried
// again until it runs. A held event (Config.PoisonPolicy
// HoldKey) is re-driven after the event it is held behind, never alone: a
// request for it alone is dropped when served. A malformed record whose
// envelope could not be read can never be re-driven: when f names one, the
// request is refused with ErrNotRedrivable and nothing is marked; a
// selection without IDs leaves such records out, and the held events too
// (their heads' re-drive releases them). With dryRun nothing changes. It returns how many events were (or would be) marked; when f
// names IDs and none of them is parked, the error wraps ErrNotParked.
func (a *Admin) RequestRedrive(ctx context.Context, f ParkedFilter, dryRun bool) (int64, error) {
	return a.parked().RequestRedrive(ctx, f.op(), dryRun, time.Now())
}

// PurgeParked gives up on the parked events f selects (Limit ignored): each
// is marked handled and discarded (discarded_at), so a redelivery of the
// same event is skipped as a duplicate, and the inbox TTL index deletes it
// after Config.InboxRetention. The events held behind a purged event
// (Config.PoisonPolicy HoldKey) and not purged themselves go on in order:
// when the next one of its key only waited (held), the partition's running
// consumer releases it and the rest within seconds; when it was parked on
// its own, it is the key's head now.
// With dryRun nothing changes. It returns how many events were (or would
// be) purged; when f names IDs and none of them is parked, the error wraps
// ErrNotParked.
func (a *Admin) PurgeParked(ctx context.Context, f ParkedFilter, dryRun bool) (int64, error) {
	return a.parked().Purge(ctx, f.op(), dryRun, time.Now())
}

// startRedriveRequests runs the loop that serves re-drive requests
// (operator.Requests) until ctx ends; handlers run under ctx too: a
// shutdown cuts a re-drive short between two transactions, and the
// partition's consumer goes on with it. The returned function waits for
// the loop to end.
func (c *Client) startRedriveRequests(ctx context.Context) (wait func()) {
	r := &operator.Requests[InboxID]{
		Inbox:   c.Admin().parked(),
		Every:   c.test.redriveEvery,
		Log:     c.cfg.Logger,
		Bound:   c.redriveBound,
		Redrive: c.serveRedriveRequest,
		Failed:  c.tel.setError,
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	return wg.Wait
}

// redriveBound is how long the re-drive of d may run here, and false when
// this process can neither handle nor skip it (another replica or version
// of the service may have its handler).
func (c *Client) redriveBound(d *store.InboxDoc[InboxID]) (time.Duration, bool) {
	h := c.handlerFor(d.ID.Topic, d.ID.ContentSchema)
	if h == nil {
		return 0, c.cfg.SkipUnknownEvents
	}
	return h.timeout(c), true
}

// serveRedriveRequest re-drives the event of a claimed re-drive request as
// Client.Redrive does, in a handling span, logs and counts the result, and
// says what is left of the request: it stays after a deferral
// (RedriveDeferredError), with the reason and its next try; it is given
// back when this replica stops; otherwise (the handler ran to a result, or
// the event was skipped, handled, purged or held meanwhile) it is done.
func (c *Client) serveRedriveRequest(ctx context.Context, d *store.InboxDoc[InboxID]) operator.Outcome {
	env := Envelope{Topic: d.ID.Topic, ContentSchema: d.ID.ContentSchema, IdempotencyKey: d.ID.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, TraceParent: d.TraceParent, TraceState: d.TraceState}
	meta := Metadata{Envelope: env, Offset: d.Offset, Attempt: int(d.Attempts) + 1}
	sctx, span := c.tel.startHandle(ctx, &meta)
	span.SetAttributes(attribute.Bool("outbox.redrive", true))
	err := c.Redrive(sctx, d.ID)
	if err != nil {
		span.RecordError(err)
	}
	span.End()
	stopping := err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err())
	var deferred *RedriveDeferredError
	switch {
	case err == nil:
		c.cfg.Logger.Info("outbox: parked event re-driven", "id", d.ID.String())
	case errors.Is(err, ErrNotParked), errors.Is(err, ErrHeld), stopping:
		// Handled or purged meanwhile, or held: re-driven with its
		// head; or stopping: the request stays for the next replica.
	case errors.As(err, &deferred):
		log := c.cfg.Logger.Info
		if deferred.Reason == consume.Locked.String() || deferred.Reason == consume.Infra.String() {
			log = c.cfg.Logger.Warn
			c.tel.setError(fmt.Errorf("re-drive %s: %w", d.ID, err))
		}
		log("outbox: re-drive could not run; the request stays and is tried again", "id", d.ID.String(),
			"reason", deferred.Reason, "retry_in", deferred.RetryAfter.Round(time.Millisecond).String(), "err", deferred.Err)
	default:
		c.cfg.Logger.Warn("outbox: re-drive failed; event stays parked", "id", d.ID.String(), "err", err)
		c.tel.setError(fmt.Errorf("re-drive %s: %w", d.ID, err))
		c.tel.ins.Parked.Add(ctx, 1, eventAttrs(&env, itel.AttrReason.String("redrive_failed")))
	}
	switch {
	case errors.As(err, &deferred):
		return operator.Outcome{Deferred: true, Why: deferred.Reason + ": " + deferred.Err.Error(), RetryAfter: deferred.RetryAfter}
	case stopping:
		return operator.Outcome{Stopped: true}
	}
	return operator.Outcome{}
}

package inboxhost

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
)

// Handle runs evs in one transaction: one bulk claim of their inbox
// entries, then their handlers in order, then the events they recorded
// (one insertMany), then the commit; within the longest of their
// handlers' timeouts. It is one attempt: the driver does not retry it, so a
// write conflict comes back at once and the consumer decides what follows.
func (h *Host) Handle(ctx context.Context, tp consume.TopicPartition, evs []*consume.Event) consume.Result {
	timeout := time.Duration(0)
	for _, e := range evs {
		timeout = max(timeout, h.app.Timeout(e))
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if res, ok := h.app.Resolve(ctx, actx, evs); !ok {
		return res
	}
	start := time.Now()
	ends := make([]func(error), 0, len(evs))
	end := func(err error) {
		for _, f := range ends {
			f(err)
		}
	}
	t, err := h.app.Begin(actx)
	if err != nil {
		return infraResult(ctx, err)
	}
	defer t.End(actx)
	now := time.Now().UTC()
	if err := h.claimAll(t.Ctx, evs, now); err != nil {
		var dup *duplicateAt
		if errors.As(err, &dup) {
			return consume.Result{Kind: consume.Duplicate, At: dup.index}
		}
		return infraResult(ctx, LockedOr(err))
	}
	for i, e := range evs {
		endRun, err := h.app.Run(t.Ctx, e, e.Attempt(), start)
		ends = append(ends, endRun)
		if err != nil {
			res := h.handlerResult(ctx, err)
			res.At = i
			end(&HandlerError{err})
			return res
		}
	}
	if err := t.Flush(t.Ctx); err != nil {
		res := h.flushResult(ctx, actx, err)
		res.At = len(evs) - 1
		if res.Kind == consume.Failed {
			end(&HandlerError{err})
		} else {
			end(err)
		}
		return res
	}
	if err := t.Commit(actx); err != nil {
		end(&CommitError{err})
		switch {
		case ctx.Err() != nil:
			return consume.Result{Kind: consume.Canceled, Err: err}
		case len(evs) == 1 && errors.Is(err, consume.ErrLocked):
			// A write conflict at commit: the transaction did not commit,
			// and another transaction's write is no fault of the event.
			// It is retried as a conflict of the handler's own writes,
			// free up to a bound (a batch's events run alone first).
			return consume.Result{Kind: consume.Conflict, Err: &CommitError{err}}
		}
		return consume.Result{Kind: consume.CommitFailed, At: len(evs) - 1, Err: &CommitError{err}}
	}
	end(nil)
	t.Committed(ctx)
	return consume.Result{Kind: consume.Handled}
}

// duplicateAt is a claim that met an event handled or parked already.
type duplicateAt struct{ index int }

func (d *duplicateAt) Error() string {
	return fmt.Sprintf("event %d of the batch is handled or parked", d.index)
}

// claim flips the event's inbox document to handled inside the transaction
// of ctx, inserting it when absent: one round trip. When the document is
// already handled (or parked) the filter does not match, the upsert collides
// with the existing _id and MongoDB answers a duplicate key error, which
// aborts the transaction: claim returns ErrAlreadyDone. Of two concurrent
// claims one gets a write conflict and, retried, ErrAlreadyDone.
func (h *Host) claim(ctx context.Context, d Delivery, offset int64, now time.Time) error {
	filter, update := store.Claim(d.InboxID(), d.At(offset), now)
	_, err := h.inbox.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return ErrAlreadyDone
	}
	return err
}

// claimAll claims evs in the transaction of ctx: one update for one event,
// an ordered bulk of upserts for more (a handled or parked event stops it
// with a duplicate key error at its index: *duplicateAt).
func (h *Host) claimAll(ctx context.Context, evs []*consume.Event, now time.Time) error {
	if len(evs) == 1 {
		err := h.claim(ctx, deliveryOf(evs[0]), evs[0].Offset, now)
		if errors.Is(err, ErrAlreadyDone) {
			return &duplicateAt{0}
		}
		return err
	}
	models := make([]mongo.WriteModel, len(evs))
	for i, e := range evs {
		d := deliveryOf(e)
		filter, update := store.Claim(d.InboxID(), d.At(e.Offset), now)
		models[i] = mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(true)
	}
	_, err := h.inbox.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
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
func (h *Host) handlerResult(ctx context.Context, err error) consume.Result {
	park, snooze, snoozed := h.app.Steer(err)
	switch {
	case ctx.Err() != nil:
		return consume.Result{Kind: consume.Canceled, Err: err}
	case park:
		return consume.Result{Kind: consume.Failed, Err: err, Park: true}
	case snoozed:
		return consume.Result{Kind: consume.Snoozed, Err: err, Snooze: snooze}
	case isTransientNotAborted(err):
		return consume.Result{Kind: consume.Conflict, Err: err}
	}
	return consume.Result{Kind: consume.Failed, Err: err}
}

// flushResult classifies a failure to insert the events the handlers
// recorded (Tx.Flush): ctx is the unit's context, hctx the handlers'
// (their timeout). The insert is the framework's own write, so its failure
// is the event's only when the handlers caused it: they recorded an event
// the outbox refuses (App.Refused: a duplicate idempotency key under
// Config.UniqueIdempotencyKeys, an event-outbox collection not migrated),
// they used up their time, or the server ended the transaction under them
// (NoSuchTransaction: most often a handler that outlived the transaction
// lifetime, which a commit would meet too and count, or every attempt of a
// slow handler would run for ever uncounted). A stop, a lock or a failure
// MongoDB or the driver calls transient (a network error, a timeout, an
// error labelled TransientTransactionError or RetryableWriteError) is not
// an attempt of the event: counting it would park an event that never
// failed (a re-drive cut short by its caller, a connection dropped). Any
// other error counts: one that comes back every time (a document validator
// of the outbox collection refusing the event, a document over MongoDB's
// size limit) must end parked, not retried for ever.
func (h *Host) flushResult(ctx, hctx context.Context, err error) consume.Result {
	var se mongo.ServerError
	switch {
	case ctx.Err() != nil:
		return consume.Result{Kind: consume.Canceled, Err: err}
	case h.app.Refused(err), hctx.Err() != nil,
		errors.As(err, &se) && se.HasErrorCode(codeNoSuchTransaction):
		return consume.Result{Kind: consume.Failed, Err: err}
	case errors.Is(LockedOr(err), consume.ErrLocked), mongo.IsNetworkError(err), mongo.IsTimeout(err),
		store.HasLabel(err, "TransientTransactionError"), store.HasLabel(err, "RetryableWriteError"):
		return infraResult(ctx, LockedOr(err))
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

// isTransientNotAborted reports an error labelled TransientTransactionError
// (a write conflict, a failover) other than NoSuchTransaction: that one
// means the server aborted the transaction under the handler, typically for
// its age, and retrying it for free would loop for ever on a handler that
// always outlives its transaction.
func isTransientNotAborted(err error) bool {
	if !store.HasLabel(err, "TransientTransactionError") {
		return false
	}
	var se mongo.ServerError
	return !errors.As(err, &se) || !se.HasErrorCode(codeNoSuchTransaction)
}

// codeNoSuchTransaction is MongoDB's NoSuchTransaction error code.
const codeNoSuchTransaction = 251

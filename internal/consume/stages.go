package consume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/tuning"
)

// The path of a delivered event, one named stage each:
//
//  1. decode (Worker.take): the host reads the record; a record it cannot
//     handle comes with Fault or NoHandler.
//  2. check the key (checkKey): an event without a handler is skipped
//     first under Config.SkipUnknown (nothing may wait for a type no
//     replica takes); an event whose key holds a sequence (a parked event
//     of the key in the partition) joins the end of it.
//  3. park what cannot run (parkUnrunnable): malformed records, events
//     without a handler.
//  4. look up (lookup): right after an assignment, or after duplicates
//     were met, the inbox state of the events is read first, so that a
//     redelivered event is skipped without rolling back the others, and
//     (after an assignment) an attempt is counted before each runs.
//  5. claim and handle (Host.Handle): one transaction claims the events in
//     the inbox and runs their handlers.
//  6. settle (settle, failure): handled, skipped, retried later (only its
//     key waits), or parked as the head of its key.
//
// Every stage returns outcomes; none sleeps: a retry is a time at which
// the event's lane may run again (see sched), so a unit is one transaction
// long and a stop never waits for a retry delay.

// unitResult is what a unit goroutine hands back to the worker loop.
type unitResult struct {
	unit *Unit
	outs []Outcome
	// For a release step: whether another step is due, and when.
	more   bool
	moreAt time.Time
	// releases are keys whose sequence became releasable meanwhile.
	releases []string
	// suspect: the unit counts its events' attempts before they run.
	suspect bool
}

// deliveries runs a unit of delivered events.
func (w *Worker) deliveries(ctx context.Context, u *Unit) unitResult {
	evs := u.Events
	r := unitResult{outs: make([]Outcome, len(evs)), suspect: u.suspect}
	if len(evs) == 1 && !w.batchOK(evs[0]) {
		w.one(ctx, evs[0], &r.outs[0], &r)
		return r
	}
	w.run(ctx, evs, &r)
	return r
}

// one runs an event that cannot share a transaction: a held key's, a
// malformed one, one without a handler, or one that failed in a batch.
func (w *Worker) one(ctx context.Context, e *Event, out *Outcome, r *unitResult) {
	if done := w.checkKey(ctx, e, out); done {
		return
	}
	if done := w.parkUnrunnable(ctx, e, out, r); done {
		return
	}
	w.run(ctx, []*Event{e}, r)
}

// checkKey skips e when no handler takes it and Config.SkipUnknown, else
// adds e to its key's sequence when the key holds one. It reports true
// when e is settled or must wait (out says which).
func (w *Worker) checkKey(ctx context.Context, e *Event, out *Outcome) bool {
	if e.NoHandler && w.cfg.SkipUnknown {
		w.settled(e, out, SettledSkipped, "no_handler")
		return true
	}
	if !w.cfg.Hold || e.Key == "" || !w.holding(e.Key) {
		return false
	}
	err := w.cfg.Host.Hold(ctx, w.tp, e)
	switch {
	case err == nil:
		w.settled(e, out, SettledHeld, "")
	case errors.Is(err, ErrDone):
		w.settled(e, out, SettledSkipped, "duplicate")
	case errors.Is(err, ErrKeyFree):
		w.unhold(e.Key)
		return false
	default:
		w.infraRetry(ctx, e, out, err)
	}
	return true
}

// parkUnrunnable parks a malformed event, or one without a handler, at
// once. It reports true when e is settled or must wait.
func (w *Worker) parkUnrunnable(ctx context.Context, e *Event, out *Outcome, r *unitResult) bool {
	switch {
	case e.Fault != nil:
		w.park(ctx, e, out, r, e.Fault, 1, 0, "malformed")
	case e.NoHandler:
		w.park(ctx, e, out, r, errNoHandler, 1, 0, "no_handler")
	default:
		return false
	}
	return true
}

var errNoHandler = errors.New("no handler for the event's topic and content schema in this service")

// run handles evs (in offset order) in one transaction and settles them.
func (w *Worker) run(ctx context.Context, evs []*Event, r *unitResult) {
	if !w.lookup(ctx, evs, r) {
		return
	}
	start := time.Now()
	res := w.cfg.Host.Handle(ctx, w.tp, evs)
	w.noteDuration(time.Since(start), len(evs), res.Kind)
	now := time.Now()
	switch {
	case res.Kind == Handled:
		for i, e := range evs {
			w.settled(e, &r.outs[i], SettledHandled, "")
		}
		return
	case res.Kind == Duplicate:
		w.lookups.Store(lookupCredits)
		e := evs[res.At]
		w.settled(e, &r.outs[res.At], SettledSkipped, "duplicate")
		w.learnHold(ctx, e, r)
		return // the others run again at once, in a new unit
	case res.Kind == Canceled:
		return
	case res.Kind == Locked || res.Kind == Infra:
		for i, e := range evs {
			w.infraRetry(ctx, e, &r.outs[i], res.Err)
		}
		return
	case len(evs) > 1:
		// The batch rolled back: the event at fault (all of them when the
		// commit failed) runs alone next, where its failure counts.
		if res.Kind == CommitFailed {
			for i := range evs {
				r.outs[i].Alone = true
			}
		} else {
			r.outs[res.At].Alone = true
		}
		return
	}
	e, out := evs[0], &r.outs[0]
	switch res.Kind {
	case Snoozed:
		if e.snoozes < e.Policy.MaxSnoozes {
			e.snoozes++
			w.retryAt(e, out, "snooze", res.Err, now.Add(res.Snooze))
			return
		}
	case Conflict:
		if e.conflicts < maxFreeConflicts {
			e.conflicts++
			w.retryAt(e, out, "conflict", res.Err, now.Add(w.cfg.Backoff.Delay(e.conflicts-1)))
			return
		}
	}
	w.failure(ctx, e, out, r, res.Err, res.Park)
}

// maxFreeConflicts is how many transient transaction errors of a handler's
// own writes are retried without counting as attempts.
const maxFreeConflicts = 10

// lookupCredits is how many units read the inbox before their transaction
// after a duplicate was met (see lookup).
const lookupCredits = 8

// lookup reads the inbox state of evs before their transaction, when
// redeliveries are likely: in the first units after an assignment (then it
// also counts an attempt of each, see Event.Counted; an event whose count
// failed is counted before its next run, alone), and for a few units after
// a duplicate was met. Events found done are skipped;
// events whose attempts ran out are parked. It reports whether the unit
// goes on to its transaction: when anything was settled, the rest waits
// for a new unit, formed knowing what was learnt.
func (w *Worker) lookup(ctx context.Context, evs []*Event, r *unitResult) bool {
	count := r.suspect || slices.ContainsFunc(evs, func(e *Event) bool { return e.mustCount })
	if !count {
		if w.lookups.Load() <= 0 || tuning.ConsumerNoDuplicateLookup.Load() {
			return true
		}
		w.lookups.Add(-1)
	}
	todo := evs
	if count {
		// Each event is counted once, before its first run here.
		todo = todo[:0:0]
		for _, e := range evs {
			if !e.looked {
				todo = append(todo, e)
			}
		}
		if len(todo) == 0 {
			return true
		}
	}
	stored, err := w.cfg.Host.Lookup(ctx, w.tp, todo, count)
	if err != nil {
		for i, e := range evs {
			w.infraRetry(ctx, e, &r.outs[i], err)
			if count && !e.looked {
				// Its count is still owed: a lock here is what the
				// earlier owner's transaction leaves when it died running
				// the event, the very case the count is for.
				e.mustCount, r.outs[i].Alone = true, true
			}
		}
		return false
	}
	settledAny := false
	for i, e := range todo {
		e.looked, e.mustCount = true, false
		s := stored[i]
		out := &r.outs[indexOf(evs, e)]
		switch {
		case s.Done:
			w.settled(e, out, SettledSkipped, "duplicate")
			w.learnHold(ctx, e, r)
			w.lookups.Store(lookupCredits) // more redeliveries are likely
			settledAny = true
		case count:
			e.Attempts, e.Failures, e.Counted = s.Attempts, s.Failures, true
			// Runs that ended without a result are churn (kills, lost
			// partitions) unless they keep coming: a handler that kills
			// its process would otherwise run for ever.
			if unfinished := e.Attempts - e.Failures; unfinished > e.Policy.MaxAttempts {
				cause := fmt.Errorf("%w: attempt %d started after %d earlier attempts ended without a result (the process stopped or lost the partition during them)",
					ErrAttemptsExhausted, e.Attempts, unfinished-1)
				w.park(ctx, e, out, r, cause, 0, 0, "attempts_exhausted")
				settledAny = true
			}
		}
	}
	return !settledAny
}

// ErrAttemptsExhausted is the cause of an event parked because its
// attempts ran out without a handler error to show.
var ErrAttemptsExhausted = errors.New("outbox: attempts exhausted")

func indexOf(evs []*Event, e *Event) int {
	for i, x := range evs {
		if x == e {
			return i
		}
	}
	panic("consume: event not in its unit")
}

// failure settles a failed attempt of e: it is counted (unless counted
// before it ran) and e runs again after the handler's backoff, or is
// parked when its attempts are used up, by the stored count, or its
// handler asked to park.
func (w *Worker) failure(ctx context.Context, e *Event, out *Outcome, r *unitResult, cause error, parkNow bool) {
	inc := 1
	if e.Counted {
		inc = 0
	}
	reason := "handler_error"
	if parkNow {
		reason = "handler_parked"
	}
	// MaxAttempts bounds the handler's failures: runs of earlier owners
	// that ended without a result (the process died or lost the partition)
	// do not use them up.
	if parkNow || e.Failures+1 >= e.Policy.MaxAttempts {
		w.park(ctx, e, out, r, cause, inc, 1, reason)
		return
	}
	t, err := w.cfg.Host.NoteFailure(ctx, w.tp, e, cause, inc)
	switch {
	case errors.Is(err, ErrDone):
		w.settled(e, out, SettledSkipped, "duplicate")
		w.learnHold(ctx, e, r)
		return
	case err != nil:
		// The attempt goes uncounted: the event runs again after the
		// infrastructure backoff.
		w.infraRetry(ctx, e, out, err)
		return
	}
	e.Attempts, e.Failures, e.Counted = max(e.Attempts+inc, t.Attempts), max(e.Failures+1, t.Failures), false
	if e.Failures >= e.Policy.MaxAttempts {
		// Earlier owners of the partition saw the other failures.
		w.park(ctx, e, out, r, cause, 0, 0, reason)
		return
	}
	w.retryAt(e, out, "error", cause, time.Now().Add(e.Policy.Backoff.Delay(e.Failures-1)))
}

// park parks e and holds its key, with inc more attempts and fails more
// failures stored.
func (w *Worker) park(ctx context.Context, e *Event, out *Outcome, r *unitResult, cause error, inc, fails int, reason string) {
	t, err := w.cfg.Host.Park(ctx, w.tp, e, cause, inc, fails, reason)
	switch {
	case errors.Is(err, ErrDone):
		w.settled(e, out, SettledSkipped, "duplicate")
		w.learnHold(ctx, e, r)
		return
	case err != nil:
		w.infraRetry(ctx, e, out, err)
		return
	}
	e.Attempts, e.Failures = max(e.Attempts+inc, t.Attempts), max(e.Failures+fails, t.Failures)
	if w.cfg.Hold && e.Key != "" {
		w.setHeld(e.Key)
	}
	w.settled(e, out, SettledParked, reason)
}

// learnHold is called for an event found handled or parked already: a
// duplicate delivery, or an event that an earlier owner of the partition
// parked after this worker read its held keys. If the key holds a
// sequence, the key is held from then on (and released if its head may
// go). One indexed read, on this path only.
func (w *Worker) learnHold(ctx context.Context, e *Event, r *unitResult) {
	if !w.cfg.Hold || e.Key == "" || w.holding(e.Key) {
		return
	}
	h, ok, err := w.cfg.Host.Head(ctx, w.tp, e.Key)
	if err != nil {
		// Not knowing costs order only if an earlier owner parked an event
		// after this worker read its held keys; the periodic re-read of the
		// sequences finds it.
		w.cfg.Observer.Error(fmt.Errorf("read the held events of key %q in %s: %w", e.Key, w.tp, err))
		return
	}
	if ok {
		w.setHeld(e.Key)
		if h.Releasable {
			r.releases = append(r.releases, e.Key)
		}
	}
}

// release runs one step of the release of key's sequence for the worker.
func (w *Worker) release(ctx context.Context, key string) unitResult {
	st := w.relState(key) // a copy: Waits reads the worker's under relMu
	k, more, at, err := releaseStep(ctx, w.cfg.Host, w.cfg.Observer, w.cfg.Backoff, w.tp, key, &st)
	switch k {
	case Empty:
		w.unhold(key)
		w.dropRelState(key)
	case Handled, HeadParked, Skipped:
		w.dropRelState(key)
	default:
		w.saveRelState(key, st, more && at.After(time.Now()), err)
	}
	return unitResult{more: more, moreAt: at}
}

// ReleaseKey releases the held events of key's sequence inline (an
// operator's re-drive) until one is parked for good, the sequence is empty,
// MongoDB keeps failing or ctx ends; the partition's worker goes on from
// there. Handler failures are retried with the handler's backoff, as the
// worker would; a lock (the worker releasing the same key meanwhile) or a
// MongoDB failure a few times.
func ReleaseKey(ctx context.Context, host Host, obs Observer, backoff retry.Backoff, tp TopicPartition, key string) {
	st := &relState{}
	for {
		k, more, at, _ := releaseStep(ctx, host, obs, backoff, tp, key, st)
		if !more || k == Canceled || st.infra > maxInlineInfra {
			return
		}
		if !retry.Sleep(ctx, nil, time.Until(at)) {
			return
		}
	}
}

// maxInlineInfra is how many MongoDB failures or locks in a row an inline
// release rides out before it leaves the rest to the partition's worker.
const maxInlineInfra = 5

// releaseStep runs one step of the release of key's sequence: the head
// handled, or a failure of it counted (and it parked for good once its
// attempts are used up). It returns the step's kind, whether another step
// is due and when, and the step's error.
func releaseStep(ctx context.Context, host Host, obs Observer, backoff retry.Backoff, tp TopicPartition, key string, st *relState) (Kind, bool, time.Time, error) {
	e, res := host.Release(ctx, tp, key)
	now := time.Now()
	switch res.Kind {
	case Empty, HeadParked:
		return res.Kind, false, time.Time{}, res.Err
	case Handled:
		*st = relState{}
		obs.Released(tp, e)
		return Handled, true, time.Time{}, nil
	case Skipped:
		*st = relState{}
		obs.Settled(tp, e, SettledSkipped, "no_handler")
		return Skipped, true, time.Time{}, nil
	case Canceled:
		return Canceled, true, time.Time{}, res.Err
	case Locked, Infra:
		reapIfLocked(host, res.Err)
		st.infra++
		return res.Kind, true, now.Add(backoff.Delay(st.infra - 1)), res.Err
	case Snoozed:
		if st.snoozes < e.Policy.MaxSnoozes {
			st.snoozes++
			return Snoozed, true, now.Add(res.Snooze), res.Err
		}
	case Conflict:
		if st.conflicts < maxFreeConflicts {
			st.conflicts++
			return Conflict, true, now.Add(backoff.Delay(st.conflicts - 1)), res.Err
		}
	}
	// A failed attempt of a released event counts as a delivered one's.
	park := res.Park || e.Failures+1 >= e.Policy.MaxAttempts
	reason := "handler_error"
	if res.Park {
		reason = "handler_parked"
	}
	t, err := host.NoteReleaseFailure(ctx, tp, e, res.Err, 1, park, reason)
	switch {
	case errors.Is(err, ErrDone):
		return Handled, true, time.Time{}, nil // handled or purged meanwhile: go on
	case err != nil:
		reapIfLocked(host, err)
		st.infra++
		return Infra, true, now.Add(backoff.Delay(st.infra - 1)), err
	}
	e.Attempts, e.Failures = t.Attempts, t.Failures
	if !park && t.Failures >= e.Policy.MaxAttempts {
		// Earlier runs saw the other failures.
		if _, err := host.NoteReleaseFailure(ctx, tp, e, res.Err, 0, true, reason); err != nil {
			reapIfLocked(host, err)
			st.infra++
			return Infra, true, now.Add(backoff.Delay(st.infra - 1)), err
		}
		park = true
	}
	if park {
		obs.Settled(tp, e, SettledParked, reason)
		return HeadParked, false, time.Time{}, res.Err
	}
	delay := e.Policy.Backoff.Delay(t.Failures - 1)
	obs.Retry(tp, e, "error", res.Err, delay)
	return Failed, true, now.Add(delay), res.Err
}

// settled marks e settled and reports it.
func (w *Worker) settled(e *Event, out *Outcome, how, reason string) {
	out.Settled = true
	w.cfg.Observer.Settled(w.tp, e, how, reason)
}

// retryAt lets e run again at t (only its key waits meanwhile).
func (w *Worker) retryAt(e *Event, out *Outcome, reason string, err error, t time.Time) {
	out.RetryAt = t
	if e.failingSince.IsZero() {
		e.failingSince = time.Now()
	}
	if err != nil {
		e.lastFailure = reason + ": " + err.Error()
	} else {
		e.lastFailure = reason
	}
	w.cfg.Observer.Retry(w.tp, e, reason, err, time.Until(t))
}

// infraRetry lets e run again after the infrastructure backoff: the
// framework's own calls failed, which is not the event's fault. A
// canceled context (stop, loss) is no failure.
func (w *Worker) infraRetry(ctx context.Context, e *Event, out *Outcome, err error) {
	if ctx.Err() != nil {
		return
	}
	e.infra++
	reason := "infra"
	if errors.Is(err, ErrLocked) {
		reason = "locked"
	}
	reapIfLocked(w.cfg.Host, err)
	w.retryAt(e, out, reason, err, time.Now().Add(w.cfg.Backoff.Delay(e.infra-1)))
}

// reapIfLocked asks the host to end the sessions of dead replicas when err
// is a write that met another transaction's lock (ErrLocked). Every write
// of the worker and of a release that fails goes through it, whichever
// call made it (a claim, a hold, a park, a failure noted): a replica that
// died in the middle of any of them leaves its locks until its sessions
// are ended or its transactions outlive the server's lifetime (60 s by
// default).
func reapIfLocked(host Host, err error) {
	if errors.Is(err, ErrLocked) {
		host.Reap()
	}
}

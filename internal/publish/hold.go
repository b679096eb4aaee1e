package publish

import (
	"context"
	"slices"
	"sync/atomic"
	"time"
)

// Holding keys (WorkerConfig.Hold).
//
// An event Kafka refused on its own is marked failed; under the hold policy
// it also holds its partition key: the later events of that key stay in the
// outbox, unpublished and not failed, until an operator retries the failed
// event (it becomes pending again) or discards it (it is deleted). Other
// keys of the partition go on. Then the key is released and its events are
// published in their order, the retried event first.
//
// State. Each worker keeps the held keys of its partition in memory: a key
// is held exactly when the partition has a failed event with that key.
// Every failed mark is the owner's own (only the worker that owns a
// partition produces and marks its events), so the worker adds a key to its
// set when it marks an event failed, and reads the whole set from the store
// (Store.FailedKeys, an indexed query over the failed events, of which
// there are few) in four cases only: before its first batch (a new owner
// learns what its predecessors held), at each safety rescan, and every
// HoldRecheck while it holds a key (an operator's retry or discard is an
// update or a delete in MongoDB that the worker does not otherwise see).
// Publishing an event therefore costs no extra query: the check is a map
// lookup. A worker that holds nothing re-reads once per Rescan.
//
// Why a periodic re-read and not the change stream: the stream carries
// inserts only, filtered on the server to the owned partitions. Following
// updates as well would deliver every "published" mark of every replica to
// every replica, and a delete event carries no topic or partition to
// filter on. A held key is rare and waits for a human, so a re-read every
// few seconds, only while a key is held, costs far less.
//
// Why no event is lost or reordered:
//
//   - Held events are never marked: they stay pending in the outbox, so a
//     crash, a rebalance or a restart leaves them where the next owner's
//     scan finds them; the next owner reads the failed keys before its
//     first batch and holds them too.
//   - The worker never produces an event of a held key: the scan leaves the
//     held keys out on the server (Store.Pending's exclude), events the
//     change stream delivers are dropped from the batch (they stay pending),
//     and, inside the batch that refused an event, the records of its key
//     after it are never sent: they belong to later waves (see Worker),
//     which leave out the keys held meanwhile.
//   - A keyless event promises no order: refused, it holds nothing (the
//     empty key is never held), so the other keyless events go on.
//   - Release goes through a scan: when a re-read shows that a held key has
//     no failed event any more, the worker resets (drops its stream buffer
//     and scans). The scan reads the partition's pending events in
//     publishing order, so the retried event (its order is its original
//     one) comes before the events that waited behind it, and a discarded
//     event is simply absent. If the retried event is refused again, the
//     key is held again before any later event of it is sent, because the
//     batch is walked in order.
//   - A stale read can only delay: a retry the worker has not seen yet keeps
//     the key held a little longer (the retried event is excluded from the
//     scan with its key).
//
// The one case that may still reorder is outside this mechanism: a failed
// mark written by a former owner after this worker read the failed keys (a
// zombie past its lease). The re-read at each rescan bounds how long it
// goes unnoticed.
type holds struct {
	keys   map[string]struct{} // nil until read from the store
	readAt time.Time
	n      atomic.Int64 // len(keys), read by HeldKeys
}

// HeldKeys returns how many partition keys the worker holds.
func (w *Worker) HeldKeys() int64 { return w.holds.n.Load() }

func (w *Worker) isHeld(key string) bool {
	_, ok := w.holds.keys[key]
	return ok
}

// hold holds key (an event of it was marked failed), under the hold policy.
// A keyless event promises no order and holds nothing.
func (w *Worker) hold(key string) {
	if !w.cfg.Hold || key == "" {
		return
	}
	if w.holds.keys == nil {
		w.holds.keys = map[string]struct{}{}
	}
	w.holds.keys[key] = struct{}{}
	w.holds.n.Store(int64(len(w.holds.keys)))
}

// heldKeys returns the held keys, sorted (for the scan's exclusion).
func (w *Worker) heldKeys() []string {
	if len(w.holds.keys) == 0 {
		return nil
	}
	out := make([]string, 0, len(w.holds.keys))
	for k := range w.holds.keys {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// withoutHeld returns items without the events of held keys; they stay
// pending in the store.
func (w *Worker) withoutHeld(items []Item) []Item {
	if len(w.holds.keys) == 0 {
		return items
	}
	out := make([]Item, 0, len(items))
	for _, it := range items {
		if !w.isHeld(string(it.Record.Key)) {
			out = append(out, it)
		}
	}
	return out
}

// holdInterval is how long a read of the failed keys stays fresh.
func (w *Worker) holdInterval() time.Duration {
	if len(w.holds.keys) > 0 && w.cfg.HoldRecheck > 0 {
		return min(w.cfg.HoldRecheck, w.cfg.Rescan)
	}
	return w.cfg.Rescan
}

// holdsDue reports whether the failed keys must be read again.
func (w *Worker) holdsDue() bool {
	return w.cfg.Hold && (w.holds.keys == nil || time.Since(w.holds.readAt) >= w.holdInterval())
}

// holdTimer returns a channel that fires when the held keys are due to be
// read again, or nil when nothing is held; stop releases it.
func (w *Worker) holdTimer() (c <-chan time.Time, stop func()) {
	if !w.cfg.Hold || len(w.holds.keys) == 0 {
		return nil, func() {}
	}
	t := time.NewTimer(max(time.Until(w.holds.readAt.Add(w.holdInterval())), 0))
	return t.C, func() { t.Stop() }
}

// refreshHolds reads the failed keys of the partition. Keys that have no
// failed event any more (retried or discarded) are released: the worker
// resets, so that a scan publishes their events in order.
func (w *Worker) refreshHolds() error {
	ctx, cancel := context.WithTimeout(w.ctx, w.cfg.MarkTimeout)
	keys, err := w.cfg.Store.FailedKeys(ctx, w.tp)
	cancel()
	if err != nil {
		return err
	}
	next := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if k != "" { // a keyless failed event holds nothing
			next[k] = struct{}{}
		}
	}
	released := 0
	for k := range w.holds.keys {
		if _, ok := next[k]; !ok {
			released++
		}
	}
	w.holds.keys = next
	w.holds.readAt = time.Now()
	w.holds.n.Store(int64(len(next)))
	if released > 0 {
		w.cfg.Logger.Info("outbox publisher: keys released (their failed events were retried or discarded); publishing their held events",
			"partition", w.tp.String(), "released", released, "still_held", len(next))
		w.reset(0)
	}
	return nil
}

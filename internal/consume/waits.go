package consume

import (
	"cmp"
	"slices"
	"time"
)

// Waits: what a partition waits on, for status, logs and metrics.
//
// Nothing the consumer does blocks for long: a retry is a lane asleep, a
// unit is one transaction. But an event may wait for a long time (its
// handler keeps failing, MongoDB is down, a dead replica's transaction
// holds its inbox entry, a handler runs long), and such a wait must be
// seen: Worker.Waits lists the waits older than Config.WaitVisible, and the
// worker logs each once when it passes that age, then again at most every
// waitRelog while it lasts.

// waitRelog is how often a wait that lasts is logged again.
const waitRelog = 30 * time.Second

// Wait is one thing a partition waits on.
type Wait struct {
	Partition TopicPartition
	// Key is the partition key of the event that waits.
	Key string
	// Offset is the event's offset; -1 for a release of held events.
	Offset int64
	// What the event waits on: "retry" (its handler failed), "snooze",
	// "conflict", "infra" (MongoDB failing), "locked" (a document held
	// by another session's open transaction), "running" (a transaction
	// that runs long), "release" (a release of held events that fails)
	// or "fetch" (the partition has records past Offset that its Kafka
	// client does not fetch; Key is empty).
	What string
	// Since is when the wait began.
	Since time.Time
	// Detail is the last error, when there is one.
	Detail string
	// Attempts counts the attempts stored for the event.
	Attempts int
	// Next is when the event runs again; zero when running.
	Next time.Time
}

// Waits returns the partition's waits older than Config.WaitVisible,
// oldest first. It asks the worker loop, and returns nil once the worker
// stopped.
func (w *Worker) Waits() []Wait {
	ch := make(chan []Wait, 1)
	select {
	case w.reqs <- ch:
		return <-ch
	case <-w.done:
		return nil
	}
}

// waits lists the waits older than Config.WaitVisible. In the loop.
func (w *Worker) waits(s *sched, running map[*Unit]time.Time, now time.Time) []Wait {
	var out []Wait
	visible := func(since time.Time) bool { return !since.IsZero() && now.Sub(since) >= w.cfg.WaitVisible }
	for l := range s.asleep {
		e := l.head()
		if visible(e.failingSince) {
			out = append(out, Wait{Partition: w.tp, Key: e.Key, Offset: e.Offset, What: waitWhat(e.lastFailure),
				Since: e.failingSince, Detail: e.lastFailure, Attempts: e.Attempts, Next: e.readyAt})
		}
	}
	for u, since := range running {
		if !visible(since) {
			continue
		}
		if u.IsRelease {
			out = append(out, Wait{Partition: w.tp, Key: u.Release, Offset: -1, What: "running", Since: since})
			continue
		}
		e := u.Events[0] // its key and offset: fixed once decoded
		out = append(out, Wait{Partition: w.tp, Key: e.Key, Offset: e.Offset, What: "running", Since: since, Attempts: u.attempts})
	}
	w.relMu.Lock()
	for key, st := range w.relWait {
		if visible(st.since) {
			out = append(out, Wait{Partition: w.tp, Key: key, Offset: -1, What: "release", Since: st.since, Detail: st.last})
		}
	}
	w.relMu.Unlock()
	w.fetchMu.Lock()
	if fw := w.fetchWait; fw != nil && visible(fw.Since) {
		out = append(out, *fw)
	}
	w.fetchMu.Unlock()
	slices.SortFunc(out, func(a, b Wait) int { return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Offset, b.Offset)) })
	return out
}

// waitWhat is the kind of a wait from the reason of its last failure
// ("reason: error").
func waitWhat(last string) string {
	for _, k := range []string{"snooze", "conflict", "infra", "locked"} {
		if len(last) >= len(k) && last[:len(k)] == k {
			return k
		}
	}
	return "retry"
}

// logWaits logs the visible waits: each once, then at most every
// waitRelog while it lasts. In the loop.
func (w *Worker) logWaits(s *sched, running map[*Unit]time.Time, logged map[string]time.Time) {
	now := time.Now()
	seen := map[string]bool{}
	for _, wt := range w.waits(s, running, now) {
		id := wt.What + "\x00" + wt.Key + "\x00" + time.Duration(wt.Offset).String()
		seen[id] = true
		if at, ok := logged[id]; ok && now.Sub(at) < waitRelog {
			continue
		}
		logged[id] = now
		w.cfg.Log.Warn("partition waiting", "partition", w.tp.String(), "waits_on", wt.What, "key", wt.Key,
			"offset", wt.Offset, "for", now.Sub(wt.Since).Round(time.Second).String(), "attempts", wt.Attempts,
			"detail", wt.Detail)
	}
	for id := range logged {
		if !seen[id] {
			delete(logged, id)
		}
	}
}

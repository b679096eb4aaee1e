package consume

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slowSequences makes the reads of the held keys wait after their read
// (a MongoDB slow to answer) until the test lets them go: pass lets the
// waiting read go (the later ones wait in turn). read is told of each
// read as it is made. All go at the end of the test.
func slowSequences(t *testing.T, h *harness) (read <-chan struct{}, pass func()) {
	ch := make(chan struct{}, 1)
	h.f.mu.Lock()
	h.f.seqGate, h.f.seqRead = make(chan struct{}), ch
	h.f.mu.Unlock()
	pass = func() {
		h.f.mu.Lock()
		defer h.f.mu.Unlock()
		close(h.f.seqGate)
		h.f.seqGate = make(chan struct{})
	}
	t.Cleanup(func() {
		h.f.mu.Lock()
		defer h.f.mu.Unlock()
		close(h.f.seqGate)
		h.f.seqGate = nil
	})
	return ch, pass
}

// A read of the held keys that began before a unit parked an event must
// not make the worker forget that the event's key is held: the key's next
// event would be handled before the parked one, breaking the key's order.
// (The worker re-reads its held keys every Recheck while it has some, so
// a park racing with a read happens in any busy partition.)
func TestWorkerStaleHeldKeysReadKeepsALaterHold(t *testing.T) {
	h := newHarness(t, 4, func(c *Config) { c.Recheck = time.Millisecond })
	// x parks: the worker now re-reads its held keys every Recheck.
	h.enqueue(ev{"x", "park"})
	h.waitQuiet()

	read, pass := slowSequences(t, h)
	<-read // a read has seen the sequences: x only
	parked := h.enqueue(ev{"a", "park"})[0]
	waitFor(t, "key a held", func() bool { return h.f.get(parked).parked && h.w.Stats().HeldKeys == 2 })
	pass()
	<-read // the next read (which waits): the slow one was applied before it began

	later := h.enqueue(ev{"a", "ok"})[0]
	waitFor(t, "a's second event settled", func() bool {
		st := h.w.Stats()
		return st.Unsettled == 0 && st.InFlight == 0 && st.LowestUnsettled == h.next
	})
	pass()
	h.waitQuiet()
	require.False(t, h.handled(later), "the event behind a parked one of its key was handled")
	d := h.f.get(later)
	require.True(t, d.parked, "held")
	require.Equal(t, parked, d.heldBy)
	require.Equal(t, 2, h.w.Stats().HeldKeys)
}

// The first units after an assignment run one event each and count its
// attempt before it runs (Lookup with count): the partition's earlier owner
// may have died while running it. An event whose stored attempts are used
// up is parked without running; the others run with their attempt number
// counted; later units batch and count nothing.
func TestWorkerSuspectUnitsCountAttempts(t *testing.T) {
	h := newHarness(t, 2, nil)
	ids := []string{h.id(0), h.id(1)}
	h.f.seedAttempts(h.tp, ids[0], "a", 0, 1, 0)                      // one attempt by the earlier owner
	h.f.seedAttempts(h.tp, ids[1], "b", 1, testPolicy.MaxAttempts, 0) // all of them, none with a result
	all := h.enqueue(ev{"a", "ok"}, ev{"b", "ok"}, ev{"c", "ok"}, ev{"d", "ok"}, ev{"e", "ok"}, ev{"f", "ok"})
	h.waitQuiet()

	var counted []string
	for _, c := range h.f.lookupCalls() {
		if c.Count {
			require.Len(t, c.IDs, 1, "a suspect unit runs one event")
			counted = append(counted, c.IDs[0])
		}
	}
	require.ElementsMatch(t, ids, counted, "the first two units (KeyConcurrency 2) count, the later ones do not")
	require.Equal(t, []int{2}, h.f.attemptsSeen(ids[0]), "run as attempt 2")
	require.Empty(t, h.f.attemptsSeen(ids[1]), "attempts used up: not run")
	d := h.f.get(ids[1])
	require.True(t, d.parked)
	require.Equal(t, "attempts_exhausted", d.reason)
	require.Equal(t, testPolicy.MaxAttempts+1, d.attempts)
	for _, id := range all[2:] {
		require.Equal(t, []int{1}, h.f.attemptsSeen(id), id)
	}
	require.ElementsMatch(t, append([]string{ids[0]}, all[2:]...), h.f.handledIDs(), "keys of their own: any order")
}

// Runs of earlier owners that ended without a result (counted before they
// ran, then the process was killed or lost the partition) do not use up
// the handler's failures: an event counted MaxAttempts-1 times by owners
// that died, whose handler then fails once, is retried and handled, not
// parked. (The 11-minute chaos run of seed 43 parked a step event whose
// handler had failed once, transiently: the kills had counted its other
// attempts.) Earlier owners' failures still count: seeded as failures, the
// same event is parked after its failure here.
func TestWorkerUnfinishedRunsDoNotUseUpFailures(t *testing.T) {
	h := newHarness(t, 1, nil)
	id := h.id(0)
	h.f.seedAttempts(h.tp, id, "a", 0, testPolicy.MaxAttempts-1, 0) // counted, never a result
	h.enqueue(ev{"a", "fail:1"}, ev{"a", "ok"})
	h.waitQuiet()
	require.True(t, h.handled(id), "handled on its retry")
	require.Equal(t, []int{testPolicy.MaxAttempts, testPolicy.MaxAttempts + 1}, h.f.attemptsSeen(id))
	d := h.f.get(id)
	require.False(t, d.parked)
	require.Equal(t, 1, d.failures)
	require.True(t, h.handled(h.id(1)))

	h2 := newHarness(t, 1, nil)
	id = h2.id(0)
	h2.f.seedAttempts(h2.tp, id, "a", 0, testPolicy.MaxAttempts-1, testPolicy.MaxAttempts-1) // failed each time
	h2.enqueue(ev{"a", "fail:1"}, ev{"a", "ok"})
	h2.waitQuiet()
	d = h2.f.get(id)
	require.True(t, d.parked, "the earlier owners' failures and this one use them up")
	require.Equal(t, "handler_error", d.reason)
	require.Equal(t, testPolicy.MaxAttempts, d.failures)
}

// When the count of a suspect unit fails, the event still has its attempt
// counted before it runs: the count fails with a lock exactly when the
// earlier owner died in the middle of the event's transaction (its open
// transaction holds the event's inbox entry), which is the case the count
// is for. Uncounted, an event that kills the process would run for ever,
// one owner after another.
func TestWorkerSuspectCountRetriedAfterFailure(t *testing.T) {
	for _, op := range []string{"lookup_locked", "lookup"} {
		t.Run(op, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			id := h.id(0)
			h.f.seedAttempts(h.tp, id, "a", 0, testPolicy.MaxAttempts, 0) // the earlier owners died running it
			h.f.mu.Lock()
			h.f.failOps[op] = 2
			h.f.mu.Unlock()
			h.enqueue(ev{"a", "ok"}, ev{"b", "ok"})
			h.waitQuiet()
			require.Empty(t, h.f.attemptsSeen(id), "run without its attempt counted")
			d := h.f.get(id)
			require.True(t, d.parked)
			require.Equal(t, "attempts_exhausted", d.reason)
			calls := h.f.lookupCalls()
			require.GreaterOrEqual(t, len(calls), 3)
			for _, c := range calls[:3] {
				require.Equal(t, lookupCall{IDs: []string{id}, Count: true}, c, "retried alone, counting")
			}
			if op == "lookup_locked" {
				require.Equal(t, 2, h.f.reapCalls())
				require.Equal(t, []string{"locked", "locked"}, h.obs.retryReasons(id))
			}
			require.True(t, h.handled(h.id(1)))
		})
	}
}

// With more keys ready than slots, units take the ready lanes' share of
// the slots even when handlers are measured slow: the lanes past the slots
// wait either way, and together they save a transaction each. Before, a
// slow moving average made every unit one event, and since the average is
// of whole transactions (MongoDB's part included), a loaded MongoDB made
// even handlers that do nothing run one event per transaction, adding
// transactions just when they were dearest (outbox-bench -phases keyconc:
// the trivial handler at KeyConcurrency 64 ran at 0.3 of its rate at 1).
func TestWorkerUnitsShareReadyLanesOverSlots(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.w.avgRun.Store(int64(20 * time.Millisecond)) // handlers measured slow
	blocked := h.enqueue(ev{"a", "block"}, ev{"b", "block"})
	for range 2 {
		select {
		case <-h.f.blocked: // both slots taken
		case <-time.After(10 * time.Second):
			t.Fatal("the first units did not start")
		}
	}
	waiting := h.enqueue(ev{"c", "ok"}, ev{"d", "ok"}, ev{"e", "ok"}, ev{"f", "ok"}, ev{"g", "ok"}, ev{"h", "ok"})
	waitFor(t, "the records taken while both slots are busy", func() bool { return h.w.Stats().Unsettled == 8 })
	h.f.unblock(blocked[0])
	h.f.unblock(blocked[1])
	h.waitQuiet()

	h.f.mu.Lock()
	calls := slices.Clone(h.f.handleCalls)
	h.f.mu.Unlock()
	var sizes []int
	for _, c := range calls[2:] {
		sizes = append(sizes, len(c))
	}
	// Six ready keys over two slots: each unit takes the ready lanes'
	// share of the slots (three, then two, then one, in whichever order the
	// two freed slots pick them up), never one event each.
	sum := 0
	for _, n := range sizes {
		sum += n
	}
	require.Equal(t, 6, sum, "handle calls %v", calls)
	require.LessOrEqual(t, len(sizes), 3, "handle calls %v", calls)
	for _, id := range waiting {
		require.True(t, h.handled(id), id)
	}
}

// maxBatch: the batch size with one slot; with more, the larger of what
// fits in targetUnit and the ready lanes' share of the free slots, within
// the batch cap.
func TestWorkerMaxBatch(t *testing.T) {
	for _, c := range []struct {
		slots int
		avg   time.Duration
		ready int
		free  int
		want  int
	}{
		{1, 20 * time.Millisecond, 100, 1, 8}, // one slot: batches as configured
		{4, 0, 2, 4, 1},                       // nothing measured, few keys: one each
		{4, 0, 13, 4, 4},                      // nothing measured: the share of 13 keys over 4 slots
		{4, time.Millisecond, 0, 4, 5},        // fast handlers: 5 ms worth
		{4, 20 * time.Millisecond, 4, 4, 1},   // slow handlers, keys fit in the slots: one each
		{4, 20 * time.Millisecond, 9, 4, 3},   // slow handlers, more keys than slots: the share
		{4, 20 * time.Millisecond, 100, 4, 8}, // never past the batch cap
		{4, 10 * time.Microsecond, 0, 4, 8},
		// Slots busy, one frees: the keys that became ready meanwhile share
		// it rather than run one per transaction (before: the share of all
		// four slots, one each).
		{4, 20 * time.Millisecond, 3, 1, 3},
		{4, 20 * time.Millisecond, 3, 2, 2},
		{4, 20 * time.Millisecond, 3, 0, 3}, // no free slot: as if one
	} {
		cfg := &Config{Slots: c.slots, BatchSize: 8}
		w := NewWorker(TopicPartition{"t", 0}, cfg, context.Background())
		w.avgRun.Store(int64(c.avg))
		require.Equal(t, c.want, w.maxBatch(c.ready, c.free), "%+v", c)
	}
}

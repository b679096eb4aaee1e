package consume

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/internal/retry"
)

// setPolicy sets the retry policy of the events decoded from now on.
func (h *harness) setPolicy(p Policy) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.policy = p
}

// pokeLoop makes the worker loop serve n requests. Each is one turn of
// its select: a channel that is ready meanwhile (a Stop's or a Lose's) is
// taken in one of them with probability 1-2^-n.
func (h *harness) pokeLoop(n int) {
	for range n {
		h.w.Waits()
	}
}

// slotCounts are the KeyConcurrency settings the behaviour tests run at.
var slotCounts = []int{1, 4, 64}

// A failing event holds only its key, at every KeyConcurrency (1
// included): the other keys are handled while it waits for its retries,
// the key's later events wait behind it, and the committed offset stays
// at it until it is handled.
func TestWorkerRetryHoldsOnlyItsKey(t *testing.T) {
	for _, slots := range slotCounts {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			h := newHarness(t, slots, nil)
			h.setPolicy(Policy{MaxAttempts: 1000, Backoff: retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}})
			ids := h.enqueue(ev{"b", "ok"}, ev{"c", "ok"}, ev{"a", "fail:-1"}, ev{"b", "ok"}, ev{"a", "ok"}, ev{"c", "ok"}, ev{"", "ok"}, ev{"d", "ok"})
			failing, behind := ids[2], ids[4]
			others := slices.Delete(slices.Clone(ids), 2, 3)
			others = slices.DeleteFunc(others, func(id string) bool { return id == behind })
			waitFor(t, "the other keys handled and the offset committed up to the failing event", func() bool {
				return len(h.f.handledIDs()) == len(others) && h.f.lastCommit(h.tp) == 2 && h.w.Stats().Committed == 2
			})
			waitFor(t, "more failures", func() bool { return h.f.get(failing).attempts >= 3 })
			require.ElementsMatch(t, others, h.f.handledIDs())
			require.False(t, h.handled(behind))
			st := h.w.Stats()
			require.EqualValues(t, 2, st.LowestUnsettled)
			require.EqualValues(t, 2, st.Committed)
			require.Equal(t, 2, st.Unsettled)

			h.f.setScript(failing, "ok")
			h.waitQuiet()
			log := h.f.handledIDs()
			require.Less(t, slices.Index(log, failing), slices.Index(log, behind), "key a in order")
		})
	}
}

// The committed offset is the lowest unsettled one: while a commit is in
// flight the events settled meanwhile are committed by the next commit,
// one for all of them; a failed commit is retried.
func TestWorkerCommitsCoalesceAndRetry(t *testing.T) {
	h := newHarness(t, 4, nil)
	gate := make(chan struct{})
	h.f.mu.Lock()
	h.f.commitGate = gate
	h.f.failCommits = 2
	h.f.mu.Unlock()
	h.enqueue(ev{"a", "ok"})
	waitFor(t, "the first event settled", func() bool { return h.handled(h.id(0)) })
	for i := range 9 {
		h.enqueue(ev{fmt.Sprint("k", i), "ok"})
	}
	waitFor(t, "every event settled", func() bool {
		st := h.w.Stats()
		return st.Unsettled == 0 && st.LowestUnsettled == h.next
	})
	h.f.mu.Lock()
	h.f.commitGate = nil
	h.f.mu.Unlock()
	close(gate)
	h.waitQuiet()
	// The commit of 1 failed twice; it was retried with the offset it
	// could commit by then.
	require.Equal(t, []int64{10}, h.f.committed(h.tp))
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	require.Len(t, h.obs.errs, 2)
	require.ErrorIs(t, h.obs.errs[0], errFakeCommit)
}

// A parked event holds its key: the key's later events are held (added to
// its sequence in order) while other keys go on, and held events count as
// settled for the commit. Once the parked head is re-driven, the worker
// finds the key releasable and releases the held events in order; the
// key is free again afterwards.
func TestWorkerParkHoldsKeyThenReleasesInOrder(t *testing.T) {
	for _, slots := range slotCounts {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			h := newHarness(t, slots, nil)
			ids := h.enqueue(ev{"a", "park"}, ev{"b", "ok"}, ev{"a", "ok"}, ev{"c", "ok"}, ev{"a", "fail:1"}, ev{"b", "ok"})
			h.waitQuiet()
			head := h.f.get(ids[0])
			require.True(t, head.parked)
			require.Equal(t, "handler_parked", head.reason)
			require.ElementsMatch(t, []string{ids[1], ids[3], ids[5]}, h.f.handledIDs())
			h.f.mu.Lock()
			require.Equal(t, []string{ids[2], ids[4]}, h.f.holds, "held in order")
			h.f.mu.Unlock()
			for _, id := range []string{ids[2], ids[4]} {
				require.Equal(t, ids[0], h.f.get(id).heldBy)
				how, _ := h.obs.settledOf(id)
				require.Equal(t, SettledHeld, how)
				require.Empty(t, h.f.attemptsSeen(id), "never run while held")
			}
			require.Equal(t, 1, h.w.Stats().HeldKeys)

			h.f.redrive(ids[0])
			waitFor(t, "the held events released", func() bool { return h.handled(ids[4]) && h.w.Stats().HeldKeys == 0 })
			log := h.f.orderLog()
			require.Equal(t, ids[2], log[len(log)-2].ID)
			require.Equal(t, ids[4], log[len(log)-1].ID)
			require.True(t, log[len(log)-2].Released && log[len(log)-1].Released)
			require.Equal(t, []int{1, 2}, h.f.attemptsSeen(ids[4]), "its failure was retried")

			// Free again: the next event of a is handled, not held.
			next := h.enqueue(ev{"a", "ok"})[0]
			h.waitQuiet()
			require.True(t, h.handled(next))
			h.f.mu.Lock()
			require.Len(t, h.f.holds, 2)
			h.f.mu.Unlock()
		})
	}
}

// A held event that fails when released is retried with its handler's
// backoff up to MaxAttempts, then parked for good as its key's new head;
// the events behind it stay held, and nothing releases the key again until
// an operator acts.
func TestWorkerReleasedEventFailsThenHeadsItsKey(t *testing.T) {
	h := newHarness(t, 4, nil)
	ids := h.enqueue(ev{"a", "park"}, ev{"a", "fail:-1"}, ev{"a", "ok"}, ev{"b", "ok"})
	h.waitQuiet()
	h.f.redrive(ids[0])
	waitFor(t, "the released event parked for good", func() bool {
		d := h.f.get(ids[1])
		how, _ := h.obs.settledOf(ids[1]) // reported after the host stored it
		return d.parked && d.heldBy == "" && how == SettledParked
	})
	d := h.f.get(ids[1])
	require.Equal(t, testPolicy.MaxAttempts, d.attempts)
	require.Equal(t, "handler_error", d.reason)
	require.Equal(t, []int{1, 2, 3}, h.f.attemptsSeen(ids[1]))
	require.Equal(t, []string{"error", "error"}, h.obs.retryReasons(ids[1]))
	how, reason := h.obs.settledOf(ids[1])
	require.Equal(t, SettledParked, how)
	require.Equal(t, "handler_error", reason)
	require.True(t, h.f.get(ids[2]).parked, "still held")
	require.False(t, h.handled(ids[2]))

	// The worker keeps re-reading its held keys; none is releasable.
	h.f.mu.Lock()
	calls := h.f.seqCalls
	h.f.mu.Unlock()
	waitFor(t, "two more reads of the held keys", func() bool {
		h.f.mu.Lock()
		defer h.f.mu.Unlock()
		return h.f.seqCalls >= calls+2
	})
	require.Equal(t, []int{1, 2, 3}, h.f.attemptsSeen(ids[1]), "not released again")
	require.Equal(t, 1, h.w.Stats().HeldKeys)
}

// An event without a handler is parked for no_handler, holding its key;
// once the handler is deployed the worker releases the key: the event
// and the ones held behind it are handled in order. With SkipUnknown it
// is skipped instead, and holds nothing. A malformed record is parked,
// holding its key.
func TestWorkerNoHandler(t *testing.T) {
	for _, script := range []string{"nohandler", "malformed"} {
		t.Run(script, func(t *testing.T) {
			h := newHarness(t, 4, nil)
			ids := h.enqueue(ev{"a", script}, ev{"a", "ok"}, ev{"b", "ok"})
			h.waitQuiet()
			d := h.f.get(ids[0])
			require.True(t, d.parked)
			require.Equal(t, map[string]string{"nohandler": "no_handler", "malformed": "malformed"}[script], d.reason)
			require.Equal(t, ids[0], h.f.get(ids[1]).heldBy)
			require.Equal(t, []string{ids[2]}, h.f.handledIDs())
			if script == "nohandler" {
				h.f.deploy()
				waitFor(t, "the key released", func() bool { return h.handled(ids[1]) })
				require.Equal(t, []string{ids[2], ids[0], ids[1]}, h.f.handledIDs())
			}
		})
	}
	t.Run("skipped", func(t *testing.T) {
		h := newHarness(t, 4, func(c *Config) { c.SkipUnknown = true })
		ids := h.enqueue(ev{"a", "nohandler"}, ev{"a", "ok"})
		h.waitQuiet()
		require.Equal(t, []string{ids[1]}, h.f.handledIDs())
		how, reason := h.obs.settledOf(ids[0])
		require.Equal(t, SettledSkipped, how)
		require.Equal(t, "no_handler", reason)
		require.False(t, h.f.get(ids[0]).parked)
	})
}

// Stop lets a running unit finish (its handler is not canceled) and
// commits what it settled; Lose lets it finish too but commits nothing.
func TestWorkerStopAndLose(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(map[bool]string{false: "stop", true: "lose"}[lose], func(t *testing.T) {
			h := newHarness(t, 4, nil)
			ids := h.enqueue(ev{"a", "block"}, ev{"b", "ok"})
			require.Equal(t, ids[0], <-h.f.blocked)
			// Settled in the worker's loop, not only committed in the
			// store: a result still on its way would let a's result
			// arrive first, and the worker commit offset 1 before 2.
			waitFor(t, "b settled", func() bool { return h.handled(ids[1]) && h.w.Stats().Unsettled == 1 })
			stopped := make(chan struct{})
			go func() {
				if lose {
					h.w.Lose()
				} else {
					h.w.Stop()
				}
				close(stopped)
			}()
			waitFor(t, "the worker closed", func() bool {
				h.w.mu.Lock()
				defer h.w.mu.Unlock()
				return h.w.closed
			})
			h.pokeLoop(50)
			select {
			case <-stopped:
				t.Fatal("returned while a unit runs")
			default:
			}
			h.f.unblock(ids[0])
			<-stopped
			require.True(t, h.handled(ids[0]), "the running unit finished")
			h.f.mu.Lock()
			require.Empty(t, h.f.canceled)
			h.f.mu.Unlock()
			if lose {
				require.Empty(t, h.f.committed(h.tp), "a lost partition commits nothing")
			} else {
				require.Equal(t, []int64{2}, h.f.committed(h.tp))
			}
			require.Nil(t, h.w.Waits(), "stopped")
		})
	}
}

// A unit that outlives Config.DrainTimeout after a Stop or Lose is
// canceled; its event stays unsettled, uncommitted.
func TestWorkerDrainTimeoutCancelsUnits(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(map[bool]string{false: "stop", true: "lose"}[lose], func(t *testing.T) {
			h := newHarness(t, 4, func(c *Config) { c.DrainTimeout = 20 * time.Millisecond })
			ids := h.enqueue(ev{"a", "ok"}, ev{"b", "block"}, ev{"c", "ok"})
			require.Equal(t, ids[1], <-h.f.blocked)
			waitFor(t, "the commit up to the blocked event", func() bool { return h.f.lastCommit(h.tp) == 1 })
			if lose {
				h.w.Lose()
			} else {
				h.w.Stop()
			}
			h.f.mu.Lock()
			require.Equal(t, []string{ids[1]}, h.f.canceled)
			h.f.mu.Unlock()
			require.False(t, h.handled(ids[1]))
			require.Equal(t, []int64{1}, h.f.committed(h.tp), "nothing past the canceled event")
			require.Empty(t, h.obs.retryReasons(ids[1]), "a cancellation is no failure")
			require.Equal(t, 1, h.f.get(ids[1]).attempts, "the count before it ran (one of the first units) only")
		})
	}
}

// A redelivered event met in a batch (the transaction's claim finds it
// handled: Duplicate) is skipped; the rest of the batch runs again at once
// without a handler having run twice, and the next units read the inbox
// first, so a later duplicate is skipped without a rolled-back
// transaction.
func TestWorkerDuplicateSkippedWithoutRollingBackOthers(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.f.seedHandled(h.tp, h.id(2), "c", 2)
	h.f.seedHandled(h.tp, h.id(5), "f", 5)
	ids := h.enqueue(ev{"a", "ok"}, ev{"b", "ok"}, ev{"c", "ok"}, ev{"d", "ok"}, ev{"e", "ok"}, ev{"f", "ok"}, ev{"g", "ok"})
	h.waitQuiet()
	h.f.mu.Lock()
	calls := slices.Clone(h.f.handleCalls)
	noted := h.f.noteFailures
	h.f.mu.Unlock()
	// The suspect unit of the assignment, the batch that met the
	// duplicate, and the batch without it: the later duplicate was found
	// by the look-up before the transaction.
	require.Equal(t, [][]string{{ids[0]}, ids[1:], {ids[1], ids[3], ids[4], ids[6]}}, calls)
	require.Equal(t, []string{ids[0], ids[1], ids[3], ids[4], ids[6]}, h.f.handledIDs())
	for _, i := range []int{1, 3, 4, 6} {
		require.Equal(t, []int{1}, h.f.attemptsSeen(ids[i]), "%s ran once", ids[i])
	}
	for _, i := range []int{2, 5} {
		require.Empty(t, h.f.attemptsSeen(ids[i]))
		how, reason := h.obs.settledOf(ids[i])
		require.Equal(t, SettledSkipped, how)
		require.Equal(t, "duplicate", reason)
	}
	require.Zero(t, noted, "no attempt counted")
	var plain int
	for _, c := range h.f.lookupCalls() {
		if !c.Count {
			plain++
		}
	}
	require.Positive(t, plain, "look-ups turned on")
}

// Framework failures and free retries: a lock asks the host to reap dead
// sessions and retries without counting an attempt; a MongoDB failure
// retries without counting; snoozes within MaxSnoozes and write conflicts
// are free, the snooze past them counts; a handler that keeps failing
// runs MaxAttempts times and is parked; one that asks to park is parked
// at once.
func TestWorkerRetriesAndTheirCounts(t *testing.T) {
	for _, tc := range []struct {
		script   string
		reasons  []string
		attempts []int // the handler's attempt numbers
		stored   int   // attempts stored in the end
		parked   string
		reaps    int
	}{
		{script: "locked:3", reasons: []string{"locked", "locked", "locked"}, attempts: []int{1}, reaps: 3},
		{script: "infra:2", reasons: []string{"infra", "infra"}, attempts: []int{1}},
		{script: "snooze:2", reasons: []string{"snooze", "snooze"}, attempts: []int{1, 1, 1}},
		{script: "snooze:3", reasons: []string{"snooze", "snooze", "error"}, attempts: []int{1, 1, 1, 2}, stored: 1},
		{script: "conflict:3", reasons: []string{"conflict", "conflict", "conflict"}, attempts: []int{1, 1, 1, 1}},
		{script: "fail:2", reasons: []string{"error", "error"}, attempts: []int{1, 2, 3}, stored: 2},
		{script: "fail:-1", reasons: []string{"error", "error"}, attempts: []int{1, 2, 3}, stored: 3, parked: "handler_error"},
		{script: "park", attempts: []int{1}, stored: 1, parked: "handler_parked"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			h.enqueue(ev{"z", "ok"}) // the suspect unit of the assignment
			h.waitQuiet()
			id := h.enqueue(ev{"a", tc.script})[0]
			h.waitQuiet()
			require.Equal(t, tc.reasons, h.obs.retryReasons(id))
			require.Equal(t, tc.attempts, h.f.attemptsSeen(id))
			d := h.f.get(id)
			require.Equal(t, tc.stored, d.attempts)
			require.Equal(t, tc.parked != "", d.parked)
			require.Equal(t, tc.parked == "", d.handled)
			require.Equal(t, tc.parked, d.reason)
			require.Equal(t, tc.reaps, h.f.reapCalls())
		})
	}
}

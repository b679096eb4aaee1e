package consume

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/internal/retry"
)

// seedParked stores an event parked by an earlier owner (held behind
// heldBy when set).
func (f *fakeHost) seedParked(tp TopicPartition, id, key string, offset int64, script, heldBy string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := &fakeDoc{id: id, tp: tp, key: key, offset: offset, parked: true, heldBy: heldBy, reason: "handler_error"}
	if heldBy != "" {
		d.reason = ""
	}
	f.put(d)
	f.scripts[id] = parseScript(script)
}

// A worker reads its partition's held keys before its first unit: the
// events of a key an earlier owner parked are held behind it; a key whose
// head is releasable (its parked head was re-driven before the earlier
// owner released the rest) is released, in order, before the key's new
// events.
func TestWorkerStartsWithEarlierOwnersHeldKeys(t *testing.T) {
	for _, slots := range slotCounts {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			h := newHarnessWith(t, slots, nil, func(h *harness) {
				h.f.seedParked(h.tp, "old-a", "a", 0, "park", "")
				h.f.seedParked(h.tp, "old-b1", "b", 1, "ok", "old-b0")
				h.f.seedParked(h.tp, "old-b2", "b", 2, "ok", "old-b0")
				h.next = 3
			})
			ids := h.enqueue(ev{"a", "ok"}, ev{"b", "ok"}, ev{"c", "ok"})
			waitFor(t, "b released and its event handled", func() bool { return h.quiet() && h.handled(ids[1]) })
			require.Equal(t, "old-a", h.f.get(ids[0]).heldBy, "held behind the earlier owner's parked event")
			log := h.f.handledIDs()
			require.Less(t, slices.Index(log, "old-b1"), slices.Index(log, "old-b2"))
			require.Less(t, slices.Index(log, "old-b2"), slices.Index(log, ids[1]))
			require.Contains(t, log, ids[2])
		})
	}
}

// An event found handled already (a duplicate) whose key holds a sequence
// this worker did not know of (an earlier owner parked an event after
// this worker read its held keys) makes the worker hold the key: the
// key's next events are held, not handled before the parked one.
func TestWorkerDuplicateTeachesAHeldKey(t *testing.T) {
	h := newHarness(t, 1, func(c *Config) { c.Recheck = time.Hour })
	h.enqueue(ev{"z", "ok"})
	h.waitQuiet()
	// The earlier owner, still running, handled offset 1 and parked 2.
	h.f.seedHandled(h.tp, h.id(1), "a", 1)
	h.f.seedParked(h.tp, h.id(2), "a", 2, "park", "")
	ids := h.enqueue(ev{"a", "ok"}, ev{"a", "park"}, ev{"a", "ok"})
	h.waitQuiet()
	how, reason := h.obs.settledOf(ids[0])
	require.Equal(t, SettledSkipped, how)
	require.Equal(t, "duplicate", reason)
	require.False(t, h.handled(ids[2]))
	require.Equal(t, h.id(2), h.f.get(ids[2]).heldBy)
	require.Equal(t, 1, h.w.Stats().HeldKeys)
}

// A failed re-read of the held keys waits for the backoff before the next
// one, as the first read does: MongoDB down must not make a worker with
// held keys re-read them in a loop.
func TestWorkerFailedRecheckBacksOff(t *testing.T) {
	h := newHarnessWith(t, 1, func(c *Config) {
		c.Recheck = time.Millisecond
		c.Backoff = retry.Backoff{Min: time.Hour, Max: time.Hour}
	}, func(h *harness) {
		h.f.seedParked(h.tp, "old-a", "a", 0, "park", "")
		h.next = 1
	})
	waitFor(t, "the held keys read", func() bool { return h.w.Stats().HeldKeys == 1 })
	h.f.mu.Lock()
	h.f.failOps["sequences"] = 1 << 20
	calls := h.f.seqCalls
	h.f.mu.Unlock()
	seqCalls := func() int {
		h.f.mu.Lock()
		defer h.f.mu.Unlock()
		return h.f.seqCalls
	}
	waitFor(t, "a re-read of the held keys failed", func() bool { return seqCalls() >= calls+1 })
	// The loop goes round with work of its own meanwhile.
	ids := h.enqueue(ev{"b", "ok"}, ev{"c", "ok"})
	waitFor(t, "b and c handled", func() bool { return h.handled(ids[0]) && h.handled(ids[1]) })
	require.LessOrEqual(t, seqCalls(), calls+2, "re-read again before the backoff")
}

package consume

import (
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

package consume

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func evs(keys ...string) []*Event {
	out := make([]*Event, len(keys))
	for i, k := range keys {
		out[i] = &Event{Offset: int64(i), Key: k, Bytes: 10}
	}
	return out
}

func offsets(u *Unit) []int64 {
	var out []int64
	for _, e := range u.Events {
		out = append(out, e.Offset)
	}
	return out
}

func settledAll(n int) []Outcome {
	out := make([]Outcome, n)
	for i := range out {
		out[i].Settled = true
	}
	return out
}

// With one slot the scheduler batches in offset order, consecutive events
// of a key included, as the consumer did before key concurrency.
func TestSchedBatchesInOffsetOrder(t *testing.T) {
	now := time.Now()
	s := newSched(1, func(*Event) bool { return true })
	s.add(evs("a", "b", "a", "c", "b"), now)
	u := s.nextUnit(now, 32)
	require.Equal(t, []int64{0, 1, 2, 3, 4}, offsets(u))
	require.Nil(t, s.nextUnit(now, 32), "one slot")
	off, _, ok := s.committable()
	require.True(t, ok)
	require.EqualValues(t, 0, off)
	s.done(u, settledAll(5), now)
	off, _, _ = s.committable()
	require.EqualValues(t, 5, off)
}

// A batch stops at an event that may not share a transaction; that event
// runs alone, then batching resumes.
func TestSchedBatchStopsAtUnbatchable(t *testing.T) {
	now := time.Now()
	s := newSched(1, func(e *Event) bool { return e.Key != "x" })
	s.add(evs("a", "b", "x", "c"), now)
	u := s.nextUnit(now, 32)
	require.Equal(t, []int64{0, 1}, offsets(u))
	s.done(u, settledAll(2), now)
	u = s.nextUnit(now, 32)
	require.Equal(t, []int64{2}, offsets(u))
	s.done(u, settledAll(1), now)
	u = s.nextUnit(now, 32)
	require.Equal(t, []int64{3}, offsets(u))
}

// A failing event waits for its retry time and holds only its key: other
// keys go on, the key's later events wait, and the committable offset
// stays at the failing event.
func TestSchedRetryHoldsOnlyItsKey(t *testing.T) {
	now := time.Now()
	s := newSched(1, func(*Event) bool { return true })
	s.add(evs("a", "b", "a", "c"), now)
	u := s.nextUnit(now, 1)
	require.Equal(t, []int64{0}, offsets(u))
	later := now.Add(time.Second)
	s.done(u, []Outcome{{RetryAt: later, Alone: true}}, now)
	var ran []int64
	for u := s.nextUnit(now, 32); u != nil; u = s.nextUnit(now, 32) {
		ran = append(ran, offsets(u)...)
		s.done(u, settledAll(len(u.Events)), now)
	}
	require.Equal(t, []int64{1, 3}, ran, "b and c run; a's second event waits behind a's first")
	off, _, _ := s.committable()
	require.EqualValues(t, 0, off)
	require.Equal(t, later, s.wake(now))
	s.wake(later)
	u = s.nextUnit(later, 32)
	require.Equal(t, []int64{0}, offsets(u), "alone after its failure")
	s.done(u, settledAll(1), later)
	u = s.nextUnit(later, 32)
	require.Equal(t, []int64{2}, offsets(u))
	s.done(u, settledAll(1), later)
	off, _, _ = s.committable()
	require.EqualValues(t, 4, off)
}

// With several slots, units run side by side with disjoint keys; a key is
// never in two units.
func TestSchedSlotsNeverShareAKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		now := time.Now()
		slots := 1 + rng.IntN(8)
		s := newSched(slots, func(e *Event) bool { return e.Offset%7 != 3 })
		n := 50 + rng.IntN(100)
		keys := make([]string, n)
		for i := range keys {
			if rng.IntN(10) == 0 {
				keys[i] = "" // keyless: a lane of its own
			} else {
				keys[i] = string(rune('a' + rng.IntN(6)))
			}
		}
		s.add(evs(keys...), now)
		var running []*Unit
		lastRun := map[string]int64{}
		handled := 0
		for handled < n {
			for u := s.nextUnit(now, 1+rng.IntN(4)); u != nil; u = s.nextUnit(now, 1+rng.IntN(4)) {
				running = append(running, u)
			}
			if len(running) > slots {
				t.Fatalf("%d units running with %d slots", len(running), slots)
			}
			busy := map[string]*Unit{}
			for _, u := range running {
				for _, e := range u.Events {
					if e.Key == "" {
						continue
					}
					if o, ok := busy[e.Key]; ok && o != u {
						t.Fatalf("key %q in two running units", e.Key)
					}
					busy[e.Key] = u
				}
			}
			require.NotEmpty(t, running)
			i := rng.IntN(len(running))
			u := running[i]
			running = append(running[:i], running[i+1:]...)
			outs := make([]Outcome, len(u.Events))
			for j, e := range u.Events {
				if rng.IntN(5) == 0 {
					break // this one and the rest run again
				}
				outs[j].Settled = true
				handled++
				if e.Key != "" {
					if e.Offset < lastRun[e.Key] {
						t.Fatalf("per-key order: %q ran offset %d after %d", e.Key, e.Offset, lastRun[e.Key]-1)
					}
					lastRun[e.Key] = e.Offset + 1
				}
			}
			s.done(u, outs, now)
			off, _, _ := s.committable()
			// Plain checks in this inner loop: require's t.Helper walks the
			// stack on every call, which made this test take seconds.
			for _, e := range s.window {
				if e.Offset < off {
					t.Fatalf("offset %d in the window behind the committable offset %d", e.Offset, off)
				}
			}
		}
		off, _, _ := s.committable()
		require.EqualValues(t, n, off)
		require.Zero(t, s.pending)
		require.Zero(t, s.bytes)
	}
}

// Release steps and deliveries take turns; a release waits while a
// delivery of its key is ready.
func TestSchedReleaseTakesTurns(t *testing.T) {
	now := time.Now()
	s := newSched(1, func(*Event) bool { return true })
	s.requestRelease("k", now)
	s.add(evs("a", "b"), now)
	u := s.nextUnit(now, 1)
	require.True(t, u.IsRelease)
	require.Equal(t, "k", u.Release)
	s.releaseDone(u, true, time.Time{}, now)
	u = s.nextUnit(now, 1)
	require.False(t, u.IsRelease)
	s.done(u, settledAll(1), now)
	u = s.nextUnit(now, 1)
	require.True(t, u.IsRelease)
	s.releaseDone(u, false, time.Time{}, now)
	u = s.nextUnit(now, 1)
	require.Equal(t, []int64{1}, offsets(u))
	s.done(u, settledAll(1), now)
	require.Nil(t, s.nextUnit(now, 1))
	require.Empty(t, s.lanes)

	// A delivery of the released key that is ready goes first.
	s = newSched(1, func(*Event) bool { return true })
	s.add(evs("k"), now)
	s.requestRelease("k", now)
	u = s.nextUnit(now, 1)
	require.False(t, u.IsRelease, "the delivery of k first")
	s.done(u, settledAll(1), now)
	u = s.nextUnit(now, 1)
	require.True(t, u.IsRelease)
}

// Records added again (a poll that raced with a reassignment) are dropped.
func TestSchedDropsOlderRecords(t *testing.T) {
	now := time.Now()
	s := newSched(1, func(*Event) bool { return true })
	s.add(evs("a", "b"), now)
	s.add(evs("a"), now)
	require.Equal(t, 2, s.pending)
}

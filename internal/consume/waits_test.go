package consume

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/internal/retry"
)

// A wait shows in Waits once it is older than Config.WaitVisible: what
// the event waits on, since when, the last error and its attempts.
func TestWorkerWaitsShowRetryingKeys(t *testing.T) {
	slow := Policy{MaxAttempts: 1000, Backoff: retry.Backoff{Min: time.Hour, Max: time.Hour}}
	t.Run("hidden before WaitVisible", func(t *testing.T) {
		h := newHarness(t, 4, nil) // WaitVisible: an hour
		h.setPolicy(slow)
		id := h.enqueue(ev{"a", "fail:-1"})[0]
		waitFor(t, "a failure", func() bool { return h.f.get(id).attempts == 1 })
		h.pokeLoop(1)
		require.Empty(t, h.w.Waits())
	})
	t.Run("shown after", func(t *testing.T) {
		h := newHarness(t, 4, func(c *Config) { c.WaitVisible = time.Nanosecond })
		h.setPolicy(slow)
		before := time.Now()
		ids := h.enqueue(ev{"a", "fail:-1"}, ev{"b", "locked:1000"}, ev{"c", "ok"})
		var a, b Wait
		// A unit that runs at the time shows as "running"; b's runs are
		// short, its waits for the next run long.
		waitFor(t, "a's and b's waits", func() bool {
			for _, w := range h.w.Waits() {
				switch {
				case w.Key == "a" && w.What != "running":
					a = w
				case w.Key == "b" && w.What != "running":
					b = w
				}
			}
			return a.Key != "" && b.Key != ""
		})
		require.Equal(t, h.tp, a.Partition)
		require.Equal(t, "a", a.Key)
		require.EqualValues(t, 0, a.Offset)
		require.Equal(t, "retry", a.What)
		require.Contains(t, a.Detail, errFakeHandler.Error())
		require.Equal(t, 1, a.Attempts)
		require.False(t, a.Since.Before(before))
		require.True(t, a.Next.After(a.Since))
		require.Equal(t, "b", b.Key)
		require.Equal(t, "locked", b.What)
		require.Contains(t, b.Detail, ErrLocked.Error())
		waitFor(t, "c handled meanwhile", func() bool { return h.handled(ids[2]) })
	})
}

// Waits (and the loop's log of waits every second) may be read while a
// key's held events are released: go test -race checks it.
func TestWorkerWaitsWhileReleasing(t *testing.T) {
	h := newHarness(t, 4, func(c *Config) { c.WaitVisible = time.Nanosecond })
	evs := []ev{{"a", "park"}}
	for range 150 {
		evs = append(evs, ev{"a", "ok"})
	}
	ids := h.enqueue(evs...)
	h.waitQuiet()
	h.f.redrive(ids[0])
	waitFor(t, "every held event released", func() bool {
		h.w.Waits()
		h.obs.mu.Lock()
		defer h.obs.mu.Unlock()
		return len(h.obs.released) == len(ids)-1
	})
}

// Waits (and the loop's log of waits every second) may be read while units
// run and fail: a running unit's wait must not read its event, which the
// unit writes (go test -race checks it).
func TestWorkerWaitsWhileUnitsFail(t *testing.T) {
	h := newHarness(t, 4, func(c *Config) { c.WaitVisible = time.Nanosecond })
	h.setPolicy(Policy{MaxAttempts: 1 << 30, Backoff: retry.Backoff{Min: time.Microsecond, Max: time.Microsecond}})
	id := h.enqueue(ev{"a", "fail:-1"})[0]
	running := 0
	waitFor(t, "failures seen running", func() bool {
		for _, w := range h.w.Waits() {
			if w.What == "running" {
				running++
			}
		}
		return running >= 20 && h.f.get(id).attempts >= 50
	})
}

package consume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

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

// The fetch watch's wait (Set.SetFetchWait) shows in Waits; records handed
// to the partition clear it, and a wait judged on a quiet spell that
// records ended meanwhile is dropped.
func TestSetFetchWait(t *testing.T) {
	h := newHarness(t, 1, func(c *Config) { c.WaitVisible = time.Nanosecond })
	tp := TopicPartition{Topic: "fetched", Partition: 9}
	s := NewSet(h.cfg, context.Background())
	s.Assign([]TopicPartition{tp})
	t.Cleanup(s.Close)
	fetchWaits := func() []Wait {
		var out []Wait
		for _, w := range s.Waits() {
			if w.What == "fetch" {
				out = append(out, w)
			}
		}
		return out
	}

	f := s.Fetching()[tp]
	require.EqualValues(t, -1, f.Next, "nothing handed over yet")
	require.False(t, f.Paused)
	s.SetFetchWait(tp, &Wait{Partition: tp, What: "fetch", Offset: 0, Since: f.Quiet, Detail: "first"})
	require.Len(t, fetchWaits(), 1)
	s.SetFetchWait(tp, &Wait{Partition: tp, What: "fetch", Offset: 0, Since: f.Quiet.Add(-time.Second), Detail: "stale"})
	require.Equal(t, "first", fetchWaits()[0].Detail, "a wait judged on another quiet spell is dropped")

	recs := []*kgo.Record{fakeRecord(tp, 0, "a", "fetched@0", "ok"), fakeRecord(tp, 1, "b", "fetched@1", "ok")}
	s.Enqueue(tp, recs)
	require.Empty(t, fetchWaits(), "records clear the wait")
	g := s.Fetching()[tp]
	require.EqualValues(t, 2, g.Next)
	require.True(t, g.Quiet.After(f.Quiet) || g.Quiet.Equal(f.Quiet))
	s.SetFetchWait(tp, &Wait{Partition: tp, What: "fetch", Offset: 0, Since: f.Quiet})
	if !g.Quiet.Equal(f.Quiet) {
		require.Empty(t, fetchWaits(), "a wait judged before the records is dropped")
	}
	s.SetFetchWait(tp, nil)
	require.Empty(t, fetchWaits())

	// The same records handed over again are not fetching: the partition
	// stays quiet since the last new ones, and a wait judged on that stays.
	s.Enqueue(tp, recs)
	h2 := s.Fetching()[tp]
	require.EqualValues(t, 2, h2.Next)
	require.True(t, h2.Quiet.Equal(g.Quiet), "records handed again do not end a quiet spell")
	s.SetFetchWait(tp, &Wait{Partition: tp, What: "fetch", Offset: 2, Since: g.Quiet, Detail: "again"})
	s.Enqueue(tp, recs[:1])
	require.Len(t, fetchWaits(), 1, "nor clear its wait")
	s.SetFetchWait(TopicPartition{Topic: "other"}, &Wait{What: "fetch"}) // not owned: nothing happens
}

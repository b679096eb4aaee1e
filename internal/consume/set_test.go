package consume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
)

// The Set runs a worker per owned partition: a repeated assignment keeps
// the worker it has; Stats and Waits cover every owned partition; Revoke
// commits what was settled, Lose commits nothing; records of a partition
// not owned are dropped.
func TestSetOwnsWorkersPerPartition(t *testing.T) {
	h := newSetHarness(t, func(c *Config) { c.WaitVisible = time.Nanosecond })
	h.f.mu.Lock()
	h.f.policy = Policy{MaxAttempts: 1000, Backoff: retry.Backoff{Min: time.Hour, Max: time.Hour}}
	h.f.mu.Unlock()
	p0, p1, p2 := TopicPartition{"orders", 0}, TopicPartition{"orders", 1}, TopicPartition{"audit", 0}
	h.s.Assign([]TopicPartition{p1, p0})
	w0 := h.worker(p0)
	h.s.Assign([]TopicPartition{p0, p2})
	require.Same(t, w0, h.worker(p0), "a repeated assignment keeps the worker")
	require.Equal(t, []TopicPartition{p2, p0, p1}, h.s.Owned())

	rec := func(tp TopicPartition, off int64, key, script string) *kgo.Record {
		return fakeRecord(tp, off, key, tp.String()+"@"+string(rune('0'+off)), script)
	}
	h.s.Enqueue(p0, []*kgo.Record{rec(p0, 0, "a", "ok"), rec(p0, 1, "b", "ok")})
	h.s.Enqueue(p1, []*kgo.Record{rec(p1, 0, "a", "ok"), rec(p1, 1, "a", "fail:-1")})
	h.s.Enqueue(p2, []*kgo.Record{rec(p2, 0, "x", "fail:-1"), rec(p2, 1, "y", "ok")})
	h.s.Enqueue(TopicPartition{"orders", 9}, []*kgo.Record{rec(TopicPartition{"orders", 9}, 0, "a", "ok")})

	waitFor(t, "the partitions settled as far as they can", func() bool {
		st := h.s.Stats()
		return len(st) == 3 && st[p0].LowestUnsettled == 2 && st[p0].Committed == 2 &&
			st[p1].LowestUnsettled == 1 && st[p1].Committed == 1 &&
			st[p2].LowestUnsettled == 0 && st[p2].Unsettled == 1
	})
	var ws []Wait
	waitFor(t, "the waits of both failing partitions", func() bool {
		ws = h.s.Waits()
		return len(ws) == 2 && ws[0].What == "retry" && ws[1].What == "retry"
	})
	require.False(t, ws[1].Since.Before(ws[0].Since), "oldest first")
	require.ElementsMatch(t, []TopicPartition{p1, p2}, []TopicPartition{ws[0].Partition, ws[1].Partition})

	h.s.Lose([]TopicPartition{p1})
	h.s.Revoke([]TopicPartition{p2})
	require.Equal(t, []TopicPartition{p0}, h.s.Owned())
	require.Equal(t, []int64{1}, h.f.committed(p1), "nothing more committed for a lost partition")
	require.Empty(t, h.f.committed(p2), "nothing settled to commit")
	h.s.Enqueue(p1, []*kgo.Record{rec(p1, 2, "c", "ok")})
	require.False(t, h.f.get(p1.String()+"@2").handled, "not owned: dropped")
	h.s.Close()
	require.Empty(t, h.s.Owned())
	require.Empty(t, h.s.Stats())
	require.Empty(t, h.s.Waits())
}

// ReleaseKey (an operator's re-drive, inline) releases a key's held events
// in order, retrying a failing one with its handler's backoff, until one
// is parked for good; a second call finds the head parked and does
// nothing; MongoDB failing makes it give up after a few tries.
func TestReleaseKey(t *testing.T) {
	obs := newRecObserver()
	f := newFakeHost(obs, testPolicy)
	tp := TopicPartition{"orders", 0}
	backoff := retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}
	// The sequence of key a: a parked head (re-driven below), then held
	// events, one of which keeps failing.
	ids := []string{"h", "e1", "e2", "e3", "e4"}
	scripts := []string{"park", "ok", "fail:2", "fail:-1", "ok"}
	for i, id := range ids {
		e := f.Decode(fakeRecord(tp, int64(i), "a", id, scripts[i]))
		e.Offset = int64(i)
		if i == 0 {
			_, err := f.Park(context.Background(), tp, e, errFakeHandler, 1, 1, "handler_parked")
			require.NoError(t, err)
			continue
		}
		require.NoError(t, f.Hold(context.Background(), tp, e))
	}
	f.redrive("h")
	ReleaseKey(context.Background(), f, obs, backoff, tp, "a")
	require.Equal(t, []string{"h", "e1", "e2"}, f.handledIDs())
	require.Equal(t, []int{1, 2, 3}, f.attemptsSeen("e2"), "retried")
	d := f.get("e3")
	require.True(t, d.parked)
	require.Empty(t, d.heldBy, "parked for good, heading the key")
	require.Equal(t, testPolicy.MaxAttempts, d.attempts)
	require.True(t, f.get("e4").parked)
	require.NotEmpty(t, f.get("e4").heldBy, "e4 still held behind it")

	ReleaseKey(context.Background(), f, obs, backoff, tp, "a")
	require.Len(t, f.attemptsSeen("e3"), testPolicy.MaxAttempts, "a parked head is not run")

	// MongoDB failing: the release gives up after maxInlineInfra failures.
	f.redrive("e3")
	f.setScript("e4", "infra:100")
	ReleaseKey(context.Background(), f, obs, backoff, tp, "a")
	require.False(t, f.get("e4").handled)
	f.mu.Lock()
	runs := f.scripts["e4"].runs
	f.mu.Unlock()
	require.Equal(t, maxInlineInfra+1, runs)
	require.Empty(t, f.Violations())
}

// A revoke waits for the units in hand, and the group's rebalance waits for
// the revoke: what such a unit waits on shows in Waits until its worker has
// stopped. (Removed from the owned workers at once, a draining worker's
// six-second handler showed in the log's "partition waiting" lines and in
// no Status: a chaos probe of issue 31 item 2 found it.)
func TestSetWaitsShowADrainingWorker(t *testing.T) {
	h := newSetHarness(t, func(c *Config) { c.WaitVisible = time.Nanosecond })
	p0 := TopicPartition{"orders", 0}
	h.s.Assign([]TopicPartition{p0})
	h.s.Enqueue(p0, []*kgo.Record{fakeRecord(p0, 0, "a", "slow", "block")})
	select {
	case <-h.f.blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
	revoked := make(chan struct{})
	go func() {
		defer close(revoked)
		h.s.Revoke([]TopicPartition{p0})
	}()
	waitFor(t, "the partition no longer owned", func() bool { return len(h.s.Owned()) == 0 })
	waitFor(t, "the draining unit's wait", func() bool {
		for _, w := range h.s.Waits() {
			if w.Partition == p0 && w.What == "running" && w.Key == "a" {
				return true
			}
		}
		return false
	})
	h.f.unblock("slow")
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoke never returned")
	}
	require.Empty(t, h.s.Waits(), "a stopped worker waits on nothing")
}

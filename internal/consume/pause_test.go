package consume

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The pause of a partition's fetching (ported from the root package's
// consumer_pause_test.go of the consumer before internal/consume): kgo
// keeps a pause until it is resumed, whatever the assignment, so a pause
// that outlives its reason stops the partition for good. The invariants:
// the client's pause state is the worker's (every pause and resume is made
// under the worker's lock); a worker that holds less than its bound (here:
// has settled everything) leaves its partition unpaused; a stopped or
// revoked worker leaves no pause behind.

// pauseBytes is the queue bound of the pause tests: every record is as
// large, so each enqueue onto an idle worker pauses its partition, and
// each record settled resumes it.
const pauseBytes = 1 << 10

var bigValue = make([]byte, pauseBytes)

// pauseConfig is a worker configuration for the pause tests: no held keys
// (so a worker reads nothing before its first unit) and the byte bound.
func pauseConfig(c *Config) {
	c.Hold = false
	c.QueueBytes = pauseBytes
}

// bigRecord is a record of tp at offset that fills the byte bound alone.
func bigRecord(tp TopicPartition, offset int64) *kgo.Record {
	r := fakeRecord(tp, offset, "k", fmt.Sprintf("%s@%d", tp, offset), "ok")
	r.Value = append(append(r.Value, '|'), bigValue...)
	return r
}

// pausedNow reads whether the client has w's partition paused, under the
// worker's lock (pause and resume calls made under it are complete, and
// none is half made), and checks that the worker agrees.
func pausedNow(t *testing.T, w *Worker, p *fakePauser) bool {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	paused := p.isPaused(w.tp)
	if paused != w.paused {
		t.Errorf("the client's pause (%v) is not the worker's (%v)", paused, w.paused)
	}
	return paused
}

// drained waits until w has settled every record up to next, then reports
// whether its partition is paused. The loop turn that published those
// stats adjusted the pause on the same state first, so a drained worker
// must have resumed.
func drained(t *testing.T, w *Worker, p *fakePauser, next int64) bool {
	t.Helper()
	waitFor(t, "the worker to settle its records", func() bool {
		st := w.Stats()
		return st.Unsettled == 0 && st.InFlight == 0 && st.LowestUnsettled == next
	})
	return pausedNow(t, w, p)
}

// A worker that drains its records at the moment enqueue has decided to
// pause (the worker was finishing its previous unit) must not leave the
// partition paused with nothing to resume it.
func TestWorkerPauseDoesNotInterleaveWithResume(t *testing.T) {
	h := newHarness(t, 1, pauseConfig)
	var once sync.Once
	h.p.beforePause = func() {
		once.Do(func() {
			// Let the worker look at its records now, if nothing prevents
			// it: only when the pause is issued outside the worker's lock.
			if !h.w.mu.TryLock() {
				return
			}
			h.w.mu.Unlock()
			select {
			case h.w.wake <- struct{}{}:
			default:
			}
			waitFor(t, "the worker to drain in the gap", func() bool { _, r := h.p.calls(); return r > 0 })
		})
	}
	h.w.Enqueue([]*kgo.Record{bigRecord(h.tp, 0)})
	require.False(t, drained(t, h.w, h.p, 1), "partition paused with every record settled: nothing will resume it")
	pauses, resumes := h.p.calls()
	require.Equal(t, 1, pauses)
	require.Equal(t, 1, resumes)
	h.w.Stop()
	require.False(t, h.p.isPaused(h.tp), "partition paused after its worker stopped")
}

// Hammer enqueue against the draining worker: whenever it has settled
// every record the partition is not paused, and a stopped worker leaves no
// pause behind.
func TestWorkerPauseResumeHammer(t *testing.T) {
	h := newHarness(t, 4, pauseConfig)
	h.p.beforePause = runtime.Gosched // widens any gap between the decision to pause and the pause
	const iterations = 1500
	for i := range int64(iterations) {
		h.w.Enqueue([]*kgo.Record{bigRecord(h.tp, i)})
		if i%3 == 0 {
			// Let the worker go idle now and then, so that the next
			// enqueue wakes it rather than finding it in its loop.
			require.False(t, drained(t, h.w, h.p, i+1), "iteration %d: partition paused with every record settled", i)
		}
		pausedNow(t, h.w, h.p)
	}
	require.False(t, drained(t, h.w, h.p, iterations), "partition paused with every record settled")
	pauses, _ := h.p.calls()
	require.Greater(t, pauses, iterations/3, "the bound was reached")
	h.w.Stop()
	require.False(t, h.p.isPaused(h.tp), "partition paused after its worker stopped")
}

// setHarness is a Set on the fakes.
type setHarness struct {
	f   *fakeHost
	obs *recObserver
	p   *fakePauser
	s   *Set
}

func newSetHarness(t *testing.T, mod func(*Config)) *setHarness {
	obs := newRecObserver()
	f := newFakeHost(obs, testPolicy)
	p := newFakePauser()
	cfg := testConfig(f, obs, p, 1)
	if mod != nil {
		mod(cfg)
	}
	work, cancel := context.WithCancel(context.Background())
	h := &setHarness{f: f, obs: obs, p: p, s: NewSet(cfg, work)}
	t.Cleanup(func() {
		h.s.Close()
		cancel()
		require.Empty(t, f.Violations())
	})
	return h
}

func (h *setHarness) worker(tp TopicPartition) *Worker {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.workers[tp]
}

// A revoke that lands while enqueue pauses the partition must not leave a
// pause behind: the partition would stay paused once assigned again.
func TestSetRevokeDuringPauseLeavesNoPause(t *testing.T) {
	h := newSetHarness(t, pauseConfig)
	tp := TopicPartition{"orders", 2}
	h.s.Assign([]TopicPartition{tp})
	w := h.worker(tp)

	revoked := make(chan struct{})
	var once sync.Once
	h.p.beforePause = func() {
		once.Do(func() {
			if w.mu.TryLock() {
				// The pause is issued outside the worker's lock: the
				// rebalance can get in first.
				w.mu.Unlock()
				h.s.Revoke([]TopicPartition{tp})
				close(revoked)
				return
			}
			go func() {
				h.s.Revoke([]TopicPartition{tp})
				close(revoked)
			}()
		})
	}
	h.s.Enqueue(tp, []*kgo.Record{bigRecord(tp, 0)})
	<-revoked
	require.False(t, h.p.isPaused(tp), "revoked partition left paused")
	require.Empty(t, h.s.Owned())

	// Assigned again, it fetches and pauses as usual.
	h.s.Assign([]TopicPartition{tp})
	w = h.worker(tp)
	require.False(t, h.p.isPaused(tp))
	h.s.Enqueue(tp, []*kgo.Record{bigRecord(tp, 0)})
	require.False(t, drained(t, w, h.p, 1))
}

// Hammer revokes and assignments of a partition against enqueue (which may
// hold the worker of an earlier assignment): between a revoke and the next
// assignment the partition is never paused.
func TestSetRevokeEnqueueHammer(t *testing.T) {
	h := newSetHarness(t, pauseConfig)
	h.f.stream = false // each assignment is fed from where the test is, not from the commit
	tp := TopicPartition{"payments", 0}
	tps := []TopicPartition{tp}
	h.p.beforePause = runtime.Gosched // widens any gap between the decision to pause and the pause
	h.s.Assign(tps)

	const cycles = 300
	violations := 0
	// enqueued counts the enqueues; assignedAt is its value at the last
	// assignment. The enqueues keep to a few per assignment: the test
	// feeds records whether the partition is paused or not, as a poll
	// already under way may, and a worker must not drown.
	var enqueued, assignedAt atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range cycles {
			// Two enqueues since the assignment: the second began after it,
			// so it reached the live worker.
			for enqueued.Load() < assignedAt.Load()+2 {
				runtime.Gosched()
			}
			h.s.Revoke(tps)
			// A late pause of the revoked worker would land now.
			runtime.Gosched()
			if h.p.isPaused(tp) {
				violations++
			}
			h.s.Assign(tps)
			assignedAt.Store(enqueued.Load())
		}
		h.s.Revoke(tps)
	}()
	var offset int64
	for {
		select {
		case <-done:
			require.Zero(t, violations, "revoked partition left paused, in %d of %d cycles", violations, cycles)
			require.False(t, h.p.isPaused(tp), "partition left paused after the last revoke")
			pauses, _ := h.p.calls()
			require.GreaterOrEqual(t, pauses, cycles, "each assignment paused")
			return
		default:
		}
		if enqueued.Load() >= assignedAt.Load()+4 {
			runtime.Gosched()
			continue
		}
		h.s.Enqueue(tp, []*kgo.Record{bigRecord(tp, offset)})
		enqueued.Add(1)
		offset++
	}
}

// Backpressure: a worker that holds its bound (records taken and not
// passed by the committable offset, or the bytes of its unsettled
// records) keeps its partition paused until it is back under half of it,
// and resumes then.
func TestWorkerPausesOverItsBound(t *testing.T) {
	for _, bound := range []string{"records", "bytes"} {
		t.Run(bound, func(t *testing.T) {
			h := newHarness(t, 4, func(c *Config) {
				c.Hold = false
				if bound == "records" {
					c.QueueRecords = 4
				} else {
					c.QueueBytes = 4 * 64
				}
			})
			// Records: a blocked event, then five of another key, handled
			// but not passed by the committable offset. Bytes: six events
			// of one key, all unsettled behind the blocked one.
			others := map[string]string{"records": "b", "bytes": "a"}[bound]
			evs := []ev{{"a", "block"}}
			for range 5 {
				evs = append(evs, ev{others, "ok"})
			}
			recs, ids := h.records(evs...)
			for _, r := range recs {
				r.Value = append(append(r.Value, '|'), make([]byte, 64)...)
			}
			h.w.Enqueue(recs)
			require.Equal(t, ids[0], <-h.f.blocked)
			waitFor(t, "every record taken", func() bool {
				st := h.w.Stats()
				if bound == "records" {
					return st.LowestUnsettled == 0 && st.Unsettled == 1 && h.handled(ids[5])
				}
				return st.LowestUnsettled == 0 && st.Unsettled == 6
			})
			require.True(t, pausedNow(t, h.w, h.p), "over its bound")
			h.f.unblock(ids[0])
			require.False(t, drained(t, h.w, h.p, h.next))
			pauses, resumes := h.p.calls()
			require.Equal(t, 1, pauses)
			require.Equal(t, 1, resumes)
		})
	}
}

// Records handed to a stopped worker (the poll loop may hold it from before
// the revoke) are dropped: they pause nothing.
func TestWorkerEnqueueAfterStopIsDropped(t *testing.T) {
	h := newHarness(t, 1, pauseConfig)
	h.w.Stop()
	h.w.Enqueue([]*kgo.Record{bigRecord(h.tp, 0)})
	require.False(t, pausedNow(t, h.w, h.p))
	pauses, _ := h.p.calls()
	require.Zero(t, pauses)
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	require.Empty(t, h.w.inbound)
}

// The consumer closes its set while the group's rebalance callbacks still
// run. A Revoke or Lose of a partition whose worker Close is draining
// returns only once that worker stopped (the group must not hand the
// partition on while it still runs or commits); a Lose stops its commits.
func TestSetRevokeWaitsForAWorkerCloseIsDraining(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(map[bool]string{false: "revoke", true: "lose"}[lose], func(t *testing.T) {
			h := newSetHarness(t, nil)
			tp := TopicPartition{"orders", 1}
			h.s.Assign([]TopicPartition{tp})
			id := fmt.Sprintf("%s@%d", tp, 0)
			h.s.Enqueue(tp, []*kgo.Record{fakeRecord(tp, 0, "a", id, "block")})
			require.Equal(t, id, <-h.f.blocked)
			closed := make(chan struct{})
			go func() { h.s.Close(); close(closed) }()
			waitFor(t, "Close took the worker", func() bool { return len(h.s.Owned()) == 0 })
			revoked := make(chan struct{})
			go func() {
				if lose {
					h.s.Lose([]TopicPartition{tp})
				} else {
					h.s.Revoke([]TopicPartition{tp})
				}
				close(revoked)
			}()
			if lose {
				// Lose closes the worker's kill before it waits.
				waitFor(t, "the loss heard", func() bool {
					h.s.mu.Lock()
					defer h.s.mu.Unlock()
					for w := range h.s.stopping {
						select {
						case <-w.kill:
							return true
						default:
						}
					}
					return false
				})
			}
			select {
			case <-revoked:
				t.Fatal("returned while Close was still draining the partition's worker")
			case <-time.After(50 * time.Millisecond):
			}
			h.f.unblock(id)
			<-revoked
			<-closed
			require.True(t, h.f.get(id).handled, "the running unit finished")
			if lose {
				require.Empty(t, h.f.committed(tp), "a lost partition commits nothing")
			} else {
				require.Equal(t, []int64{1}, h.f.committed(tp))
			}
		})
	}
}

// The fetch watch's quiet clock (Fetching.Quiet) starts again when the
// worker resumes its partition's fetching: a partition that was paused
// (its queue full behind a slow or held worker) was fetched by nobody, so
// the time it spent paused is no sign of a client that stopped fetching.
// Counting it, the watch restarted partitions resumed a moment before,
// long paused, before their client had a chance to fetch.
func TestWorkerResumeRestartsTheQuietClock(t *testing.T) {
	h := newHarness(t, 1, pauseConfig)
	h.w.Enqueue([]*kgo.Record{bigRecord(h.tp, 0)}) // fills the bound alone: paused
	handed := h.w.fetching().Quiet
	require.False(t, drained(t, h.w, h.p, 1), "settled, the partition is resumed")
	_, resumes := h.p.calls()
	require.Equal(t, 1, resumes)
	f := h.w.fetching()
	require.False(t, f.Paused)
	// Not f.Quiet.After(handed): two readings of the wall clock may be
	// equal. The resume is what the clock must count from.
	require.NotZero(t, h.w.resumed.Load(), "the resume is recorded")
	resumed := time.Unix(0, h.w.resumed.Load())
	require.False(t, f.Quiet.Before(resumed), "quiet since the records were handed (%s), not since the resume after them (%s)",
		handed.Format(time.RFC3339Nano), resumed.Format(time.RFC3339Nano))
	h.w.Stop()
}

// LoseTopic waits for the workers of the topic that another call is
// stopping already: a lost partition's worker whose commit is still in
// flight (a slow broker) must stop before the caller drops the client's
// state of the topic, or the commit would be built after the purge and
// name the recreated topic. Workers of other topics are left alone.
func TestSetLoseTopicWaitsForAStoppingWorker(t *testing.T) {
	h := newSetHarness(t, nil)
	tp, other := TopicPartition{"orders", 1}, TopicPartition{"payments", 1}
	h.s.Assign([]TopicPartition{tp, other})
	gate := make(chan struct{})
	h.f.mu.Lock()
	h.f.commitGate = gate
	h.f.mu.Unlock()
	id := fmt.Sprintf("%s@%d", tp, 0)
	h.s.Enqueue(tp, []*kgo.Record{fakeRecord(tp, 0, "a", id, "ok")})
	waitFor(t, "the event handled, its commit in flight", func() bool { return h.f.atGate.Load() == 1 })
	lost := make(chan struct{})
	go func() { h.s.Lose([]TopicPartition{tp}); close(lost) }()
	waitFor(t, "the loss took the worker", func() bool { return len(h.s.Owned()) == 1 })
	dropped := make(chan struct{})
	go func() { h.s.LoseTopic("orders"); close(dropped) }()
	select {
	case <-dropped:
		t.Fatal("LoseTopic returned while a worker of the topic still had a commit in flight")
	case <-time.After(50 * time.Millisecond):
	}
	h.f.mu.Lock()
	h.f.commitGate = nil
	h.f.mu.Unlock()
	close(gate)
	<-dropped
	<-lost
	require.Equal(t, []TopicPartition{other}, h.s.Owned(), "the other topic's worker runs on")
}

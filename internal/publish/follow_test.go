package publish

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
)

// followRig is a worker with a Marker, fed by the test in place of the
// change stream.
type followRig struct {
	store  *memStore
	prod   *fakeProducer
	w      *Worker
	marker *Marker
	stats  *Stats
	stream uint64
	stop   func()
}

func newFollowRig(t *testing.T, batch, buffer int, markDelay time.Duration) *followRig {
	t.Helper()
	r := &followRig{store: &memStore{}, prod: &fakeProducer{}}
	r.w, r.stats = newTestWorker(r.store, r.prod, validLease(), batch)
	r.marker = NewMarker(r.store, markDelay, 1000)
	r.marker.Timeout = time.Second
	r.marker.Backoff = r.w.cfg.Backoff
	r.marker.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r.marker.Stats = r.stats
	r.w.cfg.Marker = r.marker
	r.w.cfg.StreamBuffer = buffer
	r.w.recent = recentIDs{max: buffer, set: map[any]struct{}{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.marker.Run(ctx) })
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			r.w.Stop()
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// insert commits n events and, like the change stream, delivers them.
func (r *followRig) insert(n int) {
	r.store.mu.Lock()
	var items []Item
	for range n {
		e := memEvent{id: len(r.store.events), key: "k"}
		r.store.events = append(r.store.events, e)
		items = append(items, memItem(testTP, e))
	}
	r.store.mu.Unlock()
	for _, it := range items {
		r.w.push(r.stream, it)
	}
}

func (r *followRig) attach() {
	r.stream++
	r.w.attach(r.stream)
}

// startFollowing attaches a stream, starts the worker and waits until it
// follows the stream.
func (r *followRig) startFollowing(t *testing.T) {
	t.Helper()
	r.attach()
	r.w.Start()
	eventually(t, func() bool { return r.w.Following() }, "worker never followed the stream")
}

func (r *followRig) published() int { p, _ := r.store.counts(); return p }

func (r *followRig) finds() int {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	return r.store.findCalls
}

func TestFollowScansThenProducesFromTheStream(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 10, 100, 5*time.Millisecond) // the buffer holds every streamed event
	r.store.add(testTP, 25, "k")                      // backlog before the stream
	r.startFollowing(t)
	eventually(t, func() bool { return r.published() == 25 }, "backlog not published")
	finds := r.finds()

	for range 20 {
		r.insert(3)
	}
	eventually(t, func() bool { return r.published() == 85 }, "streamed events not published")
	require.Equal(t, seq(0, 85), r.prod.delivered(), "each event once, in order")
	require.Equal(t, finds, r.finds(), "a following worker must not read the store")
	require.EqualValues(t, 85, r.stats.Published())
}

func TestFollowSkipsEventsTheScanProduced(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 100, 40, 5*time.Millisecond)
	r.attach()
	// Delivered by the stream before the worker's first scan: the scan
	// reads them too.
	r.insert(5)
	r.w.Start()
	eventually(t, func() bool { return r.published() == 5 }, "not published")
	eventually(t, func() bool { return r.w.Following() }, "worker never followed the stream")
	r.insert(2)
	eventually(t, func() bool { return r.published() == 7 }, "not published")
	require.Equal(t, seq(0, 7), r.prod.delivered(), "an event both scanned and streamed was produced twice")
}

func TestFollowBufferOverflowFallsBackToScan(t *testing.T) {
	t.Parallel()
	for name, capBytes := range map[string]int{"events": 0, "bytes": 12} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newFollowRig(t, 10, 8, 5*time.Millisecond)
			r.w.cfg.StreamBufferBytes = capBytes // records here are 2-3 bytes
			r.startFollowing(t)
			// Hold the producer so that the buffer overflows.
			block := make(chan struct{})
			r.prod.mu.Lock()
			r.prod.block = block
			r.prod.mu.Unlock()
			r.insert(1)
			eventually(t, func() bool { r.prod.mu.Lock(); defer r.prod.mu.Unlock(); return r.prod.calls == 1 }, "first event not produced")
			r.insert(30) // more than the buffer holds: dropped, the worker must scan
			r.prod.mu.Lock()
			r.prod.block = nil
			r.prod.mu.Unlock()
			close(block)
			eventually(t, func() bool { return r.published() == 31 }, "events dropped from the buffer were lost")
			require.Equal(t, seq(0, 31), firstDeliveries(r.prod.delivered()), "order")
			eventually(t, func() bool { return r.w.Following() }, "worker did not follow again after catching up")
		})
	}
}

func TestFollowBufferBytes(t *testing.T) {
	t.Parallel()
	// A worker that is never started: the test plays its goroutine.
	w, _ := newTestWorker(&memStore{}, &fakeProducer{}, validLease(), 10)
	defer w.kill()
	w.cfg.StreamBufferBytes = 12
	r := &followRig{w: w}
	r.w.attach(1)
	r.w.mu.Lock()
	r.w.following = true
	r.w.mu.Unlock()
	for i := range 4 { // 2 bytes each (key "k", value "1".."4")
		r.w.push(1, memItem(testTP, memEvent{id: i + 1, key: "k"}))
	}
	r.w.mu.Lock()
	require.Len(t, r.w.buffer, 4)
	require.Equal(t, 8, r.w.bufBytes)
	r.w.mu.Unlock()
	items, ok := r.w.takeBuffered()
	require.True(t, ok)
	require.Len(t, items, 4)
	r.w.mu.Lock()
	require.Zero(t, r.w.bufBytes, "taken events release their bytes")
	r.w.mu.Unlock()
	for i := range 6 { // 12 bytes: at the cap
		r.w.push(1, memItem(testTP, memEvent{id: i + 1, key: "k"}))
	}
	require.True(t, r.w.Following())
	r.w.push(1, memItem(testTP, memEvent{id: 7, key: "k"}))
	require.False(t, r.w.Following(), "a push beyond the byte cap resets the worker")
}

func TestFollowProduceFailureFallsBackToScan(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 10, 40, 5*time.Millisecond)
	fails := map[int]int{3: 2} // guarded by prod.mu
	r.prod.fn = func(id int) error {
		if fails[id] > 0 {
			fails[id]--
			return kerr.NotLeaderForPartition
		}
		return nil
	}
	r.startFollowing(t)
	r.insert(8)
	eventually(t, func() bool { return r.published() == 8 }, "not published after a produce failure")
	require.Equal(t, seq(0, 8), firstDeliveries(r.prod.delivered()), "order")
	require.Equal(t, []int{0, 1, 2}, r.prod.delivered()[:3], "acknowledged events produced again")
	eventually(t, func() bool { return r.w.Following() }, "worker did not follow again")
}

func TestFollowDetachScans(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 10, 40, 5*time.Millisecond)
	r.startFollowing(t)
	r.w.detach(r.stream)
	require.False(t, r.w.Following())
	r.store.add(testTP, 4, "k") // the stream is gone: only a scan finds these
	r.w.Wake()
	eventually(t, func() bool { return r.published() == 4 }, "not published by the scan")
	r.insert(1) // pushes of an ended stream are ignored
	require.False(t, r.w.Following())
	r.w.Wake()
	eventually(t, func() bool { return r.published() == 5 }, "not published by the scan")
	require.Equal(t, seq(0, 5), r.prod.delivered())
}

func TestFollowStopWritesMarks(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 10, 40, time.Hour) // only the worker's stop writes
	r.startFollowing(t)
	r.insert(6)
	eventually(t, func() bool { return len(r.prod.delivered()) == 6 }, "not produced")
	r.w.Stop()
	require.Equal(t, 6, r.published(), "a graceful stop must mark what it produced")
}

func TestMarkerKeepsIDsWhenTheWriteFails(t *testing.T) {
	t.Parallel()
	store := &memStore{failMark: 1}
	store.add(testTP, 3, "k")
	m := NewMarker(store, time.Hour, 100)
	m.Stats = &Stats{}
	m.Add([]any{0, 1})
	m.Add([]any{2})
	require.Error(t, m.Flush(context.Background()))
	require.Equal(t, 3, m.Waiting())
	require.NoError(t, m.Flush(context.Background()))
	require.Equal(t, 0, m.Waiting())
	p, _ := store.counts()
	require.Equal(t, 3, p)
	require.EqualValues(t, 3, m.Stats.Published())
}

func TestMarkerRunRetriesAndWritesOnStop(t *testing.T) {
	t.Parallel()
	store := &memStore{failMark: 2}
	store.add(testTP, 4, "k")
	m := NewMarker(store, time.Millisecond, 100)
	m.Stats = &Stats{}
	m.Backoff = retry.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}
	m.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	m.Add([]any{0, 1})
	eventually(t, func() bool { p, _ := store.counts(); return p == 2 }, "not written after failures")
	require.NotEmpty(t, m.Stats.LastError())

	cancel()
	<-done

	// A marker waiting out its delay writes at once when it stops.
	m2 := NewMarker(store, time.Hour, 100)
	m2.Stats, m2.Logger = &Stats{}, m.Logger
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan struct{})
	go func() { defer close(done2); m2.Run(ctx2) }()
	m2.Add([]any{2, 3})
	cancel2()
	<-done2
	p, _ := store.counts()
	require.Equal(t, 4, p, "Run must write what is left when it stops")
}

func TestRecentIDs(t *testing.T) {
	t.Parallel()
	r := recentIDs{max: 3, set: map[any]struct{}{}}
	r.add([]any{1, 2, 2, 3})
	require.True(t, r.has(1) && r.has(2) && r.has(3))
	r.add([]any{4})
	require.False(t, r.has(1), "oldest id evicted")
	require.True(t, r.has(2) && r.has(3) && r.has(4))
	require.Len(t, r.set, 3)
}

func TestFollowRescanFindsWhatTheStreamMissed(t *testing.T) {
	t.Parallel()
	r := newFollowRig(t, 10, 40, 5*time.Millisecond)
	r.w.cfg.Rescan = 10 * time.Millisecond
	r.startFollowing(t)
	r.store.add(testTP, 3, "k") // committed, never delivered by the stream
	eventually(t, func() bool { return r.published() == 3 }, "the periodic rescan did not find the events")
	r.insert(2)
	eventually(t, func() bool { return r.published() == 5 }, "not published")
	require.Equal(t, seq(0, 5), r.prod.delivered())
}

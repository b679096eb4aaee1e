package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestLeaseRenewExpireRevoke(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLease(5*time.Second, clk.Now)
	require.False(t, l.Valid(), "a new lease is lapsed")

	l.Renew(clk.Now().Add(-time.Second)) // sent a second ago
	exp, ok := l.Expiry()
	require.True(t, ok)
	require.Equal(t, clk.Now().Add(4*time.Second), exp)

	l.Renew(clk.Now().Add(-2 * time.Second)) // older renewal: no effect
	exp2, _ := l.Expiry()
	require.Equal(t, exp, exp2)

	clk.Add(4 * time.Second)
	require.False(t, l.Valid(), "lapsed at sentAt+TTL")

	l.Renew(clk.Now())
	require.True(t, l.Valid())
	sent := clk.Now()
	clk.Add(time.Millisecond)
	l.Revoke()
	require.False(t, l.Valid())
	l.Renew(sent) // sent before the revocation: must not revive
	require.False(t, l.Valid())
	clk.Add(time.Millisecond)
	l.Renew(clk.Now())
	require.True(t, l.Valid())
}

func TestLeaseWaitAndBind(t *testing.T) {
	t.Parallel()
	l := NewLease(time.Hour, nil)
	got := make(chan bool)
	go func() {
		_, ok := l.Wait(context.Background(), nil)
		got <- ok
	}()
	select {
	case <-got:
		t.Fatal("Wait returned before renewal")
	case <-time.After(20 * time.Millisecond):
	}
	l.Renew(time.Now())
	require.True(t, <-got)

	ctx, cancel := l.Bind(context.Background())
	defer cancel()
	require.NoError(t, ctx.Err())
	l.Revoke()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("bound context not cancelled by Revoke")
	}

	// Bound to a short lease: ends at expiry.
	short := NewLease(30*time.Millisecond, nil)
	short.Renew(time.Now())
	sctx, scancel := short.Bind(context.Background())
	defer scancel()
	select {
	case <-sctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("bound context not ended at expiry")
	}

	stop := make(chan struct{})
	close(stop)
	_, ok := NewLease(time.Second, nil).Wait(context.Background(), stop)
	require.False(t, ok)
}

func TestIsPermanent(t *testing.T) {
	t.Parallel()
	require.True(t, IsPermanent(kerr.MessageTooLarge))
	require.True(t, IsPermanent(fmt.Errorf("x: %w", kerr.RecordListTooLarge)))
	require.False(t, IsPermanent(kerr.NotLeaderForPartition))
	require.False(t, IsPermanent(context.DeadlineExceeded))
}

// memStore is an in-memory Store: events in publishing order.
type memStore struct {
	mu        sync.Mutex
	events    []memEvent
	failFind  int // fail the next n Pending calls
	findCalls int
	markCalls int
	failMark  int // fail the next n MarkPublished calls

	failedKeyReads int
	// sizes pads the values of some events to these sizes: the id, then
	// spaces (fmt.Sscan reads the id back).
	sizes map[int]int
}

type memEvent struct {
	id         int
	key        string
	published  bool
	failed     bool
	discarded  bool
	unreadable bool // its document cannot be decoded
	cause      string
}

func (s *memStore) add(tp TopicPartition, n int, keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		id := len(s.events)
		key := keys[id%len(keys)]
		s.events = append(s.events, memEvent{id: id, key: key})
	}
}

func (s *memStore) Pending(ctx context.Context, tp TopicPartition, limit Limit, exclude []string) ([]Item, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.findCalls++
	if s.failFind > 0 {
		s.failFind--
		return nil, false, errors.New("mongo down")
	}
	var out []Item
	bytes := 0
	for _, e := range s.events {
		if e.published || e.failed || slices.Contains(exclude, e.key) {
			continue
		}
		it := memItem(tp, e)
		if s.sizes != nil {
			if n := s.sizes[e.id]; n > len(it.Record.Value) {
				it.Record.Value = append(it.Record.Value, strings.Repeat(" ", n-len(it.Record.Value))...)
			}
		}
		if e.unreadable {
			it.Record.Value, it.Err = nil, errors.New("cannot decode")
		}
		if len(out) == limit.Events || (len(out) > 0 && bytes+len(it.Record.Value) > limit.Bytes) {
			return out, true, nil
		}
		bytes += len(it.Record.Value)
		out = append(out, it)
	}
	return out, false, nil
}

func memItem(tp TopicPartition, e memEvent) Item {
	return Item{ID: e.id, Record: &kgo.Record{
		Topic: tp.Topic, Partition: tp.Partition, Key: []byte(e.key), Value: []byte(fmt.Sprint(e.id)),
	}}
}

func (s *memStore) MarkPublished(_ context.Context, ids []any, _ time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.markCalls++
	if s.failMark > 0 {
		s.failMark--
		return errors.New("mongo down")
	}
	for _, id := range ids {
		s.events[id.(int)].published = true
	}
	return nil
}

func (s *memStore) MarkFailed(_ context.Context, id any, cause error, _ time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events[id.(int)].failed = true
	s.events[id.(int)].cause = cause.Error()
	return nil
}

func (s *memStore) FailedKeys(context.Context, TopicPartition) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedKeyReads++
	var out []string
	for _, e := range s.events {
		if e.failed && !slices.Contains(out, e.key) {
			out = append(out, e.key)
		}
	}
	return out, nil
}

func (s *memStore) failedKeyReadsNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failedKeyReads
}

func (s *memStore) counts() (published, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.published {
			published++
		}
		if e.failed {
			failed++
		}
	}
	return
}

// fakeProducer delivers records asynchronously; fn decides each record's
// fate. Like kgo's idempotent producer, once a record of a batch fails
// transiently, every later record of the same call sequence fails too.
type fakeProducer struct {
	mu    sync.Mutex
	fn    func(id int) error
	log   []int // ids delivered, in delivery order
	calls int
	block chan struct{} // when set, promises wait for it
	prev  chan struct{} // done channel of the previous record: delivery in order
	// Like kgo, once a record fails transiently every later record in flight
	// fails too (gapless ordering), until the worker produces it again.
	failing  bool
	failedAt int
}

func (p *fakeProducer) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	var id int
	fmt.Sscan(string(r.Value), &id)
	p.mu.Lock()
	p.calls++
	if p.failing && id <= p.failedAt {
		p.failing = false // the retry of the failed record starts
	}
	block := p.block
	prev, done := p.prev, make(chan struct{})
	p.prev = done
	p.mu.Unlock()
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		if block != nil {
			select {
			case <-block:
			case <-ctx.Done():
				promise(r, ctx.Err())
				return
			}
		}
		p.mu.Lock()
		var err error
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case p.failing:
			err = kerr.NotLeaderForPartition
		case p.fn != nil:
			err = p.fn(id)
		}
		if err == nil {
			p.log = append(p.log, id)
		} else if !IsPermanent(err) && !p.failing {
			p.failing, p.failedAt = true, id
		}
		p.mu.Unlock()
		promise(r, err)
	}()
}

func (p *fakeProducer) delivered() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

var testTP = TopicPartition{Topic: "t", Partition: 3}

func newTestWorker(store Store, prod Producer, lease *Lease, batch int) (*Worker, *Stats) {
	stats := &Stats{}
	cfg := &WorkerConfig{
		Store: store, Producer: prod, Lease: lease, BatchSize: batch,
		Backoff: retry.Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond},
		Rescan:  time.Hour, MarkTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Stats: stats,
	}
	return NewWorker(testTP, cfg), stats
}

func validLease() *Lease {
	l := NewLease(time.Hour, nil)
	l.Renew(time.Now())
	return l
}

func eventually(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// firstDeliveries returns each id's first delivery, in delivery order.
func firstDeliveries(log []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, id := range log {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

func TestWorkerPublishesBacklogInOrderAndWakes(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 25, "a", "b")
	prod := &fakeProducer{}
	w, stats := newTestWorker(store, prod, validLease(), 10)
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, _ := store.counts(); return p == 25 }, "backlog not published")
	require.Equal(t, seq(0, 25), prod.delivered())
	require.EqualValues(t, 25, stats.Published())

	store.add(testTP, 3, "a")
	w.Wake()
	eventually(t, func() bool { p, _ := store.counts(); return p == 28 }, "woken events not published")
	require.Equal(t, seq(0, 28), prod.delivered())
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func TestWorkerTransientFailureRetriesWithoutReordering(t *testing.T) {
	t.Parallel()
	store := &memStore{failFind: 2}
	store.add(testTP, 40, "k")
	failures := map[int]int{0: 1, 7: 3, 23: 1} // guarded by prod.mu
	prod := &fakeProducer{}
	prod.fn = func(id int) error {
		if failures[id] > 0 {
			failures[id]--
			return kerr.NotLeaderForPartition
		}
		return nil
	}
	w, stats := newTestWorker(store, prod, validLease(), 10)
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, _ := store.counts(); return p == 40 }, "not everything published")
	require.Equal(t, seq(0, 40), firstDeliveries(prod.delivered()), "first deliveries out of order")
	require.NotEmpty(t, stats.LastError())
}

func TestWorkerPermanentFailureMarksFailedAndContinues(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 12, "k")
	prod := &fakeProducer{fn: func(id int) error {
		if id == 4 {
			return kerr.MessageTooLarge
		}
		return nil
	}}
	w, stats := newTestWorker(store, prod, validLease(), 5)
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, f := store.counts(); return p == 11 && f == 1 }, "failed event blocks the partition")
	require.True(t, store.events[4].failed)
	require.Contains(t, store.events[4].cause, "MESSAGE_TOO_LARGE")
	require.EqualValues(t, 1, stats.Failed())
	require.NotContains(t, prod.delivered(), 4)
}

func TestWorkerPausesWhileLeaseLapsed(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 5, "k")
	prod := &fakeProducer{}
	lease := NewLease(time.Hour, nil) // lapsed
	w, _ := newTestWorker(store, prod, lease, 10)
	w.Start()
	defer w.Stop()
	time.Sleep(50 * time.Millisecond) // give it a chance to misbehave
	prod.mu.Lock()
	require.Zero(t, prod.calls, "produced without a lease")
	prod.mu.Unlock()
	lease.Renew(time.Now())
	eventually(t, func() bool { p, _ := store.counts(); return p == 5 }, "not published after renewal")
}

func TestWorkerRevokedLeaseCancelsBatch(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 5, "a", "b", "c", "d", "e") // one wave
	prod := &fakeProducer{block: make(chan struct{})}
	lease := validLease()
	w, _ := newTestWorker(store, prod, lease, 10)
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { prod.mu.Lock(); defer prod.mu.Unlock(); return prod.calls == 5 }, "batch not produced")
	lease.Revoke()
	// The blocked records fail with the cancelled context; nothing marked.
	time.Sleep(20 * time.Millisecond)
	p, _ := store.counts()
	require.Zero(t, p)
	require.Empty(t, prod.delivered())
	close(prod.block)
	lease.Renew(time.Now())
	eventually(t, func() bool { p, _ := store.counts(); return p == 5 }, "not published after renewal")
}

// requireHeldUntil fails with msg if returned closes before release is
// closed (checked for 50 ms), then closes release and waits for returned.
func requireHeldUntil(t *testing.T, returned <-chan struct{}, release chan struct{}, msg string) {
	t.Helper()
	select {
	case <-returned:
		t.Fatal(msg)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-returned
}

func TestWorkerStopFinishesBatchKillDoesNot(t *testing.T) {
	t.Parallel()
	for _, kill := range []bool{false, true} {
		store := &memStore{}
		store.add(testTP, 5, "a", "b", "c", "d", "e") // one wave
		block := make(chan struct{})
		prod := &fakeProducer{block: block}
		w, _ := newTestWorker(store, prod, validLease(), 10)
		w.Start()
		eventually(t, func() bool { prod.mu.Lock(); defer prod.mu.Unlock(); return prod.calls == 5 }, "batch not produced")
		stopped := make(chan struct{})
		go func() {
			if kill {
				w.Kill()
			} else {
				w.Stop()
			}
			close(stopped)
		}()
		if kill {
			<-stopped
			close(block)
			p, _ := store.counts()
			require.Zero(t, p, "killed worker marked")
			continue
		}
		requireHeldUntil(t, stopped, block, "Stop returned before the batch in flight finished")
		p, _ := store.counts()
		require.Equal(t, 5, p, "gracefully stopped worker did not mark its batch")
	}
}

// A graceful Stop while the producer never resolves the batch in flight (Kafka
// unreachable) must not hang: with StopTimeout it ends, and nothing of the
// unresolved batch is marked.
func TestWorkerStopTimeoutAbandonsUnresolvedBatch(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 3, "a", "b", "c") // one wave
	block := make(chan struct{})
	defer close(block)
	prod := &fakeProducer{block: block}
	w, _ := newTestWorker(store, prod, validLease(), 10)
	w.cfg.StopTimeout = 50 * time.Millisecond
	w.Start()
	eventually(t, func() bool { prod.mu.Lock(); defer prod.mu.Unlock(); return prod.calls == 3 }, "batch not produced")
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after StopTimeout")
	}
	p, _ := store.counts()
	require.Zero(t, p, "an unresolved batch was marked")
}

func TestWorkerBeforeMarkHookSimulatesCrash(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 3, "a", "b", "c")
	prod := &fakeProducer{}
	w, _ := newTestWorker(store, prod, validLease(), 10)
	w.cfg.Hooks.BeforeMark = func(TopicPartition, []any) bool { return false }
	w.Start()
	<-w.done // the hook stopped it
	w.Stop()
	p, _ := store.counts()
	require.Zero(t, p)
	require.Len(t, prod.delivered(), 3)
}

func TestSetOwnership(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	prod := &fakeProducer{}
	lease := validLease()
	var mu sync.Mutex
	made := map[TopicPartition]int{}
	s := NewSet(func(tp TopicPartition) *Worker {
		mu.Lock()
		made[tp]++
		mu.Unlock()
		w, _ := newTestWorker(store, prod, lease, 10)
		w.tp = tp
		return w
	})
	g0, ch := s.Changed()
	a, b, c := TopicPartition{"x", 0}, TopicPartition{"x", 1}, TopicPartition{"a", 2}
	s.Assign([]TopicPartition{b, a})
	<-ch
	s.Assign([]TopicPartition{a}) // repeated: no new worker
	s.Assign(nil)
	s.Assign([]TopicPartition{c})
	require.Equal(t, []TopicPartition{c, a, b}, s.Owned())
	g1, _ := s.Changed()
	require.Greater(t, g1, g0)
	s.WakeAll()
	s.Revoke([]TopicPartition{a, {"nope", 9}})
	s.Lose([]TopicPartition{b})
	require.Equal(t, []TopicPartition{c}, s.Owned())
	s.Close()
	require.Empty(t, s.Owned())
	s.Assign([]TopicPartition{a}) // after Close: ignored
	require.Empty(t, s.Owned())
	mu.Lock()
	require.Equal(t, map[TopicPartition]int{a: 1, b: 1, c: 1}, made)
	mu.Unlock()
}

// The publisher closes its set while the group's rebalance callbacks still
// run. A Revoke of a partition whose worker Close is still stopping must not
// return at once, or the group gives the partition to another member while
// this one still produces its batch: Revoke returns when that worker exited;
// Lose kills it.
func TestSetRevokeWaitsForAWorkerCloseIsStopping(t *testing.T) {
	t.Parallel()
	for _, lose := range []bool{false, true} {
		store := &memStore{}
		store.add(testTP, 3, "a", "b", "c") // one wave
		block := make(chan struct{})
		prod := &fakeProducer{block: block}
		s := NewSet(func(tp TopicPartition) *Worker {
			w, _ := newTestWorker(store, prod, validLease(), 10)
			return w
		})
		s.Assign([]TopicPartition{testTP})
		eventually(t, func() bool { prod.mu.Lock(); defer prod.mu.Unlock(); return prod.calls == 3 }, "batch not produced")
		closed := make(chan struct{})
		go func() { s.Close(); close(closed) }()
		eventually(t, func() bool { return len(s.Owned()) == 0 }, "Close did not take the worker")
		revoked := make(chan struct{})
		go func() {
			if lose {
				s.Lose([]TopicPartition{testTP})
			} else {
				s.Revoke([]TopicPartition{testTP})
			}
			close(revoked)
		}()
		if lose {
			<-revoked // killed: returns with the batch unresolved
			<-closed
			close(block)
			p, _ := store.counts()
			require.Zero(t, p, "a lost partition's batch was marked")
			continue
		}
		requireHeldUntil(t, revoked, block, "Revoke returned while Close was still finishing the partition's batch")
		<-closed
		p, _ := store.counts()
		require.Equal(t, 3, p, "the batch was finished and marked")
		s.mu.Lock()
		require.Empty(t, s.stopping, "stopped workers are forgotten")
		s.mu.Unlock()
	}
}

func TestWatcherPipeline(t *testing.T) {
	t.Parallel()
	w := &Watcher{TopicField: "topic", PartitionField: "partition"}
	p := w.Pipeline([]TopicPartition{{"a", 1}, {"a", 3}, {"b", 0}})
	require.Equal(t, `[{"$match":{"operationType":"insert","$or":[{"fullDocument.topic":"a","fullDocument.partition":{"$in":[1,3]}},{"fullDocument.topic":"b","fullDocument.partition":{"$in":[0]}}]}}]`, toJSON(t, p))
}

// refusingProducer models a broker with a size limit per produce batch, as
// a topic's max.message.bytes is: records produced before release form one
// batch; after release every record is its own batch. A batch larger than
// limit is refused whole with MESSAGE_TOO_LARGE, as Kafka and kgo do.
type refusingProducer struct {
	mu        sync.Mutex
	limit     int
	released  bool
	queue     []queuedRecord
	log       []int // ids acknowledged, in order
	calls     int
	failedCtx context.Context
	// splitLast: the first batch's last record is sent on its own (see
	// release).
	splitLast bool
}

type queuedRecord struct {
	ctx     context.Context
	r       *kgo.Record
	promise func(*kgo.Record, error)
}

func (p *refusingProducer) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.mu.Lock()
	p.calls++
	p.queue = append(p.queue, queuedRecord{ctx, r, promise})
	if !p.released {
		p.mu.Unlock()
		return
	}
	p.deliverLocked()
}

// deliverLocked judges the queued records as one batch, unlocks and
// resolves their promises.
func (p *refusingProducer) deliverLocked() {
	batch := p.queue
	p.queue = nil
	size := 0
	for _, q := range batch {
		size += len(q.r.Value)
	}
	ids := make([]int, len(batch))
	for i, q := range batch {
		fmt.Sscan(string(q.r.Value), &ids[i])
	}
	var err error
	if size > p.limit || (len(batch) > 0 && batch[0].ctx == p.failedCtx) {
		// Like kgo, a refused batch fails every record of the partition
		// buffered behind it: here, the rest of the same Produce burst
		// (the worker produces a batch with one context).
		err = kerr.MessageTooLarge
		p.failedCtx = batch[0].ctx
	} else {
		p.log = append(p.log, ids...)
	}
	p.mu.Unlock()
	for _, q := range batch {
		q.promise(q.r, err)
	}
}

func (p *refusingProducer) release() {
	p.mu.Lock()
	p.released = true
	if !p.splitLast || len(p.queue) < 2 {
		p.deliverLocked()
		return
	}
	// The last record went out in a request of its own, in flight while
	// the first batch was refused. Like kgo's idempotent producer (which
	// retries it after the out-of-order-sequence answer and the epoch bump
	// that follow a refusal), it is written unless its context is done by
	// then: kgo fails a batch known not to be written whose first record's
	// context is done (recBatch.maybeFailErr).
	last := p.queue[len(p.queue)-1]
	p.queue = p.queue[:len(p.queue)-1]
	p.deliverLocked()
	p.mu.Lock()
	var id int
	fmt.Sscan(string(last.r.Value), &id)
	err := last.ctx.Err()
	if err == nil {
		p.log = append(p.log, id)
	}
	p.mu.Unlock()
	last.promise(last.r, err)
}

func (p *refusingProducer) setLimit(n int) {
	p.mu.Lock()
	p.limit = n
	p.mu.Unlock()
}

func (p *refusingProducer) produced() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

func (p *refusingProducer) delivered() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// retry clears the failed mark of id, as Admin.RetryFailed does.
func (s *memStore) retry(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events[id].failed = false
}

// discard removes id, as Admin.DiscardFailed does.
func (s *memStore) discard(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events[id].failed = false
	s.events[id].published = true // gone from the backlog
	s.events[id].discarded = true
}

func (s *memStore) isFailed(id int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events[id].failed
}

// runRefusal produces the store's events through a refusingProducer whose
// first batch holds the worker's first wave (the first event of each key),
// and returns when that batch was judged.
func runRefusal(t *testing.T, store *memStore, limit int, hold bool) (*refusingProducer, *Worker) {
	t.Helper()
	return runRefusalWith(t, store, &refusingProducer{limit: limit}, hold)
}

func runRefusalWith(t *testing.T, store *memStore, prod *refusingProducer, hold bool) (*refusingProducer, *Worker) {
	t.Helper()
	w, _ := newTestWorker(store, prod, validLease(), 10)
	w.cfg.Hold = hold
	w.cfg.HoldRecheck = 5 * time.Millisecond
	w.Start()
	t.Cleanup(w.Stop)
	keys := map[string]bool{}
	for _, e := range store.events {
		keys[e.key] = true
	}
	eventually(t, func() bool { return prod.produced() == len(keys) }, "the first wave was not produced whole")
	prod.release()
	return prod, w
}

// keyOrder returns, per key, the ids of the first deliveries, in order.
func keyOrder(store *memStore, delivered []int) map[string][]int {
	store.mu.Lock()
	defer store.mu.Unlock()
	out := map[string][]int{}
	for _, id := range firstDeliveries(delivered) {
		k := store.events[id].key
		out[k] = append(out[k], id)
	}
	return out
}

// Eight events of about 700 bytes under a 1500-byte limit. Each fits alone;
// the first wave (three keys) does not.
func TestWorkerBatchRefusalPublishesInnocentEvents(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{}}
	store.add(testTP, 8, "a", "b", "c")
	for i := range 8 {
		store.sizes[i] = 700
	}
	prod, _ := runRefusal(t, store, 1500, true)
	eventually(t, func() bool { p, _ := store.counts(); return p == 8 }, "innocent events were not published")
	_, failed := store.counts()
	require.Zero(t, failed, "an event was failed because its batch was refused")
	require.Equal(t, seq(0, 8), firstDeliveries(prod.delivered()), "published out of order")
}

// A refused batch while a later record of the partition is in a request of
// its own (seen on kfake under load: kgo split the batch in two requests
// and wrote the second after the first was refused): that record is of
// another key than the refused ones, as every record of a wave is, so
// whatever the timing, no key's order suffers.
func TestWorkerBatchRefusalKeepsOrderWhenSplit(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{}}
	store.add(testTP, 8, "a", "b", "c", "d")
	for i := range 8 {
		store.sizes[i] = 700
	}
	prod, _ := runRefusalWith(t, store, &refusingProducer{limit: 1500, splitLast: true}, true)
	eventually(t, func() bool { p, _ := store.counts(); return p == 8 }, "innocent events were not published")
	_, failed := store.counts()
	require.Zero(t, failed, "an event was failed because its batch was refused")
	require.Equal(t, map[string][]int{"a": {0, 4}, "b": {1, 5}, "c": {2, 6}, "d": {3, 7}},
		keyOrder(store, prod.delivered()), "a key published out of order")
}

// One 6 KB event among seven tiny ones under a 4000-byte limit: the big one is
// failed, the seven are published in order.
func TestWorkerBatchRefusalFailsOnlyTheGuiltyEvent(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{3: 6000}}
	store.add(testTP, 8, "a", "b", "c", "d", "e", "f", "g", "h") // distinct keys: nothing held
	prod, _ := runRefusal(t, store, 4000, true)
	eventually(t, func() bool { p, f := store.counts(); return p == 7 && f == 1 }, "want 7 published, 1 failed")
	require.True(t, store.isFailed(3))
	require.Contains(t, store.events[3].cause, "MESSAGE_TOO_LARGE")
	require.Equal(t, []int{0, 1, 2, 4, 5, 6, 7}, firstDeliveries(prod.delivered()))
}

// holdSetup: ten events of keys a and b alternating (a: 0 2 4 6 8, b: 1 3 5
// 7 9); event 2 (key a) is too large.
func holdSetup(t *testing.T, hold bool) (*memStore, *refusingProducer, *Worker) {
	t.Helper()
	store := &memStore{sizes: map[int]int{2: 6000}}
	store.add(testTP, 10, "a", "b")
	prod, w := runRefusal(t, store, 4000, hold)
	return store, prod, w
}

func TestWorkerHoldsKeyOfRefusedEvent(t *testing.T) {
	t.Parallel()
	store, prod, w := holdSetup(t, true)
	eventually(t, func() bool { p, f := store.counts(); return p == 6 && f == 1 }, "want b's 5 events and a's first published")
	require.Equal(t, []int{0, 1, 3, 5, 7, 9}, firstDeliveries(prod.delivered()), "a's events after the refused one must wait")
	require.EqualValues(t, 1, w.HeldKeys())
	// Later events of a, produced in later rounds (scan and stream), wait too.
	store.add(testTP, 2, "a", "b") // 10 (a), 11 (b)
	w.Wake()
	eventually(t, func() bool { p, _ := store.counts(); return p == 7 }, "b's new event not published")
	require.NotContains(t, prod.delivered(), 10)
	require.EqualValues(t, 1, w.HeldKeys())
}

func TestWorkerReleasesKeyInOrderOnRetry(t *testing.T) {
	t.Parallel()
	store, prod, w := holdSetup(t, true)
	eventually(t, func() bool { p, f := store.counts(); return p == 6 && f == 1 }, "not held")
	prod.setLimit(1 << 20) // the operator raised the topic's limit
	store.retry(2)
	eventually(t, func() bool { p, _ := store.counts(); return p == 10 }, "held events not released")
	require.Equal(t, []int{0, 1, 3, 5, 7, 9, 2, 4, 6, 8}, firstDeliveries(prod.delivered()), "a's events out of order after release")
	require.Zero(t, w.HeldKeys())
}

func TestWorkerRetriedEventRefusedAgainHoldsAgain(t *testing.T) {
	t.Parallel()
	store, prod, w := holdSetup(t, true)
	eventually(t, func() bool { p, f := store.counts(); return p == 6 && f == 1 }, "not held")
	reads := store.failedKeyReadsNow()
	store.retry(2) // the cause is not fixed
	eventually(t, func() bool { return store.isFailed(2) && store.failedKeyReadsNow() > reads+1 }, "not refused again")
	require.Equal(t, []int{0, 1, 3, 5, 7, 9}, firstDeliveries(prod.delivered()))
	require.EqualValues(t, 1, w.HeldKeys())
}

func TestWorkerReleasesKeyOnDiscard(t *testing.T) {
	t.Parallel()
	store, prod, w := holdSetup(t, true)
	eventually(t, func() bool { p, f := store.counts(); return p == 6 && f == 1 }, "not held")
	store.discard(2)
	eventually(t, func() bool { p, _ := store.counts(); return p == 10 }, "held events not released") // 9 + the discarded one
	require.Equal(t, []int{0, 1, 3, 5, 7, 9, 4, 6, 8}, firstDeliveries(prod.delivered()))
	require.Zero(t, w.HeldKeys())
}

func TestWorkerSkipEventPolicyPublishesPastRefusedEvent(t *testing.T) {
	t.Parallel()
	store, prod, w := holdSetup(t, false)
	eventually(t, func() bool { p, f := store.counts(); return p == 9 && f == 1 }, "want all but the refused event published")
	require.Equal(t, []int{0, 1, 3, 4, 5, 6, 7, 8, 9}, firstDeliveries(prod.delivered()))
	require.Zero(t, w.HeldKeys())
	require.Zero(t, store.failedKeyReadsNow(), "no failed-key reads without the hold policy")
}

// A new owner (after a rebalance or a restart) reads the failed keys before
// its first batch and holds them too.
func TestWorkerNewOwnerHoldsKeysFailedBefore(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 6, "a", "b") // a: 0 2 4, b: 1 3 5
	store.events[0].published = true
	store.events[2].failed = true // refused under the previous owner
	prod := &fakeProducer{}
	w, _ := newTestWorker(store, prod, validLease(), 10)
	w.cfg.Hold = true
	w.cfg.HoldRecheck = 5 * time.Millisecond
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, _ := store.counts(); return p == 4 }, "b's events not published")
	require.Equal(t, []int{1, 3, 5}, firstDeliveries(prod.delivered()), "a's event 4 must wait behind failed event 2")
	require.EqualValues(t, 1, w.HeldKeys())
	store.retry(2)
	eventually(t, func() bool { p, _ := store.counts(); return p == 6 }, "not released")
	require.Equal(t, []int{1, 3, 5, 2, 4}, firstDeliveries(prod.delivered()))
}

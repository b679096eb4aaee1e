package outbox

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// fakePauser stands for the kgo client's fetch pausing: it keeps the paused
// partitions as kgo does (a pause persists until resumed, whatever the
// assignment) and counts the calls.
type fakePauser struct {
	mu      sync.Mutex
	paused  map[topicPartition]bool
	resumes int
	// beforePause, when set, runs at the start of every pause call (a test
	// hook that widens or fills the gap before the pause takes effect).
	beforePause func()
}

func newFakePauser() *fakePauser { return &fakePauser{paused: map[topicPartition]bool{}} }

func (f *fakePauser) PauseFetchPartitions(parts map[string][]int32) map[string][]int32 {
	if f.beforePause != nil {
		f.beforePause()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			f.paused[topicPartition{t, p}] = true
		}
	}
	return nil
}

func (f *fakePauser) ResumeFetchPartitions(parts map[string][]int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resumes++
	for t, ps := range parts {
		for _, p := range ps {
			delete(f.paused, topicPartition{t, p})
		}
	}
}

func (f *fakePauser) isPaused(tp topicPartition) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused[tp]
}

func (f *fakePauser) resumeCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resumes
}

// newPauseTestConsumer returns a consumer whose workers run for real but
// whose records have no handler (so handling needs no MongoDB) and whose
// fetch pausing is faked. PoisonPolicy SkipEvent: under HoldKey a worker
// reads its partition's held keys from MongoDB first. Its kgo client is in no group: commits return at
// once without a broker.
func newPauseTestConsumer(t *testing.T) (*consumer, *fakePauser) {
	t.Helper()
	cfg := Config{MeterProvider: noop.NewMeterProvider(), TracerProvider: tracenoop.NewTracerProvider(),
		PoisonPolicy: SkipEvent}.withDefaults()
	c := &Client{cfg: cfg, handlers: map[handlerKey]*handler{}}
	c.tel = newTelemetry(&c.cfg)
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	work, cancel := context.WithCancel(context.Background())
	fp := newFakePauser()
	cons := &consumer{c: c, cl: cl, pauser: fp, log: cfg.Logger, work: work, workers: map[topicPartition]*partitionWorker{}}
	t.Cleanup(func() {
		cons.stopAll(false)
		cancel()
		cl.Close()
	})
	return cons, fp
}

// bigValue fills a worker's queue bound by bytes with one record, so every
// enqueue of a record that finds the queue empty pauses the partition.
var bigValue = make([]byte, maxQueueBytes)

// pauseTestRecord is a well-formed record of a schema nobody handles (it is
// acknowledged and skipped without MongoDB), as large as the queue bound.
func pauseTestRecord(tp topicPartition, offset int64) *kgo.Record {
	env := Envelope{Topic: tp.topic, Partition: tp.partition, ContentSchema: "Unhandled.v1", IdempotencyKey: "k", PartitionKey: "k", OccurredAt: time.Now()}
	rec := encodeRecord(&env, bigValue)
	rec.Offset = offset
	return rec
}

func assignOne(cons *consumer, tp topicPartition) *partitionWorker {
	cons.assigned(context.Background(), nil, map[string][]int32{tp.topic: {tp.partition}})
	cons.mu.Lock()
	defer cons.mu.Unlock()
	return cons.workers[tp]
}

// drained waits until the worker has taken every queued record, then
// reports whether the partition is paused.
func drained(t *testing.T, w *partitionWorker, fp *fakePauser) (paused bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		empty := len(w.queue) == 0
		// Read under the worker's lock: pause and resume calls made under it
		// are complete, any other is not ordered with the queue.
		paused = fp.isPaused(w.tp)
		w.mu.Unlock()
		if empty {
			return paused
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the worker to drain its queue")
		}
		runtime.Gosched()
	}
}

// A worker that drains its queue at the moment enqueue has decided to pause
// (the worker was finishing its previous batch) must not leave the partition
// paused with nothing to resume it: kgo would never fetch it again.
func TestConsumerPauseDoesNotInterleaveWithResume(t *testing.T) {
	t.Parallel()
	cons, fp := newPauseTestConsumer(t)
	tp := topicPartition{ordersTopic, 0}
	w := assignOne(cons, tp)

	var once sync.Once
	fp.beforePause = func() {
		once.Do(func() {
			// Let the worker look at its queue now, if nothing prevents it:
			// only when the pause is issued outside the worker's lock.
			if !w.mu.TryLock() {
				return
			}
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
			deadline := time.Now().Add(10 * time.Second)
			for fp.resumeCalls() == 0 {
				if time.Now().After(deadline) {
					t.Error("the worker did not drain in the gap")
					return
				}
				runtime.Gosched()
			}
		})
	}
	cons.enqueue(tp, []*kgo.Record{pauseTestRecord(tp, 0)})
	require.False(t, drained(t, w, fp), "partition paused with an empty queue: nothing will resume it")
	cons.stopAll(false)
	require.False(t, fp.isPaused(tp), "partition paused after its worker stopped")
}

// Hammer enqueue against the draining worker: whenever the queue is empty,
// the partition is not paused, and a stopped worker leaves no pause behind.
func TestConsumerPauseResumeHammer(t *testing.T) {
	t.Parallel()
	cons, fp := newPauseTestConsumer(t)
	tp := topicPartition{ordersTopic, 1}
	w := assignOne(cons, tp)
	fp.beforePause = runtime.Gosched // widens any gap between the decision to pause and the pause

	const iterations = 3000
	for i := range iterations {
		cons.enqueue(tp, []*kgo.Record{pauseTestRecord(tp, int64(i))})
		if i%3 == 0 {
			// Let the worker go idle now and then, so that the next enqueue
			// wakes it rather than finding it in its loop.
			require.False(t, drained(t, w, fp), "iteration %d: partition paused with an empty queue", i)
		}
	}
	require.False(t, drained(t, w, fp), "partition paused with an empty queue")
	cons.stopAll(false)
	require.False(t, fp.isPaused(tp), "partition paused after its worker stopped")
}

// A revoke that lands while enqueue pauses the partition must not leave a
// pause behind: kgo keeps pauses across assignments, so the partition would
// stay paused after it is assigned again.
func TestConsumerRevokeDuringPauseLeavesNoPause(t *testing.T) {
	t.Parallel()
	cons, fp := newPauseTestConsumer(t)
	tp := topicPartition{ordersTopic, 2}
	w := assignOne(cons, tp)
	revoke := map[string][]int32{tp.topic: {tp.partition}}

	revoked := make(chan struct{})
	var once sync.Once
	fp.beforePause = func() {
		once.Do(func() {
			if w.mu.TryLock() {
				// The pause is issued outside the worker's lock: the
				// rebalance can get in first.
				w.mu.Unlock()
				cons.revoked(context.Background(), nil, revoke)
				close(revoked)
				return
			}
			go func() {
				cons.revoked(context.Background(), nil, revoke)
				close(revoked)
			}()
		})
	}
	cons.enqueue(tp, []*kgo.Record{pauseTestRecord(tp, 0)})
	<-revoked
	require.False(t, fp.isPaused(tp), "revoked partition left paused")

	// Assigned again, it fetches and pauses as usual.
	w = assignOne(cons, tp)
	require.False(t, fp.isPaused(tp))
	cons.enqueue(tp, []*kgo.Record{pauseTestRecord(tp, 0)})
	require.False(t, drained(t, w, fp))
}

// Hammer revokes and assignments of a partition against enqueue (which may
// hold the worker of an earlier assignment): between a revoke and the next
// assignment, the partition is never paused.
func TestConsumerRevokeEnqueueHammer(t *testing.T) {
	t.Parallel()
	cons, fp := newPauseTestConsumer(t)
	tp := topicPartition{paymentsTopic, 0}
	parts := map[string][]int32{tp.topic: {tp.partition}}
	fp.beforePause = runtime.Gosched // widens any gap between the decision to pause and the pause
	assignOne(cons, tp)

	const cycles = 1000
	violations := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range cycles {
			cons.revoked(context.Background(), nil, parts)
			// A late pause of the revoked worker would land now.
			runtime.Gosched()
			if fp.isPaused(tp) {
				violations++
			}
			cons.assigned(context.Background(), nil, parts)
		}
		cons.revoked(context.Background(), nil, parts)
	}()
	var offset int64
	for {
		select {
		case <-done:
			require.Zero(t, violations, "revoked partition left paused, in %d of %d cycles", violations, cycles)
			require.False(t, fp.isPaused(tp), "partition left paused after the last revoke")
			return
		default:
		}
		cons.enqueue(tp, []*kgo.Record{pauseTestRecord(tp, offset)})
		offset++
	}
}

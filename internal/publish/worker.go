package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Item is one event to publish: its store id and its Kafka record (topic,
// partition, key, value and headers set).
type Item struct {
	// ID identifies the event in the store; it must be comparable.
	ID     any
	Record *kgo.Record
}

// Store reads and marks the events of the outbox.
type Store interface {
	// Pending returns up to limit events of tp that are neither published
	// nor failed, in publishing order, leaving out the events whose
	// partition key is in exclude (the keys held, see Hold).
	Pending(ctx context.Context, tp TopicPartition, limit int, exclude []string) ([]Item, error)
	// MarkPublished marks the events published at the given time.
	MarkPublished(ctx context.Context, ids []any, at time.Time) error
	// MarkFailed marks one event as refused for good by Kafka.
	MarkFailed(ctx context.Context, id any, cause error, at time.Time) error
	// FailedKeys returns the partition keys of tp that have a failed event
	// (the keys held under the hold policy, see Hold).
	FailedKeys(ctx context.Context, tp TopicPartition) ([]string, error)
}

// Producer sends records; *kgo.Client implements it.
type Producer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// Hooks observe or alter a worker's steps; for tests. Every field may be
// nil.
type Hooks struct {
	// BeforeMark runs after every record of a batch prefix was acknowledged
	// by Kafka and before the prefix is marked published. Returning false
	// skips the mark and stops the worker at once, as a crash at that point
	// would.
	BeforeMark func(tp TopicPartition, ids []any) bool
	// Produced runs after each produced batch with the batch, the time the
	// first record was handed to the producer, the time the last promise
	// resolved, and how many records Kafka acknowledged.
	Produced func(tp TopicPartition, items []Item, start, end time.Time, acked int)
}

// Stats counts what the workers of one publisher did. Safe for concurrent
// use.
type Stats struct {
	published atomic.Int64
	failed    atomic.Int64
	mu        sync.Mutex
	lastErr   string
	lastErrAt time.Time
}

// Published returns how many events were marked published.
func (s *Stats) Published() int64 { return s.published.Load() }

// Failed returns how many events were marked failed.
func (s *Stats) Failed() int64 { return s.failed.Load() }

// LastError returns the last error a worker met, or "".
func (s *Stats) LastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// LastErrorAt returns when the last error happened, or the zero time.
func (s *Stats) LastErrorAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErrAt
}

// SetError records err as the last error.
func (s *Stats) SetError(err error) {
	s.mu.Lock()
	s.lastErr = err.Error()
	s.lastErrAt = time.Now().UTC()
	s.mu.Unlock()
}

// IsPermanent reports whether Kafka refused a record for good, so that
// retrying it as it was sent can never succeed. Kafka gives these errors
// to a whole produce batch (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
// INVALID_RECORD, CORRUPT_MESSAGE describe the batch, not one record), so
// such an error proves a record guilty only when it was sent on its own:
// the worker then marks it failed; otherwise it sends the batch's records
// again one at a time (see Worker).
func IsPermanent(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) ||
		errors.Is(err, kerr.CorruptMessage) ||
		errors.Is(err, kerr.InvalidTopicException)
}

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	Store    Store
	Producer Producer
	Lease    *Lease
	// BatchSize caps the events read, produced and marked per round.
	BatchSize int
	// Marker, when set, lets the worker follow the change stream (see
	// Worker): it marks what the worker produced from the stream. Without
	// it the worker only scans.
	Marker *Marker
	// StreamBuffer caps the events of a partition received from the
	// change stream and not produced yet; beyond it they are dropped and
	// the worker scans instead. Defaults to 4 * BatchSize.
	StreamBuffer int
	// StreamBufferBytes caps the same buffer by the size of its records
	// (keys, values and headers). Defaults to 16 MiB.
	StreamBufferBytes int
	// Backoff spaces retries after errors.
	Backoff retry.Backoff
	// Rescan is the period of the safety scan when no wake-up comes. The
	// worker also re-reads its partition's failed keys at each rescan when
	// Hold is set.
	Rescan time.Duration
	// Hold makes an event Kafka refused for good hold the later events of
	// its partition key (see Worker). Without it the later events are
	// published without it.
	Hold bool
	// HoldRecheck is how often a worker that holds keys re-reads its
	// partition's failed keys, to learn that an operator retried or
	// discarded a failed event. Defaults to Rescan.
	HoldRecheck time.Duration
	// MarkTimeout bounds marking a batch published on graceful stop.
	MarkTimeout time.Duration
	// StopTimeout bounds a graceful Stop: when the batch in flight has not
	// finished by then (Kafka unreachable, and the producer neither
	// delivers nor fails its records), the worker is killed instead, as
	// Kill does: nothing more is marked, so the batch is published again
	// by the next owner (duplicates, never loss). 0 means no bound.
	StopTimeout time.Duration
	Logger      *slog.Logger
	Stats       *Stats
	Hooks       Hooks
}

// Worker publishes the events of one partition, one batch at a time. A
// batch is produced whole; its acknowledged prefix is marked published; a
// record that failed transiently and everything after it is produced again
// in the next round (duplicates are possible, reordering of first
// deliveries is not: the idempotent producer fails every later record of
// the partition when one fails).
//
// Refusals for good (IsPermanent) are judged per record, not per batch:
// from the first refused record on, the records of the batch are sent again
// one at a time, in order, and only a record refused on its own is marked
// failed (see publish). With WorkerConfig.Hold a failed event also holds
// the later events of its partition key until it is retried or discarded
// (see holds).
//
// A worker reads its events in one of two modes:
//
//   - Scanning: it reads the partition's unpublished events from the store
//     in publishing order, produces them and marks them before reading
//     again. Every worker starts here, and returns here after any doubt
//     (stream closed, events dropped, produce failure, periodic rescan).
//   - Following: it produces the events the change stream delivers (the
//     stream's documents, in commit order) without reading the store, and
//     hands the acknowledged ids to the Marker.
//
// The switch from scanning to following is where events could be lost or
// duplicated, so it follows one rule. A reset (the stream opened, or the
// stream buffer overflowed) empties the buffer; from then on every
// committed event of the partition reaches the buffer through the stream.
// A scan that began after the last reset and returned less than a full
// batch has read every event committed before it began. Together they
// cover every event, so the worker switches to following after such a
// scan; buffered events that a scan already produced are skipped (the
// worker remembers the ids it produced recently).
type Worker struct {
	tp   TopicPartition
	cfg  *WorkerConfig
	wake chan struct{}
	stop chan struct{} // closed for a graceful stop
	ctx  context.Context
	kill context.CancelFunc // hard stop
	done chan struct{}
	once sync.Once

	// Shared with the watcher, under mu.
	mu        sync.Mutex
	streamID  uint64 // the stream that covers this partition, 0 for none
	following bool
	epoch     uint64 // incremented by every reset
	buffer    []Item // events from the stream, not produced yet
	bufBytes  int    // record bytes in buffer

	// Owned by the worker goroutine.
	recent    recentIDs
	unflushed bool // ids handed to the Marker since the last Flush
	holds     holds
}

// NewWorker returns a worker for tp; Start runs it.
func NewWorker(tp TopicPartition, cfg *WorkerConfig) *Worker {
	ctx, kill := context.WithCancel(context.Background())
	w := &Worker{
		tp:   tp,
		cfg:  cfg,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		ctx:  ctx,
		kill: kill,
		done: make(chan struct{}),
	}
	if cfg.Marker != nil {
		// The buffer holds at most this many events to check.
		w.recent = recentIDs{max: w.bufferCap(), set: map[any]struct{}{}}
	}
	return w
}

// Start starts the worker's goroutine. It begins with a scan of the
// partition's backlog.
func (w *Worker) Start() { go w.run() }

// Wake asks the worker to look for new events. It never blocks.
func (w *Worker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Stop stops the worker gracefully: the batch in flight is finished and
// marked (bounded by the producer's delivery timeout and MarkTimeout), no
// new batch starts. It returns when the goroutine has exited.
func (w *Worker) Stop() {
	w.once.Do(func() { close(w.stop) })
	if w.cfg.StopTimeout > 0 {
		t := time.NewTimer(w.cfg.StopTimeout)
		select {
		case <-w.done:
		case <-t.C:
			w.cfg.Logger.Warn("outbox publisher: graceful stop timed out; abandoning the batch in flight (it is published again)",
				"partition", w.tp.String(), "timeout", w.cfg.StopTimeout)
			w.kill()
		}
		t.Stop()
	}
	<-w.done
	w.kill()
}

// Kill stops the worker at once: unsent records of the batch in flight are
// cancelled and nothing more is marked. It returns when the goroutine has
// exited.
func (w *Worker) Kill() {
	w.kill()
	<-w.done
}

func (w *Worker) stopping() bool {
	select {
	case <-w.stop:
		return true
	case <-w.ctx.Done():
		return true
	default:
		return false
	}
}

// sleep waits d, or less when the worker stops; it reports whether the
// worker should go on.
func (w *Worker) sleep(d time.Duration) bool {
	return retry.Sleep(w.ctx, w.stop, d)
}

func (w *Worker) fail(attempt *int, what string, err error) bool {
	w.cfg.Stats.SetError(fmt.Errorf("%s %s: %w", what, w.tp, err))
	d := w.cfg.Backoff.Delay(*attempt)
	*attempt++
	w.cfg.Logger.Warn("outbox publisher: retrying", "partition", w.tp.String(), "step", what, "error", err, "retry_in", d)
	return w.sleep(d)
}

func (w *Worker) run() {
	defer close(w.done)
	attempt := 0
	rescan := time.NewTimer(w.cfg.Rescan)
	defer rescan.Stop()
	// wait waits for a wake-up; a rescan tick resets a following worker.
	wait := func() bool {
		holdC, stopHold := w.holdTimer()
		defer stopHold()
		select {
		case <-holdC: // the loop re-reads the held keys
		case <-w.wake:
		case <-rescan.C:
			rescan.Reset(w.cfg.Rescan)
			w.reset(0)
		case <-w.stop:
			return false
		case <-w.ctx.Done():
			return false
		}
		return true
	}
loop:
	for !w.stopping() {
		if _, ok := w.cfg.Lease.Wait(w.ctx, w.stop); !ok {
			break loop
		}
		if w.holdsDue() {
			if err := w.refreshHolds(); err != nil {
				if w.stopping() || !w.fail(&attempt, "read the failed keys of", err) {
					break loop
				}
				continue
			}
		}
		if items, ok := w.takeBuffered(); ok {
			// Following the stream. The safety rescan also runs when the
			// stream never pauses.
			select {
			case <-rescan.C:
				rescan.Reset(w.cfg.Rescan)
				w.reset(0)
				continue
			default:
			}
			if len(items) == 0 {
				if !wait() {
					break loop
				}
				continue
			}
			r := w.publish(items, true)
			switch r {
			case roundExit:
				return
			case roundDone:
				attempt = 0
				continue
			}
			// In doubt: scan again.
			w.reset(0)
			if r == roundLapsed {
				continue
			}
			if !w.retryAfter(&attempt) {
				break loop
			}
			continue
		}

		// Scanning. Marks still waiting in the Marker would make the scan
		// return their events again.
		if w.unflushed {
			if err := w.flushMarks(); err != nil {
				if w.stopping() || !w.fail(&attempt, "mark events published of", err) {
					break loop
				}
				continue
			}
		}
		epoch := w.epochNow()
		items, err := w.cfg.Store.Pending(w.ctx, w.tp, w.cfg.BatchSize, w.heldKeys())
		if err != nil {
			if w.stopping() || !w.fail(&attempt, "read pending events of", err) {
				break loop
			}
			continue
		}
		if len(items) > 0 {
			switch w.publish(items, false) {
			case roundExit:
				return
			case roundLapsed:
				continue // wait for the lease again
			case roundNone:
				if !w.retryAfter(&attempt) {
					break loop
				}
				continue
			case roundPartial:
				attempt = 0
				continue
			case roundDone:
				attempt = 0
				if len(items) == w.cfg.BatchSize {
					continue // more may be waiting
				}
			}
		}
		attempt = 0
		if w.follow(epoch) {
			continue
		}
		if !rescan.Stop() {
			select {
			case <-rescan.C:
			default:
			}
		}
		rescan.Reset(w.cfg.Rescan)
		if !wait() {
			break loop
		}
	}
	// Graceful stop: the next owner must not scan what we produced.
	if w.unflushed && w.ctx.Err() == nil {
		if err := w.flushMarks(); err != nil {
			w.cfg.Stats.SetError(fmt.Errorf("mark events published of %s: %w", w.tp, err))
		}
	}
}

// retryAfter logs a produce failure (its error is in Stats) and waits
// before the retry; it reports whether the worker should go on.
func (w *Worker) retryAfter(attempt *int) bool {
	d := w.cfg.Backoff.Delay(*attempt)
	*attempt++
	w.cfg.Logger.Warn("outbox publisher: produce failed; retrying", "partition", w.tp.String(),
		"error", w.cfg.Stats.LastError(), "retry_in", d)
	return w.sleep(d)
}

// flushMarks writes the ids this worker handed to the Marker, bounded by
// MarkTimeout.
func (w *Worker) flushMarks() error {
	ctx, cancel := context.WithTimeout(w.ctx, w.cfg.MarkTimeout)
	defer cancel()
	if err := w.cfg.Marker.Flush(ctx); err != nil {
		return err
	}
	w.unflushed = false
	return nil
}

// round is the outcome of one batch.
type round int

const (
	roundDone    round = iota // every record acknowledged or refused for good
	roundPartial              // a prefix done, then a transient failure
	roundNone                 // nothing done: the first record failed transiently
	roundLapsed               // the lease lapsed before the batch started
	roundExit                 // the worker must exit
)

// publish produces one batch and marks what Kafka acknowledged (at once,
// or through the Marker when deferred) and what it refused for good.
//
// Kafka refuses whole produce batches (see IsPermanent), and kgo then
// fails every record of the batch, and the records after it, with that
// error. So a refusal proves nothing about a record sent together with
// others: from the first refused record on, every record not acknowledged
// is sent again on its own, in order, and only a record refused on its own
// is marked failed. Innocent records are published in their order; the
// cost, one round trip per record, is paid only after a refusal.
func (w *Worker) publish(items []Item, deferred bool) round {
	items = w.withoutHeld(items)
	if len(items) == 0 {
		return roundDone
	}
	if !w.cfg.Lease.Valid() {
		return roundLapsed
	}
	bctx, cancel := w.cfg.Lease.Bind(w.ctx)
	defer cancel()
	start := time.Now()
	errs, ok := w.produce(bctx, items)
	if !ok {
		return roundExit // lost: do not wait, do not mark
	}
	// Walk the batch in order: acknowledged records are done; from the
	// first refusal on, records are sent alone; a transient failure ends
	// the round (it and everything after it are produced again next round).
	var acked []any
	failed, skipped := 0, 0
	firstErr := -1
	alone, isolating := len(items) == 1, false
	for i, it := range items {
		err := errs[i]
		key := string(it.Record.Key)
		if err == nil {
			if w.isHeld(key) {
				// Cannot happen with kgo's idempotent producer (a refused
				// batch fails every later record of the partition); if it
				// did, the record is in Kafka and must be marked.
				w.cfg.Logger.Warn("outbox publisher: Kafka acknowledged an event after refusing an earlier event of its key",
					"partition", w.tp.String(), "id", it.ID)
			}
			acked = append(acked, it.ID)
			continue
		}
		if w.isHeld(key) {
			// An earlier event of this key was refused in this round: this
			// one waits behind it, unpublished.
			skipped++
			continue
		}
		if !isolating && !IsPermanent(err) {
			firstErr = i
			break
		}
		if !alone {
			isolating = true
			if err = w.produceOne(bctx, it); errors.Is(err, errKilled) {
				return roundExit
			}
			if err == nil {
				acked = append(acked, it.ID)
				continue
			}
			if !IsPermanent(err) {
				errs[i] = err
				firstErr = i
				break
			}
		}
		// Refused on its own: failed for good.
		if !w.markFailed(it, err) {
			return roundExit
		}
		failed++
	}
	if h := w.cfg.Hooks.Produced; h != nil {
		h(w.tp, items, start, time.Now(), len(acked))
	}
	if len(acked) > 0 {
		w.recent.add(acked)
		if h := w.cfg.Hooks.BeforeMark; h != nil && !h(w.tp, acked) {
			w.kill()
			return roundExit
		}
		if deferred {
			w.cfg.Marker.Add(acked)
			w.unflushed = true
		} else {
			if !w.mark(func(ctx context.Context) error { return w.cfg.Store.MarkPublished(ctx, acked, time.Now()) }) {
				return roundExit
			}
			w.cfg.Stats.published.Add(int64(len(acked)))
		}
	}
	if firstErr >= 0 {
		err := errs[firstErr]
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			// Kafka did not acknowledge before the lease-bound deadline; the
			// producer's last error is lost in the cancellation.
			err = fmt.Errorf("not acknowledged before the batch deadline (lease expiry or stop): %w", err)
		}
		w.cfg.Stats.SetError(fmt.Errorf("produce to %s: %w", w.tp, err))
		if len(acked) > 0 || failed > 0 || skipped > 0 {
			return roundPartial
		}
		return roundNone
	}
	return roundDone
}

// produce hands items to the producer and waits for every promise. It
// reports false when the worker was killed meanwhile (the promises are
// then not waited for).
//
// The first failed record cancels the context of the whole batch. kgo's
// idempotent producer may have a later record of the partition in a
// request of its own, or buffered, when a batch is refused; after the
// refusal it bumps the producer epoch and would write that record, ahead
// of the refused ones that publish then sends again: out of order. A batch
// whose first record's context is done is failed instead, when kgo knows
// it is not written (before it is sent, or answered with an error), and
// the worker sends it again in order.
func (w *Worker) produce(ctx context.Context, items []Item) ([]error, bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	wg.Add(len(items))
	for i, it := range items {
		it.Record.Context = nil
		w.cfg.Producer.Produce(ctx, it.Record, func(_ *kgo.Record, err error) {
			errs[i] = err
			if err != nil {
				cancel()
			}
			wg.Done()
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
		return errs, true
	case <-w.ctx.Done():
		return nil, false
	}
}

// produceOne sends a copy of it's record on its own: nothing else of the
// partition is in flight (the worker waits for every promise of a batch),
// so Kafka's answer is about this record alone.
// It returns errKilled when the worker was killed meanwhile.
func (w *Worker) produceOne(ctx context.Context, it Item) error {
	r := it.Record
	one := Item{ID: it.ID, Record: &kgo.Record{
		Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers,
	}}
	// A context of its own marks the record as a produce call of its own
	// for Producers that batch per call.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs, ok := w.produce(ctx, []Item{one})
	if !ok {
		return errKilled
	}
	return errs[0]
}

// errKilled reports that the worker was killed while it waited.
var errKilled = errors.New("outbox publisher: worker killed")

// markFailed marks an event Kafka refused on its own as failed and, under
// the hold policy, holds its key. It reports false when the worker must
// exit.
func (w *Worker) markFailed(it Item, cause error) bool {
	w.cfg.Logger.Error("outbox publisher: Kafka refused an event for good; marked failed",
		"partition", w.tp.String(), "id", it.ID, "error", cause, "holds_key", w.cfg.Hold)
	w.cfg.Stats.SetError(fmt.Errorf("produce to %s: event %v refused: %w", w.tp, it.ID, cause))
	if !w.mark(func(ctx context.Context) error { return w.cfg.Store.MarkFailed(ctx, it.ID, cause, time.Now()) }) {
		return false
	}
	w.cfg.Stats.failed.Add(1)
	w.hold(string(it.Record.Key))
	return true
}

// mark runs a store write, retrying with backoff: the records are in Kafka,
// so giving up would only cause duplicates. It gives up when the worker is
// killed, or when it stops gracefully and MarkTimeout has passed. It
// reports whether the write succeeded.
func (w *Worker) mark(write func(ctx context.Context) error) bool {
	deadline := time.Now().Add(w.cfg.MarkTimeout)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.MarkTimeout)
		err := write(ctx)
		cancel()
		if err == nil {
			return true
		}
		w.cfg.Stats.SetError(fmt.Errorf("mark events of %s: %w", w.tp, err))
		w.cfg.Logger.Warn("outbox publisher: marking failed; retrying", "partition", w.tp.String(), "error", err)
		select {
		case <-w.stop:
			if time.Now().After(deadline) {
				return false
			}
		default:
		}
		// Not cut short by stop: a stopping worker still marks until the
		// deadline.
		if !retry.Sleep(w.ctx, nil, w.cfg.Backoff.Delay(attempt)) {
			return false
		}
	}
}

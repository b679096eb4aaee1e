package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Item is one event to publish: its store id and its Kafka record (topic,
// partition, key, value and headers set).
type Item struct {
	ID     any
	Record *kgo.Record
}

// Store reads and marks the events of the outbox.
type Store interface {
	// Pending returns up to limit events of tp that are neither published
	// nor failed, in publishing order.
	Pending(ctx context.Context, tp TopicPartition, limit int) ([]Item, error)
	// MarkPublished marks the events published at the given time.
	MarkPublished(ctx context.Context, ids []any, at time.Time) error
	// MarkFailed marks one event as refused for good by Kafka.
	MarkFailed(ctx context.Context, id any, cause error, at time.Time) error
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
	// Produced runs after each produced batch with the time the first
	// record was handed to the producer, the time the last promise
	// resolved, and how many records Kafka acknowledged.
	Produced func(tp TopicPartition, start, end time.Time, acked int)
}

// Stats counts what the workers of one publisher did. Safe for concurrent
// use.
type Stats struct {
	published atomic.Int64
	failed    atomic.Int64
	mu        sync.Mutex
	lastErr   string
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

// SetError records err as the last error.
func (s *Stats) SetError(err error) {
	s.mu.Lock()
	s.lastErr = err.Error()
	s.mu.Unlock()
}

// IsPermanent reports whether Kafka refuses a record for good, so that
// retrying it can never succeed: the event is marked failed instead of
// blocking its partition.
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
	// Backoff spaces retries after errors.
	Backoff Backoff
	// Rescan is the period of the safety scan when no wake-up comes.
	Rescan time.Duration
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

// Worker publishes the events of one partition, one batch at a time, in
// store order. A batch is produced whole, then its acknowledged prefix is
// marked published in one write; a record that failed transiently and
// everything after it is produced again in the next round (duplicates are
// possible, reordering of first deliveries is not: the idempotent producer
// fails every later record of the partition when one fails).
type Worker struct {
	tp   TopicPartition
	cfg  *WorkerConfig
	wake chan struct{}
	stop chan struct{} // closed for a graceful stop
	ctx  context.Context
	kill context.CancelFunc // hard stop
	done chan struct{}
	once sync.Once
}

// NewWorker returns a worker for tp; Start runs it.
func NewWorker(tp TopicPartition, cfg *WorkerConfig) *Worker {
	ctx, kill := context.WithCancel(context.Background())
	return &Worker{
		tp:   tp,
		cfg:  cfg,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		ctx:  ctx,
		kill: kill,
		done: make(chan struct{}),
	}
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
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stop:
		return false
	case <-w.ctx.Done():
		return false
	}
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
	for !w.stopping() {
		if _, ok := w.cfg.Lease.Wait(w.ctx, w.stop); !ok {
			return
		}
		items, err := w.cfg.Store.Pending(w.ctx, w.tp, w.cfg.BatchSize)
		if err != nil {
			if w.stopping() || !w.fail(&attempt, "read pending events of", err) {
				return
			}
			continue
		}
		if len(items) > 0 {
			switch w.publish(items) {
			case roundExit:
				return
			case roundLapsed:
				continue // wait for the lease again
			case roundNone:
				// The error is in Stats already.
				d := w.cfg.Backoff.Delay(attempt)
				attempt++
				w.cfg.Logger.Warn("outbox publisher: produce failed; retrying", "partition", w.tp.String(),
					"error", w.cfg.Stats.LastError(), "retry_in", d)
				if !w.sleep(d) {
					return
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
		if !rescan.Stop() {
			select {
			case <-rescan.C:
			default:
			}
		}
		rescan.Reset(w.cfg.Rescan)
		select {
		case <-w.wake:
		case <-rescan.C:
		case <-w.stop:
			return
		case <-w.ctx.Done():
			return
		}
	}
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

// publish produces one batch and marks what Kafka acknowledged.
func (w *Worker) publish(items []Item) round {
	if !w.cfg.Lease.Valid() {
		return roundLapsed
	}
	bctx, cancel := w.cfg.Lease.Bind(w.ctx)
	defer cancel()
	start := time.Now()
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	wg.Add(len(items))
	for i, it := range items {
		it.Record.Context = nil
		w.cfg.Producer.Produce(bctx, it.Record, func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-w.ctx.Done():
		return roundExit // lost: do not wait, do not mark
	}
	// Acknowledged prefix: everything up to the first transient failure.
	// Permanent failures inside it are marked failed; they never reach
	// Kafka, so the order of what does is kept.
	var acked []any
	var failed []int
	firstErr := -1
	for i, err := range errs {
		switch {
		case err == nil:
			acked = append(acked, items[i].ID)
		case IsPermanent(err):
			failed = append(failed, i)
		default:
			firstErr = i
		}
		if firstErr >= 0 {
			break
		}
	}
	if h := w.cfg.Hooks.Produced; h != nil {
		h(w.tp, start, time.Now(), len(acked))
	}
	if len(acked) > 0 {
		if h := w.cfg.Hooks.BeforeMark; h != nil && !h(w.tp, acked) {
			w.kill()
			return roundExit
		}
		if !w.mark(func(ctx context.Context) error { return w.cfg.Store.MarkPublished(ctx, acked, time.Now()) }) {
			return roundExit
		}
		w.cfg.Stats.published.Add(int64(len(acked)))
	}
	for _, i := range failed {
		cause := errs[i]
		w.cfg.Logger.Error("outbox publisher: Kafka refused an event for good; marked failed",
			"partition", w.tp.String(), "id", items[i].ID, "error", cause)
		w.cfg.Stats.SetError(fmt.Errorf("produce to %s: event %v refused: %w", w.tp, items[i].ID, cause))
		if !w.mark(func(ctx context.Context) error { return w.cfg.Store.MarkFailed(ctx, items[i].ID, cause, time.Now()) }) {
			return roundExit
		}
		w.cfg.Stats.failed.Add(1)
	}
	if firstErr >= 0 {
		err := errs[firstErr]
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			// Kafka did not acknowledge before the lease-bound deadline; the
			// producer's last error is lost in the cancellation.
			err = fmt.Errorf("not acknowledged before the batch deadline (lease expiry or stop): %w", err)
		}
		w.cfg.Stats.SetError(fmt.Errorf("produce to %s: %w", w.tp, err))
		if len(acked) > 0 || len(failed) > 0 {
			return roundPartial
		}
		return roundNone
	}
	return roundDone
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
		t := time.NewTimer(w.cfg.Backoff.Delay(attempt))
		select {
		case <-t.C:
		case <-w.ctx.Done():
			t.Stop()
			return false
		}
	}
}

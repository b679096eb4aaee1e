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
	// ID identifies the event in the store; it must be comparable unless
	// Err is set.
	ID     any
	Record *kgo.Record
	// Err, when set, says that the event's document could not be read: the
	// worker marks it failed with this cause, in its place in the batch,
	// and holds its partition key (Record.Key, when one could be read) as
	// for an event Kafka refused. Record then carries no value.
	Err error
}

// Limit bounds one read of pending events.
type Limit struct {
	// Events caps the events read.
	Events int
	// Bytes caps the size of the documents read, past the first one (an
	// event larger than Bytes is read alone).
	Bytes int
}

// Store reads and marks the events of the outbox.
type Store interface {
	// Pending returns the events of tp that are neither published nor
	// failed, in publishing order, within limit, leaving out the events
	// whose partition key is in exclude (the keys held, see Hold). more
	// reports that the limit cut the read short: more events may be
	// waiting. A document that cannot be read is returned as an Item with
	// Err set; it never fails the read.
	Pending(ctx context.Context, tp TopicPartition, limit Limit, exclude []string) (items []Item, more bool, err error)
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
	// Failed runs after an event was marked failed: refused for good by
	// Kafka, or its document could not be read (it.Err set).
	Failed func(tp TopicPartition, it Item, cause error)
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
	// Solo, when set, sends the records that must be judged on their own:
	// a record too large for Producer's batches (see MaxBatchBytes) and a
	// record of a batch Kafka refused. Its own size limit should be what
	// the broker accepts at most, so that Kafka, not the client, judges
	// the record. Defaults to Producer.
	Solo Producer
	// MaxBatchBytes, when set, returns the largest record batch Producer
	// builds for a Kafka topic (its ProducerBatchMaxBytes). A record whose
	// batch alone would be larger (see RecordBatchBytes) is never handed
	// to Producer, which would refuse it on the client while still sending
	// the records after it: it goes through Solo.
	MaxBatchBytes func(topic string) int
	// SizeRefused, when set, is called when Kafka or the producer refused a
	// record of topic for its size; it must not block. The publisher reads
	// the topic's limit again.
	SizeRefused func(topic string)
	// BatchSize caps the events read, produced and marked per round.
	BatchSize int
	// BatchBytes caps the bytes of the documents a scan reads per round
	// (past the first event). Defaults to 16 MiB.
	BatchBytes int
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
// batch is produced in waves (see waves): each wave holds at most one event
// of a partition key, the key's first event not settled yet, and the next
// wave starts only when every record of the previous one was acknowledged
// or refused for good. So no event of a key is ever in flight while an
// earlier event of its key may still fail, whatever the timing: a record
// refused (on the client or by Kafka) can never be overtaken by a later
// record of its key. Events of distinct keys, and keyless events, which
// promise no order, share a wave, so a batch of distinct keys is produced
// at once; n events of one key in a batch cost n round trips. Acknowledged
// records are marked published; after a transient failure no further wave
// starts, and what was not acknowledged is produced again in the next
// round (duplicates are possible, reordering of first deliveries is not).
//
// Refusals for good (IsPermanent) are judged per record, not per batch:
// a record of a refused wave is sent again on its own, through
// WorkerConfig.Solo, and only a record refused on its own is marked failed
// (see publish). A record too large for the producer's batches is always
// sent on its own (WorkerConfig.MaxBatchBytes). With WorkerConfig.Hold a
// failed event also holds the later events of its partition key until it
// is retried or discarded (see holds); a keyless event holds nothing.
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
		items, more, err := w.cfg.Store.Pending(w.ctx, w.tp, w.scanLimit(), w.heldKeys())
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
				if more {
					// The limit (events or bytes) cut the read: more
					// wait, read them now rather than at the next rescan.
					continue
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
	roundDone    round = iota // every record acknowledged, refused for good or held
	roundPartial              // some records settled, others not (a transient failure, or a graceful stop)
	roundNone                 // nothing settled: transient failures only
	roundLapsed               // the lease lapsed before the batch started
	roundExit                 // the worker must exit
)

// publish produces one batch, in waves, and marks what Kafka acknowledged
// (at once, or through the Marker when deferred) and what it refused for
// good.
//
// Kafka refuses whole produce batches (see IsPermanent), and kgo then
// fails every record of the batch, and the records after it, with that
// error. So a refusal proves nothing about a record sent together with
// others: a record of a refused wave is sent again on its own, and only a
// record refused on its own is marked failed. Innocent records are
// published; the cost, one round trip per record, is paid only after a
// refusal.
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
	var res roundResult
	for i, wave := range waves(items) {
		if i > 0 && w.stopping() {
			// A graceful stop finishes the wave in flight only; the rest
			// stays pending for the next owner.
			res.unsent = true
			break
		}
		if !w.wave(bctx, wave, &res) {
			return roundExit
		}
		if res.err != nil {
			break // Kafka is in trouble: the rest waits for the next round
		}
	}
	if h := w.cfg.Hooks.Produced; h != nil {
		h(w.tp, items, start, time.Now(), len(res.acked))
	}
	if len(res.acked) > 0 {
		acked := res.acked
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
	if res.err != nil {
		err := res.err
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			// Kafka did not acknowledge before the lease-bound deadline; the
			// producer's last error is lost in the cancellation.
			err = fmt.Errorf("not acknowledged before the batch deadline (lease expiry or stop): %w", err)
		}
		w.cfg.Stats.SetError(fmt.Errorf("produce to %s: %w", w.tp, err))
	}
	if res.err == nil && !res.unsent {
		return roundDone
	}
	if len(res.acked) > 0 || res.failed > 0 || res.skipped > 0 {
		return roundPartial
	}
	return roundNone
}

// roundResult is what the waves of one round did.
type roundResult struct {
	acked           []any
	failed, skipped int
	err             error // the first transient failure
	unsent          bool  // waves left unsent (graceful stop)
}

// waves splits items (in publishing order) into waves: wave n holds the
// n-th event of each partition key, in publishing order, and every keyless
// event goes to the first wave (keyless events promise no order).
func waves(items []Item) [][]Item {
	if len(items) == 1 {
		return [][]Item{items}
	}
	seen := make(map[string]int, len(items))
	var out [][]Item
	for _, it := range items {
		n := 0
		if key := string(it.Record.Key); key != "" {
			n = seen[key]
			seen[key] = n + 1
		}
		if n == len(out) {
			out = append(out, nil)
		}
		out[n] = append(out[n], it)
	}
	return out
}

// wave produces one wave (distinct keys) and settles every record of it:
// acknowledged, refused for good (marked failed), held (an earlier event
// of its key failed in this round), or failed transiently (res.err). It
// reports false when the worker must exit.
func (w *Worker) wave(ctx context.Context, items []Item, res *roundResult) bool {
	var batch, alone []Item
	for _, it := range items {
		switch {
		case w.isHeld(string(it.Record.Key)):
			// An earlier event of this key was refused in this round: this
			// one waits behind it, unpublished.
			res.skipped++
		case it.Err != nil:
			if !w.markFailed(it, it.Err) {
				return false
			}
			res.failed++
		case w.tooLargeForBatch(it):
			alone = append(alone, it)
		default:
			batch = append(batch, it)
		}
	}
	errs, ok := w.produce(ctx, w.cfg.Producer, batch)
	if !ok {
		return false
	}
	for i, it := range batch {
		err := errs[i]
		if err != nil && IsPermanent(err) && (len(batch) > 1 || w.cfg.Solo != nil && errors.Is(err, kerr.MessageTooLarge)) {
			// Refused with others, or maybe by the producer's own size
			// limit: judge it alone, unless Kafka is in trouble (then it
			// waits for the next round, as the transient failures do).
			w.sizeRefused(it, err)
			if res.err != nil {
				continue
			}
			if err = w.produceOne(ctx, it); errors.Is(err, errKilled) {
				return false
			}
		}
		if !w.settle(it, err, res) {
			return false
		}
	}
	for _, it := range alone {
		if res.err != nil {
			break // each would wait for the delivery timeout: next round
		}
		err := w.produceOne(ctx, it)
		if errors.Is(err, errKilled) {
			return false
		}
		if !w.settle(it, err, res) {
			return false
		}
	}
	return true
}

// settle records the outcome of a record that was judged on its own (or
// acknowledged): it reports false when the worker must exit.
func (w *Worker) settle(it Item, err error, res *roundResult) bool {
	switch {
	case err == nil:
		res.acked = append(res.acked, it.ID)
	case IsPermanent(err):
		// Refused on its own: failed for good.
		w.sizeRefused(it, err)
		if !w.markFailed(it, err) {
			return false
		}
		res.failed++
	default:
		if res.err == nil {
			res.err = err
		}
	}
	return true
}

// tooLargeForBatch reports whether the producer would refuse it on the
// client (see WorkerConfig.MaxBatchBytes).
func (w *Worker) tooLargeForBatch(it Item) bool {
	if w.cfg.MaxBatchBytes == nil {
		return false
	}
	return RecordBatchBytes(it.Record) > w.cfg.MaxBatchBytes(it.Record.Topic)
}

// sizeRefused reports a refusal that names the record's size.
func (w *Worker) sizeRefused(it Item, err error) {
	if w.cfg.SizeRefused != nil && (errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)) {
		w.cfg.SizeRefused(it.Record.Topic)
	}
}

// RecordBatchBytes bounds from above the size of a record batch that holds
// r alone, as kgo counts it against ProducerBatchMaxBytes and as Kafka
// counts it against a topic's max.message.bytes before compression: the
// batch header, the record's framing (varints at their widest) and its
// key, value and headers.
func RecordBatchBytes(r *kgo.Record) int {
	const (
		batchHeader = 65 // kgo's recordBatchOverhead: Kafka's 61 and an array length
		framing     = 5 + 1 + 10 + 5 + 5 + 5 + 5
	)
	n := batchHeader + framing + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// produce hands items to p and waits for every promise. It reports false
// when the worker was killed meanwhile (the promises are then not waited
// for). The records of a wave have distinct keys, so a failed record does
// not cancel the others: each is judged on its own outcome.
func (w *Worker) produce(ctx context.Context, p Producer, items []Item) ([]error, bool) {
	if len(items) == 0 {
		return nil, true
	}
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	wg.Add(len(items))
	for i, it := range items {
		it.Record.Context = nil
		p.Produce(ctx, it.Record, func(_ *kgo.Record, err error) {
			errs[i] = err
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

// produceOne sends a copy of it's record on its own, through Solo:
// nothing else of the partition is in flight (the worker waits for every
// promise of a wave), so Kafka's answer is about this record alone.
// It returns errKilled when the worker was killed meanwhile.
func (w *Worker) produceOne(ctx context.Context, it Item) error {
	r := it.Record
	one := Item{ID: it.ID, Record: &kgo.Record{
		Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers,
	}}
	p := w.cfg.Solo
	if p == nil {
		p = w.cfg.Producer
	}
	// A context of its own marks the record as a produce call of its own
	// for Producers that batch per call.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs, ok := w.produce(ctx, p, []Item{one})
	if !ok {
		return errKilled
	}
	return errs[0]
}

// errKilled reports that the worker was killed while it waited.
var errKilled = errors.New("outbox publisher: worker killed")

// markFailed marks an event failed (refused on its own by Kafka, or its
// document unreadable: it.Err) and, under the hold policy, holds its key.
// It reports false when the worker must exit.
func (w *Worker) markFailed(it Item, cause error) bool {
	what, msg := "refused", "outbox publisher: Kafka refused an event for good; marked failed"
	if it.Err != nil {
		what, msg = "unreadable", "outbox publisher: an outbox document cannot be read; marked failed"
	}
	key := string(it.Record.Key)
	w.cfg.Logger.Error(msg, "partition", w.tp.String(), "id", it.ID, "error", cause, "holds_key", w.cfg.Hold && key != "")
	w.cfg.Stats.SetError(fmt.Errorf("produce to %s: event %v %s: %w", w.tp, it.ID, what, cause))
	if !w.mark(func(ctx context.Context) error { return w.cfg.Store.MarkFailed(ctx, it.ID, cause, time.Now()) }) {
		return false
	}
	w.cfg.Stats.failed.Add(1)
	if h := w.cfg.Hooks.Failed; h != nil {
		h(w.tp, it, cause)
	}
	w.hold(key)
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

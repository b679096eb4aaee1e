package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The consumer.
//
// One kgo client in Config.ConsumerGroup polls the topics of the registered
// handlers with automatic commits off. Each assigned partition gets a worker
// goroutine with a queue: the poll loop appends records, the worker handles
// them in order, up to Config.HandleBatchSize of them per MongoDB
// transaction (see handleBatch), and commits the offset after the last
// record of a drained batch, never before the transactions of the records
// it covers have committed. A worker whose queue grows past maxQueue records
// or maxQueueBytes has its partition's fetching paused, so one slow or
// failing partition never holds back the others or grows memory without
// bound.
//
// Goroutines and how they stop:
//   - The poll loop runs on runConsumer's goroutine (owned by Run). It is the
//     only caller of enqueue and stops when Run's context ends.
//   - The kgo client's rebalance callbacks (OnPartitionsAssigned, Revoked,
//     Lost; kgo runs them one at a time) start and stop the workers: one
//     goroutine per owned partition, in cons.workers. OnPartitionsRevoked
//     stops the revoked partitions' workers and waits for them (each finishes
//     the record in hand and commits); OnPartitionsLost stops them without
//     committing, since another member may own the partitions already.
//   - The lag poller (lag.go) is started and stopped by runConsumer; it
//     stops when Run's context ends.
//
// When Run's context ends, the poll loop and the lag poller stop, every
// worker finishes its record in hand and commits (bounded by drainTimeout),
// then the client leaves the group (waiting at most leaveTimeout for the
// coordinator).
//
// Pause state: each worker owns its partition's pause state (its paused
// flag, guarded by its mutex), and every kgo pause or resume call for the
// partition is made holding that mutex, together with the flag's change:
// enqueue pauses (queue over its bound), take resumes (the worker emptied
// the queue), stopWorkers resumes and closes the worker (revoked, lost,
// shutdown). So kgo's pause state always equals the flag; a worker idle
// with an empty queue never has its partition paused; a closed worker never
// pauses again, so no pause outlives the worker that made it (kgo keeps
// pauses across assignments), and a later worker of the same partition
// finds it resumed.

const (
	// A partition's fetching pauses when its queue holds maxQueue records
	// or maxQueueBytes of values, whichever comes first.
	maxQueue      = 5000
	maxQueueBytes = 8 << 20
	// fetchMaxWait bounds how long a fetch waits at the broker for data. A
	// fetch sent while partitions were paused waits this long before a
	// resumed partition's records can flow, so keep it short.
	fetchMaxWait = 500 * time.Millisecond
	drainTimeout = 30 * time.Second
)

type topicPartition struct {
	topic     string
	partition int32
}

// fetchMap is tp in the form kgo's pause and resume calls take.
func (tp topicPartition) fetchMap() map[string][]int32 {
	return map[string][]int32{tp.topic: {tp.partition}}
}

type consumer struct {
	c  *Client
	cl *kgo.Client
	// pauser pauses and resumes fetching: cl, or a fake in tests.
	pauser fetchPauser
	log    *slog.Logger
	// work is the context handlers run under. It outlives Run's context by
	// drainTimeout so in-flight handling can finish and commit.
	work context.Context

	mu      sync.Mutex
	workers map[topicPartition]*partitionWorker
}

// fetchPauser is the part of the kgo client that pauses and resumes the
// fetching of partitions; tests fake it.
type fetchPauser interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

type partitionWorker struct {
	tp   topicPartition
	cons *consumer
	wake chan struct{} // capacity 1: "the queue has records"
	stop chan struct{} // closed to stop after the record in hand
	done chan struct{} // closed when the worker goroutine returns
	// mu guards the fields below, and every pause or resume of tp's
	// fetching is called with it held (see the consumer's doc).
	mu    sync.Mutex
	queue []*kgo.Record
	// queuedBytes sums the values of the queued records.
	queuedBytes int
	next        int64 // offset after the last queued record: older records are stale
	// paused is true exactly when this worker has tp's fetching paused.
	paused bool
	// closed is set when the worker is stopped: enqueue drops records and
	// never pauses again, so a stopped worker leaves no pause behind.
	closed bool
	lost   bool // the partition was lost: do not commit
}

// runConsumer runs the consumer until ctx ends. It returns nil after a clean
// drain, or a fatal error.
func (c *Client) runConsumer(ctx context.Context) error {
	topics := c.subscribedTopics()
	if len(topics) == 0 {
		return nil
	}
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	cons := &consumer{c: c, log: c.cfg.Logger.With("component", "outbox.consumer"), work: work,
		workers: map[topicPartition]*partitionWorker{}}
	opts := append([]kgo.Opt{}, c.cfg.KafkaOptions...)
	opts = append(opts,
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.ConsumerGroup),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.HeartbeatInterval(c.cfg.HeartbeatInterval),
		c.groupHook(c.cfg.ConsumerGroup),
		kgo.OnPartitionsAssigned(cons.assigned),
		kgo.OnPartitionsRevoked(cons.revoked),
		kgo.OnPartitionsLost(cons.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("outbox: consumer: %w", err)
	}
	cons.cl = cl
	cons.pauser = cl
	c.tel.cons.Store(cons)
	defer c.tel.cons.Store(nil)
	// Re-drive requests (Admin.RequestRedrive) are served while consuming.
	defer c.startRedriveRequests(ctx, work)()
	defer func() {
		// Drain first, while still a member: every worker finishes the
		// record in hand and commits (bounded by drainTimeout). Then leave
		// with a bounded wait, and force the leave before Close: Close
		// leaves again with no deadline and blocks for as long as the
		// coordinator is unreachable.
		stopTimer := time.AfterFunc(drainTimeout, cancelWork)
		cons.stopAll(false)
		stopTimer.Stop()
		leaveCtx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
		_ = cl.LeaveGroupContext(leaveCtx)
		cancel()
		forced, force := context.WithCancel(context.Background())
		force()
		_ = cl.LeaveGroupContext(forced)
		cl.Close()
	}()
	// Deferred after the drain and Close above, so it stops before them: it
	// uses the client.
	defer cons.startLagPoller(ctx, topics)()
	for {
		fetches := cl.PollRecords(ctx, maxQueue)
		if ctx.Err() != nil {
			return nil
		}
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				cons.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			c.tel.noteHighWatermark(p.Topic, p.Partition, p.HighWatermark)
			if len(p.Records) > 0 {
				cons.enqueue(topicPartition{p.Topic, p.Partition}, p.Records)
			}
		})
	}
}

func (cons *consumer) enqueue(tp topicPartition, recs []*kgo.Record) {
	cons.mu.Lock()
	w := cons.workers[tp]
	cons.mu.Unlock()
	if w == nil {
		return // not owned any more; the next owner fetches from the committed offset
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		// Revoked or lost since the lookup: the next owner fetches from the
		// committed offset. Pausing now would outlive the worker.
		return
	}
	for _, r := range recs {
		// A poll that raced with a revoke and a new assignment of the same
		// partition may hand over records older than those already queued;
		// they are fetched again from the committed offset, so drop them
		// rather than break the partition's order.
		if r.Offset >= w.next {
			w.queue = append(w.queue, r)
			w.queuedBytes += len(r.Value)
			w.next = r.Offset + 1
		}
	}
	if (len(w.queue) >= maxQueue || w.queuedBytes >= maxQueueBytes) && !w.paused {
		// Under w.mu, as the worker's resume (take): the two calls cannot
		// cross, so kgo's pause state always matches w.paused.
		w.paused = true
		cons.pauser.PauseFetchPartitions(tp.fetchMap())
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (cons *consumer) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	cons.c.tel.rebalance("consumer", "assigned", assigned)
	cons.mu.Lock()
	defer cons.mu.Unlock()
	for t, ps := range assigned {
		for _, p := range ps {
			tp := topicPartition{t, p}
			if cons.workers[tp] != nil {
				continue
			}
			w := &partitionWorker{tp: tp, cons: cons, wake: make(chan struct{}, 1),
				stop: make(chan struct{}), done: make(chan struct{})}
			cons.workers[tp] = w
			go w.run()
		}
	}
}

func (cons *consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	cons.c.tel.rebalance("consumer", "revoked", revoked)
	cons.stopPartitions(revoked, false)
}

func (cons *consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	cons.c.tel.rebalance("consumer", "lost", lost)
	cons.stopPartitions(lost, true)
}

// stopPartitions stops the workers of the given partitions and waits for
// them. Lost partitions do not commit.
func (cons *consumer) stopPartitions(parts map[string][]int32, lost bool) {
	var stopping []*partitionWorker
	cons.mu.Lock()
	for t, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{t, p}
			if w := cons.workers[tp]; w != nil {
				delete(cons.workers, tp)
				stopping = append(stopping, w)
			}
		}
	}
	cons.mu.Unlock()
	cons.stopWorkers(stopping, lost)
}

func (cons *consumer) stopAll(lost bool) {
	cons.mu.Lock()
	stopping := make([]*partitionWorker, 0, len(cons.workers))
	for tp, w := range cons.workers {
		delete(cons.workers, tp)
		stopping = append(stopping, w)
	}
	cons.mu.Unlock()
	cons.stopWorkers(stopping, lost)
}

// stopWorkers stops workers removed from cons.workers and waits for them.
// Each is closed and resumed under its lock first: kgo keeps pauses across
// assignments, and a closed worker never pauses again, so no pause outlives
// it and a later assignment of the partition fetches.
func (cons *consumer) stopWorkers(ws []*partitionWorker, lost bool) {
	for _, w := range ws {
		w.mu.Lock()
		w.lost = w.lost || lost
		w.closed = true
		if w.paused {
			w.paused = false
			cons.pauser.ResumeFetchPartitions(w.tp.fetchMap())
		}
		w.mu.Unlock()
		close(w.stop)
	}
	for _, w := range ws {
		<-w.done
	}
}

// run is the worker goroutine. It returns when stop is closed (after the
// record in hand and its commit) or when the work context ends.
func (w *partitionWorker) run() {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case <-w.cons.work.Done():
			return
		case <-w.wake:
		}
		for {
			batch := w.take()
			if len(batch) == 0 {
				break
			}
			var last *kgo.Record
			stopped := false
			single := 0 // records to handle one transaction each before batching again
			for i := 0; i < len(batch); {
				if w.stopping() {
					stopped = true
					break
				}
				if single == 0 {
					n, failedAt := w.cons.c.handleBatch(w.cons.work, batch[i:])
					if n > 0 {
						last = batch[i+n-1]
						i += n
						continue
					}
					single = failedAt + 1
				}
				if err := w.cons.c.handleRecord(w.cons.work, w.stop, batch[i]); err != nil {
					stopped = true // interrupted: this record is not done
					break
				}
				last = batch[i]
				i++
				single--
			}
			if last != nil {
				w.commit(last)
			}
			if stopped {
				return
			}
		}
	}
}

// take empties the queue and returns what it held. When the queue's bound
// had paused fetching, it resumes it, under w.mu (see enqueue).
func (w *partitionWorker) take() []*kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	batch := w.queue
	w.queue = nil
	w.queuedBytes = 0
	if w.paused {
		w.paused = false
		w.cons.pauser.ResumeFetchPartitions(w.tp.fetchMap())
	}
	return batch
}

func (w *partitionWorker) stopping() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// commit commits the offset after rec, unless the partition was lost.
//
// Commits go only to owned partitions: the worker is the only committer of
// its partition, and both rebalance callbacks wait for it to return. A
// revoked partition commits before OnPartitionsRevoked returns, so before
// the rebalance hands it over; a lost one does not commit (lost is set
// before stop closes). A commit that read lost just before it was set
// finishes before OnPartitionsLost returns, so before kgo rejoins: it
// carries the lost session's generation, which the broker checks.
func (w *partitionWorker) commit(rec *kgo.Record) {
	w.mu.Lock()
	lost := w.lost
	w.mu.Unlock()
	if lost {
		return
	}
	offsets := map[string]map[int32]kgo.EpochOffset{
		rec.Topic: {rec.Partition: {Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}},
	}
	w.cons.cl.CommitOffsetsSync(w.cons.work, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err == nil {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if p.ErrorCode != 0 {
						err = fmt.Errorf("partition %d: error code %d", p.Partition, p.ErrorCode)
					}
				}
			}
		}
		if err != nil {
			// Not fatal: the records are redelivered and the inbox skips them.
			w.cons.log.Warn("offset commit failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset+1, "err", err)
		}
	})
}

// handlerError marks an error that comes from the user's handler (or from
// the events it recorded), as opposed to the framework's own MongoDB calls.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// handleRecord handles one record to a final state: handled, skipped
// (duplicate, parked earlier, no handler) or parked. It returns an error only
// when it was interrupted (stop or shutdown) before reaching one, in which
// case the record's offset must not be committed.
func (c *Client) handleRecord(ctx context.Context, stop <-chan struct{}, rec *kgo.Record) error {
	log := c.cfg.Logger.With("topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
	env, payload, err := decodeRecord(rec)
	if err != nil {
		return c.parkMalformed(ctx, stop, &env, rec, err, log)
	}
	rec = withValue(rec, payload) // from here on the value is the handler's payload
	h := c.handlerFor(env.Topic, env.ContentSchema)
	if h == nil {
		log.Info("no handler for event; acknowledged", "schema", env.ContentSchema)
		c.tel.skipped.Add(ctx, 1, eventAttrs(&env, attrReason.String("no_handler")))
		return nil
	}
	evt, err := h.decode(c, rec.Value)
	if err != nil {
		return c.parkMalformed(ctx, stop, &env, rec, err, log)
	}
	infraFailures := 0
	for attempt := 1; ; {
		meta := Metadata{Envelope: env, Offset: rec.Offset, Attempt: attempt}
		err := c.handleOnce(ctx, h, evt, meta)
		var herr *handlerError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errAlreadyDone):
			log.Debug("duplicate or parked event skipped", "schema", env.ContentSchema, "key", env.IdempotencyKey)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &herr):
			park := attempt >= c.cfg.MaxAttempts
			log.Warn("handler failed", "schema", env.ContentSchema, "key", env.IdempotencyKey, "attempt", attempt, "parked", park, "err", herr.err)
			if nerr := c.retryInfra(ctx, stop, func() error {
				return c.noteFailure(ctx, &env, rec.Offset, rec.Value, herr.err, park)
			}); nerr != nil {
				return nerr
			}
			c.tel.setError(fmt.Errorf("handler of %s/%s (key %s, attempt %d): %w", env.Topic, env.ContentSchema, env.IdempotencyKey, attempt, herr.err))
			if park {
				c.tel.parked.Add(ctx, 1, eventAttrs(&env, attrReason.String("handler_error")))
				return nil
			}
			c.tel.retried.Add(ctx, 1, eventAttrs(&env))
			if !sleepCtx(ctx, stop, backoff(c.cfg.RetryMinBackoff, c.cfg.RetryMaxBackoff, attempt)) {
				return errInterrupted
			}
			attempt++
		default:
			// MongoDB unavailable or another failure of the framework's own
			// calls: not the event's fault, so it does not count as an attempt.
			infraFailures++
			log.Warn("handling interrupted by an infrastructure error; retrying", "err", err, "failures", infraFailures)
			if !sleepCtx(ctx, stop, backoff(c.cfg.RetryMinBackoff, c.cfg.RetryMaxBackoff, infraFailures)) {
				return errInterrupted
			}
		}
	}
}

var errInterrupted = errors.New("outbox: interrupted")

// handleOnce runs one attempt: claim, handler and the events it recorded,
// in one transaction.
//
// The attempt runs in a span whose parent is the trace context recorded
// with the event, so the handler's work and the events it records continue
// the recording request's trace.
func (c *Client) handleOnce(ctx context.Context, h *handler, evt Event, meta Metadata) (err error) {
	ctx, span := c.tel.startHandle(ctx, &meta)
	start := time.Now()
	var last *txState // the attempt that committed, when err is nil
	defer func() {
		if err == nil {
			c.tel.committed(ctx, last)
		}
		c.tel.endHandle(ctx, span, &meta.Envelope, start, err)
	}()
	last, err = c.inTransaction(ctx, func(tctx context.Context) error {
		if err := c.claim(tctx, &meta.Envelope, meta.Offset, nil, time.Now().UTC()); err != nil {
			return err
		}
		if err := safeRun(tctx, h, evt, meta); err != nil {
			return &handlerError{err}
		}
		return nil
	}, wrapHandlerError)
	return err
}

// wrapHandlerError marks an error as the handler's (see handlerError).
func wrapHandlerError(err error) error { return &handlerError{err} }

// parkMalformed parks a record that cannot be handled. A record without an
// idempotency key is parked under its position.
func (c *Client) parkMalformed(ctx context.Context, stop <-chan struct{}, env *Envelope, rec *kgo.Record, cause error, log *slog.Logger) error {
	if env.ContentSchema == "" {
		env.ContentSchema = "unknown"
	}
	if env.IdempotencyKey == "" {
		env.IdempotencyKey = fmt.Sprintf("malformed:%d:%d", rec.Partition, rec.Offset)
	}
	log.Warn("malformed record parked", "err", cause)
	err := c.retryInfra(ctx, stop, func() error {
		return c.noteFailure(ctx, env, rec.Offset, rec.Value, cause, true)
	})
	if err == nil {
		c.tel.parked.Add(ctx, 1, eventAttrs(env, attrReason.String("malformed")))
		c.tel.setError(fmt.Errorf("malformed record %s/%d@%d parked: %w", rec.Topic, rec.Partition, rec.Offset, cause))
	}
	return err
}

// retryInfra retries fn with backoff until it succeeds or the worker stops.
func (c *Client) retryInfra(ctx context.Context, stop <-chan struct{}, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		c.cfg.Logger.Warn("inbox write failed; retrying", "err", err, "attempt", attempt)
		if !sleepCtx(ctx, stop, backoff(c.cfg.RetryMinBackoff, c.cfg.RetryMaxBackoff, attempt)) {
			return errInterrupted
		}
	}
}

// backoff returns the delay before retry n (n >= 1): min doubled n-1 times,
// capped at max, with "equal jitter" (half fixed, half random).
func backoff(min, max time.Duration, n int) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + rand.N(half+1)
}

// sleepCtx waits for d, returning false early if ctx ends or stop closes.
func sleepCtx(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}

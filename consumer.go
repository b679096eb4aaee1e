package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/tuning"
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

// queueBound returns the records and bytes at which a partition's
// fetching pauses: maxQueue and maxQueueBytes, unless a harness shrank
// them (internal/tuning).
func queueBound() (records, bytes int) {
	records, bytes = maxQueue, maxQueueBytes
	if n := tuning.ConsumerQueueRecords.Load(); n > 0 {
		records = int(n)
	}
	if n := tuning.ConsumerQueueBytes.Load(); n > 0 {
		bytes = int(n)
	}
	return records, bytes
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
// fetching of partitions, with bare topics; tests fake it.
type fetchPauser interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// kafkaPauser is the consumer's fetchPauser: it gives kgo the Kafka topics
// of the bare topics it is called with (Config.TopicPrefix).
type kafkaPauser struct {
	cl  fetchPauser
	cfg *Config
}

func (p kafkaPauser) PauseFetchPartitions(m map[string][]int32) map[string][]int32 {
	return p.cfg.barePartitions(p.cl.PauseFetchPartitions(p.cfg.kafkaPartitions(m)))
}

func (p kafkaPauser) ResumeFetchPartitions(m map[string][]int32) {
	p.cl.ResumeFetchPartitions(p.cfg.kafkaPartitions(m))
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
	// holds is the poison state of the partition, owned by the worker
	// goroutine (see keyHolds in poison.go).
	holds keyHolds
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
		kgo.ConsumeTopics(c.cfg.kafkaTopics(topics)...),
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
	cons.pauser = kafkaPauser{cl, &c.cfg}
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
			// Past this point topics are bare (Config.TopicPrefix): the
			// records' too, before anything reads them.
			topic := c.cfg.bareTopic(p.Topic)
			for _, r := range p.Records {
				r.Topic = topic
			}
			c.tel.noteHighWatermark(topic, p.Partition, p.HighWatermark)
			if len(p.Records) > 0 {
				cons.enqueue(topicPartition{topic, p.Partition}, p.Records)
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
	maxRecords, maxBytes := queueBound()
	if (len(w.queue) >= maxRecords || w.queuedBytes >= maxBytes) && !w.paused {
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
	assigned = cons.c.cfg.barePartitions(assigned)
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
	revoked = cons.c.cfg.barePartitions(revoked)
	cons.c.tel.rebalance("consumer", "revoked", revoked)
	cons.stopPartitions(revoked, false)
}

func (cons *consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	lost = cons.c.cfg.barePartitions(lost)
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
	// A failed commit is retried with backoff while no record comes (a
	// later commit covers it too): else the group's offset of a partition
	// that went quiet would stay behind it for good.
	var uncommitted *kgo.Record
	var retryCommit <-chan time.Time
	failures := 0
	commit := func(rec *kgo.Record) {
		uncommitted, retryCommit = nil, nil
		if w.commit(rec) {
			failures = 0
			return
		}
		uncommitted = rec
		retryCommit = time.After(w.cons.c.cfg.backoff().Delay(failures))
		failures++
	}
	for {
		select {
		case <-w.stop:
			if uncommitted != nil {
				commit(uncommitted) // once more before the partition goes (not when lost)
			}
			return
		case <-w.cons.work.Done():
			return
		case <-retryCommit:
			commit(uncommitted)
			continue
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
					n, failedAt := w.handleBatch(batch[i:])
					if n > 0 {
						last = batch[i+n-1]
						i += n
						continue
					}
					single = failedAt + 1
				}
				if err := w.handleRecord(batch[i]); err != nil {
					stopped = true // interrupted: this record is not done
					break
				}
				last = batch[i]
				i++
				single--
			}
			if last != nil {
				commit(last)
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

// commit commits the offset after rec, unless the partition was lost, and
// reports false when the commit failed.
//
// Commits go only to owned partitions: the worker is the only committer of
// its partition, and both rebalance callbacks wait for it to return. A
// revoked partition commits before OnPartitionsRevoked returns, so before
// the rebalance hands it over; a lost one does not commit (lost is set
// before stop closes). A commit that read lost just before it was set
// finishes before OnPartitionsLost returns, so before kgo rejoins: it
// carries the lost session's generation, which the broker checks.
func (w *partitionWorker) commit(rec *kgo.Record) bool {
	w.mu.Lock()
	lost := w.lost
	w.mu.Unlock()
	if lost {
		return true // nothing to commit: the partition is gone
	}
	ok := true
	offsets := map[string]map[int32]kgo.EpochOffset{
		w.cons.c.cfg.kafkaTopic(rec.Topic): {rec.Partition: {Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}},
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
			// Not fatal: retried (see run); meanwhile a redelivered record
			// is skipped by the inbox.
			ok = false
			w.cons.log.Warn("offset commit failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset+1, "err", err)
		}
	})
	return ok
}

// handlerError marks an error that comes from the user's handler (or from
// the events it recorded), as opposed to the framework's own MongoDB calls.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// commitError marks a transaction that failed after the handler returned
// nil: its commit (or the insert of the events it recorded) failed, for
// example because the attempt outlived Config.HandlerTimeout or the
// server's transaction lifetime. It counts as an attempt: retrying it as an
// infrastructure failure would run a handler that always outlives the
// transaction for ever.
type commitError struct{ err error }

func (e *commitError) Error() string {
	return "transaction failed after the handler returned: " + e.err.Error()
}
func (e *commitError) Unwrap() error { return e.err }

// errRunAgain stops the driver from running a handler again inside one
// attempt (see handleOnce).
var errRunAgain = errors.New("outbox: the transaction failed with a transient error (aborted by the server, or its commit failed)")

// handleRecord handles one record to a final state: handled, skipped
// (duplicate, parked earlier, no handler), parked or held (see keyHolds). It
// returns an error only when it was interrupted (stop or shutdown) before
// reaching one, in which case the record's offset must not be committed.
//
// Attempts: each run of the handler that fails, or whose transaction fails
// after it returned nil, is an attempt; failures are noted in the inbox
// (noteFailure) and the stored count is read back, so the attempts of
// earlier owners of the partition count too. The first record a worker
// handles after its partition is assigned gets its attempt counted before it
// runs (kh.suspect): if the previous owner died while running it, nothing
// else would count that attempt. Infrastructure failures before the handler
// ran are retried with backoff and do not count.
func (c *Client) handleRecord(ctx context.Context, stop <-chan struct{}, kh *keyHolds, rec *kgo.Record) error {
	log := c.cfg.Logger.With("topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
	env, payload, err := decodeRecord(rec)
	if err != nil {
		return c.parkMalformed(ctx, stop, kh, &env, rec, unreadable(err), log)
	}
	rec = withValue(rec, payload) // from here on the value is the handler's payload
	h := c.handlerFor(env.Topic, env.ContentSchema)
	if h == nil {
		log.Info("no handler for event; acknowledged", "schema", env.ContentSchema)
		c.tel.skipped.Add(ctx, 1, eventAttrs(&env, attrReason.String("no_handler")))
		return nil
	}
	if kh.holding(env.PartitionKey) {
		if err := c.holdRecord(ctx, stop, kh, &env, rec, log); !errors.Is(err, errKeyFree) {
			return err
		}
	}
	evt, err := h.decode(c, rec.Value)
	if err != nil {
		return c.parkMalformed(ctx, stop, kh, &env, rec, err, log)
	}
	attempt, counted := 1, false
	if kh != nil && kh.suspect {
		var n int32
		err := c.retryInfra(ctx, stop, func() (err error) {
			n, err = c.noteAttempt(ctx, &env, rec.Offset)
			if errors.Is(err, errAlreadyDone) {
				return nil
			}
			return err
		})
		if err != nil {
			return err
		}
		if n == 0 {
			log.Debug("duplicate or parked event skipped", "schema", env.ContentSchema, "key", env.IdempotencyKey)
			// Counted as the claim's errAlreadyDone is (telemetry.endHandle).
			c.tel.skipped.Add(ctx, 1, eventAttrs(&env, attrReason.String("duplicate")))
			return c.learnHold(ctx, stop, kh, &env) // the next record is the suspect
		}
		kh.suspect = false
		attempt, counted = int(n), true
		if attempt > c.cfg.MaxAttempts {
			cause := fmt.Errorf("%w: attempt %d started after earlier attempts ended without a result (the process stopped or lost the partition during them)", ErrAttemptsExhausted, attempt)
			_, err := c.fail(ctx, stop, kh, &env, rec, cause, attempt, true, log)
			return err
		}
	}
	infraFailures, snoozes, conflicts := 0, 0, 0
	for {
		select {
		case <-stop:
			return errInterrupted
		default:
		}
		meta := Metadata{Envelope: env, Offset: rec.Offset, Attempt: attempt}
		err := c.handleOnce(ctx, h, evt, meta)
		var herr *handlerError
		var cerr *commitError
		var snooze *SnoozeError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errAlreadyDone):
			log.Debug("duplicate or parked event skipped", "schema", env.ContentSchema, "key", env.IdempotencyKey)
			return c.learnHold(ctx, stop, kh, &env)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &herr) && errors.As(herr.err, &snooze) && snoozes < c.cfg.MaxSnoozes:
			snoozes++
			log.Debug("handler snoozed", "schema", env.ContentSchema, "key", env.IdempotencyKey, "for", snooze.Duration, "snoozes", snoozes)
			c.tel.retried.Add(ctx, 1, eventAttrs(&env, attrReason.String("snooze")))
			if !retry.Sleep(ctx, stop, snooze.Duration) {
				return errInterrupted
			}
		case errors.As(err, &herr) && isTransientNotAborted(herr.err) && conflicts < maxFreeConflicts:
			// A write of the handler met a concurrent transaction or a
			// failover: not the event's fault. The first few are free.
			conflicts++
			log.Debug("handler met a transient transaction error; retrying", "schema", env.ContentSchema, "key", env.IdempotencyKey, "err", herr.err, "conflicts", conflicts)
			if !retry.Sleep(ctx, stop, c.cfg.backoff().Delay(conflicts-1)) {
				return errInterrupted
			}
		case errors.As(err, &herr) || errors.As(err, &cerr):
			cause := err
			if herr != nil {
				cause = herr.err
			}
			stored, err := c.fail(ctx, stop, kh, &env, rec, cause, attempt, counted, log)
			if !errors.Is(err, errRetry) {
				return err
			}
			counted = false
			c.tel.retried.Add(ctx, 1, eventAttrs(&env))
			if !retry.Sleep(ctx, stop, c.cfg.backoff().Delay(attempt-1)) {
				return errInterrupted
			}
			attempt = max(attempt, stored) + 1
		default:
			// MongoDB unavailable or another failure of the framework's own
			// calls before the handler ran: not the event's fault, so it
			// does not count as an attempt.
			infraFailures++
			log.Warn("handling interrupted by an infrastructure error; retrying", "err", err, "failures", infraFailures)
			if !retry.Sleep(ctx, stop, c.cfg.backoff().Delay(infraFailures-1)) {
				return errInterrupted
			}
		}
	}
}

var errInterrupted = errors.New("outbox: interrupted")

// maxFreeConflicts is how many transient transaction errors (see
// isTransientNotAborted) of one event's handler are retried without
// counting as attempts.
const maxFreeConflicts = 10

// isTransientNotAborted reports an error labelled TransientTransactionError
// (a write conflict, a failover) other than NoSuchTransaction: that one
// means the server aborted the transaction under the handler, typically for
// its age, and retrying it for free would loop for ever on a handler that
// always outlives its transaction.
func isTransientNotAborted(err error) bool {
	var le mongo.LabeledError
	if !errors.As(err, &le) || !le.HasErrorLabel("TransientTransactionError") {
		return false
	}
	var se mongo.ServerError
	return !errors.As(err, &se) || !se.HasErrorCode(codeNoSuchTransaction)
}

// codeNoSuchTransaction is MongoDB's NoSuchTransaction error code.
const codeNoSuchTransaction = 251

// handleOnce runs one attempt: claim, handler and the events it recorded,
// in one transaction, within Config.HandlerTimeout. A failure after the
// handler returned nil is a *commitError.
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
	actx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	ran := false     // the handler ran in this attempt
	var runErr error // and returned this
	last, err = c.inTransaction(actx, func(tctx context.Context) error {
		if ran {
			// The driver runs the whole transaction again when it fails
			// with a transient error: NoSuchTransaction once the server
			// aborted it for its age, in the handler's writes or at the
			// commit. Each run of the handler is an attempt, decided by the
			// caller: a handler that always outlives its transaction would
			// otherwise run for as long as the driver retries (120 s), and
			// not count at all.
			return errRunAgain
		}
		if err := c.claim(tctx, &meta.Envelope, meta.Offset, nil, time.Now().UTC()); err != nil {
			return err
		}
		ran = true
		if err := safeRun(tctx, h, evt, meta); err != nil {
			runErr = &handlerError{err}
			return runErr
		}
		return nil
	}, wrapHandlerError)
	var herr *handlerError
	switch {
	case err == nil || !ran:
	case errors.Is(err, errRunAgain) && runErr != nil:
		err = runErr
	case !errors.As(err, &herr):
		err = &commitError{err}
	}
	return err
}

// wrapHandlerError marks an error as the handler's (see handlerError).
func wrapHandlerError(err error) error { return &handlerError{err} }

// parkMalformed parks a record that cannot be handled. A record without an
// idempotency key is parked under its position. A record of a held key is
// held instead: it gets its turn when the key is released.
func (c *Client) parkMalformed(ctx context.Context, stop <-chan struct{}, kh *keyHolds, env *Envelope, rec *kgo.Record, cause error, log *slog.Logger) error {
	if env.ContentSchema == "" {
		env.ContentSchema = "unknown"
	}
	if env.IdempotencyKey == "" {
		env.IdempotencyKey = fmt.Sprintf("malformed:%d:%d", rec.Partition, rec.Offset)
	}
	if kh.holding(env.PartitionKey) {
		if err := c.holdRecord(ctx, stop, kh, env, rec, log); !errors.Is(err, errKeyFree) {
			return err
		}
	}
	log.Warn("malformed record parked", "err", cause)
	done := false
	err := c.retryInfra(ctx, stop, func() error {
		_, err := c.noteFailure(ctx, env, rec.Offset, rec.Value, cause, true, 1)
		if errors.Is(err, errAlreadyDone) {
			done = true
			return nil
		}
		return err
	})
	if err == nil && done {
		// Parked (or handled) already: hold its key only if an event of
		// the key is parked.
		return c.learnHold(ctx, stop, kh, env)
	}
	if err == nil {
		kh.hold(c, env)
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
		if !retry.Sleep(ctx, stop, c.cfg.backoff().Delay(attempt-1)) {
			return errInterrupted
		}
	}
}

package consume

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
)

// Config is the configuration shared by the workers of a consumer.
type Config struct {
	Host     Host
	Observer Observer
	// Pauser pauses and resumes the fetching of partitions.
	Pauser Pauser
	Log    *slog.Logger
	// Slots is Config.KeyConcurrency: units of one partition that may run
	// at once (each with its own keys).
	Slots int
	// BatchSize is Config.HandleBatchSize.
	BatchSize int
	// Hold is PoisonPolicy HoldKey: a parked event holds its key.
	Hold bool
	// SkipUnknown skips events without a handler instead of parking them,
	// wherever they meet their key: on arrival, held key or not, and as
	// the head of a release (Host.Release returns Skipped).
	SkipUnknown bool
	// QueueRecords and QueueBytes bound a partition's look-ahead (records
	// taken and not passed by the committable offset) and the payload bytes
	// of its unsettled records: fetching pauses past either.
	QueueRecords, QueueBytes int
	// Backoff spaces infrastructure retries and commit retries.
	Backoff retry.Backoff
	// Recheck is how often a worker with held keys reads its partition's
	// sequences again, to release the ones an operator unblocked.
	Recheck time.Duration
	// DrainTimeout bounds how long a revoked partition waits for its
	// running units before they are canceled.
	DrainTimeout time.Duration
	// WaitVisible is how long a wait lasts before Waits and the log show it.
	WaitVisible time.Duration
}

// Pauser pauses and resumes the fetching of one partition.
type Pauser interface {
	Pause(tp TopicPartition)
	Resume(tp TopicPartition)
}

// Worker handles the records of one owned partition.
//
// Goroutines: the worker loop (Start; it owns the scheduler) and, while
// they run, one goroutine per unit (at most Config.Slots) and one per
// offset commit (at most one at a time). Units and commits hand their
// results back to the loop over channels; the loop waits for all of them
// before it returns. Stop and Lose end the loop and return once it has
// returned: both let the running units finish (canceling them after
// Config.DrainTimeout); Stop then commits, Lose commits nothing, since
// another member may own the partition already.
type Worker struct {
	tp   TopicPartition
	cfg  *Config
	work context.Context // handlers run under it; it outlives a stop by the drain
	born uint64          // Set.started when the set started it (see Set.EnqueuePolled)

	wake chan struct{} // capacity 1: records were enqueued
	stop chan struct{} // closed by Stop
	kill chan struct{} // closed by Lose
	// stopOnce and killOnce close stop and kill: Stop and Lose may run at
	// once (a callback's Lose of a worker Close is stopping).
	stopOnce, killOnce sync.Once
	done               chan struct{} // closed when the loop returns
	reqs               chan chan []Wait

	// mu guards the fields below, and every pause or resume of tp is made
	// with it held, together with the change of paused: so the client's
	// pause state always equals paused, and a closed worker never pauses.
	mu       sync.Mutex
	inbound  []*kgo.Record
	inBytes  int
	paused   bool
	closed   bool
	lookBack atomic.Int64 // the scheduler's look-ahead, for enqueue's bound
	unsBytes atomic.Int64 // the scheduler's unsettled bytes

	// Read by unit goroutines.
	lookups atomic.Int32 // units left that read the inbox first
	avgRun  atomic.Int64 // moving average of a handler's run, ns per event
	// batchCap caps the events of a unit: halved when a batch rolls back,
	// doubled when one commits, so that a run of failing events (a bad
	// deploy) is not paid for with a rolled-back batch per event.
	batchCap atomic.Int32

	heldMu sync.Mutex
	// held is the held keys, each with the count of marks when it was
	// last marked held (see applyLoad).
	held    map[string]uint64
	marks   uint64 // counts setHeld calls
	relMu   sync.Mutex
	relWait map[string]*relState

	stats atomic.Pointer[Stats]

	// What the poll loop handed over, for the fetch watch (Set.Fetching):
	// started is when the worker started, nextIn the offset after the last
	// record enqueued (-1 before any), lastIn when records past nextIn
	// were last enqueued, resumed when the worker last resumed the
	// partition's fetching (unix ns, 0 before any).
	started time.Time
	nextIn  atomic.Int64
	lastIn  atomic.Int64
	resumed atomic.Int64
	// fetchWait is set by the fetch watch while the partition's fetching
	// is stalled (Set.SetFetchWait); nil otherwise.
	fetchMu   sync.Mutex
	fetchWait *Wait
}

// relState is the free retries and the waiting of a key's release.
type relState struct {
	snoozes, conflicts, infra int
	since                     time.Time
	last                      string
}

// Stats is a snapshot of a worker for status and metrics.
type Stats struct {
	// InFlight counts the events of running units.
	InFlight int
	// Unsettled counts the events taken and not settled.
	Unsettled int
	// LowestUnsettled is the committable offset (-1 before any record).
	LowestUnsettled int64
	// Committed is the last committed offset; before the first commit,
	// the offset the partition's fetching started from (-1 before any
	// record).
	Committed int64
	// HeldKeys counts the keys this worker knows are held.
	HeldKeys int
	// Paused is whether the partition's fetching is paused (its bound of
	// records or bytes is reached).
	Paused bool
}

// NewWorker returns the worker of tp; Start starts it.
func NewWorker(tp TopicPartition, cfg *Config, work context.Context) *Worker {
	w := &Worker{tp: tp, cfg: cfg, work: work,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), kill: make(chan struct{}), done: make(chan struct{}),
		reqs: make(chan chan []Wait), held: map[string]uint64{}, relWait: map[string]*relState{}}
	w.stats.Store(&Stats{LowestUnsettled: -1, Committed: -1})
	w.batchCap.Store(int32(max(cfg.BatchSize, 1)))
	w.started = time.Now()
	w.nextIn.Store(-1)
	return w
}

// Start starts the worker loop.
func (w *Worker) Start() { go w.loop() }

// Enqueue hands records of the partition (bare topic, offset order) to the
// worker, from the poll loop. It pauses the partition's fetching when the
// worker's bound is reached; records given to a stopped worker are dropped
// (the next owner fetches them from the committed offset).
func (w *Worker) Enqueue(recs []*kgo.Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.inbound = append(w.inbound, recs...)
	for _, r := range recs {
		w.inBytes += len(r.Value)
	}
	// Only records past those handed over before count as fetching: a
	// client that hands the same records again and again (the scheduler
	// drops them as seen) is not fetching the partition.
	if n := len(recs); n > 0 && recs[n-1].Offset+1 > w.nextIn.Load() {
		w.lastIn.Store(time.Now().UnixNano())
		w.nextIn.Store(recs[n-1].Offset + 1) // only Enqueue writes it, under w.mu
		w.fetchMu.Lock()
		w.fetchWait = nil // fetched again: the wait is over
		w.fetchMu.Unlock()
	}
	if !w.paused && w.overBound() {
		w.paused = true
		w.cfg.Pauser.Pause(w.tp)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// overBound reports whether the partition holds as many records or bytes
// as its bound. Under w.mu.
func (w *Worker) overBound() bool {
	return len(w.inbound)+int(w.lookBack.Load()) >= w.cfg.QueueRecords ||
		w.inBytes+int(w.unsBytes.Load()) >= w.cfg.QueueBytes
}

// adjustPause pauses fetching when the partition holds its bound (records
// taken meanwhile may have filled it), and resumes it once the partition
// is back under half its bound (half, so that it does not flap). It
// returns whether fetching is paused.
func (w *Worker) adjustPause() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.paused
	}
	switch {
	case !w.paused && w.overBound():
		w.paused = true
		w.cfg.Pauser.Pause(w.tp)
	case w.paused && 2*(len(w.inbound)+int(w.lookBack.Load())) < w.cfg.QueueRecords &&
		2*(w.inBytes+int(w.unsBytes.Load())) < w.cfg.QueueBytes:
		w.paused = false
		w.cfg.Pauser.Resume(w.tp)
		w.resumed.Store(time.Now().UnixNano())
	}
	return w.paused
}

// close marks the worker closed and resumes its partition when paused:
// the client keeps pauses across assignments, so none may outlive the
// worker that made it.
func (w *Worker) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.inbound = nil
	if w.paused {
		w.paused = false
		w.cfg.Pauser.Resume(w.tp)
	}
}

// Stop stops the worker after its running units and commits; it returns
// when the loop has returned.
func (w *Worker) Stop() {
	w.close()
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// Lose stops the worker after its running units (canceled after
// Config.DrainTimeout) without committing; it returns when the loop has
// returned.
func (w *Worker) Lose() {
	// The loop hears of the loss before the worker shows closed: once
	// closed shows, no commit starts.
	w.killOnce.Do(func() { close(w.kill) })
	w.close()
	<-w.done
}

// fetching returns what the poll loop handed the worker.
func (w *Worker) fetching() Fetching {
	f := Fetching{Next: w.nextIn.Load(), Quiet: w.quiet()}
	w.mu.Lock()
	f.Paused = w.paused
	w.mu.Unlock()
	return f
}

// quiet is since when the worker was handed nothing new while its
// partition's fetching ran: its last records past those it had, its start,
// or the last resume of its fetching, whichever is latest. A paused
// partition is fetched by nobody, so the time it spent paused is no sign of
// a client that stopped fetching: counting it, a partition resumed after a
// long pause (a slow or held worker with a full queue) would look stalled
// at once, before its client had a chance to fetch. Atomics only: called
// under fetchMu, which Enqueue takes under mu.
func (w *Worker) quiet() time.Time {
	q := w.started
	if ns := w.lastIn.Load(); ns != 0 {
		q = time.Unix(0, ns)
	}
	if ns := w.resumed.Load(); ns != 0 && time.Unix(0, ns).After(q) {
		q = time.Unix(0, ns)
	}
	return q
}

// Stats returns a snapshot of the worker.
func (w *Worker) Stats() Stats { return *w.stats.Load() }

// batchOK reports whether e may share a transaction with others: it can be
// handled (no fault, a handler), its key holds nothing, and it did not
// fail in a batch.
func (w *Worker) batchOK(e *Event) bool {
	return e.Fault == nil && !e.NoHandler && (!w.cfg.Hold || e.Key == "" || !w.holding(e.Key))
}

func (w *Worker) holding(key string) bool {
	w.heldMu.Lock()
	defer w.heldMu.Unlock()
	_, ok := w.held[key]
	return ok
}

// setHeld marks key held: a unit parked an event of it, or found its
// sequence.
func (w *Worker) setHeld(key string) {
	w.heldMu.Lock()
	defer w.heldMu.Unlock()
	w.marks++
	w.held[key] = w.marks
}

func (w *Worker) unhold(key string) {
	w.heldMu.Lock()
	defer w.heldMu.Unlock()
	delete(w.held, key)
}

func (w *Worker) heldKeys() int {
	w.heldMu.Lock()
	defer w.heldMu.Unlock()
	return len(w.held)
}

// relState returns a copy of the state of key's release.
func (w *Worker) relState(key string) relState {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	if st := w.relWait[key]; st != nil {
		return *st
	}
	return relState{}
}

// saveRelState stores the state of key's release; waiting marks the
// release as waiting since now unless it was already, with err as its
// last error.
func (w *Worker) saveRelState(key string, st relState, waiting bool, err error) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	if waiting {
		if st.since.IsZero() {
			st.since = time.Now()
		}
		if err != nil {
			st.last = err.Error()
		}
	}
	w.relWait[key] = &st
}

func (w *Worker) dropRelState(key string) {
	w.relMu.Lock()
	defer w.relMu.Unlock()
	delete(w.relWait, key)
}

// targetUnit is the run time a unit of deliveries aims at when several run
// at once: handlers that wait (on an external call, say) run one event per
// transaction, so that the slots spread over keys; fast handlers keep
// sharing transactions, which saves a commit per event.
const targetUnit = 5 * time.Millisecond

// noteDuration feeds the moving average of a handler's run per event, and
// the batch cap.
func (w *Worker) noteDuration(d time.Duration, n int, k Kind) {
	if n > 1 {
		c := w.batchCap.Load()
		switch {
		case k == Handled && int(c) < w.cfg.BatchSize:
			w.batchCap.Store(min(2*c, int32(w.cfg.BatchSize)))
		case k != Handled && k != Canceled && c > 1:
			w.batchCap.Store(c / 2)
		}
	} else if k == Handled {
		if c := w.batchCap.Load(); int(c) < w.cfg.BatchSize {
			w.batchCap.Store(c + 1) // singles that commit earn batching back
		}
	}
	if k != Handled || n == 0 {
		return
	}
	per := int64(d) / int64(n)
	old := w.avgRun.Load()
	if old == 0 {
		w.avgRun.Store(per)
		return
	}
	w.avgRun.Store(old + (per-old)/8)
}

// maxBatch is the cap on the deliveries of the next unit, when ready lanes
// may run now and free slots are free: Config.BatchSize with one slot; with
// more, as many as fit in targetUnit by the moving average (one before
// anything was measured), but at least the ready lanes' share of the free
// slots; never more than the batch cap.
//
// The share keeps units large while more keys wait than there are free
// slots: lanes past the free slots wait either way, and in a unit they save
// a transaction each, where units of one event would add transactions (and
// so load on MongoDB) without running more handlers at once. It is of the
// free slots, not of all: once the slots are busy, a slot that frees finds
// the few lanes that became ready meanwhile, and a share of all the slots
// would run them one per transaction however many waited. The moving
// average is of whole transactions, MongoDB's part included: when MongoDB
// is loaded it grows even for handlers that do nothing, so alone it would
// shrink their units to one event just when transactions are dearest.
func (w *Worker) maxBatch(ready, free int) int {
	limit := int(w.batchCap.Load())
	if w.cfg.Slots <= 1 {
		return limit
	}
	n := 1
	if avg := time.Duration(w.avgRun.Load()); avg > 0 {
		n = max(int(targetUnit/avg), 1)
	}
	free = max(free, 1)
	n = max(n, (ready+free-1)/free)
	return min(n, limit)
}

// loop is the worker goroutine.
func (w *Worker) loop() {
	defer close(w.done)
	s := newSched(w.cfg.Slots, w.batchOK)
	unitCtx, cancelUnits := context.WithCancel(w.work)
	defer cancelUnits()
	results := make(chan unitResult, w.cfg.Slots)
	type commitResult struct {
		offset int64
		err    error
	}
	commits := make(chan commitResult, 1)
	loads := make(chan loadResult, 1)
	var (
		committed         int64 = -1
		committing        bool
		commitFailures    int
		retryCommitAt     time.Time
		stopping, lost    bool
		stopCh, killCh    = w.stop, w.kill
		drainTimer        <-chan time.Time
		loaded, loading   bool
		loadFailures      int
		loadAt, recheckAt time.Time
		timer             = time.NewTimer(time.Hour)
		tick              = time.NewTicker(time.Second)
		running           = map[*Unit]time.Time{}
		workDone          = w.work.Done()
		suspects          = w.cfg.Slots            // units left that count attempts first
		logged            = map[string]time.Time{} // waits logged, by what
	)
	defer timer.Stop()
	defer tick.Stop()
	// onLose is the loop's answer to Lose, wherever it hears of it.
	onLose := func() {
		stopping, lost, killCh = true, true, nil
		drainTimer = time.After(w.cfg.DrainTimeout)
	}

	startUnit := func(u *Unit) {
		running[u] = time.Now()
		if len(u.Events) > 0 {
			u.attempts = u.Events[0].Attempts
		}
		go func() {
			var r unitResult
			if u.IsRelease {
				r = w.release(unitCtx, u.Release)
			} else {
				r = w.deliveries(unitCtx, u)
			}
			r.unit = u
			results <- r
		}()
	}
	startCommit := func(offset int64, epoch int32) {
		committing = true
		go func() {
			err := w.cfg.Host.Commit(w.work, w.tp, offset, epoch)
			commits <- commitResult{offset, err}
		}()
	}
	// startLoad reads the held keys of the partition: before the first
	// unit, then every Recheck while some are held.
	startLoad := func() {
		loading = true
		w.heldMu.Lock()
		marks := w.marks
		w.heldMu.Unlock()
		go func() {
			heads, err := w.cfg.Host.Sequences(unitCtx, w.tp)
			loads <- loadResult{heads, err, marks}
		}()
	}
	// applyLoad asks for the release of the keys whose head may go.
	applyLoad := func(l loadResult, now time.Time) {
		loading = false
		if l.err != nil {
			if stopping {
				return
			}
			loadFailures++
			// The first read and the re-reads alike wait for the backoff:
			// MongoDB down must not make the loop read again at once.
			loadAt = now.Add(w.cfg.Backoff.Delay(loadFailures - 1))
			recheckAt = loadAt
			if loadFailures == 1 || loadFailures%10 == 0 {
				w.cfg.Log.Warn("reading the held keys of the partition failed; retrying", "partition", w.tp.String(), "err", l.err, "failures", loadFailures)
			}
			w.cfg.Observer.Error(fmt.Errorf("read held keys of %s: %w", w.tp, l.err))
			return
		}
		loadFailures, loaded = 0, true
		recheckAt = now.Add(w.cfg.Recheck)
		w.heldMu.Lock()
		for k, at := range w.held {
			// A key marked held after the read began (a unit parked an
			// event of it meanwhile) stays held: the read may predate the
			// park, and forgetting the key would let its next event
			// overtake the parked one.
			if _, ok := l.heads[k]; !ok && at <= l.marks {
				delete(w.held, k)
			}
		}
		for k := range l.heads {
			if _, ok := w.held[k]; !ok {
				w.held[k] = l.marks
			}
		}
		w.heldMu.Unlock()
		for k, h := range l.heads {
			if h.Releasable && !s.releasing(k) {
				s.requestRelease(k, now)
			}
		}
	}
	if !w.cfg.Hold {
		loaded = true
	}

	for {
		now := time.Now()
		if !loading && !stopping && w.cfg.Hold && ((!loaded && !now.Before(loadAt)) ||
			(loaded && w.heldKeys() > 0 && !now.Before(recheckAt))) {
			startLoad()
		}
		// Dispatch what may run.
		var nextWake time.Time
		if loaded && !stopping {
			nextWake = s.wake(now)
			for {
				// The first units after the assignment run one event each,
				// counting its attempt before it runs: the partition's
				// earlier owner may have died while running it, and nothing
				// else would count that attempt.
				suspect, limit := suspects > 0, w.maxBatch(s.ready.Len(), s.slots-s.running)
				if suspect {
					limit = 1
				}
				u := s.nextUnit(now, limit)
				if u == nil {
					break
				}
				if suspect && !u.IsRelease {
					u.suspect = true
					suspects--
				}
				startUnit(u)
			}
		}
		var commitAt, recheck, load time.Time
		if !committing && !lost {
			commitAt = retryCommitAt
		}
		if loaded && !loading && !stopping && w.cfg.Hold && w.heldKeys() > 0 {
			recheck = recheckAt
		}
		if !loaded && !loading && !stopping {
			load = loadAt
		}
		armTimer(timer, now, nextWake, commitAt, recheck, load)
		// Commit what may be committed. A Lose that came meanwhile wins
		// over the results this iteration took: select picks at random
		// among ready cases, and a lost partition commits nothing.
		if off, epoch, ok := s.committable(); ok && !lost && !committing && off > committed && !now.Before(retryCommitAt) {
			select {
			case <-killCh:
				onLose()
			default:
				startCommit(off, epoch)
			}
		}
		w.lookBack.Store(int64(s.lookahead()))
		w.unsBytes.Store(int64(s.bytes))
		w.publishStats(s, committed, running, w.adjustPause())

		if stopping && len(running) == 0 && !committing && !loading {
			if !lost {
				// The last commit, of what the running units settled.
				if off, epoch, ok := s.committable(); ok && off > committed {
					if err := w.cfg.Host.Commit(w.work, w.tp, off, epoch); err != nil {
						w.cfg.Log.Warn("offset commit failed at stop", "partition", w.tp.String(), "offset", off, "err", err)
					}
				}
			}
			return
		}

		select {
		case <-w.wake:
			if !stopping {
				evs := w.take()
				if committed < 0 && len(evs) > 0 {
					// Where the partition's fetching started: nothing
					// before it is this worker's to commit.
					committed = evs[0].Offset
				}
				s.add(evs, time.Now())
			}
		case r := <-results:
			delete(running, r.unit)
			now := time.Now()
			if r.unit.IsRelease {
				s.releaseDone(r.unit, r.more && !stopping, r.moreAt, now)
			} else {
				s.done(r.unit, r.outs, now)
			}
			for _, k := range r.releases {
				if !s.releasing(k) {
					s.requestRelease(k, now)
				}
			}
		case c := <-commits:
			committing = false
			if c.err != nil {
				commitFailures++
				retryCommitAt = time.Now().Add(w.cfg.Backoff.Delay(commitFailures - 1))
				w.cfg.Log.Warn("offset commit failed; retrying", "partition", w.tp.String(), "offset", c.offset, "err", c.err, "failures", commitFailures)
				w.cfg.Observer.Error(fmt.Errorf("commit offset %d of %s: %w", c.offset, w.tp, c.err))
				continue
			}
			commitFailures, retryCommitAt = 0, time.Time{}
			committed = max(committed, c.offset)
		case <-timer.C:
		case <-tick.C:
			w.logWaits(s, running, logged)
		case ch := <-w.reqs:
			ch <- w.waits(s, running, time.Now())
		case l := <-loads:
			applyLoad(l, time.Now())
		case <-stopCh:
			stopping, stopCh = true, nil
			drainTimer = time.After(w.cfg.DrainTimeout)
		case <-killCh:
			onLose()
		case <-drainTimer:
			cancelUnits()
		case <-workDone:
			stopping, workDone = true, nil
			cancelUnits()
		}
	}
}

// take empties the inbound queue, decoding its records.
func (w *Worker) take() []*Event {
	w.mu.Lock()
	recs := w.inbound
	w.inbound, w.inBytes = nil, 0
	w.mu.Unlock()
	evs := make([]*Event, 0, len(recs))
	for _, r := range recs {
		e := w.cfg.Host.Decode(r)
		e.Offset, e.Epoch, e.Bytes = r.Offset, r.LeaderEpoch, len(r.Value)
		evs = append(evs, e)
	}
	return evs
}

// loadResult is the outcome of a read of the partition's held keys.
type loadResult struct {
	heads map[string]Head
	err   error
	marks uint64 // Worker.marks when the read began
}

// armTimer sets the loop's timer to the earliest of the given times (zero
// times ignored; an hour when none).
func armTimer(t *time.Timer, now time.Time, times ...time.Time) {
	var next time.Time
	for _, at := range times {
		if at.IsZero() {
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	d := time.Hour
	if !next.IsZero() {
		d = max(next.Sub(now), time.Millisecond)
	}
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

func (w *Worker) publishStats(s *sched, committed int64, running map[*Unit]time.Time, paused bool) {
	st := &Stats{Unsettled: s.pending, LowestUnsettled: -1, Committed: committed, HeldKeys: w.heldKeys(), Paused: paused}
	if len(s.window) > 0 {
		st.LowestUnsettled = s.window[0].Offset
	} else if s.last != nil {
		st.LowestUnsettled = s.last.Offset + 1
	}
	for u := range running {
		st.InFlight += max(len(u.Events), 1)
	}
	w.stats.Store(st)
}

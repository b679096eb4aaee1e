package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	outbox "github.com/event-outbox/outbox"
)

// The keyconc phase: Config.KeyConcurrency 1 against kcHigh, side by side
// in one run, with a handler that waits kcWait (standing for an external
// call) and writes one document, on events spread over kcKeys keys; and
// the trivial handler of the consume phase at both settings.

const (
	kcWait = 20 * time.Millisecond
	kcHigh = 64
)

// keyconcRun is the slow handler at one key concurrency.
type keyconcRun struct {
	KeyConcurrency int `json:"key_concurrency"`
	// Backlog: -events records produced to Kafka beforehand; events
	// committed from the first handler start, for -duration or until the
	// backlog is done.
	Events        int              `json:"events"`
	Seconds       float64          `json:"seconds"`
	Rate          float64          `json:"events_per_s"`
	MongoPerEvent float64          `json:"mongo_commands_per_event"`
	TxnsPerEvent  float64          `json:"transactions_per_event"`
	MongoCommands map[string]int64 `json:"mongo_commands"`
	// Latency: -keyconc-rate events/s recorded through the framework for
	// -duration; from the recording transaction's commit to the commit of
	// the handler's transaction.
	Offered              int     `json:"offered_events_per_s"`
	LatencyEvents        int     `json:"latency_events"`
	P50ms                float64 `json:"p50_ms"`
	P99ms                float64 `json:"p99_ms"`
	Maxms                float64 `json:"max_ms"`
	LatencyMongoPerEvent float64 `json:"latency_consumer_mongo_commands_per_event"`
}

// trivialRun is the consume phase's trivial handler at one key
// concurrency.
type trivialRun struct {
	KeyConcurrency int `json:"key_concurrency"`
	consumeResult
}

// keyconcResult is the outcome of the keyconc phase.
type keyconcResult struct {
	Keys          int          `json:"keys"`
	HandlerWaitMs float64      `json:"handler_wait_ms"`
	Slow          []keyconcRun `json:"slow_handler"`
	// SlowRatio is the slow handler's events/s at kcHigh over those at 1.
	SlowRatio    float64      `json:"slow_ratio"`
	Trivial      []trivialRun `json:"trivial_handler"`
	TrivialRatio float64      `json:"trivial_ratio"`
}

func runKeyConc(ctx context.Context, e *env, progress func(string)) (keyconcResult, error) {
	r := keyconcResult{Keys: kcKeys, HandlerWaitMs: float64(kcWait) / float64(time.Millisecond)}
	n := e.opts.events
	if err := produceBacklog(ctx, e, topics.kcSlow, kcSlowEvent{}.ContentSchema(), n, kcKeyOf); err != nil {
		return r, err
	}
	for _, kc := range []int{1, kcHigh} {
		progress(fmt.Sprintf("keyconc: %v handler, KeyConcurrency %d, backlog", kcWait, kc))
		run, err := slowBacklog(ctx, e, kc, n)
		if err != nil {
			return r, fmt.Errorf("KeyConcurrency %d, backlog: %w", kc, err)
		}
		progress(fmt.Sprintf("keyconc: %v handler, KeyConcurrency %d, latency at %d/s", kcWait, kc, e.opts.kcRate))
		if kc == 1 {
			err = slowLatency(ctx, e, kc, topics.kcLat1, func(i int) outbox.Event { return kcLat1Event{newPayload(i, e.opts.eventSize)} }, &run)
		} else {
			err = slowLatency(ctx, e, kc, topics.kcLatHigh, func(i int) outbox.Event { return kcLatHighEvent{newPayload(i, e.opts.eventSize)} }, &run)
		}
		if err != nil {
			return r, fmt.Errorf("KeyConcurrency %d, latency: %w", kc, err)
		}
		r.Slow = append(r.Slow, run)
		e.dropDatabases()
	}
	if r.Slow[0].Rate > 0 {
		r.SlowRatio = r.Slow[1].Rate / r.Slow[0].Rate
	}
	if err := produceBacklog(ctx, e, topics.kcTrivial, kcTrivialEvent{}.ContentSchema(), n, keyOf); err != nil {
		return r, err
	}
	for _, kc := range []int{1, kcHigh} {
		progress(fmt.Sprintf("keyconc: trivial handler, KeyConcurrency %d", kc))
		c, err := consumeBacklog[kcTrivialEvent](ctx, e, fmt.Sprintf("kctrivial%d", kc), fmt.Sprintf("kc-trivial-%d", kc), n, kc)
		if err != nil {
			return r, fmt.Errorf("trivial handler, KeyConcurrency %d: %w", kc, err)
		}
		r.Trivial = append(r.Trivial, trivialRun{kc, c})
		e.dropDatabases()
	}
	if r.Trivial[0].Rate > 0 {
		r.TrivialRatio = r.Trivial[1].Rate / r.Trivial[0].Rate
	}
	return r, nil
}

// commitTracker matches the events a handler ran with the commit of the
// handler's transaction (e.conCount's txnEnd), by session id: a session
// runs one transaction at a time.
type commitTracker struct {
	mu      sync.Mutex
	pending map[string][]string // session id → idempotency keys run in its transaction
	// onCommit is told of each event whose handler's transaction
	// committed.
	onCommit func(key string, at time.Time)
}

func newCommitTracker(onCommit func(key string, at time.Time)) *commitTracker {
	return &commitTracker{pending: map[string][]string{}, onCommit: onCommit}
}

// ran notes that the handler of the event with idempotency key ran in the
// transaction of ctx.
func (t *commitTracker) ran(ctx context.Context, key string) {
	id := sessionID(ctx)
	t.mu.Lock()
	t.pending[id] = append(t.pending[id], key)
	t.mu.Unlock()
}

// ended is e.conCount's txnEnd.
func (t *commitTracker) ended(lsid string, committed bool) {
	now := time.Now()
	t.mu.Lock()
	keys := t.pending[lsid]
	delete(t.pending, lsid)
	t.mu.Unlock()
	if committed {
		for _, k := range keys {
			t.onCommit(k, now)
		}
	}
}

// track makes t hear the consumer client's transaction ends until the
// returned function is called.
func (t *commitTracker) track(e *env) (untrack func()) {
	f := t.ended
	e.conCount.txnEnd.Store(&f)
	return func() { e.conCount.txnEnd.Store(nil) }
}

// slowHandler registers the slow handler for E: wait kcWait (or the end of
// ctx), insert one document into docs, note the run with t.
func slowHandler[E outbox.Event](c *outbox.Client, docs *mongo.Collection, t *commitTracker, first *atomic.Int64) {
	outbox.MustHandle(c, func(ctx context.Context, _ E, m outbox.Metadata) error {
		first.CompareAndSwap(0, time.Now().UnixNano())
		timer := time.NewTimer(kcWait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		if _, err := docs.InsertOne(ctx, bson.D{{Key: "_id", Value: m.IdempotencyKey}, {Key: "offset", Value: m.Offset}}); err != nil {
			return err
		}
		t.ran(ctx, m.IdempotencyKey)
		return nil
	})
}

// slowBacklog handles the kcSlow backlog of n records with the slow
// handler at key concurrency kc, for -duration from the first handler
// start or until every record is handled.
func slowBacklog(ctx context.Context, e *env, kc, n int) (keyconcRun, error) {
	phase := fmt.Sprintf("kcslow%d", kc)
	var committed, lastCommit, first atomic.Int64
	t := newCommitTracker(func(string, time.Time) {
		committed.Add(1)
		lastCommit.Store(time.Now().UnixNano())
	})
	defer t.track(e)()
	cfg := e.config(e.conMongo, phase, fmt.Sprintf("kc-slow-%d", kc))
	cfg.KeyConcurrency = kc
	c, err := outbox.New(cfg)
	if err != nil {
		return keyconcRun{}, err
	}
	slowHandler[kcSlowEvent](c, e.conMongo.Database(e.db(phase)).Collection("docs"), t, &first)
	if err := c.EnsureIndexes(ctx); err != nil {
		return keyconcRun{}, err
	}
	e.conCount.reset()
	stop := runClients(c)
	werr := waitFor(ctx, 2*time.Minute, "the first handler start", func() bool { return first.Load() != 0 })
	var events, cmds int64
	var names map[string]int64
	var end time.Time
	if werr == nil {
		deadline := time.Unix(0, first.Load()).Add(e.opts.duration)
		werr = waitFor(ctx, e.opts.duration+time.Minute, "the window to end", func() bool {
			// The window lasts until at least one event committed: on a
			// loaded machine (the smoke test's 300 ms) the first commit may
			// come after the window would have ended.
			return committed.Load() >= int64(n) || (time.Now().After(deadline) && committed.Load() > 0)
		})
		events, cmds, names, end = committed.Load(), e.conCount.total.Load(), e.conCount.names(), time.Now()
		if events >= int64(n) {
			end = time.Unix(0, lastCommit.Load())
		}
	}
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return keyconcRun{}, werr
	}
	if events == 0 {
		return keyconcRun{}, fmt.Errorf("no event handled in %v", e.opts.duration)
	}
	secs := end.Sub(time.Unix(0, first.Load())).Seconds()
	return keyconcRun{KeyConcurrency: kc, Events: int(events), Seconds: secs, Rate: float64(events) / secs,
		MongoPerEvent: float64(cmds) / float64(events), TxnsPerEvent: float64(names["commitTransaction"]) / float64(events),
		MongoCommands: names}, nil
}

// slowLatency records -keyconc-rate events/s of mk's topic for -duration
// through the framework's publisher, handled with the slow handler at key
// concurrency kc, and fills run's latency fields: from the commit of the
// recording transaction to the commit of the handler's.
func slowLatency(ctx context.Context, e *env, kc int, topic string, mk func(int) outbox.Event, run *keyconcRun) error {
	phase := fmt.Sprintf("kclat%d", kc)
	p := newLatencyProbe()
	t := newCommitTracker(p.start)
	defer t.track(e)()
	rec, err := outbox.New(e.config(e.setup, phase, "kc-lat-recorder", topic))
	if err != nil {
		return err
	}
	pub, err := outbox.New(e.config(e.pubMongo, phase, "kc-lat", topic))
	if err != nil {
		return err
	}
	cfg := e.config(e.conMongo, phase, "kc-lat-consumer")
	cfg.KeyConcurrency = kc
	con, err := outbox.New(cfg)
	if err != nil {
		return err
	}
	var first atomic.Int64
	docs := e.conMongo.Database(e.db(phase)).Collection("docs")
	if kc == 1 {
		slowHandler[kcLat1Event](con, docs, t, &first)
	} else {
		slowHandler[kcLatHighEvent](con, docs, t, &first)
	}
	stop := runClients(pub, con)
	if err := waitSettled(ctx, e, []*outbox.Client{pub}, []*outbox.Client{con}); err != nil {
		_ = stop()
		return err
	}
	n, err := offer(ctx, rec, p, e.opts.kcRate, e.opts.duration, mk, func() { e.conCount.reset() })
	if err == nil {
		err = waitFor(ctx, 2*time.Minute, "every offered event to be handled", func() bool { return p.handled.Load() >= int64(n) })
	}
	cmds := e.conCount.total.Load()
	if serr := stop(); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	ls := p.latencies()
	run.Offered, run.LatencyEvents = e.opts.kcRate, len(ls)
	run.P50ms, run.P99ms, run.Maxms = quantile(ls, 0.5), quantile(ls, 0.99), quantile(ls, 1)
	run.LatencyMongoPerEvent = float64(cmds) / float64(n)
	return nil
}

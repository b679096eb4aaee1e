package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/event-outbox/outbox"
)

// latencyResult is the outcome of a latency phase.
type latencyResult struct {
	Offered       int     `json:"offered_events_per_s"`
	Events        int     `json:"events"`
	P50ms         float64 `json:"p50_ms"`
	P95ms         float64 `json:"p95_ms"`
	P99ms         float64 `json:"p99_ms"`
	Maxms         float64 `json:"max_ms"`
	MongoPerEvent float64 `json:"relay_mongo_commands_per_event"`
	KafkaPerEvent float64 `json:"kafka_requests_per_event"`
	// Breakdown splits the latency: commit → produced (Kafka record
	// timestamp), → fetched by a watching consumer, → handler start. The
	// record timestamp is the producer's clock in this process.
	Breakdown map[string]float64 `json:"breakdown_ms,omitempty"`
	// MongoCommands breaks the relay's commands down by name.
	MongoCommands map[string]int64 `json:"relay_mongo_commands,omitempty"`
}

// latencyProbe matches commits with handler starts by idempotency key.
type latencyProbe struct {
	mu        sync.Mutex
	committed map[string]time.Time
	started   map[string]time.Time
	// produced and fetched are the Kafka record's timestamp (when the relay
	// produced it) and when a watching consumer fetched it.
	produced, fetched map[string]time.Time
	handled           atomic.Int64
	// run tells the idempotency keys of this probe's events from those of
	// earlier runs in the same databases: a key seen before is a duplicate
	// to the inbox, and its handler never runs.
	run int64
}

// probeRuns numbers the probes of a process.
var probeRuns atomic.Int64

// watch follows topic with a plain consumer and notes when each record was
// produced and fetched, for the latency breakdown.
func (p *latencyProbe) watch(ctx context.Context, e *env, topic string) (stop func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchMaxWait(time.Second))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == outbox.HeaderIdempotencyKey {
						p.mu.Lock()
						p.produced[string(h.Value)] = r.Timestamp
						p.fetched[string(h.Value)] = now
						p.mu.Unlock()
					}
				}
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }, nil
}

// breakdown returns the medians and p99 of commit → produce, produce →
// fetch and fetch → handler start.
func (p *latencyProbe) breakdown() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var a, b, c []time.Duration
	for k, s := range p.started {
		cm, ok1 := p.committed[k]
		pr, ok2 := p.produced[k]
		fe, ok3 := p.fetched[k]
		if ok1 && ok2 && ok3 {
			a = append(a, pr.Sub(cm))
			b = append(b, fe.Sub(pr))
			c = append(c, s.Sub(fe))
		}
	}
	for _, x := range [][]time.Duration{a, b, c} {
		slices.Sort(x)
	}
	return map[string]float64{
		"commit_to_produce_p50_ms": quantile(a, 0.5), "commit_to_produce_p99_ms": quantile(a, 0.99),
		"produce_to_fetch_p50_ms": quantile(b, 0.5), "produce_to_fetch_p99_ms": quantile(b, 0.99),
		"fetch_to_handler_p50_ms": quantile(c, 0.5), "fetch_to_handler_p99_ms": quantile(c, 0.99),
	}
}

func newLatencyProbe() *latencyProbe {
	return &latencyProbe{committed: map[string]time.Time{}, started: map[string]time.Time{},
		produced: map[string]time.Time{}, fetched: map[string]time.Time{}, run: probeRuns.Add(1)}
}

func (p *latencyProbe) commit(key string, at time.Time) {
	p.mu.Lock()
	p.committed[key] = at
	p.mu.Unlock()
}

func (p *latencyProbe) start(key string, at time.Time) {
	p.mu.Lock()
	if _, dup := p.started[key]; !dup {
		p.started[key] = at
		p.handled.Add(1)
	}
	p.mu.Unlock()
}

func (p *latencyProbe) latencies() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]time.Duration, 0, len(p.started))
	for k, s := range p.started {
		if c, ok := p.committed[k]; ok {
			// A handler may start a hair before Transact returns to the
			// caller (the commit is visible before the reply arrives).
			out = append(out, max(s.Sub(c), 0))
		}
	}
	slices.Sort(out)
	return out
}

func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	i := min(int(q*float64(len(ds))), len(ds)-1)
	return float64(ds[i].Microseconds()) / 1000
}

// offer records events at a fixed rate for d, one event per transaction,
// from a few writers; mk builds event i. Probe events (i < 0) wait for the
// pipeline to be ready first.
func offer(ctx context.Context, rec *outbox.Client, p *latencyProbe, rate int, d time.Duration, mk func(i int) outbox.Event, afterWarmUp func()) (int, error) {
	// Warm up: one event at a time until one is handled.
	for i := -1; p.handled.Load() == 0; i-- {
		if err := rec.Transact(ctx, func(ctx context.Context) error {
			return outbox.Record(ctx, mk(i), outbox.WithIdempotencyKey(fmt.Sprintf("warm-%d-%d", p.run, -i)))
		}); err != nil {
			return 0, fmt.Errorf("warm-up: %w", err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Let the warm-up events drain, then forget them.
	time.Sleep(500 * time.Millisecond)
	p.mu.Lock()
	p.started = map[string]time.Time{}
	p.committed = map[string]time.Time{}
	p.handled.Store(0)
	p.mu.Unlock()
	afterWarmUp()

	n := int(float64(rate) * d.Seconds())
	jobs := make(chan int, n)
	const writers = 16
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range writers {
		wg.Go(func() {
			for i := range jobs {
				key := fmt.Sprintf("lat-%d-%d", p.run, i)
				err := rec.Transact(ctx, func(ctx context.Context) error {
					return outbox.Record(ctx, mk(i), outbox.WithIdempotencyKey(key))
				})
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				p.commit(key, time.Now())
			}
		})
	}
	start := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	sent := 0
	for sent < n {
		<-tick.C
		due := min(int(time.Since(start).Seconds()*float64(rate)), n)
		for ; sent < due; sent++ {
			jobs <- sent
		}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, fmt.Errorf("record: %w", err)
	}
	return n, nil
}

// runLatencyOurs measures commit → handler start through the framework's
// publisher and consumer at the offered rate.
func runLatencyOurs(ctx context.Context, e *env) (latencyResult, error) {
	const phase = "latency"
	p := newLatencyProbe()
	mk := func(i int) outbox.Event { return latencyEvent{newPayload(i, e.opts.eventSize)} }
	rec, err := outbox.New(e.config(e.setup, phase, "lat-recorder", topics.latency))
	if err != nil {
		return latencyResult{}, err
	}
	var cs, pubs, cons []*outbox.Client
	for range e.opts.replicas {
		pub, err := outbox.New(e.config(e.pubMongo, phase, "lat", topics.latency))
		if err != nil {
			return latencyResult{}, err
		}
		con, err := outbox.New(e.config(e.conMongo, phase, "lat-consumer"))
		if err != nil {
			return latencyResult{}, err
		}
		outbox.MustHandle(con, func(_ context.Context, _ latencyEvent, m outbox.Metadata) error {
			p.start(m.IdempotencyKey, time.Now())
			return nil
		})
		cs = append(cs, pub, con)
		pubs, cons = append(pubs, pub), append(cons, con)
	}
	unwatch, err := p.watch(ctx, e, topics.latency)
	if err != nil {
		return latencyResult{}, err
	}
	defer unwatch()
	stop := runClients(cs...)
	if err := waitSettled(ctx, e, pubs, cons); err != nil {
		_ = stop()
		return latencyResult{}, err
	}
	res, err := measureLatency(ctx, e, rec, p, mk)
	if serr := stop(); serr != nil && err == nil {
		err = serr
	}
	return res, err
}

// runLatencyPolling measures the same through the polling baseline relay
// and the framework's consumer.
func runLatencyPolling(ctx context.Context, e *env) (latencyResult, error) {
	const phase = "polllatency"
	p := newLatencyProbe()
	mk := func(i int) outbox.Event { return pollLatencyEvent{newPayload(i, e.opts.eventSize)} }
	rec, err := outbox.New(e.config(e.setup, phase, "poll-lat-recorder", topics.pollLatency))
	if err != nil {
		return latencyResult{}, err
	}
	if err := rec.EnsureIndexes(ctx); err != nil {
		return latencyResult{}, err
	}
	relay, err := newPollingRelay(ctx, e, e.pubMongo.Database(e.db(phase)).Collection("outbox"), topics.pollLatency)
	if err != nil {
		return latencyResult{}, err
	}
	var cs []*outbox.Client
	for range e.opts.replicas {
		con, err := outbox.New(e.config(e.conMongo, phase, "poll-lat-consumer"))
		if err != nil {
			return latencyResult{}, err
		}
		outbox.MustHandle(con, func(_ context.Context, _ pollLatencyEvent, m outbox.Metadata) error {
			p.start(m.IdempotencyKey, time.Now())
			return nil
		})
		cs = append(cs, con)
	}
	unwatch, err := p.watch(ctx, e, topics.pollLatency)
	if err != nil {
		return latencyResult{}, err
	}
	defer unwatch()
	stop := runClients(cs...)
	if err := waitSettled(ctx, e, nil, cs); err != nil {
		_ = stop()
		return latencyResult{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	rerr := make(chan error, 1)
	go func() { rerr <- relay.run(rctx, func(int) {}) }()
	res, err := measureLatency(ctx, e, rec, p, mk)
	cancel()
	if rerr := <-rerr; rerr != nil && err == nil {
		err = rerr
	}
	if serr := stop(); serr != nil && err == nil {
		err = serr
	}
	return res, err
}

func measureLatency(ctx context.Context, e *env, rec *outbox.Client, p *latencyProbe, mk func(int) outbox.Event) (latencyResult, error) {
	var mongoCmds, kafkaReqs int64
	var names map[string]int64
	// Counters start after the warm-up, inside offer, via the hook below.
	n, err := offerCounted(ctx, e, rec, p, mk, func() {
		e.pubCount.reset()
		e.kafka.reset()
	})
	if err != nil {
		return latencyResult{}, err
	}
	if err := waitFor(ctx, time.Minute, "every offered event to be handled", func() bool {
		return p.handled.Load() >= int64(n)
	}); err != nil {
		return latencyResult{}, err
	}
	mongoCmds, kafkaReqs, names = e.pubCount.total.Load(), e.kafka.requests.Load(), e.pubCount.names()
	ls := p.latencies()
	bd := p.breakdown()
	return latencyResult{
		Offered: e.opts.rate, Events: len(ls),
		P50ms: quantile(ls, 0.50), P95ms: quantile(ls, 0.95), P99ms: quantile(ls, 0.99),
		Maxms:         quantile(ls, 1),
		MongoPerEvent: float64(mongoCmds) / float64(n),
		KafkaPerEvent: float64(kafkaReqs) / float64(n),
		MongoCommands: names,
		Breakdown:     bd,
	}, nil
}

// offerCounted is offer with a callback run between the warm-up and the
// measured load.
func offerCounted(ctx context.Context, e *env, rec *outbox.Client, p *latencyProbe, mk func(int) outbox.Event, afterWarmUp func()) (int, error) {
	return offer(ctx, rec, p, e.opts.rate, e.opts.duration, mk, afterWarmUp)
}

// latencyRun is one run of the latency phase, reduced to what the ratio
// needs.
type latencyRun struct {
	RelayP50ms   float64 `json:"relay_p50_ms"`
	RelayP99ms   float64 `json:"relay_p99_ms"`
	PollingP99ms float64 `json:"polling_p99_ms"`
	// Ratio is PollingP99ms / RelayP99ms (0 when the relay's p99 is 0).
	Ratio float64 `json:"polling_p99_over_relay_p99"`
}

func latencyRuns(ours, polling []latencyResult) []latencyRun {
	out := make([]latencyRun, len(ours))
	for i := range ours {
		out[i] = latencyRun{RelayP50ms: ours[i].P50ms, RelayP99ms: ours[i].P99ms, PollingP99ms: polling[i].P99ms}
		if ours[i].P99ms > 0 {
			out[i].Ratio = polling[i].P99ms / ours[i].P99ms
		}
	}
	return out
}

// medianRun returns the index of the run whose ratio is the median (the
// lower middle one for an even count).
func medianRun(runs []latencyRun) int {
	idx := make([]int, len(runs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(runs[a].Ratio, runs[b].Ratio) })
	return idx[(len(idx)-1)/2]
}

// worstRatio returns the smallest ratio of the runs.
func worstRatio(runs []latencyRun) float64 {
	w := runs[0].Ratio
	for _, r := range runs[1:] {
		w = min(w, r.Ratio)
	}
	return w
}

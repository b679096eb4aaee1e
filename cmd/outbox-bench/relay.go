package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax"
)

// relayResult is the outcome of the relay throughput phase.
type relayResult struct {
	Events        int              `json:"events"`
	Seconds       float64          `json:"seconds"`
	Rate          float64          `json:"events_per_s"`
	MongoPerEvent float64          `json:"mongo_commands_per_event"`
	KafkaPerEvent float64          `json:"kafka_requests_per_event"`
	MongoCommands map[string]int64 `json:"mongo_commands"`
}

// rawResult is the outcome of producing the same records straight to Kafka.
type rawResult struct {
	Events        int     `json:"events"`
	Seconds       float64 `json:"seconds"`
	Rate          float64 `json:"events_per_s"`
	KafkaPerEvent float64 `json:"kafka_requests_per_event"`
}

// baselineResult is the outcome of a baseline relay.
type baselineResult struct {
	Events        int     `json:"events"`
	Seconds       float64 `json:"seconds"`
	Rate          float64 `json:"events_per_s"`
	MongoPerEvent float64 `json:"mongo_commands_per_event"`
}

// runRelay measures the framework's relay: a backlog of n committed events
// is recorded first, then the publisher(s) start; the clock runs from the
// publisher's first read to the last event marked published.
func runRelay(ctx context.Context, e *env, n int, publish string, db string, mk func(int) outbox.Event, sample func()) (relayResult, error) {
	setupCfg := e.config(e.setup, db, "relay-setup", publish)
	sc, err := outbox.New(setupCfg)
	if err != nil {
		return relayResult{}, err
	}
	if err := sc.EnsureIndexes(ctx); err != nil {
		return relayResult{}, err
	}
	if err := fill(ctx, sc, n, 500, mk); err != nil {
		return relayResult{}, fmt.Errorf("record the backlog: %w", err)
	}
	if sample != nil {
		sample()
	}
	var cs []*outbox.Client
	for range e.opts.replicas {
		c, err := outbox.New(e.config(e.pubMongo, db, "relay-"+db, publish))
		if err != nil {
			return relayResult{}, err
		}
		cs = append(cs, c)
	}
	e.pubCount.reset()
	e.kafka.reset()
	stop := runClients(cs...)
	werr := waitFor(ctx, 10*time.Minute, "the backlog to be published", func() bool {
		return e.pubCount.marked.Load() >= int64(n)
	})
	mongoCmds, kafkaReqs := e.pubCount.total.Load(), e.kafka.requests.Load()
	names := e.pubCount.names()
	first, last := e.pubCount.firstFind.Load(), e.pubCount.lastMark.Load()
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return relayResult{}, werr
	}
	secs := time.Duration(last - first).Seconds()
	return relayResult{
		Events: n, Seconds: secs, Rate: float64(n) / secs,
		MongoPerEvent: float64(mongoCmds) / float64(n),
		KafkaPerEvent: float64(kafkaReqs) / float64(n),
		MongoCommands: names,
	}, nil
}

// producerOpts are the publisher's own producer settings.
func producerOpts(e *env, linger time.Duration) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(e.brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(linger),
		kgo.WithHooks(e.kafka),
	}
}

// runRaw produces n records of the same shape and size as the relay's,
// with the publisher's producer settings, straight to Kafka: the ceiling
// of the relay.
func runRaw(ctx context.Context, e *env, n int) (rawResult, error) {
	cl, err := kgo.NewClient(producerOpts(e, 0)...) // the publisher's linger
	if err != nil {
		return rawResult{}, err
	}
	defer cl.Close()
	// Warm up: metadata and the producer id.
	if err := cl.ProduceSync(ctx, rawRecord(0, e.opts.partitions, e.opts.eventSize)).FirstErr(); err != nil {
		return rawResult{}, fmt.Errorf("raw produce: %w", err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = rawRecord(i, e.opts.partitions, e.opts.eventSize)
	}
	e.kafka.reset()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	wg.Add(n)
	start := time.Now()
	for _, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if firstErr != nil {
		return rawResult{}, fmt.Errorf("raw produce: %w", firstErr)
	}
	return rawResult{Events: n, Seconds: secs, Rate: float64(n) / secs,
		KafkaPerEvent: float64(e.kafka.requests.Load()) / float64(n)}, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func rawRecord(i, partitions, size int) *kgo.Record {
	key := keyOf(i)
	value := fmt.Appendf(nil, `{"n":%d,"data":"%s"}`, i, newPayload(i, size).Data)
	return record(topics.raw, kafkax.Partition([]byte(key), partitions), key, "BenchRaw.v1",
		outbox.NewIdempotencyKey(), time.Now(), value)
}

// fillBaseline records n events for a baseline relay in its own database
// and returns its outbox collection.
func fillBaseline(ctx context.Context, e *env, db, publish string, n int, mk func(int) outbox.Event) (*mongo.Collection, error) {
	sc, err := outbox.New(e.config(e.setup, db, "setup-"+db, publish))
	if err != nil {
		return nil, err
	}
	if err := sc.EnsureIndexes(ctx); err != nil {
		return nil, err
	}
	if err := fill(ctx, sc, n, 500, mk); err != nil {
		return nil, fmt.Errorf("record the backlog: %w", err)
	}
	return e.pubMongo.Database(e.db(db)).Collection("outbox"), nil
}

// runNaive is the naive relay: for each event, one transaction that reads
// the oldest unpublished event of a partition (round robin), sends it with
// a synchronous produce and marks it published. It runs for the phase's
// duration or until the backlog is empty.
func runNaive(ctx context.Context, e *env, n int) (baselineResult, error) {
	coll, err := fillBaseline(ctx, e, "naive", topics.naive, n, func(i int) outbox.Event {
		return naiveEvent{newPayload(i, e.opts.eventSize)}
	})
	if err != nil {
		return baselineResult{}, err
	}
	cl, err := kgo.NewClient(producerOpts(e, 0)...)
	if err != nil {
		return baselineResult{}, err
	}
	defer cl.Close()
	e.pubCount.reset()
	done, empty := 0, 0
	start := time.Now()
	deadline := start.Add(e.opts.duration)
	for p := 0; time.Now().Before(deadline) && empty < e.opts.partitions; p = (p + 1) % e.opts.partitions {
		sess, err := e.pubMongo.StartSession()
		if err != nil {
			return baselineResult{}, err
		}
		found := true
		_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
			var ev storedEvent
			err := coll.FindOne(ctx, bson.D{
				{Key: "published", Value: false}, {Key: "topic", Value: topics.naive},
				{Key: "partition", Value: int32(p)}, {Key: "failed", Value: false},
			}, options.FindOne().SetSort(bson.D{{Key: "seq", Value: 1}, {Key: "_id", Value: 1}})).Decode(&ev)
			if errors.Is(err, mongo.ErrNoDocuments) {
				found = false
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			if err := cl.ProduceSync(ctx, ev.record()).FirstErr(); err != nil {
				return nil, err
			}
			_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: ev.ID}}, bson.D{{Key: "$set", Value: bson.D{
				{Key: "published", Value: true}, {Key: "published_at", Value: time.Now().UTC()}}}})
			return nil, err
		})
		sess.EndSession(ctx)
		if err != nil {
			return baselineResult{}, fmt.Errorf("naive relay: %w", err)
		}
		if found {
			done++
			empty = 0
		} else {
			empty++
		}
	}
	secs := time.Since(start).Seconds()
	if done == 0 {
		return baselineResult{}, errors.New("naive relay published nothing")
	}
	return baselineResult{Events: done, Seconds: secs, Rate: float64(done) / secs,
		MongoPerEvent: float64(e.pubCount.total.Load()) / float64(done)}, nil
}

// pollingRelay is the polling baseline: every interval it reads up to batch
// unpublished events of its topic (oldest first, through its own index),
// produces them, waits for the acknowledgements and marks them published in
// one update; while batches come back full it goes on at once.
type pollingRelay struct {
	coll     *mongo.Collection
	producer *kgo.Client
	topic    string
	interval time.Duration
	batch    int
}

func newPollingRelay(ctx context.Context, e *env, coll *mongo.Collection, topic string) (*pollingRelay, error) {
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "topic", Value: 1}, {Key: "seq", Value: 1}, {Key: "_id", Value: 1}},
		Options: options.Index().SetName("polling_baseline").
			SetPartialFilterExpression(bson.D{{Key: "published", Value: false}}),
	})
	if err != nil {
		return nil, fmt.Errorf("polling relay index: %w", err)
	}
	cl, err := kgo.NewClient(producerOpts(e, 0)...)
	if err != nil {
		return nil, err
	}
	return &pollingRelay{coll: coll, producer: cl, topic: topic, interval: 100 * time.Millisecond, batch: 100}, nil
}

// run polls until ctx ends; published counts what it marked.
func (r *pollingRelay) run(ctx context.Context, published func(int)) error {
	defer r.producer.Close()
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		for {
			n, err := r.once(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return fmt.Errorf("polling relay: %w", err)
			}
			published(n)
			if n < r.batch {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (r *pollingRelay) once(ctx context.Context) (int, error) {
	cur, err := r.coll.Find(ctx, bson.D{{Key: "published", Value: false}, {Key: "topic", Value: r.topic}},
		options.Find().SetSort(bson.D{{Key: "seq", Value: 1}, {Key: "_id", Value: 1}}).
			SetLimit(int64(r.batch)).SetBatchSize(int32(r.batch)))
	if err != nil {
		return 0, err
	}
	var evs []storedEvent
	if err := cur.All(ctx, &evs); err != nil {
		return 0, err
	}
	if len(evs) == 0 {
		return 0, nil
	}
	recs := make([]*kgo.Record, len(evs))
	ids := make(bson.A, len(evs))
	for i := range evs {
		recs[i] = evs[i].record()
		ids[i] = evs[i].ID
	}
	if err := r.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, err
	}
	_, err = r.coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: time.Now().UTC()}}}})
	return len(evs), err
}

// runPolling measures the polling baseline's throughput on a backlog of n.
func runPolling(ctx context.Context, e *env, n int) (baselineResult, error) {
	coll, err := fillBaseline(ctx, e, "poll", topics.poll, n, func(i int) outbox.Event {
		return pollEvent{newPayload(i, e.opts.eventSize)}
	})
	if err != nil {
		return baselineResult{}, err
	}
	r, err := newPollingRelay(ctx, e, coll, topics.poll)
	if err != nil {
		return baselineResult{}, err
	}
	e.pubCount.reset()
	rctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	done := 0
	finished := make(chan struct{})
	start := time.Now()
	var end time.Time
	errc := make(chan error, 1)
	go func() {
		errc <- r.run(rctx, func(k int) {
			mu.Lock()
			defer mu.Unlock()
			done += k
			if done >= n && end.IsZero() {
				end = time.Now()
				close(finished)
			}
		})
	}()
	select {
	case <-finished:
	case <-time.After(max(e.opts.duration, time.Minute) * 10):
	}
	cancel()
	if err := <-errc; err != nil {
		return baselineResult{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	if end.IsZero() {
		return baselineResult{}, fmt.Errorf("polling relay published %d of %d events", done, n)
	}
	secs := end.Sub(start).Seconds()
	return baselineResult{Events: n, Seconds: secs, Rate: float64(n) / secs,
		MongoPerEvent: float64(e.pubCount.total.Load()) / float64(n)}, nil
}

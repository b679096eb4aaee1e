package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax"
)

// consumeResult is the outcome of the consumer throughput phase.
type consumeResult struct {
	Events        int              `json:"events"`
	Seconds       float64          `json:"seconds"`
	Rate          float64          `json:"events_per_s"`
	MongoPerEvent float64          `json:"mongo_commands_per_event"`
	KafkaPerEvent float64          `json:"kafka_requests_per_event"`
	MongoCommands map[string]int64 `json:"mongo_commands"`
}

// runConsume produces n framework records straight to Kafka, then runs the
// consumer(s) with a handler that does nothing; the clock runs from the
// first handler start to the last handled event's commit (the last inbox
// transaction's commitTransaction reply).
func runConsume(ctx context.Context, e *env, n int) (consumeResult, error) {
	if err := produceBacklog(ctx, e, topics.consume, consumeEvent{}.ContentSchema(), n, keyOf); err != nil {
		return consumeResult{}, err
	}
	return consumeBacklog[consumeEvent](ctx, e, "consume", "consume", n, 1)
}

// produceBacklog produces n framework records of schema to topic straight
// to Kafka; key names the partition key of record i.
func produceBacklog(ctx context.Context, e *env, topic, schema string, n int, key func(int) string) error {
	cl, err := kgo.NewClient(producerOpts(e, 5*time.Millisecond)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		k := key(i)
		value := fmt.Appendf(nil, `{"n":%d,"data":"%s"}`, i, newPayload(i, e.opts.eventSize).Data)
		recs[i] = record(topic, kafkax.Partition([]byte(k), e.opts.partitions), k,
			schema, outbox.NewIdempotencyKey(), time.Now(), value)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce the records: %w", err)
	}
	return nil
}

// consumeBacklog handles the n records of E's topic with a handler that
// does nothing, in the database of phase and the groups of service, with
// Config.KeyConcurrency keyConcurrency; see runConsume.
func consumeBacklog[E outbox.Event](ctx context.Context, e *env, phase, service string, n, keyConcurrency int) (consumeResult, error) {
	var handled atomic.Int64
	var first atomic.Int64
	var cs []*outbox.Client
	for range e.opts.replicas {
		cfg := e.config(e.conMongo, phase, service)
		cfg.KeyConcurrency = keyConcurrency
		c, err := outbox.New(cfg)
		if err != nil {
			return consumeResult{}, err
		}
		outbox.MustHandle(c, func(context.Context, E, outbox.Metadata) error {
			first.CompareAndSwap(0, time.Now().UnixNano())
			handled.Add(1)
			return nil
		})
		cs = append(cs, c)
	}
	// Indexes first, so that Run's own EnsureIndexes is not counted.
	if err := cs[0].EnsureIndexes(ctx); err != nil {
		return consumeResult{}, err
	}
	e.conCount.reset()
	e.kafka.reset()
	stop := runClients(cs...)
	// Every handler started; wait for the last transactions to commit.
	werr := waitFor(ctx, 10*time.Minute, "every record to be handled", func() bool { return handled.Load() >= int64(n) })
	if werr == nil {
		werr = waitFor(ctx, time.Minute, "the inbox to hold every event", func() bool {
			c, err := e.setup.Database(e.db(phase)).Collection("inbox").CountDocuments(ctx, bson.D{{Key: "handled", Value: true}})
			return err == nil && c >= int64(n)
		})
	}
	mongoCmds, kafkaReqs, names := e.conCount.total.Load(), e.kafka.requests.Load(), e.conCount.names()
	if err := stop(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return consumeResult{}, werr
	}
	secs := time.Duration(e.conCount.lastCommit.Load() - first.Load()).Seconds()
	return consumeResult{Events: n, Seconds: secs, Rate: float64(n) / secs,
		MongoPerEvent: float64(mongoCmds) / float64(n), KafkaPerEvent: float64(kafkaReqs) / float64(n),
		MongoCommands: names}, nil
}

// runBare measures bare one-document transactions (insert one small
// document, commit) on the same server, from as many goroutines as the
// consumer has partition workers: the consumer's ceiling.
func runBare(ctx context.Context, e *env) (baselineResult, error) {
	coll := e.conMongo.Database(e.db("bare")).Collection("docs")
	workers := e.opts.partitions
	var done atomic.Int64
	var mu sync.Mutex
	var firstErr error
	e.conCount.reset()
	start := time.Now()
	deadline := start.Add(e.opts.duration)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			sess, err := e.conMongo.StartSession()
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			defer sess.EndSession(ctx)
			for i := 0; time.Now().Before(deadline); i++ {
				_, err := sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
					_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("%d-%d", w, i)}, {Key: "handled", Value: true}})
					return nil, err
				}, txnOpts())
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if firstErr != nil {
		return baselineResult{}, fmt.Errorf("bare transactions: %w", firstErr)
	}
	n := int(done.Load())
	return baselineResult{Events: n, Seconds: secs, Rate: float64(n) / secs,
		MongoPerEvent: float64(e.conCount.total.Load()) / float64(n)}, nil
}

// txnOpts are the framework's transaction options (majority commit).
func txnOpts() *options.TransactionOptionsBuilder {
	return options.Transaction().SetWriteConcern(writeconcern.Majority())
}

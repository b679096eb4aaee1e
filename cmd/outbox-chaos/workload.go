package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// Schemas of the workload's events.
const (
	schemaStep   = "ChaosStep.v1"
	schemaPoison = "ChaosPoison.v1"
)

// topicName is set once per run (the topic is unique per run so that runs
// against real brokers do not see each other's records).
var topicName atomic.Pointer[string]

func chaosTopic() string { return *topicName.Load() }

// stepEvent is the workload's ordinary event: the Seq-th event of Key, Seq
// assigned in the recording transaction from the key's counter document, so
// the commit order of a key's events is 1, 2, 3...
type stepEvent struct {
	Key string `json:"key" validate:"required"`
	Seq int64  `json:"seq" validate:"gte=1"`
	ID  string `json:"id" validate:"required"`
}

func (stepEvent) Topic() string          { return chaosTopic() }
func (stepEvent) ContentSchema() string  { return schemaStep }
func (e stepEvent) PartitionKey() string { return e.Key }

// poisonEvent's handler always fails: it must end parked, never blocking
// its partition.
type poisonEvent struct {
	Key string `json:"key" validate:"required"`
	ID  string `json:"id" validate:"required"`
}

func (poisonEvent) Topic() string          { return chaosTopic() }
func (poisonEvent) ContentSchema() string  { return schemaPoison }
func (e poisonEvent) PartitionKey() string { return e.Key }

// Collections of the workload (in the run's database, next to the
// framework's outbox and inbox).
const (
	collCounters   = "chaos_counters"   // {_id: key, seq}: last committed seq per key
	collLedger     = "chaos_ledger"     // {_id: event id, key, seq, poison}: every committed event
	collApplied    = "chaos_applied"    // {_id: key, seq}: last handled seq per key
	collEffects    = "chaos_effects"    // {event, key, seq, replica}: one per committed handling
	collViolations = "chaos_violations" // {event, key, seq, last}: out-of-order handlings
)

// workload records events and handles them.
type workload struct {
	db          *mongo.Database
	keys        []string
	transient   int     // percent of step events whose first handling attempt fails
	poisonRatio float64 // probability that a transaction also records a poison event
	abortRatio  float64 // probability that a transaction is aborted on purpose

	attempted sync.Map // event id -> struct{}: every id any attempt generated
	nextID    atomic.Int64
	runID     string

	recorded    atomic.Int64 // transactions that returned nil
	aborted     atomic.Int64 // transactions aborted on purpose
	failedTx    atomic.Int64 // transactions that failed (faults, kills)
	handledRuns atomic.Int64
}

var errPlannedAbort = errors.New("chaos: transaction aborted on purpose")
var errTransient = errors.New("chaos: transient handler failure")
var errPoison = errors.New("chaos: poison event, handler always fails")

func (w *workload) newID() string {
	id := fmt.Sprintf("%s-%d", w.runID, w.nextID.Add(1))
	w.attempted.Store(id, struct{}{})
	return id
}

// prepare creates the per-key documents, so that handlers and recorders
// update existing documents instead of racing upserts.
func (w *workload) prepare(ctx context.Context) error {
	docs := make([]any, len(w.keys))
	for i, k := range w.keys {
		docs[i] = bson.D{{Key: "_id", Value: k}, {Key: "seq", Value: int64(0)}}
	}
	for _, c := range []string{collCounters, collApplied} {
		if _, err := w.db.Collection(c).InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("prepare %s: %w", c, err)
		}
	}
	_, err := w.db.Collection(collEffects).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "event", Value: 1}}})
	return err
}

// transact runs one business transaction on client: 1-3 step events for
// random keys, sometimes a poison event, sometimes an abort on purpose.
// db is the replica's database handle: operations in a transaction must use
// the MongoDB client that started it.
func (w *workload) transact(ctx context.Context, client *outbox.Client, db *mongo.Database, rng *rand.Rand) error {
	n := 1 + rng.IntN(3)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = w.keys[rng.IntN(len(w.keys))]
	}
	poison := rng.Float64() < w.poisonRatio
	abort := rng.Float64() < w.abortRatio
	counters := db.Collection(collCounters)
	ledger := db.Collection(collLedger)
	err := client.Transact(ctx, func(ctx context.Context) error {
		for _, k := range keys {
			var c struct {
				Seq int64 `bson:"seq"`
			}
			err := counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: k}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}}}},
				options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
			if err != nil {
				return err
			}
			id := w.newID()
			if err := outbox.Record(ctx, stepEvent{Key: k, Seq: c.Seq, ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "key", Value: k}, {Key: "seq", Value: c.Seq}, {Key: "poison", Value: false}}); err != nil {
				return err
			}
		}
		if poison {
			id := w.newID()
			if err := outbox.Record(ctx, poisonEvent{Key: keys[0], ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "key", Value: keys[0]}, {Key: "seq", Value: int64(0)}, {Key: "poison", Value: true}}); err != nil {
				return err
			}
		}
		if abort {
			return errPlannedAbort
		}
		return nil
	})
	switch {
	case err == nil:
		w.recorded.Add(1)
	case errors.Is(err, errPlannedAbort):
		w.aborted.Add(1)
	default:
		w.failedTx.Add(1)
	}
	return err
}

// register adds the workload's handlers to a replica's client.
func (w *workload) register(client *outbox.Client, db *mongo.Database, replica string) error {
	applied := db.Collection(collApplied)
	effects := db.Collection(collEffects)
	violations := db.Collection(collViolations)
	err := outbox.Handle(client, func(ctx context.Context, e stepEvent, meta outbox.Metadata) error {
		if meta.Attempt == 1 && w.failsOnce(e.ID) {
			return errTransient
		}
		var st struct {
			Seq int64 `bson:"seq"`
		}
		if err := applied.FindOne(ctx, bson.D{{Key: "_id", Value: e.Key}}).Decode(&st); err != nil {
			return err
		}
		if e.Seq != st.Seq+1 {
			if _, err := violations.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "key", Value: e.Key},
				{Key: "seq", Value: e.Seq}, {Key: "last", Value: st.Seq}, {Key: "replica", Value: replica}}); err != nil {
				return err
			}
		}
		if _, err := applied.UpdateOne(ctx, bson.D{{Key: "_id", Value: e.Key}},
			bson.D{{Key: "$max", Value: bson.D{{Key: "seq", Value: e.Seq}}}}); err != nil {
			return err
		}
		if _, err := effects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "key", Value: e.Key},
			{Key: "seq", Value: e.Seq}, {Key: "replica", Value: replica}, {Key: "at", Value: time.Now()}}); err != nil {
			return err
		}
		w.handledRuns.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	return outbox.Handle(client, func(context.Context, poisonEvent, outbox.Metadata) error {
		return errPoison
	})
}

// failsOnce decides, from the event id alone, whether the first handling
// attempt of a step event fails.
func (w *workload) failsOnce(id string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32()%100) < w.transient
}

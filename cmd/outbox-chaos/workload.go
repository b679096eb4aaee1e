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
	// Pad makes the event as large as a fault needs: about 55% of a small
	// max.message.bytes (two do not fit in one batch), 150% of it (too large
	// alone) or stormPad (pause storms).
	Pad string `json:"pad,omitempty"`
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
	sameKey     float64 // probability that a multi-event transaction records consecutive events of one key

	attempted sync.Map // event id -> struct{}: every id any attempt generated
	nextID    atomic.Int64
	runID     string

	recorded    atomic.Int64 // transactions that returned nil
	aborted     atomic.Int64 // transactions aborted on purpose
	failedTx    atomic.Int64 // transactions that failed (faults, kills)
	handledRuns atomic.Int64

	// smallLimit is the topic's max.message.bytes while a small-limit
	// window is open (0 otherwise): transactions then pad some events to
	// about 55% of it (innocent: each fits alone, two do not fit one batch)
	// and some to 150% of it (oversize: refused alone).
	smallLimit atomic.Int64
	padded     atomic.Int64 // padded events attempted (both sizes)
	oversize   atomic.Int64 // oversize events attempted

	// slowArmed is how many more step events get a first handling attempt
	// slower than the MongoDB transaction lifetime; slowIDs the events
	// chosen; slowFor how long their handler takes.
	slowArmed atomic.Int64
	slowIDs   sync.Map // event id -> struct{}
	slowFor   time.Duration
	slowRuns  atomic.Int64 // slow handler runs (each one beyond the lifetime)

	// Downstream outages: while a key is down its step handler fails, so
	// its events exhaust MaxAttempts and are parked.
	outMu   sync.Mutex
	outages map[string]*outage // by key: the current (last) outage
	// poisoned holds the keys a poison event was recorded for (maybe in a
	// transaction that then aborted): under HoldKey their later step
	// events are held behind it, and released (parked, then re-driven) when
	// the operator purges it.
	poisoned map[string]bool
}

// outage is one key's downstream outage. It lasts until `until` and, when
// the consumer lags, longer: until one of the key's events was seen parked
// (so that every outage exceeds the retry budget of some event), at most
// until hardEnd.
type outage struct {
	until, hardEnd time.Time
	parked         bool
}

// outageCap bounds an outage that no parked event ends (a key without
// traffic).
const outageCap = 30 * time.Second

var (
	errPlannedAbort = errors.New("chaos: transaction aborted on purpose")
	errTransient    = errors.New("chaos: transient handler failure")
	errPoison       = errors.New("chaos: poison event, handler always fails")
	errDownstream   = errors.New("chaos: downstream outage")
)

// stormPad is the payload padding of a pause storm's events: the
// consumer's queue pauses its partition at 8 MiB of values (the root
// package's maxQueueBytes), so about 40 of them fill it.
const stormPad = 200 << 10

// plan is one transaction's content, drawn before it runs.
type plan struct {
	keys   []string
	pads   []int // padding per event
	poison bool
	abort  bool
}

// newPlan draws a transaction: 1-3 step events, with probability sameKey
// (when more than one) all of the same key, so that a reordering inside a
// batch is visible on every seed; sometimes padded (small-limit window),
// a poison event, or an abort on purpose.
func (w *workload) newPlan(rng *rand.Rand) plan {
	n := 1 + rng.IntN(3)
	p := plan{keys: make([]string, n), pads: make([]int, n)}
	one := n > 1 && rng.Float64() < w.sameKey
	for i := range p.keys {
		if one && i > 0 {
			p.keys[i] = p.keys[0]
		} else {
			p.keys[i] = w.keys[rng.IntN(len(w.keys))]
		}
	}
	if limit := int(w.smallLimit.Load()); limit > 0 && rng.Float64() < 0.4 {
		for i := range p.pads {
			p.pads[i] = limit * 55 / 100
		}
		if rng.Float64() < 0.3 {
			p.pads[rng.IntN(n)] = limit * 3 / 2
		}
	}
	p.poison = rng.Float64() < w.poisonRatio
	p.abort = rng.Float64() < w.abortRatio
	return p
}

// padding returns n bytes of random letters (incompressible enough that
// Kafka's batch compression keeps the size).
func padding(rng *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return string(b)
}

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

// transact runs one business transaction on client: the step events of
// p in order (each taking the next seq of its key), maybe a poison event,
// maybe an abort on purpose. db is the replica's database handle:
// operations in a transaction must use the MongoDB client that started it.
func (w *workload) transact(ctx context.Context, client *outbox.Client, db *mongo.Database, rng *rand.Rand, p plan) error {
	counters := db.Collection(collCounters)
	ledger := db.Collection(collLedger)
	pads := make([]string, len(p.pads))
	for i, n := range p.pads {
		if n > 0 {
			pads[i] = padding(rng, n)
		}
	}
	err := client.Transact(ctx, func(ctx context.Context) error {
		for i, k := range p.keys {
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
			if pads[i] != "" {
				w.padded.Add(1)
				if limit := w.smallLimit.Load(); limit > 0 && int64(len(pads[i])) > limit {
					w.oversize.Add(1)
				}
			}
			if err := outbox.Record(ctx, stepEvent{Key: k, Seq: c.Seq, ID: id, Pad: pads[i]}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "key", Value: k}, {Key: "seq", Value: c.Seq}, {Key: "poison", Value: false}}); err != nil {
				return err
			}
		}
		if p.poison {
			w.outMu.Lock()
			if w.poisoned == nil {
				w.poisoned = map[string]bool{}
			}
			w.poisoned[p.keys[0]] = true
			w.outMu.Unlock()
			id := w.newID()
			if err := outbox.Record(ctx, poisonEvent{Key: p.keys[0], ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "key", Value: p.keys[0]}, {Key: "seq", Value: int64(0)}, {Key: "poison", Value: true}}); err != nil {
				return err
			}
		}
		if p.abort {
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
		if w.isDown(e.Key) {
			return errDownstream
		}
		if meta.Attempt == 1 && w.isSlow(e.ID) {
			// Slower than the transaction lifetime: the transaction is
			// gone by the time the handler returns, so this attempt must
			// fail (and count as one), the next one is fast. The handler
			// honours its context, as handlers should.
			w.slowRuns.Add(1)
			if err := sleepCtx(ctx, w.slowFor); err != nil {
				return err
			}
		}
		if meta.Attempt == 1 && w.failsOnce(e.ID) {
			return errTransient
		}
		if len(e.Pad) >= stormPad {
			// Pause storms: a slow worker lets the queue fill.
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return err
			}
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

// isSlow reports whether the first handling attempt of a step event is
// slower than the transaction lifetime: events chosen while slow handlers
// are armed (fault "slow-handler").
func (w *workload) isSlow(id string) bool {
	if _, ok := w.slowIDs.Load(id); ok {
		return true
	}
	for {
		n := w.slowArmed.Load()
		if n <= 0 {
			return false
		}
		if w.slowArmed.CompareAndSwap(n, n-1) {
			w.slowIDs.Store(id, struct{}{})
			return true
		}
	}
}

// startOutage makes keys' downstream fail for at least d.
func (w *workload) startOutage(keys []string, d time.Duration) {
	now := time.Now()
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if w.outages == nil {
		w.outages = map[string]*outage{}
	}
	for _, k := range keys {
		w.outages[k] = &outage{until: now.Add(d), hardEnd: now.Add(d + outageCap)}
	}
}

// isDown reports whether key's downstream is in an outage.
func (w *workload) isDown(key string) bool {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	o := w.outages[key]
	if o == nil {
		return false
	}
	now := time.Now()
	return now.Before(o.until) || !o.parked && now.Before(o.hardEnd)
}

// sawParked tells key's outage that one of its events was parked.
func (w *workload) sawParked(key string) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if o := w.outages[key]; o != nil {
		o.parked = true
	}
}

// mayPark reports whether key's step events may be parked: its downstream
// was down once, or a poison event of the key held them (a released held
// event is parked until its re-drive, and a re-drive that meets a
// transient failure leaves it parked).
func (w *workload) mayPark(key string) bool {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	return w.outages[key] != nil || w.poisoned[key]
}

// endOutages ends every outage (quiescence).
func (w *workload) endOutages() {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	for _, o := range w.outages {
		o.until, o.hardEnd = time.Time{}, time.Time{}
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

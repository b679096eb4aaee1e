package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
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
	schemaFollow = "ChaosFollow.v1"
	schemaNew    = "ChaosNew.v1"
)

// topicName is set once per run (the topic is unique per run so that runs
// against real brokers do not see each other's records).
var topicName atomic.Pointer[string]

func chaosTopic() string { return *topicName.Load() }

// topicPrefix is the replicas' Config.TopicPrefix of the run (-topic-prefix):
// the framework's names (events, ledger, inbox ids) are bare topics, Kafka's
// are prefixed. Set once per run, before the first replica.
var topicPrefix atomic.Pointer[string]

// kafkaTopic is the Kafka topic of the bare topic t.
func kafkaTopic(t string) string {
	if p := topicPrefix.Load(); p != nil {
		return *p + t
	}
	return t
}

// bareTopic is the bare topic of the Kafka topic k: every topic the
// harness reads from Kafka crosses this boundary, so that the checks
// compare bare names only.
func bareTopic(k string) string {
	if p := topicPrefix.Load(); p != nil {
		return strings.TrimPrefix(k, *p)
	}
	return k
}

// chainTopic is the second topic: the follow-up events that step handlers
// record in their own transaction go there.
func chainTopic() string { return chaosTopic() + "-chain" }

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

// followEvent is the follow-up a step handler records, in its own
// transaction, for the step events that chain (chains): the Seq-th
// follow-up of Key, Seq taken from the key's applied document in the same
// transaction, so per key the follow-ups' commit order is 1, 2, 3...
// Source is the step event it follows; its id is followID(Source).
type followEvent struct {
	Key    string `json:"key" validate:"required"`
	Seq    int64  `json:"seq" validate:"gte=1"`
	ID     string `json:"id" validate:"required"`
	Source string `json:"source" validate:"required"`
}

func (followEvent) Topic() string          { return chainTopic() }
func (followEvent) ContentSchema() string  { return schemaFollow }
func (e followEvent) PartitionKey() string { return e.Key }

// newEvent is an event type the replicas first have no handler for: the
// no-handler-deploy scenario (extras.go) records some, then deploys the
// handler by a rolling restart. Until then each must stay parked (reason
// no_handler) holding its key, then be handled once.
type newEvent struct {
	Key string `json:"key" validate:"required"`
	ID  string `json:"id" validate:"required"`
}

func (newEvent) Topic() string          { return chaosTopic() }
func (newEvent) ContentSchema() string  { return schemaNew }
func (e newEvent) PartitionKey() string { return e.Key }

// followID is the id (and idempotency key) of the follow-up of step event
// source: one per source, whichever attempt records it.
func followID(source string) string { return source + "-f" }

// Kinds of ledger entries.
const (
	kindStep   = "step"   // a step event, recorded by the load
	kindPoison = "poison" // a poison event, recorded by the load
	kindFollow = "follow" // a follow-up, recorded by a step handler
	kindNew    = "new"    // an event of a type deployed late (no-handler-deploy)
)

// ledgerEntry is one committed event, written in the transaction that
// recorded it. Place is the event's place in its key's sequence on its
// topic, over every kind (1, 2, 3...): the order in which the key's events
// must be handled. Seq numbers the step events of a key alone (0 for a
// poison event), the order the step handler checks; a follow-up's Seq and
// Place are its place among its key's follow-ups.
type ledgerEntry struct {
	ID     string `bson:"_id"`
	Topic  string `bson:"topic"`
	Key    string `bson:"key"`
	Seq    int64  `bson:"seq"`
	Place  int64  `bson:"place"`
	Kind   string `bson:"kind"`
	Source string `bson:"source,omitempty"` // follow-ups: the step event handled
	// External marks a step event produced straight to Kafka in the Python
	// event-outbox library's format (eventoutbox.go): never in the outbox.
	External bool `bson:"external,omitempty"`
	// PadSum is the digest of a padded step event's pad (padSum), which
	// its handler must see whole.
	PadSum string `bson:"pad_sum,omitempty"`
	// DueAt is a scheduled event's due time, PastDue set when it was due
	// already at Record; Cancelled and TooLate are set by the transaction
	// of a cancellation that returned nil or ErrTooLate (scheduled.go).
	DueAt     time.Time `bson:"due_at,omitempty"`
	PastDue   bool      `bson:"past_due,omitempty"`
	Cancelled bool      `bson:"cancelled,omitempty"`
	TooLate   bool      `bson:"too_late,omitempty"`
}

// Poison reports whether the entry is a poison event.
func (e *ledgerEntry) Poison() bool { return e.Kind == kindPoison }

// handledKind reports whether the entry's handler succeeds (step events,
// follow-ups and scheduled events): it must end with at most one effect,
// exactly one unless it is a scheduled event cancelled (scheduled.go).
func (e *ledgerEntry) handledKind() bool {
	return e.Kind == kindStep || e.Kind == kindFollow || e.Kind == kindNew || e.Kind == kindScheduled
}

// Collections of the workload (in the run's database, next to the
// framework's outbox and inbox).
const (
	collCounters     = "chaos_counters"      // {_id: key, seq, place}: last committed step seq and place per key
	collLedger       = "chaos_ledger"        // ledgerEntry: every committed event
	collApplied      = "chaos_applied"       // {_id: key, seq, pos, fseq}: last handled step seq, handlings, follow-ups per key
	collChainApplied = "chaos_chain_applied" // {_id: key, seq}: last handled follow-up seq per key
	collEffects      = "chaos_effects"       // {event, kind, key, seq, pos, replica}: one per committed handling
	collViolations   = "chaos_violations"    // {event, kind, key, seq, last}: out-of-order handlings
	collSentinel     = "chaos_sentinel"      // written once at the end: the inbox history has caught up when it sees it
)

// workload records events and handles them.
type workload struct {
	// redriveSnoozed are the events whose re-drive snoozed once.
	redriveSnoozed sync.Map
	db             *mongo.Database
	keys           []string // the load's keys
	// extraKeys are the keys of the scenarios that need keys of their own
	// (the event-outbox producer, mass holds, retry isolation): never the
	// load's.
	extraKeys   []string
	mass        []string    // mass-hold's keys
	massBusy    atomic.Bool // a mass hold is going on (they share mass)
	iso         []string    // retry-isolation's keys
	transient   int         // percent of step events whose first handling attempt fails
	chainPct    int         // percent of step events whose handler records a follow-up
	poisonRatio float64     // probability that a transaction also records a poison event
	abortRatio  float64     // probability that a transaction is aborted on purpose
	sameKey     float64     // probability that a multi-event transaction records consecutive events of one key
	claimRatio  float64     // probability that a transaction pads an event to claimPad (-claim-check)

	attempted sync.Map // event id -> struct{}: every id any attempt generated
	nextID    atomic.Int64
	// nextRecreated numbers the recreated topic's events (recreate.go).
	nextRecreated atomic.Int64
	runID         string

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
	// slowLog records each slow run: its key, replica and when it ran,
	// for the check that a long run shows in Status (waitsvisible.go).
	slowMu  sync.Mutex
	slowLog []slowRun

	// Downstream outages: while a key is down its step handler fails, so
	// its events exhaust MaxAttempts and are parked.
	outMu   sync.Mutex
	outages map[string]*outage // by key: the current (last) outage

	// newHandler is whether replicas started now register the handler of
	// newEvent (no-handler-deploy).
	newHandler atomic.Bool

	// Kill with open transactions (kill-open-txns): the step handlers of
	// replica blockOn (the first to run one once armed) block after their
	// writes, their transactions open, until the replica dies; blocked
	// lists the events so caught.
	blockMu   sync.Mutex
	blockOn   string
	blockLeft int
	blocked   []string

	// lastStep is the last committed step event, which a duplicate
	// recording repeats (-migrated: Config.UniqueIdempotencyKeys must
	// refuse it).
	lastStep atomic.Pointer[stepEvent]
	// dupRatio is the probability that a transaction records lastStep
	// again instead; dupRefused and dupRecorded count the outcomes.
	dupRatio                float64
	dupRefused, dupRecorded atomic.Int64

	// sched is the history of the cancellations of scheduled events
	// (-scheduled).
	sched schedLog
}

// outage is one key's downstream outage. It lasts until `until` and, when
// the consumer lags, longer: until one of the key's events was seen parked
// (so that every outage exceeds the retry budget of some event), at most
// until hardEnd.
type outage struct {
	until, hardEnd time.Time
	parked         bool
	// park makes the handler park the key's events at once (outbox.Park)
	// instead of failing them until their attempts run out: mass-hold.
	park bool
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
	// poisonAt places the poison event after the poisonAt-th step event
	// (1..len(keys)), on that event's key: in a transaction of one key the
	// steps after it follow it in the key's sequence, and must be held
	// behind it once it is parked.
	poisonAt int
	abort    bool
	// fresh records a newEvent of keys[0] before the step events
	// (no-handler-deploy): the key's step events follow it in its
	// sequence.
	fresh bool
	// dup records the step event again instead of anything else: it must
	// be refused (Config.UniqueIdempotencyKeys).
	dup *stepEvent
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
	if w.claimRatio > 0 && rng.Float64() < w.claimRatio {
		p.pads[rng.IntN(n)] = claimPad
	}
	p.poison = rng.Float64() < w.poisonRatio
	p.poisonAt = 1 + rng.IntN(n)
	p.abort = rng.Float64() < w.abortRatio
	if w.dupRatio > 0 && rng.Float64() < w.dupRatio {
		p.dup = w.lastStep.Load()
	}
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
	keys := append(append([]string(nil), w.keys...), w.extraKeys...)
	docs := make([]any, len(keys))
	for i, k := range keys {
		docs[i] = bson.D{{Key: "_id", Value: k}, {Key: "seq", Value: int64(0)}, {Key: "place", Value: int64(0)},
			{Key: "pos", Value: int64(0)}, {Key: "fseq", Value: int64(0)}}
	}
	for _, c := range []string{collCounters, collApplied, collChainApplied} {
		if _, err := w.db.Collection(c).InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("prepare %s: %w", c, err)
		}
	}
	if err := prepareRecreated(ctx, w.db); err != nil {
		return err
	}
	for _, c := range []string{collEffects, collRecreatedEffects} {
		if _, err := w.db.Collection(c).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "event", Value: 1}}}); err != nil {
			return err
		}
	}
	return nil
}

// transact runs one business transaction on client: the step events of
// p in order (each taking the next seq of its key), maybe a poison event
// (after the poisonAt-th step, on its key), maybe an abort on purpose. db
// is the replica's database handle: operations in a transaction must use
// the MongoDB client that started it.
func (w *workload) transact(ctx context.Context, client *outbox.Client, db *mongo.Database, rng *rand.Rand, p plan) error {
	counters := db.Collection(collCounters)
	ledger := db.Collection(collLedger)
	pads := make([]string, len(p.pads))
	for i, n := range p.pads {
		if n > 0 {
			pads[i] = padding(rng, n)
		}
	}
	// recordPoison records a poison event of key k, which takes its place in
	// the key's sequence: the key's later events must wait for it to be
	// settled.
	recordPoison := func(ctx context.Context, k string) error {
		var c struct {
			Place int64 `bson:"place"`
		}
		err := counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: k}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "place", Value: int64(1)}}}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
		if err != nil {
			return err
		}
		id := w.newID()
		if err := outbox.Record(ctx, poisonEvent{Key: k, ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
			return err
		}
		_, err = ledger.InsertOne(ctx, ledgerEntry{ID: id, Topic: chaosTopic(), Key: k, Place: c.Place, Kind: kindPoison})
		return err
	}
	if p.dup != nil {
		return w.recordDuplicate(ctx, client, p.dup)
	}
	var lastStep *stepEvent
	err := client.Transact(ctx, func(ctx context.Context) error {
		lastStep = nil
		if p.fresh {
			var c struct {
				Place int64 `bson:"place"`
			}
			err := counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: p.keys[0]}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "place", Value: int64(1)}}}},
				options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
			if err != nil {
				return err
			}
			id := w.newID()
			if err := outbox.Record(ctx, newEvent{Key: p.keys[0], ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, ledgerEntry{ID: id, Topic: chaosTopic(), Key: p.keys[0], Place: c.Place, Kind: kindNew}); err != nil {
				return err
			}
		}
		for i, k := range p.keys {
			var c struct {
				Seq   int64 `bson:"seq"`
				Place int64 `bson:"place"`
			}
			err := counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: k}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}, {Key: "place", Value: int64(1)}}}},
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
			ev := stepEvent{Key: k, Seq: c.Seq, ID: id, Pad: pads[i]}
			if err := outbox.Record(ctx, ev, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if pads[i] == "" {
				lastStep = &ev
			}
			if _, err := ledger.InsertOne(ctx, ledgerEntry{ID: id, Topic: chaosTopic(), Key: k, Seq: c.Seq, Place: c.Place, Kind: kindStep,
				PadSum: padSum(pads[i])}); err != nil {
				return err
			}
			if p.poison && i+1 == p.poisonAt {
				if err := recordPoison(ctx, k); err != nil {
					return err
				}
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
		if lastStep != nil {
			w.lastStep.Store(lastStep)
		}
	case errors.Is(err, errPlannedAbort):
		w.aborted.Add(1)
	default:
		w.failedTx.Add(1)
	}
	return err
}

// register adds the workload's handlers to a replica's client.
//
// The step handler, in the handling transaction: checks the key's "last
// handled seq" (an out-of-order handling is recorded as a violation),
// advances it, counts the handling (pos: the key's handlings in commit
// order), inserts an effect (saying whether it chained), and for the step
// events that chain (chains, and every slow one) records a follow-up on the
// second topic with its ledger entry. A slow attempt then outlives the
// transaction, and a step event whose first attempt is to fail (failsOnce)
// fails, after all of that: the transaction must take the follow-up with
// it. The follow-up handler checks
// and advances the key's follow-up seq the same way and inserts an effect.
func (w *workload) register(client *outbox.Client, db *mongo.Database, replica string) error {
	applied := db.Collection(collApplied)
	chainApplied := db.Collection(collChainApplied)
	effects := db.Collection(collEffects)
	violations := db.Collection(collViolations)
	ledger := db.Collection(collLedger)
	// advance moves a key's applied document past seq, counting the
	// handling, and records a violation when seq is not the next one.
	advance := func(ctx context.Context, coll *mongo.Collection, kind, id, key string, seq int64, inc bson.D) (before appliedDoc, err error) {
		err = coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: key}},
			bson.D{{Key: "$max", Value: bson.D{{Key: "seq", Value: seq}}}, {Key: "$inc", Value: inc}},
			options.FindOneAndUpdate().SetReturnDocument(options.Before)).Decode(&before)
		if err != nil {
			return before, err
		}
		if seq != before.Seq+1 {
			_, err = violations.InsertOne(ctx, bson.D{{Key: "event", Value: id}, {Key: "kind", Value: kind}, {Key: "key", Value: key},
				{Key: "seq", Value: seq}, {Key: "last", Value: before.Seq}, {Key: "replica", Value: replica}})
		}
		return before, err
	}
	err := outbox.Handle(client, func(ctx context.Context, e stepEvent, meta outbox.Metadata) error {
		if down, park := w.outageOf(e.Key); down && park {
			return outbox.Park(errDownstream)
		} else if down {
			return errDownstream
		}
		// An attempt past MaxAttempts is a re-drive of a parked event (or
		// the release of a head parked so): its first one snoozes, which
		// must count nothing and leave an operator's request pending.
		if meta.Attempt > chaosMaxAttempts {
			if _, seen := w.redriveSnoozed.LoadOrStore(e.ID, true); !seen {
				return outbox.Snooze(20 * time.Millisecond)
			}
		}
		// A slow attempt records a follow-up, then outlives the transaction
		// (below): the transaction must take the follow-up with it.
		slow := meta.Attempt == 1 && w.isSlow(e.ID)
		if len(e.Pad) >= stormPad {
			// Pause storms: a slow worker lets the queue fill.
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
		chain := slow || w.chains(e.ID)
		inc := bson.D{{Key: "pos", Value: int64(1)}}
		if chain {
			inc = append(inc, bson.E{Key: "fseq", Value: int64(1)})
		}
		before, err := advance(ctx, applied, kindStep, e.ID, e.Key, e.Seq, inc)
		if err != nil {
			return err
		}
		if _, err := effects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "kind", Value: kindStep}, {Key: "key", Value: e.Key},
			{Key: "seq", Value: e.Seq}, {Key: "pos", Value: before.Pos + 1}, {Key: "chained", Value: chain}, {Key: "replica", Value: replica},
			{Key: "at", Value: time.Now()}, {Key: "pad_sum", Value: padSum(e.Pad)}}); err != nil {
			return err
		}
		if chain {
			f := followEvent{Key: e.Key, Seq: before.FSeq + 1, ID: followID(e.ID), Source: e.ID}
			if err := outbox.Record(ctx, f, outbox.WithIdempotencyKey(f.ID)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, ledgerEntry{ID: f.ID, Topic: chainTopic(), Key: f.Key, Seq: f.Seq, Place: f.Seq,
				Kind: kindFollow, Source: e.ID}); err != nil {
				return err
			}
		}
		if slow {
			// Slower than the transaction lifetime: the transaction is
			// gone by the time the handler returns, so this attempt must
			// fail (and count as one), the next one is fast. The handler
			// honours its context, as handlers should.
			w.slowRuns.Add(1)
			start := time.Now()
			err := sleepCtx(ctx, w.slowFor)
			w.slowMu.Lock()
			w.slowLog = append(w.slowLog, slowRun{ID: e.ID, Key: e.Key, Replica: replica, Start: start, End: time.Now()})
			w.slowMu.Unlock()
			if err != nil {
				return err
			}
		}
		if meta.Attempt == 1 && w.failsOnce(e.ID) {
			return errTransient // after the writes: the transaction must undo them all
		}
		if w.blocks(replica, e.ID) {
			// kill-open-txns: the transaction stays open, its writes
			// locking the key's documents, until the replica dies: its
			// session is abandoned, never aborted.
			<-ctx.Done()
			return ctx.Err()
		}
		w.handledRuns.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	err = outbox.Handle(client, func(ctx context.Context, e followEvent, meta outbox.Metadata) error {
		if _, err := advance(ctx, chainApplied, kindFollow, e.ID, e.Key, e.Seq, bson.D{}); err != nil {
			return err
		}
		if _, err := effects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "kind", Value: kindFollow}, {Key: "key", Value: e.Key},
			{Key: "seq", Value: e.Seq}, {Key: "source", Value: e.Source}, {Key: "replica", Value: replica}, {Key: "at", Value: time.Now()}}); err != nil {
			return err
		}
		if meta.Attempt == 1 && w.failsOnce(e.ID) {
			return errTransient
		}
		return nil
	})
	if err != nil {
		return err
	}
	recreatedApplied := db.Collection(collRecreatedApplied)
	recreatedEffects := db.Collection(collRecreatedEffects)
	err = outbox.Handle(client, func(ctx context.Context, e recreatedEvent, _ outbox.Metadata) error {
		if _, err := advance(ctx, recreatedApplied, kindRecreated, e.ID, e.Key, e.Seq, bson.D{}); err != nil {
			return err
		}
		_, err := recreatedEffects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "key", Value: e.Key}, {Key: "seq", Value: e.Seq},
			{Key: "replica", Value: replica}, {Key: "at", Value: time.Now()}})
		return err
	})
	if err != nil {
		return err
	}
	err = outbox.Handle(client, func(ctx context.Context, e scheduledEvent, _ outbox.Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "kind", Value: kindScheduled}, {Key: "key", Value: e.Key},
			{Key: "replica", Value: replica}, {Key: "at", Value: time.Now()}, {Key: "pad_sum", Value: padSum(e.Pad)}})
		return err
	})
	if err != nil {
		return err
	}
	if w.newHandler.Load() {
		err = outbox.Handle(client, func(ctx context.Context, e newEvent, _ outbox.Metadata) error {
			_, err := effects.InsertOne(ctx, bson.D{{Key: "event", Value: e.ID}, {Key: "kind", Value: kindNew}, {Key: "key", Value: e.Key},
				{Key: "replica", Value: replica}, {Key: "at", Value: time.Now()}})
			return err
		})
		if err != nil {
			return err
		}
	}
	return outbox.Handle(client, func(context.Context, poisonEvent, outbox.Metadata) error {
		return errPoison
	})
}

// recordDuplicate records a committed step event again, alone in its
// transaction: with Config.UniqueIdempotencyKeys it must fail with
// ErrDuplicateEvent (counted as refused); committed, it is counted as
// recorded, a violation.
func (w *workload) recordDuplicate(ctx context.Context, client *outbox.Client, e *stepEvent) error {
	err := client.Transact(ctx, func(ctx context.Context) error {
		return outbox.Record(ctx, *e, outbox.WithIdempotencyKey(e.ID))
	})
	switch {
	case err == nil:
		w.dupRecorded.Add(1)
	case errors.Is(err, outbox.ErrDuplicateEvent):
		w.dupRefused.Add(1)
		return nil
	}
	return err
}

// armBlock makes the next n step handlings of one replica block with
// their transactions open (kill-open-txns): of the first replica that
// runs one after the call.
func (w *workload) armBlock(n int) {
	w.blockMu.Lock()
	w.blockOn, w.blockLeft, w.blocked = "", n, nil
	w.blockMu.Unlock()
}

// disarmBlock ends the arming and returns the replica whose handlings
// blocked and the events blocked.
func (w *workload) disarmBlock() (string, []string) {
	w.blockMu.Lock()
	defer w.blockMu.Unlock()
	on, out := w.blockOn, w.blocked
	w.blockOn, w.blockLeft, w.blocked = "", 0, nil
	return on, out
}

// blockedCount is how many handlings are blocked now.
func (w *workload) blockedCount() int {
	w.blockMu.Lock()
	defer w.blockMu.Unlock()
	return len(w.blocked)
}

// blocks reports whether a step handling on replica blocks (and notes
// it).
func (w *workload) blocks(replica, id string) bool {
	w.blockMu.Lock()
	defer w.blockMu.Unlock()
	if w.blockLeft <= 0 || w.blockOn != "" && w.blockOn != replica {
		return false
	}
	w.blockOn = replica
	w.blockLeft--
	w.blocked = append(w.blocked, id)
	return true
}

// appliedDoc is a key's applied document (collApplied, collChainApplied).
type appliedDoc struct {
	Seq  int64 `bson:"seq"`
	Pos  int64 `bson:"pos"`
	FSeq int64 `bson:"fseq"`
}

// chains decides, from the event id alone, whether a step event's handler
// records a follow-up.
func (w *workload) chains(id string) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte("chain:" + id))
	return int(h.Sum32()%100) < w.chainPct
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

// startOutage makes keys' downstream fail for at least d (with park,
// parking their events at once).
func (w *workload) startOutage(keys []string, d time.Duration, park bool) {
	now := time.Now()
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if w.outages == nil {
		w.outages = map[string]*outage{}
	}
	for _, k := range keys {
		w.outages[k] = &outage{until: now.Add(d), hardEnd: now.Add(d + outageCap), park: park}
	}
}

// endOutage ends keys' outages now, parked or not.
func (w *workload) endOutage(keys []string) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	for _, k := range keys {
		if o := w.outages[k]; o != nil {
			o.until, o.hardEnd = time.Time{}, time.Time{}
		}
	}
}

// isDown reports whether key's downstream is in an outage.
func (w *workload) isDown(key string) bool {
	down, _ := w.outageOf(key)
	return down
}

// outageOf reports whether key's downstream is in an outage, and whether
// that outage parks its events at once.
func (w *workload) outageOf(key string) (down, park bool) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	o := w.outages[key]
	if o == nil {
		return false, false
	}
	now := time.Now()
	return now.Before(o.until) || !o.parked && now.Before(o.hardEnd), o.park
}

// sawParked tells key's outage that one of its events was parked.
func (w *workload) sawParked(key string) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if o := w.outages[key]; o != nil {
		o.parked = true
	}
}

// outageKeys returns the keys whose downstream had an outage.
func (w *workload) outageKeys() map[string]bool {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	out := make(map[string]bool, len(w.outages))
	for k := range w.outages {
		out[k] = true
	}
	return out
}

// endOutages ends every outage (quiescence), but for those that have not
// parked an event of their key yet: they last until one is parked, at
// most until their hard end, so that every outage parks what the
// operator re-drives, however late in the load it began.
func (w *workload) endOutages() {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	for _, o := range w.outages {
		o.until = time.Time{}
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

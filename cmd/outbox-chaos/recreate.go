package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// The recreated topic (issue 31 item 3): a topic of its own, deleted and
// created again under the running replicas, as a dev stack restarted
// under a service or an operator's mistake does. Its events live apart
// from the load's (their own ledger, counters and effects), because a
// deleted topic takes its records with it: the Kafka-side checks of the
// load's topics (publication order, fencing) cannot read them back.
//
// fRecreateTopic records events on the topic, waits until every one is
// handled, deletes the topic, (every other time) records more while it is
// gone, creates it again and records more. Every event must be handled exactly once and in
// order per key (the handler checks its key's seq), the ones recorded while
// the topic was gone or after it came back included: the publisher must
// produce to the new topic, and the consumer must read it from its start,
// although the group's offsets of the old topic were further on (more
// events follow than preceded, so that an old offset inside the new
// topic's range would skip some).
const fRecreateTopic actionKind = "topic-recreated"

// schemaRecreated is the schema of the recreated topic's events.
const schemaRecreated = "ChaosRecreated.v1"

// Collections of the recreated topic's events.
const (
	collRecreated         = "chaos_recreated"          // recreatedEntry: every committed event
	collRecreatedCounters = "chaos_recreated_counters" // {_id: key, seq}: last recorded seq per key
	collRecreatedApplied  = "chaos_recreated_applied"  // {_id: key, seq}: last handled seq per key
	collRecreatedEffects  = "chaos_recreated_effects"  // {event, key, seq, replica}: one per committed handling
)

// kindRecreated marks an out-of-order handling of a recreated topic's
// event in collViolations.
const kindRecreated = "recreated"

// recreateTopic is the topic that is deleted and created again.
func recreateTopic() string { return chaosTopic() + "-recreated" }

// recreateKeys are the recreated topic's partition keys.
func recreateKeys() []string {
	out := make([]string, 8)
	for i := range out {
		out[i] = fmt.Sprintf("r%02d", i)
	}
	return out
}

// recreatedEvent is an event of the recreated topic: the Seq-th of Key.
type recreatedEvent struct {
	Key string `json:"key" validate:"required"`
	Seq int64  `json:"seq" validate:"gte=1"`
	ID  string `json:"id" validate:"required"`
}

func (recreatedEvent) Topic() string          { return recreateTopic() }
func (recreatedEvent) ContentSchema() string  { return schemaRecreated }
func (e recreatedEvent) PartitionKey() string { return e.Key }

// Phases of a recreation, as the ledger records them.
const (
	phaseBefore = "before" // recorded while the old topic existed
	phaseGone   = "gone"   // recorded while the topic did not exist
	phaseAfter  = "after"  // recorded once the new topic existed
)

// recreatedEntry is one committed event of the recreated topic, written in
// the transaction that recorded it.
type recreatedEntry struct {
	ID    string `bson:"_id"`
	Key   string `bson:"key"`
	Seq   int64  `bson:"seq"`
	Round int    `bson:"round"` // the recreation it belongs to (0, 1...)
	Phase string `bson:"phase"`
}

// prepareRecreated creates the recreated topic's per-key documents.
func prepareRecreated(ctx context.Context, db *mongo.Database) error {
	keys := recreateKeys()
	docs := make([]any, len(keys))
	for i, k := range keys {
		docs[i] = bson.D{{Key: "_id", Value: k}, {Key: "seq", Value: int64(0)}}
	}
	for _, c := range []string{collRecreatedCounters, collRecreatedApplied} {
		if _, err := db.Collection(c).InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("prepare %s: %w", c, err)
		}
	}
	return nil
}

// recordRecreated records one event of each of keys on the recreated
// topic, in one transaction of client, with their ledger entries.
func (w *workload) recordRecreated(ctx context.Context, client *outbox.Client, db *mongo.Database, keys []string, round int, phase string) error {
	counters := db.Collection(collRecreatedCounters)
	ledger := db.Collection(collRecreated)
	return client.Transact(ctx, func(ctx context.Context) error {
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
			id := fmt.Sprintf("%s-r%d", w.runID, w.nextRecreated.Add(1))
			if err := outbox.Record(ctx, recreatedEvent{Key: k, Seq: c.Seq, ID: id}, outbox.WithIdempotencyKey(id)); err != nil {
				return err
			}
			if _, err := ledger.InsertOne(ctx, recreatedEntry{ID: id, Key: k, Seq: c.Seq, Round: round, Phase: phase}); err != nil {
				return err
			}
		}
		return nil
	})
}

// maxChurnHold bounds how long a recreation holds the kills and stops.
const maxChurnHold = 2 * time.Minute

// holdChurn makes kills and stops wait (killSlot, stopSlot), so that the
// replicas that saw the topic deleted are the ones that must recover: a
// replica started since knows only the new topic, and one that replaced
// every old replica would hide an old one that never recovers. The
// returned function ends the hold; so does maxChurnHold.
func (h *harness) holdChurn() (release func()) {
	ch := make(chan struct{})
	h.mu.Lock()
	h.held = ch
	h.mu.Unlock()
	var once sync.Once
	end := func() {
		once.Do(func() {
			h.mu.Lock()
			h.held = nil
			h.mu.Unlock()
			close(ch)
		})
	}
	t := time.AfterFunc(maxChurnHold, end)
	return func() {
		t.Stop()
		end()
	}
}

// churnHeld reports whether a recreation holds kills and stops now.
func (h *harness) churnHeld() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held != nil
}

// waitChurn waits while a recreation holds kills and stops.
func (h *harness) waitChurn() {
	h.mu.Lock()
	ch := h.held
	h.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// recreateTopicNow: see fRecreateTopic. a.n events are recorded before the
// deletion, on odd rounds a few while the topic is gone (for a.d), a.n+10
// after it.
func (h *harness) recreateTopicNow(ctx context.Context, a action) (bool, error) {
	rng := rand.New(rand.NewPCG(a.pick, 0x7ec4))
	ctx = context.WithoutCancel(ctx) // the recreation ends on its own, load or not
	h.mu.Lock()
	round := h.xf.recreations
	h.mu.Unlock()
	keys := recreateKeys()
	record := func(n int, phase string) int {
		recorded := 0
		for i := 0; i < n; i += 4 {
			batch := make([]string, min(4, n-i))
			for j := range batch {
				batch[j] = keys[rng.IntN(len(keys))]
			}
			err := h.onReplica(ctx, rng, func(ctx context.Context, r *replica) error {
				return h.work.recordRecreated(ctx, r.client, r.mongo.Database(h.env.database), batch, round, phase)
			})
			if err != nil {
				h.logf("%s: recording %d events %s the recreation failed: %v", a, len(batch), phase, err)
				continue
			}
			recorded += len(batch)
		}
		return recorded
	}
	before := record(a.n, phaseBefore)
	// Every event so far handled, so that the deletion loses none: a
	// deleted topic's unconsumed records are gone for every consumer.
	if got, want := h.waitRecreatedHandled(ctx); got < want {
		return false, fmt.Errorf("only %d of %d events of %s handled after %s without progress: not deleted", got, want, recreateTopic(), recreatePatience)
	}
	release := h.holdChurn()
	defer release()
	adm := kadm.NewClient(h.inj.raw)
	topic := kafkaTopic(recreateTopic())
	if _, err := adm.DeleteTopics(ctx, topic); err != nil {
		return false, fmt.Errorf("delete %s: %w", topic, err)
	}
	at := time.Now()
	h.logf("%s: %s deleted; kills and stops held until its events are handled", a, topic)
	gap, gone := time.Duration(0), 0
	if round%2 == 1 {
		// Gone for a while, events recorded meanwhile. (Created again at
		// once, as on even rounds, a producer never learns the topic was
		// gone: it must notice the new topic id.)
		gap = a.d
		gone = record(2+rng.IntN(4), phaseGone)
		if err := sleepCtx(ctx, time.Until(at.Add(gap))); err != nil {
			return false, nil
		}
	}
	// A replica may produce to the topic meanwhile, and a broker that
	// creates topics on produce would have created it: either way it
	// exists afterwards.
	if _, err := adm.CreateTopic(ctx, int32(h.cfg.partitions), -1, nil, topic); err != nil {
		td, lerr := adm.ListTopics(ctx, topic)
		if d, ok := td[topic]; lerr != nil || !ok || d.Err != nil {
			return false, fmt.Errorf("create %s again: %w", topic, err)
		}
	}
	after := record(a.n+10, phaseAfter)
	// The replicas that saw the deletion must handle what followed it
	// without a restart.
	got, want := h.waitRecreatedHandled(ctx)
	release()
	h.mu.Lock()
	h.xf.recreations++
	if got < want {
		h.xf.recreateStuck = append(h.xf.recreateStuck, fmt.Sprintf(
			"recreation %d of %s (deleted %s): %d of %d events handled, then nothing for %s with no replica killed or stopped",
			round, topic, at.Format(tsFormat), got, want, recreatePatience))
	}
	h.mu.Unlock()
	h.logf("%s: %s deleted after %d events, %d recorded while it was gone (%s), created again, %d recorded after; %d of %d handled by the replicas that saw it",
		a, topic, before, gone, gap, after, got, want)
	return true, nil
}

// recreatePatience is how long the recreated topic's events may go
// without progress.
const recreatePatience = progressPatience

// waitRecreatedHandled waits until every committed event of the recreated
// topic is handled, for as long as their handling progresses, and returns
// how many are and how many were committed.
func (h *harness) waitRecreatedHandled(ctx context.Context) (got, want int64) {
	waitProgress(ctx, 100*time.Millisecond, func() (bool, int64) {
		// The run's MongoDB faults hit the harness's reads too: a failed
		// count is no progress.
		n, err := h.db.Collection(collRecreated).CountDocuments(ctx, bson.D{})
		if err == nil {
			want = n
		}
		got = h.distinctEvents(ctx, collRecreatedEffects)
		return err == nil && got >= want, got
	})
	return max(got, 0), want
}

// progressPatience is how long a scenario waits for the consumers without
// progress (they may be minutes behind on a loaded machine).
const progressPatience = 90 * time.Second

// How a waitProgress ended.
const (
	waitDone = iota
	waitStalled
	waitCanceled
)

// waitProgress calls look every `every` until it reports done (waitDone),
// its progress figure stays the same for progressPatience (waitStalled),
// or ctx ends (waitCanceled).
func waitProgress(ctx context.Context, every time.Duration, look func() (done bool, progress int64)) int {
	deadline, last := time.Now().Add(progressPatience), int64(-1)
	for {
		done, progress := look()
		if done {
			return waitDone
		}
		if progress != last {
			deadline, last = time.Now().Add(progressPatience), progress
		}
		if time.Now().After(deadline) {
			return waitStalled
		}
		if sleepCtx(ctx, every) != nil {
			return waitCanceled
		}
	}
}

// recreateFacts are what judgeRecreated judges.
type recreateFacts struct {
	Ledger  []recreatedEntry
	Effects map[string]int        // effects per event id
	Outbox  map[string]outboxFact // the recreated topic's outbox documents, by id
	Final   map[string]inboxState // the inbox state of each event at the end
	// Stuck describes the recreations after which the replicas that saw
	// the deletion did not handle the events that followed.
	Stuck []string
}

// recreateVerdict counts what judgeRecreated found.
type recreateVerdict struct {
	// HandledAfter counts the events recorded while the topic was gone or
	// after it came back, handled exactly once.
	HandledAfter int
	Lost, Double int
}

// judgeRecreated fails on an event of the recreated topic that is not in
// the outbox published and handled exactly once (recreate-lost,
// double-effect), one left parked, held or failed, on outbox documents
// and effects of no committed event (recreate-unknown), and on a
// recreation after which the running replicas did not recover on their
// own (recreate-stuck: its events were handled only once replicas were
// replaced, if at all).
func judgeRecreated(f *recreateFacts, v *verdict) recreateVerdict {
	var out recreateVerdict
	for _, s := range f.Stuck {
		v.fail("recreate-stuck", "%s", s)
	}
	known := make(map[string]bool, len(f.Ledger))
	ledger := append([]recreatedEntry(nil), f.Ledger...)
	sort.Slice(ledger, func(i, j int) bool { return ledger[i].ID < ledger[j].ID })
	for _, e := range ledger {
		known[e.ID] = true
		o, inOutbox := f.Outbox[e.ID]
		n := f.Effects[e.ID]
		switch {
		case !inOutbox || !o.Published || n == 0:
			out.Lost++
			v.fail("recreate-lost", "lost: %s event %s (key %s seq %d, recorded %s recreation %d): outbox %v, published %v, failed %v, effects %d, inbox %s",
				recreateTopic(), e.ID, e.Key, e.Seq, e.Phase, e.Round, inOutbox, o.Published, o.Failed, n, f.Final[e.ID])
		case n > 1:
			out.Double += n - 1
			v.fail("double-effect", "%s event %s (key %s seq %d) has %d effects", recreateTopic(), e.ID, e.Key, e.Seq, n)
		case o.Failed:
			v.fail("recreate-failed", "%s event %s handled but marked failed in the outbox", recreateTopic(), e.ID)
		case f.Final[e.ID].waiting():
			v.fail("recreate-waiting", "%s event %s handled but %s in the inbox at the end", recreateTopic(), e.ID, f.Final[e.ID])
		case e.Phase != phaseBefore:
			out.HandledAfter++
		}
	}
	for _, id := range sortedKeys(f.Outbox) {
		if !known[id] {
			v.fail("recreate-unknown", "outbox event %s of %s is no committed event (a leaked aborted one?)", id, recreateTopic())
		}
	}
	for _, id := range sortedKeys(f.Effects) {
		if !known[id] {
			v.fail("recreate-unknown", "effect of %s on %s, which is no committed event", id, recreateTopic())
		}
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// recreateFactsOf reads the recreated topic's facts; outboxDocs are the
// recreated topic's outbox documents, final the inbox state of its events.
func (h *harness) recreateFactsOf(ctx context.Context, outboxDocs map[string]outboxFact, final map[string]inboxState) (*recreateFacts, error) {
	h.mu.Lock()
	stuck := slices.Clone(h.xf.recreateStuck)
	h.mu.Unlock()
	f := &recreateFacts{Outbox: outboxDocs, Final: final, Effects: map[string]int{}, Stuck: stuck}
	if err := h.findAll(ctx, collRecreated, bson.D{}, nil, &f.Ledger); err != nil {
		return nil, err
	}
	var effects []struct {
		Event string `bson:"event"`
	}
	if err := h.findAll(ctx, collRecreatedEffects, bson.D{}, bson.D{{Key: "event", Value: 1}}, &effects); err != nil {
		return nil, err
	}
	for _, e := range effects {
		f.Effects[e.Event]++
	}
	return f, nil
}

package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// The scenarios of issues 20 and 31 (see the extras list): each runs in
// the background (h.bg), on keys of its own where it needs them, and
// leaves facts the final check judges (extraFacts).

// Extra scenario kinds, scheduled on their own stream (scheduleExtras).
const (
	// mass-hold: a downstream outage over more than a thousand keys of
	// their own (-mass-keys) that parks each key's first event at once
	// (outbox.Park) and holds its second behind it; once every key is
	// held, the outage ends and the operator re-drives them all.
	fMassHold actionKind = "mass-hold"
	// no-handler-deploy: events of a type no replica has a handler for
	// are recorded on the load's keys, each followed by a step event of
	// its key; they must stay parked (reason no_handler) holding their
	// key; then the handler is deployed by a rolling restart and the new
	// replicas must release them, in order. Once per run.
	fNoHandler actionKind = "no-handler-deploy"
	// retry-isolation: a key of its own fails (a downstream outage, longer
	// than its retry budget) while three other keys of its partition get
	// an event right after it: they must be handled while it retries.
	fRetryIsolation actionKind = "retry-isolation"
	// kill-open-txns: the step handlers of one replica block after their
	// writes, transactions open on many keys, and the replica is killed:
	// its sessions are abandoned, never aborted. The survivors must handle
	// those events without waiting for MongoDB's transaction lifetime to
	// abort them (judged with -txn-lifetime 60s, MongoDB's default).
	fKillOpenTxns actionKind = "kill-open-txns"

	// keyless-behind-held (a fault): a record without an idempotency key
	// written on a key that is held now; it must be parked (unreadable)
	// behind the key's head, never handled, and purged by the operator.
	fKeylessHeld actionKind = "keyless-behind-held"
)

// rotating are the extra scenarios drawn in turn; extras all of them.
var (
	rotating = []actionKind{fMassHold, fNoHandler, fRetryIsolation, fKillOpenTxns}
	extras   = append(slices.Clone(rotating), fRecreateTopic)
)

// recreateEvery spaces the topic recreations of a long run.
const recreateEvery = 3 * time.Minute

// scheduleExtras draws the extra scenarios: from a tenth of the run,
// every min(30 s, 8/10 of the run over their count), the rotating kinds
// in turn from a seed-drawn start, none in the last tenth; no-handler-deploy
// only once. topic-recreated, which needs no load, is on a schedule of its
// own (so that it never takes the place of a scenario that needs the
// load): at 45% of the run, then every recreateEvery, none in the last
// tenth.
func scheduleExtras(seed uint64, duration, scenarioEvery time.Duration) []action {
	if scenarioEvery <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0xe47a5))
	step := min(30*time.Second, duration*8/10/time.Duration(len(rotating)))
	next := rng.IntN(len(rotating))
	var acts []action
	noHandler := false
	for t := duration / 10; t < duration*9/10; t += step {
		a := action{at: t, kind: rotating[next%len(rotating)], pick: rng.Uint64(), slot: rng.IntN(1 << 10)}
		next++
		switch a.kind {
		case fNoHandler:
			if noHandler {
				continue
			}
			noHandler = true
			a.n = 4 + rng.IntN(4) // new events
			a.d = 2 * time.Second // held before the deploy
		case fRetryIsolation:
			a.d = 3 * time.Second // the outage of the retrying key
		case fKillOpenTxns:
			a.n = 6 + rng.IntN(10) // handlings blocked
		}
		acts = append(acts, a)
	}
	for t := duration * 45 / 100; t < duration*9/10; t += recreateEvery {
		acts = append(acts, action{at: t, kind: fRecreateTopic, pick: rng.Uint64(),
			n: 20 + rng.IntN(20),                                            // events before the deletion
			d: time.Second + time.Duration(rng.IntN(1000))*time.Millisecond, // the topic gone
		})
	}
	return acts
}

// Key spaces of the extra scenarios (never the load's).
func massKeys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("m%05d", i)
	}
	return out
}

// isoKeys are retry-isolation's keys: enough for every partition to have
// several.
func isoKeys(partitions int) []string {
	out := make([]string, 16*partitions)
	for i := range out {
		out[i] = fmt.Sprintf("i%04d", i)
	}
	return out
}

// extraFacts are what the extra scenarios leave for the final check.
type extraFacts struct {
	massRuns    int      // mass holds carried out
	massKeys    int      // keys each mass hold held
	newEvents   []string // the no-handler-deploy events recorded (ids)
	deployedAt  time.Time
	isoCases    []isoCase
	takeovers   []takeoverCase
	keylessHeld []recordPos // key-less records written on a held key
	recreations int         // topic-recreated carried out
	// recreateStuck describes each recreation after which the replicas
	// that saw it did not handle the events that followed.
	recreateStuck []string
}

// isoCase is one retry-isolation: the retrying event and the events of
// other keys of its partition recorded right after it.
type isoCase struct {
	Retrying string   // eventRef
	Others   []string // eventRefs
	At       time.Time
}

// takeoverCase is one kill-open-txns: when the replica died and the
// events its open transactions were handling.
type takeoverCase struct {
	Replica  string
	KilledAt time.Time
	Events   []string // eventRefs
}

// extra executes an extra scenario in the background; it is counted when
// it took place.
func (h *harness) extra(ctx context.Context, a action) {
	var ok bool
	var err error
	switch a.kind {
	case fMassHold:
		ok, err = h.massHold(ctx, a)
	case fNoHandler:
		ok, err = h.noHandlerDeploy(ctx, a)
	case fRetryIsolation:
		ok, err = h.retryIsolation(ctx, a)
	case fKillOpenTxns:
		ok, err = h.killOpenTxns(ctx, a)
	case fRecreateTopic:
		ok, err = h.recreateTopicNow(ctx, a)
	default:
		err = fmt.Errorf("unknown scenario %q", a.kind)
	}
	h.account(a, ok, err, true)
}

// recordPlan records one transaction of plan on a live replica, trying up
// to five times (kills, deploys), each bounded by txnDeadline.
func (h *harness) recordPlan(ctx context.Context, rng *rand.Rand, pl plan) error {
	return h.onReplica(ctx, rng, func(ctx context.Context, r *replica) error {
		return h.work.transact(ctx, r.client, r.mongo.Database(h.env.database), rng, pl)
	})
}

// onReplica runs tx on a live replica until it succeeds, up to five times
// (kills, deploys), each bounded by txnDeadline.
func (h *harness) onReplica(ctx context.Context, rng *rand.Rand, tx func(context.Context, *replica) error) error {
	var err error
	for try := 1; try <= 5; try++ {
		r := h.pick(rng)
		if r == nil {
			err = fmt.Errorf("no live replica")
			if sleepCtx(ctx, 200*time.Millisecond) != nil {
				return ctx.Err()
			}
			continue
		}
		tctx, cancel := context.WithTimeout(r.ctx, txnDeadline)
		stop := context.AfterFunc(ctx, cancel)
		err = tx(tctx, r)
		stop()
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// massHold: see fMassHold.
func (h *harness) massHold(ctx context.Context, a action) (bool, error) {
	keys := h.work.mass
	if len(keys) == 0 {
		return false, nil
	}
	if !h.work.massBusy.CompareAndSwap(false, true) {
		return false, nil // the last one is still going: they share their keys
	}
	defer h.work.massBusy.Store(false)
	rng := rand.New(rand.NewPCG(a.pick, 0x3a55))
	ctx = context.WithoutCancel(ctx) // the hold ends on its own, load or not
	h.work.startOutage(keys, time.Hour, true)
	defer h.work.endOutage(keys)
	recorded := 0
	for i := 0; i < len(keys); i += 10 {
		var pl plan
		for _, k := range keys[i:min(i+10, len(keys))] {
			pl.keys = append(pl.keys, k, k)
		}
		pl.pads = make([]int, len(pl.keys))
		if err := h.recordPlan(ctx, rng, pl); err != nil {
			h.logf("%s: a transaction of %d events failed: %v", a, len(pl.keys), err)
			continue
		}
		recorded += len(pl.keys) / 2
	}
	// Every key held at once: wait for it, for as long as holds progress
	// (the consumers may be minutes behind on a loaded machine).
	n := 0
	if waitProgress(ctx, 250*time.Millisecond, func() (bool, int64) {
		n = h.rec.waitingKeys(isMassKey)
		return n >= recorded, int64(n)
	}) == waitStalled {
		h.logf("%s: only %d of %d keys held after %s without progress", a, n, recorded, progressPatience)
	}
	held := h.rec.waitingKeys(isMassKey)
	h.logf("%s: %d keys recorded, %d held at once; outage over, re-drives follow", a, recorded, held)
	h.mu.Lock()
	h.xf.massRuns++
	h.xf.massKeys = max(h.xf.massKeys, recorded)
	h.mu.Unlock()
	return recorded > 0, nil
}

// isMassKey reports whether a partition key is a mass-hold key.
func isMassKey(k string) bool { return len(k) == 6 && k[0] == 'm' && k[1] >= '0' && k[1] <= '9' }

// noHandlerDeploy: see fNoHandler.
func (h *harness) noHandlerDeploy(ctx context.Context, a action) (bool, error) {
	if h.work.newHandler.Load() {
		return false, nil
	}
	rng := rand.New(rand.NewPCG(a.pick, 0x4e77))
	ctx = context.WithoutCancel(ctx)
	for range a.n {
		k := h.work.keys[rng.IntN(len(h.work.keys))]
		if err := h.recordPlan(ctx, rng, plan{keys: []string{k}, pads: []int{0}, fresh: true}); err != nil {
			h.logf("%s: recording failed: %v", a, err)
		}
	}
	// The ids of the new events: the ledger knows which committed.
	ids, err := h.newEventIDs(ctx)
	if err != nil {
		return false, err
	}
	if len(ids) == 0 {
		return false, fmt.Errorf("no new event committed")
	}
	// They wait, parked for want of a handler (or held behind an earlier
	// event of their key), once the consumers get to them: wait for that,
	// for as long as it progresses, then a while longer.
	// (The consumers may be minutes behind on a loaded machine.)
	n := 0
	switch waitProgress(ctx, 100*time.Millisecond, func() (bool, int64) {
		n = h.rec.waitingOf(schemaNew, ids)
		return n == len(ids), int64(n)
	}) {
	case waitStalled:
		h.logf("%s: only %d of %d events without handler parked or held after %s without progress", a, n, len(ids), progressPatience)
	case waitCanceled:
		return false, nil
	}
	if sleepCtx(ctx, a.d) != nil {
		return false, nil
	}
	// The deploy: every replica started from now on has the handler; the
	// live ones are replaced one at a time.
	h.mu.Lock()
	h.xf.newEvents = append(h.xf.newEvents, ids...)
	h.xf.deployedAt = time.Now()
	slots := slices.Sorted(maps.Keys(h.slots))
	h.mu.Unlock()
	h.work.newHandler.Store(true)
	h.logf("%s: %d events of a type without handler recorded; rolling deploy of slots %v", a, len(ids), slots)
	for _, slot := range slots {
		if h.stopSlot(slot) == nil {
			continue
		}
		if _, err := h.startIfDown(slot); err != nil {
			h.logf("%s: restart of slot %d: %v", a, slot, err)
		}
		if sleepCtx(ctx, 500*time.Millisecond) != nil {
			break
		}
	}
	return true, nil
}

// retryIsolation: see fRetryIsolation.
func (h *harness) retryIsolation(ctx context.Context, a action) (bool, error) {
	p := int32(a.pick % uint64(h.cfg.partitions))
	var ofP []string
	for _, k := range h.work.iso {
		if h.inj.partitionOf(k) == p {
			ofP = append(ofP, k)
		}
	}
	if len(ofP) < 4 {
		return false, fmt.Errorf("fewer than 4 keys of partition %d", p)
	}
	h.mu.Lock()
	round := len(h.xf.isoCases)
	h.mu.Unlock()
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = ofP[(4*round+i)%len(ofP)]
	}
	rng := rand.New(rand.NewPCG(a.pick, 0x150))
	ctx = context.WithoutCancel(ctx)
	h.work.startOutage(keys[:1], a.d, false)
	at := time.Now()
	if err := h.recordPlan(ctx, rng, plan{keys: keys, pads: make([]int, 4)}); err != nil {
		return false, err
	}
	ids, err := h.lastStepIDs(ctx, keys)
	if err != nil || len(ids) != 4 {
		return false, fmt.Errorf("the events of %v not found in the ledger (%v)", keys, err)
	}
	c := isoCase{Retrying: eventRef(chaosTopic(), ids[keys[0]]), At: at}
	for _, k := range keys[1:] {
		c.Others = append(c.Others, eventRef(chaosTopic(), ids[k]))
	}
	h.mu.Lock()
	h.xf.isoCases = append(h.xf.isoCases, c)
	h.mu.Unlock()
	h.logf("%s: key %s of partition %d retrying, keys %v behind it", a, keys[0], p, keys[1:])
	return true, nil
}

// killOpenTxns: see fKillOpenTxns. The victim is the first replica to
// block a handling once armed (one that consumes); when it is stopped
// meanwhile (a leave, a deploy), or nothing blocks in killOpenTxnsWindow,
// it is tried again, up to killOpenTxnsTries times. The tries may outlast
// the load (a short run's load can end within the first window; the
// backlog's handlings block as well): on a loaded machine a short run's
// handling can pause for seconds (rebalances, a topic recreation), and a
// scenario that never runs fails TestChaosShort.
func (h *harness) killOpenTxns(ctx context.Context, a action) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killOpenTxnsTries*(killOpenTxnsWindow+time.Second))
	defer cancel()
	var err error
	for range killOpenTxnsTries {
		var ok bool
		ok, err = h.killOpenTxnsOnce(ctx, a)
		if ok || ctx.Err() != nil {
			return ok, err
		}
		h.logf("%s: %v", a, err)
	}
	return false, err
}

const (
	// killOpenTxnsWindow is how long one try of kill-open-txns waits for
	// handlings to block; killOpenTxnsSettle how long after the first one
	// it waits for more.
	killOpenTxnsWindow = 5 * time.Second
	killOpenTxnsSettle = time.Second
	killOpenTxnsTries  = 6
)

// killOpenTxnsOnce blocks handlings of one replica and kills it: once a.n
// handlings block, or killOpenTxnsSettle after the first (the sooner the
// kill, the less likely a scheduled leave stops the victim first).
func (h *harness) killOpenTxnsOnce(ctx context.Context, a action) (bool, error) {
	h.work.armBlock(a.n)
	deadline := time.Now().Add(killOpenTxnsWindow)
	var first time.Time
	for n := h.work.blockedCount(); n < a.n && time.Now().Before(deadline); n = h.work.blockedCount() {
		if n > 0 && first.IsZero() {
			first = time.Now()
		}
		if !first.IsZero() && time.Since(first) >= killOpenTxnsSettle {
			break
		}
		if sleepCtx(ctx, 50*time.Millisecond) != nil {
			break
		}
	}
	// Disarmed first, so that no handling blocks after the decision: each
	// blocked one is in ids, and dies with the replica.
	name, ids := h.work.disarmBlock()
	if len(ids) == 0 {
		return false, fmt.Errorf("no handling blocked in %s", killOpenTxnsWindow)
	}
	h.mu.Lock()
	slot := -1
	for s, r := range h.slots {
		if r.name == name {
			slot = s
		}
	}
	h.mu.Unlock()
	var at time.Time
	if slot >= 0 && h.killSlotNow(slot) != nil {
		at = time.Now()
		h.bg.Go(func() {
			if sleepCtx(context.WithoutCancel(ctx), time.Second) == nil {
				if _, err := h.startIfDown(slot); err != nil {
					h.logf("%s: restart of slot %d failed: %v", a, slot, err)
				}
			}
		})
	} else {
		// Killed meanwhile by the schedule: its transactions were open
		// all the same. Stopped gracefully, it is no case.
		k, ok := h.klog.killedAt(name)
		if !ok {
			return false, fmt.Errorf("%s stopped meanwhile", name)
		}
		at = k
	}
	c := takeoverCase{Replica: name, KilledAt: at}
	for _, id := range ids {
		c.Events = append(c.Events, eventRef(chaosTopic(), id))
	}
	h.mu.Lock()
	h.xf.takeovers = append(h.xf.takeovers, c)
	h.mu.Unlock()
	h.logf("%s: killed %s with %d transactions open", a, name, len(ids))
	return true, nil
}

// writeKeylessHeld writes a record without an idempotency key on a key
// that is held now (as the operator last saw it); false when no key is
// held.
func (h *harness) writeKeylessHeld(ctx context.Context, a action) (bool, error) {
	key, ok := h.op.heldKey(a.pick)
	if !ok {
		return false, nil
	}
	pos, err := h.inj.writeKeyless(ctx, key)
	if err != nil {
		return true, err
	}
	h.mu.Lock()
	h.xf.keylessHeld = append(h.xf.keylessHeld, pos)
	h.mu.Unlock()
	return true, nil
}

// writeKeyless writes a record of key without an idempotency key: a
// malformed record (counted as one) that the consumer must park behind
// the key's head, unreadable.
func (in *injector) writeKeyless(ctx context.Context, key string) (recordPos, error) {
	in.mu.Lock()
	n := in.malformed + in.uncertain + 1
	in.mu.Unlock()
	rec := &kgo.Record{Topic: in.topic, Partition: in.partitionOf(key), Key: []byte(key),
		Value: fmt.Appendf(nil, `{"key": %q, "seq": 1, "id": "malformed-%d"}`, key, n), Headers: malformedHeaders(false)}
	err := in.produceMalformed(ctx, rec)
	return recordPos{bareTopic(rec.Topic), rec.Partition, rec.Offset}, err
}

// newEventIDs lists the committed newEvents (no-handler-deploy).
func (h *harness) newEventIDs(ctx context.Context) ([]string, error) {
	var es []ledgerEntry
	if err := h.findAll(ctx, collLedger, bson.D{{Key: "kind", Value: kindNew}}, nil, &es); err != nil {
		return nil, err
	}
	ids := make([]string, len(es))
	for i := range es {
		ids[i] = es[i].ID
	}
	return ids, nil
}

// lastStepIDs returns the last committed step event of each key.
func (h *harness) lastStepIDs(ctx context.Context, keys []string) (map[string]string, error) {
	var es []ledgerEntry
	if err := h.findAll(ctx, collLedger, bson.D{{Key: "kind", Value: kindStep}, {Key: "key", Value: bson.D{{Key: "$in", Value: keys}}}}, nil, &es); err != nil {
		return nil, err
	}
	last := map[string]*ledgerEntry{}
	for i := range es {
		if l := last[es[i].Key]; l == nil || es[i].Seq > l.Seq {
			last[es[i].Key] = &es[i]
		}
	}
	out := map[string]string{}
	for k, e := range last {
		out[k] = e.ID
	}
	return out, nil
}

// waitingOf counts the events of schema among ids that are parked or held
// now.
func (r *inboxRecorder) waitingOf(schema string, ids []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, id := range ids {
		if f := r.docs[outbox.InboxID{Topic: chaosTopic(), ContentSchema: schema, IdempotencyKey: id}]; f != nil && f.state().waiting() {
			n++
		}
	}
	return n
}

// partitionOf is the partition a slow run's step event was delivered on,
// from its inbox document.
func (r *inboxRecorder) partitionOf(run slowRun) (topicPartition, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.docs[outbox.InboxID{Topic: chaosTopic(), ContentSchema: schemaStep, IdempotencyKey: run.ID}]
	if f == nil {
		return topicPartition{}, false
	}
	return topicPartition{chaosTopic(), f.Partition}, true
}

// waitingKeys counts the keys, among those match accepts, with an event
// parked or held now.
func (r *inboxRecorder) waitingKeys(match func(string) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := map[string]bool{}
	for _, f := range r.docs {
		if f.state().waiting() && match(f.PartitionKey) {
			keys[f.PartitionKey] = true
		}
	}
	return len(keys)
}

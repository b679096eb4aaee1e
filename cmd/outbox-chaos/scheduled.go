package main

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// Delayed publication (-scheduled): a generator of its own records
// scheduledPerSec transactions a second, each scheduling one event
// (WithPublishAt) on a key of its own, due scheduledMinDelay to
// scheduledMaxDelay later, or, for scheduledPastRatio of them, due
// already (recorded for immediate publication); scheduledCancelRatio of
// the scheduled ones are cancelled (CancelScheduled) by a later
// transaction, at a time drawn between the recording and a little after
// the due time, so that some cancels come in time and some too late.
const (
	schemaScheduled      = "ChaosScheduled.v1"
	kindScheduled        = "scheduled"
	scheduledPerSec      = 4
	scheduledMinDelay    = 500 * time.Millisecond
	scheduledMaxDelay    = 20 * time.Second
	scheduledPastRatio   = 0.1
	scheduledCancelRatio = 0.3
	// scheduledCancelAfterDue is how far past the due time a cancel may
	// be drawn: those must meet ErrTooLate.
	scheduledCancelAfterDue = 3 * time.Second
	// scheduledPadRatio of the scheduled events are padded to claimPad
	// with -claim-check: their payload goes out of band in the scheduling
	// transaction and must reach the handler whole after the promotion
	// (judgeClaims), or expire with its cancellation.
	scheduledPadRatio = 0.25
)

// The bound of scheduled-late (scheduledBound), after the first time at
// or after its due time from which one live publisher owned the event's
// partition for that long: scheduledPrecision, what docs/guarantees.md
// promises in steady state; plus the transaction lifetime, for which a
// promotion or a cancellation begun by a replica that was killed holds
// the events it wrote (docs/guarantees.md); plus the promotion's own
// transaction: the slowest transaction of the run's load (the store's
// latency under the run's faults and the machine's load), at least
// scheduledFaultSlack, the longest MongoDB stall the harness injects
// (1 s) and a few retries at the replicas' RetryMaxBackoff (250 ms).
const (
	scheduledPrecision  = time.Second
	scheduledFaultSlack = 2 * time.Second
)

// scheduledEvent is an event recorded with a publication time. Due is
// the time asked for, in Unix milliseconds (the framework keeps due times
// to the millisecond).
type scheduledEvent struct {
	Key string `json:"key" validate:"required"`
	ID  string `json:"id" validate:"required"`
	Due int64  `json:"due"`
	// Pad makes the payload go out of band (-claim-check).
	Pad string `json:"pad,omitempty"`
}

func (scheduledEvent) Topic() string          { return chaosTopic() }
func (scheduledEvent) ContentSchema() string  { return schemaScheduled }
func (e scheduledEvent) PartitionKey() string { return e.Key }

// Outcomes of a cancellation, as the workload saw CancelScheduled return.
const (
	cancelNil          = "nil"
	cancelTooLate      = "too-late"
	cancelNotScheduled = "not-scheduled"
	cancelError        = "error"
)

// cancelOutcome is what one cancellation returned: Result is the last
// CancelScheduled's outcome inside the transaction (Transact may run the
// function more than once), Committed whether the transaction returned
// nil, End when it returned.
type cancelOutcome struct {
	Result    string
	Committed bool
	End       time.Time
}

// schedLog is the workload's history of its scheduled events, by event
// id: when the transaction that recorded each returned nil, and what its
// cancellation saw.
type schedLog struct {
	mu       sync.Mutex
	recorded map[string]time.Time
	cancels  map[string]cancelOutcome
}

func (l *schedLog) noteRecorded(id string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recorded == nil {
		l.recorded = map[string]time.Time{}
	}
	l.recorded[id] = at
}

func (l *schedLog) note(id string, o cancelOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancels == nil {
		l.cancels = map[string]cancelOutcome{}
	}
	l.cancels[id] = o
}

func (l *schedLog) snapshot() (map[string]time.Time, map[string]cancelOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.recorded), maps.Clone(l.cancels)
}

// pendingCancel is a cancellation drawn for later.
type pendingCancel struct {
	id string
	at time.Time
}

// runScheduled records scheduled events and cancels some of them until
// ctx ends (the load's end, its deadline). No event is due after the
// load: the quiescence then only waits for events already due.
func (h *harness) runScheduled(ctx context.Context) {
	end, ok := ctx.Deadline()
	if !ok {
		end = time.Now().Add(h.cfg.duration)
	}
	rng := rand.New(rand.NewPCG(h.cfg.seed, 0x5c4ed))
	t := time.NewTicker(time.Second / scheduledPerSec)
	defer t.Stop()
	var pending []pendingCancel
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for len(pending) > 0 && !pending[0].at.After(now) {
			h.cancelScheduled(ctx, rng, pending[0].id)
			pending = pending[1:]
		}
		var due time.Time
		past := rng.Float64() < scheduledPastRatio
		if past {
			due = now.Add(-time.Duration(1 + rng.Int64N(int64(5*time.Second))))
		} else {
			d := scheduledMinDelay + time.Duration(rng.Int64N(int64(scheduledMaxDelay-scheduledMinDelay)))
			if d = min(d, time.Until(end)-time.Second); d < scheduledMinDelay {
				continue // it would fall due after the load
			}
			due = now.Add(d)
		}
		due = due.UTC().Truncate(time.Millisecond)
		cancel := !past && rng.Float64() < scheduledCancelRatio
		var cancelAt time.Time
		if cancel {
			cancelAt = now.Add(time.Duration(rng.Int64N(int64(due.Sub(now) + scheduledCancelAfterDue))))
		}
		var pad string
		if h.env.claimCheck && rng.Float64() < scheduledPadRatio {
			pad = padding(rng, claimPad)
		}
		id, err := h.recordScheduled(ctx, rng, due, past, pad)
		if err != nil || !cancel {
			continue
		}
		i, _ := slices.BinarySearchFunc(pending, cancelAt, func(p pendingCancel, t time.Time) int { return p.at.Compare(t) })
		pending = slices.Insert(pending, i, pendingCancel{id: id, at: cancelAt})
	}
}

// recordScheduled records one event due at due, padded with pad, alone
// in its transaction on a random replica, with its ledger entry; it
// returns its id.
func (h *harness) recordScheduled(ctx context.Context, rng *rand.Rand, due time.Time, past bool, pad string) (string, error) {
	r := h.pick(rng)
	if r == nil {
		return "", errors.New("no replica")
	}
	tctx, cancel := context.WithTimeout(r.ctx, txnDeadline)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	ledger := r.mongo.Database(h.env.database).Collection(collLedger)
	id := h.work.newID()
	err := r.client.Transact(tctx, func(ctx context.Context) error {
		ev := scheduledEvent{Key: "sched-" + id, ID: id, Due: due.UnixMilli(), Pad: pad}
		if err := outbox.Record(ctx, ev, outbox.WithIdempotencyKey(id), outbox.WithPublishAt(due)); err != nil {
			return err
		}
		_, err := ledger.InsertOne(ctx, ledgerEntry{ID: id, Topic: chaosTopic(), Key: ev.Key, Place: 1, Kind: kindScheduled,
			DueAt: due, PastDue: past, PadSum: padSum(pad)})
		return err
	})
	if err == nil {
		h.work.sched.noteRecorded(id, time.Now())
	}
	return id, err
}

// cancelScheduled cancels event id in a transaction on a random replica,
// marking its ledger entry cancelled (CancelScheduled returned nil) or
// too late (ErrTooLate) in the same transaction, and notes the outcome.
func (h *harness) cancelScheduled(ctx context.Context, rng *rand.Rand, id string) {
	r := h.pick(rng)
	if r == nil {
		return
	}
	tctx, cancel := context.WithTimeout(r.ctx, txnDeadline)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	ledger := r.mongo.Database(h.env.database).Collection(collLedger)
	var o cancelOutcome
	err := r.client.Transact(tctx, func(ctx context.Context) error {
		err := outbox.CancelScheduled(ctx, chaosTopic(), id)
		field := ""
		switch {
		case err == nil:
			o.Result, field = cancelNil, "cancelled"
		case errors.Is(err, outbox.ErrTooLate):
			o.Result, field = cancelTooLate, "too_late"
		case errors.Is(err, outbox.ErrNotScheduled):
			o.Result = cancelNotScheduled
			return nil
		default:
			o.Result = cancelError
			return err
		}
		_, err = ledger.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: field, Value: true}}}})
		return err
	})
	o.Committed, o.End = err == nil, time.Now()
	h.work.sched.note(id, o)
}

// scheduledFact is what the run left of one committed scheduled event.
type scheduledFact struct {
	ID  string
	Due time.Time
	// PastDue marks an event whose due time had passed at Record: it was
	// recorded for immediate publication.
	PastDue bool
	// Committed is when the transaction that recorded it returned nil, at
	// or after its commit (zero when it returned an error: the commit's
	// result unknown). A transaction slower than the delay commits an
	// event due already, promoted as soon as a loop learns of it.
	Committed time.Time
	// Cancelled and TooLate are its ledger's marks, written by a committed
	// cancellation that returned nil or ErrTooLate.
	Cancelled, TooLate bool
	// Cancel is what the workload's cancellation saw (Result "" for none).
	Cancel cancelOutcome
	// Promoted is whether its scheduled document is marked promoted, and
	// PromotedAt when; InOutbox counts its outbox documents.
	Promoted   bool
	PromotedAt time.Time
	InOutbox   int
	// Records are the timestamps of its records in the topic, Partition
	// the partition of the first.
	Records   []time.Time
	Partition int32
	// Effects counts its handlings.
	Effects int
}

// scheduledFacts are what judgeScheduled judges.
type scheduledFacts struct {
	Events []scheduledFact
	// AvailableAt is the first time at or after t from which one live
	// publisher owned the partition for at least Bound (false: none did).
	AvailableAt func(partition int32, t time.Time) (time.Time, bool)
	// Bound is how long after AvailableAt a promotion may come.
	Bound time.Duration
	// On reports -scheduled.
	On bool
}

// scheduledResult counts what judgeScheduled saw: the events scheduled
// (PastDue left out), recorded past due, cancelled, too late to cancel,
// lost; the longest time from due time to first record in the topic
// (MaxLate) and to promotion (MaxPromoteLate), and the longest time from
// the partition's live owner to a promotion (MaxAfterOwner, judged
// against Bound).
type scheduledResult struct {
	Scheduled, PastDue, Cancelled, TooLate, Lost int
	MaxLate, MaxPromoteLate, MaxAfterOwner       time.Duration
}

// judgeScheduled judges the scheduled events:
//   - scheduled-lost: one not cancelled never reached the topic or its
//     handler (scheduled-too-late-lost when a cancellation said it was
//     too late, which promises its publication);
//   - scheduled-early: a record of one, or its promotion, before its due
//     time (one clock: the harness, the replicas and the broker share the
//     machine's, and Kafka's record timestamps are the producer's);
//   - scheduled-late: its promotion came later than Bound after the first
//     time at or after its due time, and after its recording transaction
//     returned, from which one live publisher owned its partition for
//     Bound (a kill, a rebalance or a broker fault moves that time; a
//     recording slower than the delay commits an event due already);
//   - scheduled-cancelled-published: a committed cancellation returned
//     nil, yet the event was promoted, published or handled;
//   - scheduled-too-late-early: a cancellation met ErrTooLate before the
//     event was due;
//   - scheduled-cancel-unrecorded: a cancellation's transaction returned
//     nil with CancelScheduled's nil or ErrTooLate, yet the ledger written
//     in it lacks the mark (the cancellation was not part of it);
//   - scheduled-promoted-twice: more than one outbox document of one;
//   - scheduled-unexercised: with -scheduled, nothing scheduled, or
//     nothing cancelled in time: the rules would judge nothing.
func judgeScheduled(f *scheduledFacts, v *verdict) scheduledResult {
	var r scheduledResult
	for i := range f.Events {
		e := &f.Events[i]
		if e.PastDue {
			r.PastDue++
		} else {
			r.Scheduled++
		}
		if e.Cancel.Committed && (e.Cancel.Result == cancelNil && !e.Cancelled || e.Cancel.Result == cancelTooLate && !e.TooLate) {
			v.fail("scheduled-cancel-unrecorded", "scheduled event %s: the cancellation returned %s and committed, the ledger says cancelled=%v too_late=%v",
				e.ID, e.Cancel.Result, e.Cancelled, e.TooLate)
		}
		if e.Cancelled {
			r.Cancelled++
			if e.Promoted || e.InOutbox > 0 || len(e.Records) > 0 || e.Effects > 0 {
				v.fail("scheduled-cancelled-published", "scheduled event %s (due %s) cancelled, yet promoted %v (at %s), %d outbox documents, %d records, %d effects",
					e.ID, e.Due.Format(tsFormat), e.Promoted, fmtTime(e.PromotedAt), e.InOutbox, len(e.Records), e.Effects)
			}
			continue
		}
		if e.TooLate {
			r.TooLate++
		}
		if e.Cancel.Result == cancelTooLate && e.Cancel.End.Before(e.Due) {
			v.fail("scheduled-too-late-early", "scheduled event %s: a cancellation met ErrTooLate at %s, before its due time %s",
				e.ID, e.Cancel.End.Format(tsFormat), e.Due.Format(tsFormat))
		}
		if e.InOutbox > 1 {
			v.fail("scheduled-promoted-twice", "scheduled event %s has %d outbox documents", e.ID, e.InOutbox)
		}
		if len(e.Records) == 0 || e.Effects == 0 {
			r.Lost++
			kind := "scheduled-lost"
			if e.TooLate {
				kind = "scheduled-too-late-lost"
			}
			v.fail(kind, "scheduled event %s (due %s, past due %v, too late to cancel %v): promoted %v, %d outbox documents, %d records, %d effects",
				e.ID, e.Due.Format(tsFormat), e.PastDue, e.TooLate, e.Promoted, e.InOutbox, len(e.Records), e.Effects)
			continue
		}
		if e.PastDue {
			continue
		}
		for _, at := range e.Records {
			if at.Before(e.Due) {
				v.fail("scheduled-early", "scheduled event %s reached the topic at %s, before its due time %s",
					e.ID, at.Format(tsFormat), e.Due.Format(tsFormat))
			}
		}
		r.MaxLate = max(r.MaxLate, slices.MinFunc(e.Records, time.Time.Compare).Sub(e.Due))
		if !e.Promoted {
			continue // recorded for immediate publication: due by Record's clock
		}
		if e.PromotedAt.Before(e.Due) {
			v.fail("scheduled-early", "scheduled event %s promoted at %s, before its due time %s",
				e.ID, e.PromotedAt.Format(tsFormat), e.Due.Format(tsFormat))
		}
		r.MaxPromoteLate = max(r.MaxPromoteLate, e.PromotedAt.Sub(e.Due))
		if e.Committed.IsZero() {
			continue // not judged: when it committed is unknown
		}
		avail, ok := f.AvailableAt(e.Partition, later(e.Due, e.Committed))
		if ok {
			r.MaxAfterOwner = max(r.MaxAfterOwner, e.PromotedAt.Sub(avail))
		}
		if ok && e.PromotedAt.Sub(avail) > f.Bound {
			v.fail("scheduled-late", "scheduled event %s (partition %d) due %s, committed %s, promoted at %s: %s after a live publisher owned its partition for good (%s), bound %s",
				e.ID, e.Partition, e.Due.Format(tsFormat), e.Committed.Format(tsFormat), e.PromotedAt.Format(tsFormat),
				e.PromotedAt.Sub(avail).Round(time.Millisecond), avail.Format(tsFormat), f.Bound)
		}
	}
	if f.On && (r.Scheduled == 0 || r.Cancelled == 0) {
		v.fail("scheduled-unexercised", "-scheduled: %d events scheduled, %d cancelled in time: the rules judged too little", r.Scheduled, r.Cancelled)
	}
	return r
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// scheduledBound is the bound of scheduled-late for a transaction
// lifetime and the slowest transaction of the run.
func scheduledBound(lifetime, slowestTx time.Duration) time.Duration {
	return scheduledPrecision + lifetime + max(scheduledFaultSlack, slowestTx)
}

// fmtTime formats t, "never" for the zero time.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(tsFormat)
}

// availableAt is the first time a at or after t from which one live
// replica's publisher owned topic's partition p for at least span: an
// ownership ends at its revoke or loss, or when its replica was killed
// (gone), whichever comes first. An owner that lost the partition, or
// died, sooner may have left the promotion to the next one.
func availableAt(owned []ownership, gone map[string]time.Time, topic string, p int32, t time.Time, span time.Duration) (time.Time, bool) {
	var first time.Time
	for _, o := range owned {
		if o.Topic != topic || o.Partition != p {
			continue
		}
		end := o.To
		if g, ok := gone[o.Replica]; ok && (end.IsZero() || g.Before(end)) {
			end = g
		}
		from := t
		if o.From.After(t) {
			from = o.From
		}
		if !end.IsZero() && end.Sub(from) < span {
			continue // over before span
		}
		if first.IsZero() || from.Before(first) {
			first = from
		}
	}
	return first, !first.IsZero()
}

// checkScheduled gathers the facts of judgeScheduled: the ledger's
// scheduled events, the workload's cancellations, the scheduled events'
// collection, the outbox, the topic's records (tr), the effects and the
// publishers' ownership.
func (h *harness) checkScheduled(ctx context.Context, ledger []ledgerEntry, tr *topicsRead, effectCount map[string]int, res *result, v *verdict) error {
	byID := map[string]*scheduledFact{}
	recorded, cancels := h.work.sched.snapshot()
	ids := []string{} // an array for $in even when there are none
	for i := range ledger {
		e := &ledger[i]
		if e.Kind != kindScheduled {
			continue
		}
		byID[e.ID] = &scheduledFact{ID: e.ID, Due: e.DueAt, PastDue: e.PastDue, Committed: recorded[e.ID], Cancelled: e.Cancelled, TooLate: e.TooLate,
			Cancel: cancels[e.ID], Effects: effectCount[e.ID]}
		ids = append(ids, e.ID)
	}
	in := bson.D{{Key: "$in", Value: ids}}
	var sched []struct {
		Key        string     `bson:"idempotency_key"`
		Promoted   bool       `bson:"promoted"`
		PromotedAt *time.Time `bson:"promoted_at"`
	}
	if err := h.findAll(ctx, "outbox"+store.ScheduledSuffix, bson.D{{Key: store.OutboxIdempotencyKey, Value: in}},
		bson.D{{Key: store.OutboxIdempotencyKey, Value: 1}, {Key: store.ScheduledPromoted, Value: 1}, {Key: store.ScheduledPromotedAt, Value: 1}}, &sched); err != nil {
		return err
	}
	for _, s := range sched {
		if f := byID[s.Key]; f != nil && s.Promoted && s.PromotedAt != nil {
			f.Promoted, f.PromotedAt = true, *s.PromotedAt
		}
	}
	var docs []struct {
		Key string `bson:"idempotency_key"`
	}
	if err := h.findAll(ctx, "outbox", bson.D{{Key: store.OutboxIdempotencyKey, Value: in}},
		bson.D{{Key: store.OutboxIdempotencyKey, Value: 1}}, &docs); err != nil {
		return err
	}
	for _, d := range docs {
		if f := byID[d.Key]; f != nil {
			f.InOutbox++
		}
	}
	for _, rec := range tr.records {
		if f := byID[rec.ID]; f != nil && rec.Topic == chaosTopic() {
			if len(f.Records) == 0 || rec.Offset == tr.first[eventRef(rec.Topic, rec.ID)] {
				f.Partition = rec.Partition
			}
			f.Records = append(f.Records, rec.At)
		}
	}
	h.mu.Lock()
	slowest := h.slowestKafkaUp
	h.mu.Unlock()
	facts := &scheduledFacts{Events: make([]scheduledFact, 0, len(ids)), On: h.cfg.scheduled,
		Bound: scheduledBound(h.cfg.txnLifetime, slowest)}
	for _, id := range ids {
		facts.Events = append(facts.Events, *byID[id])
	}
	l := h.klog
	l.mu.Lock()
	owned, gone := slices.Clone(l.owned), maps.Clone(l.gone)
	l.mu.Unlock()
	facts.AvailableAt = func(p int32, t time.Time) (time.Time, bool) {
		return availableAt(owned, gone, chaosTopic(), p, t, facts.Bound)
	}
	sr := judgeScheduled(facts, v)
	res.Scheduled, res.PastDue, res.Cancelled, res.TooLate = sr.Scheduled, sr.PastDue, sr.Cancelled, sr.TooLate
	res.MaxLate, res.MaxPromoteLate = sr.MaxLate, sr.MaxPromoteLate
	res.Lost += sr.Lost
	h.logf("scheduled events: %d scheduled, %d past due, %d cancelled, %d too late to cancel; latest first record %s after its due time, latest promotion %s after its due time, %s after a live owner held its partition (bound %s)",
		sr.Scheduled, sr.PastDue, sr.Cancelled, sr.TooLate, sr.MaxLate.Round(time.Millisecond), sr.MaxPromoteLate.Round(time.Millisecond),
		sr.MaxAfterOwner.Round(time.Millisecond), facts.Bound.Round(time.Millisecond))
	return nil
}

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// Each check of the checker is proven here on a hand-made ledger and
// history that it must fail (and, for contrast, on one it must pass).

// history builds hand-made inbox histories for judgeOrder: one key "k" on
// topic "t", whose events are named by their refs in the key's order.
type history struct {
	facts  orderFacts
	states map[string]inboxState
}

func newHistory(kinds ...string) *history {
	h := &history{states: map[string]inboxState{}}
	var seq []seqEvent
	for i, k := range kinds {
		seq = append(seq, seqEvent{Ref: fmt.Sprintf("e%d", i+1), Kind: k, Place: int64(i + 1), Offset: int64(10 + i)})
	}
	h.facts = orderFacts{Seqs: map[seqKey][]seqEvent{{Topic: "t", Key: "k"}: seq},
		Ref:    func(c *inboxChange) string { return c.ID.IdempotencyKey },
		Outage: map[string]bool{}}
	return h
}

// to records a change of event ref to state, with a last error.
func (h *history) to(ref string, s inboxState, lastError ...string) *history {
	c := inboxChange{ID: outbox.InboxID{Topic: "t", IdempotencyKey: ref}, From: h.states[ref], To: s, Key: "k"}
	if len(lastError) > 0 {
		c.LastError = lastError[0]
	}
	h.states[ref] = s
	h.facts.Changes = append(h.facts.Changes, c)
	return h
}

func (h *history) judge() (orderResult, *verdict) {
	v := &verdict{}
	return judgeOrder(&h.facts, v), v
}

// requireFails asserts that the verdict holds a line of the kind, and
// shows the lines.
func requireFails(t *testing.T, v *verdict, kind string) {
	t.Helper()
	require.Positive(t, v.count(kind), "no %s failure; lines: %q", kind, v.all())
}

const outageErr = "chaos: downstream outage"

// TestJudgeOrderPassesAPurgedPoisonAndItsRelease: a poison event parked,
// the key's later events held, the poison purged, the first held event
// promoted and re-driven, the next released: the checker's expected
// history, with nothing to report.
func TestJudgeOrderPassesAPurgedPoisonAndItsRelease(t *testing.T) {
	t.Parallel()
	h := newHistory(kindPoison, kindStep, kindStep).
		to("e1", inboxFailing).to("e1", inboxParked, "chaos: poison event").
		to("e2", inboxHeld).to("e3", inboxHeld).
		to("e1", inboxDiscarded).
		to("e2", inboxParked, "purged; re-drive requested").to("e2", inboxHandled).
		to("e3", inboxHandled)
	res, v := h.judge()
	require.Empty(t, v.all())
	require.Equal(t, 2, res.Held)
	require.Equal(t, 2, res.Parked)
	require.Equal(t, 1, res.MaxHeldKeys)
}

// TestJudgeOrderFailsAStepHandledBehindAParkedPoison: the bug the issue
// names first: a key's later event handled while its poison event is
// parked.
func TestJudgeOrderFailsAStepHandledBehindAParkedPoison(t *testing.T) {
	t.Parallel()
	res, v := newHistory(kindPoison, kindStep).
		to("e1", inboxFailing).to("e1", inboxParked).
		to("e2", inboxHandled).judge()
	requireFails(t, v, "key-order")
	require.Equal(t, 1, res.Violations)
}

// TestJudgeOrderFailsAHandlingOverAnEventNotYetDelivered: a gap: the
// second event handled before the first arrived.
func TestJudgeOrderFailsAHandlingOverAnEventNotYetDelivered(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindStep, kindStep).to("e2", inboxHandled).to("e1", inboxHandled).judge()
	requireFails(t, v, "key-order")
}

// TestJudgeOrderFailsAPoisonRunBehindAParkedStep: an event attempted
// while an earlier event of its key was parked should have been held.
func TestJudgeOrderFailsAPoisonRunBehindAParkedStep(t *testing.T) {
	t.Parallel()
	h := newHistory(kindStep, kindPoison)
	h.facts.Outage["k"] = true
	_, v := h.to("e1", inboxFailing).to("e1", inboxParked, outageErr).
		to("e2", inboxFailing).judge()
	requireFails(t, v, "held-missing")
}

// TestJudgeOrderFailsAnEventParkedOnItsOwnBehindAParkedOne: parked as a
// head of its own while an earlier event of its key was parked.
func TestJudgeOrderFailsAnEventParkedOnItsOwnBehindAParkedOne(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindMalformed, kindPoison).
		to("e1", inboxParked).to("e2", inboxParked).judge()
	requireFails(t, v, "held-missing")
}

// TestJudgeOrderFailsAHoldWithNothingToWaitFor: an event held although
// nothing earlier of its key was parked or held.
func TestJudgeOrderFailsAHoldWithNothingToWaitFor(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindStep, kindStep).
		to("e1", inboxHandled).to("e2", inboxHeld).judge()
	requireFails(t, v, "held-unexpected")
}

// TestJudgeOrderAllowsJoiningARelease: an event held just after the last
// waiting event of its key was released (the release closes its chain):
// allowed, it is released in turn.
func TestJudgeOrderAllowsJoiningARelease(t *testing.T) {
	t.Parallel()
	h := newHistory(kindStep, kindStep, kindStep)
	h.facts.Outage["k"] = true
	_, v := h.to("e1", inboxParked, outageErr).to("e2", inboxHeld).
		to("e1", inboxHandled).to("e2", inboxHandled).
		to("e3", inboxHeld).to("e3", inboxHandled).judge()
	require.Empty(t, v.all())
}

// TestJudgeOrderFailsAnUnexplainedPark: a step event parked on a key that
// had no outage, or with another error.
func TestJudgeOrderFailsAnUnexplainedPark(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindStep).to("e1", inboxFailing).to("e1", inboxParked, outageErr).judge()
	requireFails(t, v, "parked-unexplained")

	h := newHistory(kindStep)
	h.facts.Outage["k"] = true
	_, v = h.to("e1", inboxParked, "context canceled").judge()
	requireFails(t, v, "parked-unexplained")

	h = newHistory(kindStep)
	h.facts.Outage["k"] = true
	_, v = h.to("e1", inboxParked, outageErr).judge()
	require.Empty(t, v.all(), "an outage explains it")
}

// TestJudgeOrderFailsAPromotionAheadOfAWaitingEvent: a held event made
// the head of its key while an earlier event still waited.
func TestJudgeOrderFailsAPromotionAheadOfAWaitingEvent(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindPoison, kindStep, kindStep).
		to("e1", inboxParked).to("e2", inboxHeld).to("e3", inboxHeld).
		to("e3", inboxParked).judge()
	requireFails(t, v, "promoted-early")
}

// TestJudgeOrderFailsASettledEventParkedAgain.
func TestJudgeOrderFailsASettledEventParkedAgain(t *testing.T) {
	t.Parallel()
	_, v := newHistory(kindPoison).to("e1", inboxParked).to("e1", inboxDiscarded).to("e1", inboxParked).judge()
	requireFails(t, v, "parked-after-settled")
}

// TestJudgeRedrives: a re-drive must end handled.
func TestJudgeRedrives(t *testing.T) {
	t.Parallel()
	once := func(string) (int, bool) { return 1, true }
	v := &verdict{}
	judgeRedrives([]redriveFact{{Ref: "a", How: "call", After: inboxParked}}, map[string]inboxState{"a": inboxHandled}, once, v)
	requireFails(t, v, "redrive")
	v = &verdict{}
	judgeRedrives([]redriveFact{{Ref: "a", How: "request"}}, map[string]inboxState{"a": inboxParked}, once, v)
	requireFails(t, v, "redrive")
	v = &verdict{}
	judgeRedrives([]redriveFact{{Ref: "a", How: "call", After: inboxHandled}, {Ref: "a", How: "request"}},
		map[string]inboxState{"a": inboxHandled}, once, v)
	require.Empty(t, v.all())
}

// TestJudgeRedrivesByEffect: a re-drive that flips its event to handled
// without running its handler (or runs it twice) fails as a re-drive,
// not only as a lost event; events without an effect of their own
// (malformed records, poison events) are judged by the inbox alone.
func TestJudgeRedrivesByEffect(t *testing.T) {
	t.Parallel()
	effects := map[string]int{"t/a": 0, "t/b": 2, "t/c": 1}
	of := func(ref string) (int, bool) {
		n, ok := effects[ref]
		return n, ok
	}
	final := map[string]inboxState{"t/a": inboxHandled, "t/b": inboxHandled, "t/c": inboxHandled, "t/m": inboxHandled}
	v := &verdict{}
	judgeRedrives([]redriveFact{{Ref: "t/a", How: "call", After: inboxHandled}, {Ref: "t/a", How: "request"}}, final, of, v)
	requireFails(t, v, "redrive")
	require.Len(t, v.all(), 1, "one line per re-driven event")
	require.Contains(t, v.all()[0], "re-drive (call) of t/a ended handled with 0 effects")
	v = &verdict{}
	judgeRedrives([]redriveFact{{Ref: "t/b", How: "request"}}, final, of, v)
	requireFails(t, v, "redrive")
	v = &verdict{}
	judgeRedrives([]redriveFact{{Ref: "t/c", How: "request"}, {Ref: "t/m", How: "request"}}, final, of, v)
	require.Empty(t, v.all())
}

// TestJudgeEffectsFailsADoubleEffect: a redelivered event handled again.
func TestJudgeEffectsFailsADoubleEffect(t *testing.T) {
	t.Parallel()
	byID := map[string]*ledgerEntry{"a": {ID: "a", Kind: kindStep}, "f": {ID: "f", Kind: kindFollow}}
	v := &verdict{}
	require.Equal(t, effectsResult{}, judgeEffects(map[string]int{"a": 1, "f": 1}, byID, nil, map[string]bool{}, v))
	require.Empty(t, v.all())
	require.Equal(t, effectsResult{Double: 3, DoubleHandled: 2}, judgeEffects(map[string]int{"a": 2, "f": 3}, byID, nil, map[string]bool{}, v))
	requireFails(t, v, "double-effect")
}

// TestJudgeEffectsCountsDedupFailures: the summary's dedup counters, from
// a hand-made ledger: events handled more than once, and effects of no
// committed event.
func TestJudgeEffectsCountsDedupFailures(t *testing.T) {
	t.Parallel()
	byID := map[string]*ledgerEntry{"a": {ID: "a", Kind: kindStep}, "b": {ID: "b", Kind: kindStep}, "p": {ID: "p", Kind: kindPoison}}
	v := &verdict{}
	r := judgeEffects(map[string]int{"a": 4, "b": 1, "p": 1, "x": 1}, byID, nil, map[string]bool{}, v)
	require.Equal(t, effectsResult{Double: 3, DoubleHandled: 1, Unknown: 2}, r)
	res := &result{DoubleEffects: r.Double, DoubleHandled: r.DoubleHandled, UnknownEffects: r.Unknown}
	require.Contains(t, res.summary(), " double_effects=3 ")
	require.Contains(t, res.summary(), " double_handled=1 unknown_effects=2 ")
}

// TestCountRedelivered: only deliveries after the event was settled count.
func TestCountRedelivered(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	polls := []poll{{Topic: "t", ID: "a", At: t0}, {Topic: "t", ID: "a", At: t0.Add(2 * time.Second)},
		{Topic: "t", ID: "b", At: t0.Add(3 * time.Second)}, {Topic: "u", ID: "a", At: t0.Add(3 * time.Second)}}
	require.Equal(t, 1, countRedelivered(polls, map[string]time.Time{"t/a": t0.Add(time.Second), "t/b": t0.Add(4 * time.Second)}))
}

// fencing builds hand-made fencing facts: replica r1 owns t/0 from t0+1s
// to t0+10s (revoked), r2 from t0+11s on.
type fencing struct {
	t0 time.Time
	f  fencingFacts
}

func newFencing() *fencing {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	return &fencing{t0: t0, f: fencingFacts{
		Owned: []ownership{
			{Replica: "r1", Topic: "t", Partition: 0, From: at(1), To: at(10), Ended: "revoked"},
			{Replica: "r2", Topic: "t", Partition: 0, From: at(11)},
		},
		Gone: map[string]time.Time{}, Rogue: map[recordPos]bool{}, RogueDoubt: map[doubtKey]int{},
	}}
}

func (f *fencing) at(s float64) time.Time { return f.t0.Add(time.Duration(s * float64(time.Second))) }

// publish adds a record at offset off of event id, produced by replica at
// second s (acknowledged 10 ms later).
func (f *fencing) publish(replica string, off int64, id string, s float64) *fencing {
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, off}, ID: id, Key: "k"})
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: replica, Topic: "t", Partition: 0, Offset: off, ID: id,
		Buffered: f.at(s), Done: f.at(s + 0.01)})
	return f
}

func (f *fencing) judge() (int, *verdict) {
	v := &verdict{}
	return judgeFencing(&f.f, v).Duplicates, v
}

// TestJudgeFencingPassesOwnedPublications.
func TestJudgeFencingPassesOwnedPublications(t *testing.T) {
	t.Parallel()
	dups, v := newFencing().publish("r1", 0, "a", 2).publish("r2", 1, "b", 12).judge()
	require.Empty(t, v.all())
	require.Zero(t, dups)
}

// TestJudgeFencingFailsARecordAfterTheRevoke: a zombie publisher that
// keeps publishing a partition after it was revoked, without reordering.
func TestJudgeFencingFailsARecordAfterTheRevoke(t *testing.T) {
	t.Parallel()
	_, v := newFencing().publish("r1", 0, "a", 2).publish("r1", 1, "b", 10.5).judge()
	requireFails(t, v, "fence-outside")
}

// TestJudgeFencingCountsAZombie: a zombie publisher (it goes on
// publishing a partition after it lost it, publishing events again) shows
// in the summary as fence violations and unexplained duplicates, not only
// as duplicate publications.
func TestJudgeFencingCountsAZombie(t *testing.T) {
	t.Parallel()
	f := newFencing().publish("r1", 0, "a", 2).publish("r2", 1, "b", 12).
		publish("r1", 2, "c", 10.5).publish("r1", 3, "a", 13).publish("r1", 4, "b", 13.5)
	v := &verdict{}
	fr := judgeFencing(&f.f, v)
	require.Equal(t, fencingResult{Duplicates: 2, Violations: 3, Unexplained: 1}, fr)
	res := &result{DuplicatePublications: fr.Duplicates, FenceViolations: fr.Violations, UnexplainedDuplicates: fr.Unexplained}
	require.Contains(t, res.summary(), " duplicate_publications=2 unexplained_duplicates=1 fence_violations=3 ")
	require.True(t, strings.Contains(res.summary(), " group_protocol=classic "), "the summary names the replicas' group protocol")
}

// TestJudgeFencingFailsTwoOwnersAtOnce: a record produced while another
// replica owned the partition.
func TestJudgeFencingFailsTwoOwnersAtOnce(t *testing.T) {
	t.Parallel()
	f := newFencing()
	f.f.Owned[0].To, f.f.Owned[0].Ended = time.Time{}, "" // r1 never gave it up
	_, v := f.publish("r1", 0, "a", 12).judge()
	requireFails(t, v, "fence-overlap")

	f = newFencing()
	f.f.Owned[0].To, f.f.Owned[0].Ended = time.Time{}, ""
	f.f.Gone["r1"] = f.at(9) // killed: it owns nothing after
	_, v = f.publish("r2", 0, "a", 12).judge()
	require.Empty(t, v.all())
}

// TestJudgeFencingFailsARecordNoReplicaProduced.
func TestJudgeFencingFailsARecordNoReplicaProduced(t *testing.T) {
	t.Parallel()
	f := newFencing()
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 5}, ID: "x"})
	_, v := f.judge()
	requireFails(t, v, "fence-unattributed")

	// A produce whose promise never completed (its replica killed, its
	// client abandoned) may have landed too.
	l := newKafkaLog()
	replicaHooks{l, "r1"}.OnProduceRecordBuffered(&kgo.Record{Topic: "t", Partition: 0,
		Headers: []kgo.RecordHeader{{Key: outbox.HeaderIdempotencyKey, Value: []byte("x")}}})
	gone := time.Now()
	l.gone["r1"] = gone
	inDoubt := l.unfinished(gone.Add(time.Minute))
	require.Len(t, inDoubt, 1)
	p := inDoubt[0]
	require.Equal(t, pubRecord{Replica: "r1", Topic: "t", Partition: 0, ID: "x", Buffered: p.Buffered, Done: gone, Err: true}, p)
	f = newFencing()
	p.Buffered, p.Done = f.at(3), f.at(9) // while r1 owned the partition
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 5}, ID: "x"})
	f.f.Produced = append(f.f.Produced, p)
	_, v = f.judge()
	require.Empty(t, v.all())

	// A produce that failed on a replica may have landed (in doubt).
	f = newFencing()
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 5}, ID: "x"})
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 0, ID: "x", Buffered: f.at(3), Done: f.at(7), Err: true})
	_, v = f.judge()
	require.Empty(t, v.all())
}

// TestJudgeFencingExplainsDuplicates: a duplicate publication is explained
// by a kill of the earlier publisher, or a revoke, within dupWindow of the
// earlier publication; one without is a failure.
func TestJudgeFencingExplainsDuplicates(t *testing.T) {
	t.Parallel()
	// Published at 9.5 by r1, whose partition was revoked at 10: r2 publishes again.
	dups, v := newFencing().publish("r1", 0, "a", 9.5).publish("r2", 1, "a", 12).judge()
	require.Empty(t, v.all())
	require.Equal(t, 1, dups)

	// r1 killed right after it published.
	f := newFencing().publish("r1", 0, "a", 3).publish("r2", 1, "a", 12)
	f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(3.2), Kind: "kill"})
	dups, v = f.judge()
	require.Empty(t, v.all())
	require.Equal(t, 1, dups)

	// r1 killed just before it handed the record to its producer: a
	// replica's goroutines outlive the moment its kill is noted, and what
	// it publishes then it never marks.
	// Its group notices the loss later, after the next owner published.
	f = newFencing().publish("r1", 0, "a", 3).publish("r2", 1, "a", 12)
	f.f.Owned[0].To, f.f.Owned[0].Ended = f.at(13), "lost"
	f.f.Gone["r1"] = f.at(2.99)
	f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(2.99), Kind: "kill"})
	dups, v = f.judge()
	require.Empty(t, v.all())
	require.Equal(t, 1, dups)

	// Published again by the same owner, nothing in between.
	dups, v = newFencing().publish("r1", 0, "a", 3).publish("r1", 1, "a", 6).judge()
	requireFails(t, v, "duplicate-unexplained")
	require.Equal(t, 1, dups)

	// A kill long after the first publication explains nothing once the
	// publisher had marked the rest of that round; it does while nothing
	// of the round was marked (the publisher was cut before it could).
	f = newFencing().publish("r1", 0, "a", 3).publish("r1", 1, "b", 3).publish("r2", 2, "a", 12)
	f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(8), Kind: "kill"})
	f.f.MarkedAt = map[string]time.Time{"t/b": f.at(3.1)}
	_, v = f.judge()
	requireFails(t, v, "duplicate-unexplained")
	f.f.MarkedAt = map[string]time.Time{"t/b": f.at(8.5)}
	_, v = f.judge()
	require.Empty(t, v.all())

	// A produce that failed on the same partition around the publication:
	// the publisher produces the failed record and those after it again.
	f = newFencing().publish("r1", 0, "a", 3).publish("r1", 1, "a", 4)
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 0, ID: "x", Buffered: f.at(2.9), Done: f.at(3.05), Err: true})
	dups, v = f.judge()
	require.Empty(t, v.all())
	require.Equal(t, 1, dups)
	f = newFencing().publish("r1", 0, "a", 3).publish("r1", 1, "a", 4)
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 1, ID: "x", Buffered: f.at(2.9), Done: f.at(3.05), Err: true})
	_, v = f.judge()
	requireFails(t, v, "duplicate-unexplained") // on another partition: no excuse

	// A batch is marked once all of it is acknowledged: a kill 1.5 s
	// after the publication, while the rest of its round was in flight
	// until then, explains it.
	f = newFencing().publish("r1", 0, "a", 3).publish("r2", 2, "a", 12)
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 0, Offset: 1, ID: "b", Buffered: f.at(3), Done: f.at(4.2)})
	f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(4.5), Kind: "kill"})
	_, v = f.judge()
	require.Empty(t, v.all())

	// On a loaded machine marking took 3 s then: a kill 2 s after the
	// publication explains the duplicate; with marks taking 0.3 s it
	// does not.
	for lag, ok := range map[float64]bool{3: true, 0.3: false} {
		f = newFencing().publish("r1", 0, "a", 3).publish("r1", 1, "b", 3.5).publish("r2", 2, "a", 12)
		f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(5), Kind: "kill"})
		f.f.MarkedAt = map[string]time.Time{"t/b": f.at(3.51 + lag)}
		_, v = f.judge()
		require.Equal(t, !ok, v.count("duplicate-unexplained") > 0, "mark lag %vs: %q", lag, v.all())
	}

	// The rogue producer's copies are no publications.
	f = newFencing().publish("r1", 0, "a", 3)
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 1}, ID: "a"})
	f.f.Rogue[recordPos{"t", 0, 1}] = true
	dups, v = f.judge()
	require.Empty(t, v.all())
	require.Zero(t, dups)
}

// TestJudgeFencingAttributesADoubtByItsPlace: an event whose produce
// failed on two replicas, in turn, is in the topic once after a third
// replica's acknowledged publication of it. The replica whose produce
// failed first (killed long before, its network cut) cannot have written
// a record appended after one handed over later: the record is the later
// replica's, whose publication again the kill of the acknowledged
// publisher explains (it was cut before it marked its round).
func TestJudgeFencingAttributesADoubtByItsPlace(t *testing.T) {
	t.Parallel()
	build := func() *fencing {
		f := newFencing()
		f.f.Owned = []ownership{
			{Replica: "r1", Topic: "t", Partition: 0, From: f.at(1), To: f.at(2.6), Ended: "lost"},
			{Replica: "r2", Topic: "t", Partition: 0, From: f.at(11), To: f.at(13.6), Ended: "lost"},
			{Replica: "r3", Topic: "t", Partition: 0, From: f.at(14), To: f.at(15.5), Ended: "lost"},
		}
		// r1 handed "a" over at 2 and was killed at once: its client,
		// closed at 2.5, failed the record.
		f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 0, ID: "a",
			Buffered: f.at(2), Done: f.at(2.5), Err: true})
		f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r1", At: f.at(2.1), Kind: "kill"})
		f.f.Gone["r1"] = f.at(2.1)
		// r2 published it at 12 (acknowledged), and was killed at 13.5
		// before it could mark it.
		f.publish("r2", 0, "a", 12)
		f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r2", At: f.at(13.5), Kind: "kill"})
		f.f.Gone["r2"] = f.at(13.5)
		// r3 published it again at 15, and was killed before Kafka's
		// answer: in doubt, but in the topic.
		f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 1}, ID: "a", Key: "k"})
		f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r3", Topic: "t", Partition: 0, ID: "a",
			Buffered: f.at(15), Done: f.at(15.5), Err: true})
		f.f.Interruptions = append(f.f.Interruptions, interruption{Replica: "r3", At: f.at(15.4), Kind: "kill"})
		return f
	}
	dups, v := build().judge()
	require.Empty(t, v.all())
	require.Equal(t, 1, dups)

	// Without r3's failed produce, only r1's is left, and it cannot have
	// written a record appended after r2's, handed over at 12... unless a
	// broker held it up: it is the writer all the same, and nothing
	// explains the duplicate.
	f := build()
	f.f.Produced = f.f.Produced[:len(f.f.Produced)-1]
	_, v = f.judge()
	requireFails(t, v, "duplicate-unexplained")
	require.Zero(t, v.count("fence-unattributed"))
}

// TestJudgeFencingRefusesADoubtHandedOverTooLate: a failed produce handed
// over after a record at a higher offset was acknowledged cannot have
// written the record.
func TestJudgeFencingRefusesADoubtHandedOverTooLate(t *testing.T) {
	t.Parallel()
	f := newFencing()
	f.f.Records = append(f.f.Records, topicRecord{recordPos: recordPos{"t", 0, 0}, ID: "x", Key: "k"})
	f.publish("r1", 1, "b", 3)
	f.f.Produced = append(f.f.Produced, pubRecord{Replica: "r1", Topic: "t", Partition: 0, ID: "x",
		Buffered: f.at(4), Done: f.at(5), Err: true})
	_, v := f.judge()
	requireFails(t, v, "fence-unattributed")

	// Handed over before it: the record is its.
	f.f.Produced[len(f.f.Produced)-1].Buffered = f.at(2.5)
	_, v = f.judge()
	require.Empty(t, v.all())
}

// TestPickDoubt: of the failed produces that can have written a record,
// the first still in flight after its lower bound, else the last to fail.
func TestPickDoubt(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	c := func(b, d float64) *pubRecord { return &pubRecord{Buffered: at(b), Done: at(d), Err: true} }
	cands := []*pubRecord{c(1, 2), c(3, 4), c(5, 9), c(6, 7), c(20, 21)}
	for _, tc := range []struct {
		after, before time.Time
		want          int
	}{
		{time.Time{}, time.Time{}, 0}, // no bounds: the first to fail
		{at(3.5), time.Time{}, 1},     // in flight after 3.5: 1 to 4; 1 failed first
		{at(5.5), at(10), 3},          // 2 and 3 in flight; 3 failed first; 4 handed over too late
		{at(9.5), at(10), 2},          // none in flight: the last to fail
		{at(0), at(0.5), -1},          // all handed over too late
		{at(22), time.Time{}, 4},      // none in flight: the last to fail
	} {
		require.Equal(t, tc.want, pickDoubt(cands, tc.after, tc.before), "after %v before %v", tc.after.Sub(t0), tc.before.Sub(t0))
	}
}

// chains builds hand-made facts for judgeChains: step events s1 (chains)
// and s2 (does not).
func chains() *chainFacts {
	return &chainFacts{
		ChainTopic: "c",
		Ledger: []ledgerEntry{
			{ID: "s1", Topic: "t", Key: "k", Seq: 1, Place: 1, Kind: kindStep},
			{ID: "s2", Topic: "t", Key: "k", Seq: 2, Place: 2, Kind: kindStep},
			{ID: followID("s1"), Topic: "c", Key: "k", Seq: 1, Place: 1, Kind: kindFollow, Source: "s1"},
		},
		Chains:    func(id string) bool { return id == "s1" },
		Effects:   map[string]int{"s1": 1, "s2": 1, followID("s1"): 1},
		Outbox:    map[string][]outboxFact{followID("s1"): {{Published: true}}},
		Published: map[string]bool{eventRef("c", followID("s1")): true},
	}
}

func judgeChainsOf(f *chainFacts) (int, *verdict) {
	v := &verdict{}
	return judgeChains(f, v), v
}

// TestJudgeChains: one follow-up per handled source that chains,
// published and handled once; none otherwise.
func TestJudgeChains(t *testing.T) {
	t.Parallel()
	n, v := judgeChainsOf(chains())
	require.Empty(t, v.all())
	require.Equal(t, 1, n)

	f := chains()
	f.Ledger, f.Outbox = f.Ledger[:2], map[string][]outboxFact{}
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-missing") // handled, no follow-up

	f = chains()
	f.Outbox[followID("s1")] = append(f.Outbox[followID("s1")], outboxFact{Published: true})
	_, v = judgeChainsOf(f)
	requireFails(t, v, "leaked") // an aborted attempt's follow-up escaped its transaction

	f = chains()
	f.Outbox[followID("s1")][0].Published = false
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-unpublished")

	f = chains()
	delete(f.Published, eventRef("c", followID("s1")))
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-unpublished")

	f = chains()
	f.Effects[followID("s1")] = 2
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-handled")

	f = chains()
	f.Effects["s1"] = 0
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-unexpected") // a follow-up of a source not handled

	f = chains()
	f.Outbox[followID("s2")] = []outboxFact{{Published: true}}
	_, v = judgeChainsOf(f)
	requireFails(t, v, "leaked") // s2 does not chain: an aborted attempt's follow-up, without its ledger entry

	f = chains()
	f.Outbox[followID("s9")] = []outboxFact{{Published: true}}
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-unexpected") // no such source
}

// TestJudgeChainsCountsEscapedFollowUps: a follow-up written outside its
// handling transaction outlives the transaction's abort: its ledger entry
// goes, its outbox document stays. Each such follow-up is counted in
// leaked: beside the one its committed retry recorded, or alone when the
// retry recorded none (the source's final handling did not chain, or it
// was never handled).
func TestJudgeChainsCountsEscapedFollowUps(t *testing.T) {
	t.Parallel()
	f := chains()
	f.Leaked = map[string]bool{}
	f.Outbox[followID("s1")] = append(f.Outbox[followID("s1")], outboxFact{Published: true}) // aborted, then committed
	f.Outbox[followID("s2")] = []outboxFact{{Published: true}}                               // a slow attempt chained, the next did not
	_, v := judgeChainsOf(f)
	requireFails(t, v, "leaked")
	require.Equal(t, map[string]bool{followID("s1"): true, followID("s2"): true}, f.Leaked)
	require.Zero(t, v.count("chain-missing")+v.count("chain-unexpected"), "named as leaks: %v", v.all())

	// A follow-up in the ledger of a step event that does not chain is
	// no leak: it committed.
	f = chains()
	f.Leaked = map[string]bool{}
	f.Ledger = append(f.Ledger, ledgerEntry{ID: followID("s2"), Topic: "c", Key: "k", Seq: 2, Place: 2, Kind: kindFollow, Source: "s2"})
	f.Outbox[followID("s2")] = []outboxFact{{Published: true}}
	_, v = judgeChainsOf(f)
	requireFails(t, v, "chain-unexpected")
	require.Empty(t, f.Leaked)
}

// fakeClock advances only when slept on.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.now = c.now.Add(d)
	return nil
}

// TestWaitSettled: the wait ends when everything is settled, however
// long that takes while work progresses, and fails only after the stated
// time without progress.
func TestWaitSettled(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: time.Now()}
	looks := 0
	ok, _ := waitSettled(context.Background(), clk, time.Second, 10*time.Second, func(context.Context) (settleState, error) {
		looks++
		// Progress every 5 s for 100 s, then settled.
		return settleState{settled: looks > 100, progress: fmt.Sprint(looks / 5)}, nil
	}, func(string, ...any) {}, nil)
	require.True(t, ok)
	require.Equal(t, 102, looks, "settled is confirmed by a second look")

	// A torn look: one look says settled (its reads straddled a commit),
	// the next one sees the work that commit left.
	clk = &fakeClock{now: time.Now()}
	looks = 0
	ok, _ = waitSettled(context.Background(), clk, time.Second, 10*time.Second, func(context.Context) (settleState, error) {
		looks++
		switch {
		case looks == 3:
			return settleState{settled: true, progress: "3"}, nil
		case looks < 6:
			return settleState{progress: fmt.Sprint(looks)}, nil
		}
		return settleState{settled: true, progress: "done"}, nil
	}, func(string, ...any) {}, nil)
	require.True(t, ok)
	require.Equal(t, 7, looks, "the torn look at 3 is not taken for settled")

	clk = &fakeClock{now: time.Now()}
	looks = 0
	ok, last := waitSettled(context.Background(), clk, time.Second, 10*time.Second, func(context.Context) (settleState, error) {
		looks++
		return settleState{progress: fmt.Sprint(min(looks, 20)), summary: "stuck at 20"}, nil
	}, func(string, ...any) {}, nil)
	require.False(t, ok)
	require.Equal(t, "stuck at 20", last.summary)
	require.Equal(t, 30, looks, "10 s without progress after the 20th look")
	require.True(t, strings.Contains(last.summary, "20"))
}

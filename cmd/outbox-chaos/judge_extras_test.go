package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// The checks of the extra scenarios (issues 20 and 31), each failing on a
// hand-made case.

// TestJudgeOrderFailsAHealthyEventParkedByACancelledRelease: issue 20's
// second defect: a release cut short by its caller's context parks the
// held event it was handling, with the context's error, as a new head.
func TestJudgeOrderFailsAHealthyEventParkedByACancelledRelease(t *testing.T) {
	t.Parallel()
	h := newHistory(kindStep, kindStep)
	h.facts.Outage["k"] = true
	_, v := h.to("e1", inboxFailing).to("e1", inboxParked, outageErr).
		to("e2", inboxHeld).
		to("e1", inboxHandled).
		to("e2", inboxParked, "context canceled").judge()
	requireFails(t, v, "parked-unexplained")
}

// TestJudgeOrderFailsAKeylessRecordHandledBehindAHeldKey: issue 20's first
// defect: a record without an idempotency key, held behind its key's
// parked head, handled (under an invented key) while the head waits.
func TestJudgeOrderFailsAKeylessRecordHandledBehindAHeldKey(t *testing.T) {
	t.Parallel()
	res, v := newHistory(kindPoison, kindMalformed).
		to("e1", inboxFailing).to("e1", inboxParked, "chaos: poison event").
		to("e2", inboxHeld).to("e2", inboxHandled).judge()
	requireFails(t, v, "key-order")
	require.True(t, res.HeldRefs["e2"])
}

// TestJudgeOrderExplainsAParkForWantOfAHandler: an event of a type deployed
// late parked with reason no_handler is explained; parked for another
// reason it is not.
func TestJudgeOrderExplainsAParkForWantOfAHandler(t *testing.T) {
	t.Parallel()
	h := newHistory(kindNew, kindStep)
	h.to("e1", inboxParked, "no handler")
	h.facts.Changes[0].Reason = reasonNoHandler
	_, v := h.to("e2", inboxHeld).to("e1", inboxHandled).to("e2", inboxHandled).judge()
	require.Empty(t, v.all())

	_, v = newHistory(kindNew).to("e1", inboxParked, "decode: bad payload").judge()
	requireFails(t, v, "parked-unexplained")
}

// TestJudgeOrderCountsTheKeysHeldAtOnce: MaxHeldKeys is the most keys with
// a parked or held event at the same time.
func TestJudgeOrderCountsTheKeysHeldAtOnce(t *testing.T) {
	t.Parallel()
	seq := func(key string) []seqEvent {
		return []seqEvent{{Ref: key + "1", Kind: kindPoison, Place: 1, Offset: 1}, {Ref: key + "2", Kind: kindStep, Place: 2, Offset: 2}}
	}
	f := &orderFacts{Seqs: map[seqKey][]seqEvent{{"t", "a"}: seq("a"), {"t", "b"}: seq("b"), {"t", "c"}: seq("c")},
		Ref: func(c *inboxChange) string { return c.ID.IdempotencyKey }, Outage: map[string]bool{}}
	states := map[string]inboxState{}
	to := func(ref string, s inboxState) {
		f.Changes = append(f.Changes, inboxChange{ID: outbox.InboxID{Topic: "t", IdempotencyKey: ref}, From: states[ref], To: s})
		states[ref] = s
	}
	to("a1", inboxParked)
	to("a2", inboxHeld)
	to("b1", inboxParked)
	to("a1", inboxDiscarded)
	to("a2", inboxHandled) // a is free again
	to("c1", inboxParked)
	to("c2", inboxHeld)
	res := judgeOrder(f, &verdict{})
	require.Equal(t, 2, res.MaxHeldKeys)
}

// TestJudgeOrderPassesKeysOfAPartitionOvertakingEachOther: with
// KeyConcurrency above 1 the events of different keys of one partition are
// handled out of offset order; each key's own order is what is judged.
func TestJudgeOrderPassesKeysOfAPartitionOvertakingEachOther(t *testing.T) {
	t.Parallel()
	f := &orderFacts{Seqs: map[seqKey][]seqEvent{
		{"t", "a"}: {{Ref: "a1", Kind: kindStep, Place: 1, Offset: 1}, {Ref: "a2", Kind: kindStep, Place: 2, Offset: 3}},
		{"t", "b"}: {{Ref: "b1", Kind: kindStep, Place: 1, Offset: 2}, {Ref: "b2", Kind: kindStep, Place: 2, Offset: 4}},
	}, Ref: func(c *inboxChange) string { return c.ID.IdempotencyKey }, Outage: map[string]bool{}}
	handled := func(refs ...string) []inboxChange {
		var out []inboxChange
		for _, r := range refs {
			out = append(out, inboxChange{ID: outbox.InboxID{Topic: "t", IdempotencyKey: r}, To: inboxHandled})
		}
		return out
	}
	f.Changes = handled("b1", "b2", "a1", "a2") // offsets 2, 4, 1, 3
	v := &verdict{}
	judgeOrder(f, v)
	require.Empty(t, v.all())
	f.Changes = handled("b1", "a2", "a1", "b2") // a2 overtakes a1: a key's own order broken
	judgeOrder(f, v)
	requireFails(t, v, "key-order")
}

// TestJudgeRetryIsolation: a retrying key whose partition's other keys
// wait until it parks fails; one they overtake passes; a disturbed case
// is left undecided.
func TestJudgeRetryIsolation(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	c := isoCase{Retrying: "k", Others: []string{"a", "b"}, At: t0}
	parked := map[string]time.Time{"k": t0.Add(2 * time.Second)}
	quiet := func(time.Time, time.Time) bool { return false }

	v := &verdict{}
	got := judgeRetryIsolation([]isoCase{c}, parked, map[string]time.Time{"a": t0.Add(100 * time.Millisecond), "b": t0.Add(3 * time.Second)}, quiet, v)
	require.Empty(t, v.all())
	require.Equal(t, isoVerdict{Isolated: 1}, got)

	blocked := map[string]time.Time{"a": t0.Add(2100 * time.Millisecond), "b": t0.Add(2200 * time.Millisecond)}
	v = &verdict{}
	judgeRetryIsolation([]isoCase{c}, parked, blocked, quiet, v)
	requireFails(t, v, "retry-blocked")

	v = &verdict{}
	got = judgeRetryIsolation([]isoCase{c}, parked, blocked, func(time.Time, time.Time) bool { return true }, v)
	require.Empty(t, v.all())
	require.Equal(t, isoVerdict{Undecided: 1}, got)
}

// TestJudgeTakeover: an event of a killed replica's open transaction
// settled after the bound fails; one that waited parked or held is left
// out; a bound of 0 measures only.
func TestJudgeTakeover(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	c := takeoverCase{Replica: "r1.1", KilledAt: t0, Events: []string{"x", "y"}}
	bound := takeoverBound(time.Minute)
	require.Equal(t, 45*time.Second, bound)
	require.Zero(t, takeoverBound(3*time.Second))
	v := &verdict{}
	longest := judgeTakeover([]takeoverCase{c}, map[string]time.Time{"x": t0.Add(5 * time.Second), "y": t0.Add(9 * time.Second)}, nil, bound, v)
	require.Empty(t, v.all())
	require.Equal(t, 9*time.Second, longest)
	// The survivor waited for MongoDB's transaction lifetime (60 s).
	slow := map[string]time.Time{"x": t0.Add(58 * time.Second)}
	judgeTakeover([]takeoverCase{c}, slow, nil, bound, v)
	requireFails(t, v, "takeover-slow")
	// Parked before it settled: an operator's wait, not the takeover's.
	v = &verdict{}
	judgeTakeover([]takeoverCase{c}, slow, map[string]time.Time{"x": t0.Add(time.Second)}, bound, v)
	require.Empty(t, v.all())
	require.Equal(t, 58*time.Second, judgeTakeover([]takeoverCase{c}, slow, nil, 0, v))
	require.Empty(t, v.all())
}

// TestJudgeNoHandler: an event of a type without handler settled before
// its handler was deployed fails (acknowledged and dropped, or handled by
// nobody's handler); one parked then handled after the deploy is released.
func TestJudgeNoHandler(t *testing.T) { // not parallel: it sets the run's topic
	topic := "chaos-test"
	topicName.Store(&topic)
	t0 := time.Now()
	ref := func(id string) string { return eventRef(topic, id) }
	waited := map[string]time.Time{ref("n1"): t0.Add(-2 * time.Second), ref("n2"): t0.Add(-time.Second)}
	settled := map[string]time.Time{ref("n1"): t0.Add(time.Second), ref("n2"): t0.Add(2 * time.Second)}
	v := &verdict{}
	require.Equal(t, 2, judgeNoHandler([]string{"n1", "n2"}, t0, waited, settled, v))
	require.Empty(t, v.all())
	settled[ref("n2")] = t0.Add(-500 * time.Millisecond)
	judgeNoHandler([]string{"n1", "n2"}, t0, waited, settled, v)
	requireFails(t, v, "no-handler")
}

// TestJudgeMigration: the unique index missing or not partial, a library
// document lost, a duplicate recording committed: each fails.
func TestJudgeMigration(t *testing.T) {
	t.Parallel()
	good := func() *migrationFacts {
		return &migrationFacts{Index: bson.M{"name": "outbox_idempotency", "unique": true,
			"partialFilterExpression": bson.M{"idempotency_key": bson.M{"$type": "string"}}}, LegacyLeft: legacyDocs, DupRefused: 3}
	}
	v := &verdict{}
	require.EqualValues(t, 3, judgeMigration(good(), v))
	require.Empty(t, v.all())
	for name, spoil := range map[string]func(*migrationFacts){
		"no index":        func(f *migrationFacts) { f.Index = nil },
		"not partial":     func(f *migrationFacts) { delete(f.Index, "partialFilterExpression") },
		"not unique":      func(f *migrationFacts) { delete(f.Index, "unique") },
		"library changed": func(f *migrationFacts) { f.LegacyLeft-- },
		"dup recorded":    func(f *migrationFacts) { f.DupRecorded = 1 },
	} {
		f := good()
		spoil(f)
		v := &verdict{}
		judgeMigration(f, v)
		require.Positive(t, v.count("migrated"), name)
	}
}

// TestEventOutboxRecord: the harness's Python-library records carry their
// identity in the flat body, name the prefixed topic, and choose their
// partition by Kafka key or by the body's integer partition_key; the
// checks read their identity back.
func TestEventOutboxRecord(t *testing.T) { // not parallel: it sets the run's topic and prefix
	topic, prefix := "chaos-x", "staging."
	topicName.Store(&topic)
	topicPrefix.Store(&prefix)
	e := &ledgerEntry{ID: "id-1", Topic: topic, Key: "9005", Seq: 3, Place: 4, Kind: kindStep, External: true}
	r := eventOutboxRecord(e, false, 12, func(string) int32 { return 99 })
	require.Nil(t, r.Key)
	require.EqualValues(t, 9005%12, r.Partition)
	require.Equal(t, "staging.chaos-x", r.Topic)
	var body map[string]any
	require.NoError(t, json.Unmarshal(r.Value, &body))
	require.Equal(t, "staging.chaos-x", body["topic"])
	require.EqualValues(t, 9005, body["partition_key"])
	require.Equal(t, "id-1", idOf(r))
	id, schema := bodyIdentity(r)
	require.Equal(t, "id-1", id)
	require.Equal(t, schemaStep, schema)
	require.True(t, recordMatches(schema, r.Value, e))

	e.Key = "py1"
	r = eventOutboxRecord(e, true, 12, func(string) int32 { return 7 })
	require.Equal(t, "py1", string(r.Key))
	require.EqualValues(t, 7, r.Partition)
	require.Equal(t, "chaos-x", bareTopic(r.Topic))
	topicPrefix.Store(nil)
}

// TestJudgeRecreatedFailsWhatTheNewTopicLost: an event recorded after its
// topic was created again that the consumer never handled (it resumed at
// the old topic's offset, past it), one never published (the producer
// still wrote to the old topic id), one handled twice, one left parked,
// and an outbox document of no committed event each fail; the events
// handled once after the recreation are counted.
func TestJudgeRecreatedFailsWhatTheNewTopicLost(t *testing.T) {
	t.Parallel()
	topicName.Store(new("chaos-t"))
	good := func() *recreateFacts {
		return &recreateFacts{
			Ledger: []recreatedEntry{
				{ID: "a", Key: "r00", Seq: 1, Phase: phaseBefore},
				{ID: "b", Key: "r00", Seq: 2, Phase: phaseGone},
				{ID: "c", Key: "r01", Seq: 1, Phase: phaseAfter},
			},
			Effects: map[string]int{"a": 1, "b": 1, "c": 1},
			Outbox:  map[string]outboxFact{"a": {Published: true}, "b": {Published: true}, "c": {Published: true}},
			Final:   map[string]inboxState{"a": inboxHandled, "b": inboxHandled, "c": inboxHandled},
		}
	}
	v := &verdict{}
	require.Equal(t, recreateVerdict{HandledAfter: 2}, judgeRecreated(good(), v))
	require.Empty(t, v.all())

	for name, c := range map[string]struct {
		spoil func(*recreateFacts)
		kind  string
	}{
		"never handled":   {func(f *recreateFacts) { delete(f.Effects, "c") }, "recreate-lost"},
		"never published": {func(f *recreateFacts) { f.Outbox["b"] = outboxFact{} }, "recreate-lost"},
		"not in outbox":   {func(f *recreateFacts) { delete(f.Outbox, "c") }, "recreate-lost"},
		"handled twice":   {func(f *recreateFacts) { f.Effects["c"] = 2 }, "double-effect"},
		"left parked":     {func(f *recreateFacts) { f.Final["b"] = inboxParked }, "recreate-waiting"},
		"marked failed":   {func(f *recreateFacts) { f.Outbox["a"] = outboxFact{Published: true, Failed: true} }, "recreate-failed"},
		"leaked":          {func(f *recreateFacts) { f.Outbox["x"] = outboxFact{Published: true} }, "recreate-unknown"},
		"unknown effect":  {func(f *recreateFacts) { f.Effects["x"] = 1 }, "recreate-unknown"},
		"stuck":           {func(f *recreateFacts) { f.Stuck = []string{"recreation 0: 1 of 3 handled"} }, "recreate-stuck"},
	} {
		f := good()
		c.spoil(f)
		v := &verdict{}
		judgeRecreated(f, v)
		require.Equal(t, 1, v.count(c.kind), "%s: %v", name, v.all())
	}
}

// TestJudgeWaitsVisibleFailsASlowRunStatusNeverShowed: issue 31 item 2: a
// run that lasted six seconds while every poll of its replica's Status
// past the visibility delay listed no wait on its partition fails; one
// poll showing it passes; no poll at all is undecided; a run cut short is
// not judged.
func TestJudgeWaitsVisibleFailsASlowRunStatusNeverShowed(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	p := topicPartition{"chaos-t", 2}
	tp := func(slowRun) (topicPartition, bool) { return p, true }
	run := slowRun{Key: "k1", Replica: "r0.1", Start: t0, End: t0.Add(slowVisibleFor)}
	polls := func(showAt ...time.Duration) map[string][]statusSample {
		var out []statusSample
		for d := time.Duration(0); d < slowVisibleFor; d += pollEvery {
			s := statusSample{At: t0.Add(d), Running: map[topicPartition]bool{}}
			for _, at := range showAt {
				if at == d {
					s.Running[p] = true
				}
			}
			out = append(out, s)
		}
		return map[string][]statusSample{"r0.1": out}
	}

	v := &verdict{}
	require.Equal(t, visibleVerdict{}, judgeWaitsVisible([]slowRun{run}, polls(), tp, v))
	requireFails(t, v, "wait-invisible")

	v = &verdict{}
	require.Equal(t, visibleVerdict{Seen: 1}, judgeWaitsVisible([]slowRun{run}, polls(4*time.Second), tp, v))
	require.Empty(t, v.all())

	v = &verdict{}
	require.Equal(t, visibleVerdict{Undecided: 1}, judgeWaitsVisible([]slowRun{run}, nil, tp, v))
	require.Empty(t, v.all())

	cut := run
	cut.End = t0.Add(4 * time.Second)
	v = &verdict{}
	require.Equal(t, visibleVerdict{}, judgeWaitsVisible([]slowRun{cut}, polls(), tp, v))
	require.Empty(t, v.all())
}

// TestJudgeIgnored: events of a type the replicas skip pass when skipped
// on arrival (no inbox document) or in a release (handled); one that was
// held behind its key's head, or left parked, fails.
func TestJudgeIgnored(t *testing.T) {
	t.Parallel()
	rec := func(id string, off int64) topicRecord {
		return topicRecord{recordPos: recordPos{"t", 0, off}, ID: id, Key: "k"}
	}
	change := func(id string, from, to inboxState) inboxChange {
		return inboxChange{ID: outbox.InboxID{Topic: "t", ContentSchema: schemaIgnored, IdempotencyKey: id}, From: from, To: to, Key: "k"}
	}
	v := &verdict{}
	n := judgeIgnored(&ignoredFacts{Records: []topicRecord{rec("ignored-1", 1), rec("ignored-2", 2), rec("ignored-2", 3)},
		Final: map[string]inboxState{"ignored-2": inboxHandled}}, v)
	require.Equal(t, 2, n, "a record produced twice is one event")
	require.Empty(t, v.all())

	v = &verdict{}
	judgeIgnored(&ignoredFacts{Records: []topicRecord{rec("ignored-1", 1)}, Final: map[string]inboxState{"ignored-1": inboxHandled},
		Changes: []inboxChange{change("ignored-1", inboxAbsent, inboxHeld), change("ignored-1", inboxHeld, inboxHandled)}}, v)
	requireFails(t, v, "ignored")

	v = &verdict{}
	judgeIgnored(&ignoredFacts{Records: []topicRecord{rec("ignored-1", 1)}, Final: map[string]inboxState{"ignored-1": inboxParked}}, v)
	requireFails(t, v, "ignored")
}

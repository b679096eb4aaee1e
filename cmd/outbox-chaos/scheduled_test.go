package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// schedGood is a history every rule of judgeScheduled passes: an event
// promoted and published after its due time, handled once; one cancelled
// in time, never promoted; one whose cancellation came too late,
// published; one recorded past due.
func schedGood(due time.Time) []scheduledFact {
	return []scheduledFact{
		{ID: "a", Due: due, Committed: due.Add(-time.Second), Promoted: true, PromotedAt: due.Add(300 * time.Millisecond), InOutbox: 1,
			Records: []time.Time{due.Add(400 * time.Millisecond)}, Effects: 1},
		{ID: "b", Due: due, Cancelled: true, Cancel: cancelOutcome{Result: cancelNil, Committed: true, End: due.Add(-time.Second)}},
		{ID: "c", Due: due, Committed: due.Add(-time.Second), TooLate: true, Cancel: cancelOutcome{Result: cancelTooLate, Committed: true, End: due.Add(time.Second)},
			Promoted: true, PromotedAt: due.Add(100 * time.Millisecond), InOutbox: 1,
			Records: []time.Time{due.Add(200 * time.Millisecond), due.Add(5 * time.Second)}, Effects: 1},
		{ID: "d", Due: due.Add(-time.Second), PastDue: true, InOutbox: 1, Records: []time.Time{due}, Effects: 1},
	}
}

func TestJudgeScheduled(t *testing.T) {
	t.Parallel()
	due := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	always := func(_ int32, at time.Time) (time.Time, bool) { return at, true }
	judge := func(events []scheduledFact, avail func(int32, time.Time) (time.Time, bool)) (*verdict, scheduledResult) {
		v := &verdict{}
		r := judgeScheduled(&scheduledFacts{Events: events, AvailableAt: avail, Bound: 2 * time.Second, On: true}, v)
		return v, r
	}

	v, r := judge(schedGood(due), always)
	require.Empty(t, v.all())
	require.Equal(t, scheduledResult{Scheduled: 3, PastDue: 1, Cancelled: 1, TooLate: 1,
		MaxLate: 400 * time.Millisecond, MaxPromoteLate: 300 * time.Millisecond, MaxAfterOwner: 300 * time.Millisecond}, r)

	// Each planted bug, on a copy of the good history, fails its rule and
	// that rule alone.
	for _, tc := range []struct {
		rule  string
		plant func(e []scheduledFact)
	}{
		{"scheduled-lost", func(e []scheduledFact) { e[0].Records, e[0].Effects = nil, 0 }},                     // a promotion dropped
		{"scheduled-lost", func(e []scheduledFact) { e[3].Effects = 0 }},                                        // published, never handled
		{"scheduled-too-late-lost", func(e []scheduledFact) { e[2].Records, e[2].Effects = nil, 0 }},            // too late, yet never published
		{"scheduled-early", func(e []scheduledFact) { e[0].Records = []time.Time{due.Add(-time.Millisecond)} }}, // published early
		{"scheduled-early", func(e []scheduledFact) { e[2].PromotedAt = due.Add(-time.Second) }},                // promoted early
		{"scheduled-late", func(e []scheduledFact) { e[0].PromotedAt = due.Add(2*time.Second + time.Millisecond) }},
		{"scheduled-cancelled-published", func(e []scheduledFact) { e[1].Records, e[1].Effects = []time.Time{due}, 1 }},
		{"scheduled-cancelled-published", func(e []scheduledFact) { e[1].Promoted, e[1].PromotedAt, e[1].InOutbox = true, due, 1 }},
		{"scheduled-too-late-early", func(e []scheduledFact) { e[2].Cancel.End = due.Add(-time.Millisecond) }},
		{"scheduled-cancel-unrecorded", func(e []scheduledFact) { e[1].Cancelled = false; e[1].Promoted, e[1].PromotedAt = false, time.Time{} }},
		{"scheduled-promoted-twice", func(e []scheduledFact) { e[0].InOutbox = 2 }},
		{"scheduled-unexercised", func(e []scheduledFact) { e[1].Cancelled = false; e[1].Cancel = cancelOutcome{} }},
	} {
		events := schedGood(due)
		tc.plant(events)
		v, _ := judge(events, always)
		require.Equal(t, 1, v.count(tc.rule), "rule %s: %v", tc.rule, v.all())
		if tc.rule == "scheduled-unexercised" || tc.rule == "scheduled-cancel-unrecorded" {
			continue // the event is then also lost: judged by scheduled-lost too
		}
		require.Len(t, v.all(), 1, "rule %s alone: %v", tc.rule, v.all())
	}

	// A promotion late after the due time is no violation when no live
	// publisher owned the partition until shortly before it: the bound
	// runs from the takeover.
	events := schedGood(due)
	events[0].PromotedAt = due.Add(10 * time.Second)
	v, r = judge(events, func(_ int32, at time.Time) (time.Time, bool) { return at.Add(9 * time.Second), true })
	require.Empty(t, v.all())
	require.Equal(t, 10*time.Second, r.MaxPromoteLate)
	v, _ = judge(events, always)
	require.Equal(t, 1, v.count("scheduled-late"))

	// A recording transaction that returned after the due time moves the
	// bound's start to its return; one whose return is unknown leaves the
	// promotion unjudged.
	events = schedGood(due)
	events[0].Committed, events[0].PromotedAt = due.Add(5*time.Second), due.Add(6*time.Second)
	v, _ = judge(events, always)
	require.Empty(t, v.all())
	events[0].Committed = time.Time{}
	events[0].PromotedAt = due.Add(time.Minute)
	v, _ = judge(events, always)
	require.Empty(t, v.all())

	// Without -scheduled, no scheduled events is no violation.
	v = &verdict{}
	judgeScheduled(&scheduledFacts{AvailableAt: always}, v)
	require.Empty(t, v.all())
}

func TestAvailableAt(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	owned := []ownership{
		{Replica: "r1", Topic: "t", Partition: 0, From: at(0), To: at(10), Ended: "revoked"},
		{Replica: "r2", Topic: "t", Partition: 0, From: at(12)},     // killed at 20
		{Replica: "r4", Topic: "t", Partition: 0, From: at(22)},     // killed at 23
		{Replica: "r3", Topic: "t", Partition: 0, From: at(26)},     // still owns
		{Replica: "r1", Topic: "t", Partition: 1, From: at(0)},      // another partition
		{Replica: "r1", Topic: "other", Partition: 0, From: at(10)}, // another topic
	}
	gone := map[string]time.Time{"r2": at(20), "r4": at(23)}
	for _, tc := range []struct {
		due, want float64
	}{
		{5, 5},   // owned then, for the span
		{9, 12},  // revoked at 10, a second later: taken over at 12
		{10, 12}, // revoked at 10, taken over at 12
		{11, 12},
		{15, 15},
		{18.5, 26}, // r2 killed at 20, r4 at 23: r3 took over at 26 for good
		{20, 26},
		{30, 30},
	} {
		got, ok := availableAt(owned, gone, "t", 0, at(tc.due), 2*time.Second)
		require.True(t, ok)
		require.Equal(t, at(tc.want), got, "due %vs", tc.due)
	}
	_, ok := availableAt(owned[:2], gone, "t", 0, at(21), 2*time.Second)
	require.False(t, ok, "no owner after the kill")
	require.Equal(t, time.Second+3*time.Second+2*time.Second, scheduledBound(3*time.Second, time.Second))
	require.Equal(t, time.Second+3*time.Second+6*time.Second, scheduledBound(3*time.Second, 6*time.Second))
}

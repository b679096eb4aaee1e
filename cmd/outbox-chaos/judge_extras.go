package main

import (
	"context"
	"slices"
	"time"
)

// The judgements of the extra scenarios (extras.go), pure functions of
// their facts and of the inbox history's times, each proven on a
// hand-made case it must fail (judge_extras_test.go).

// isoVerdict counts retry-isolation cases.
type isoVerdict struct {
	Isolated, Undecided int
}

// judgeRetryIsolation fails (retry-blocked) on a case where no other key's
// event recorded right behind the retrying one was handled before the
// retrying event settled or was parked: the retrying key blocked its
// partition. A case whose window [At-1s, end] saw a kill, a stop or a
// rebalance (disturbed) is undecided: a new owner may deliver the others
// after the retrying event, whose attempts count across owners, ran out.
func judgeRetryIsolation(cases []isoCase, parkedAt, settledAt map[string]time.Time, disturbed func(from, to time.Time) bool, v *verdict) isoVerdict {
	var out isoVerdict
	for _, c := range cases {
		end := firstOf(parkedAt[c.Retrying], settledAt[c.Retrying])
		if end.IsZero() {
			continue // never settled: the lost and parked checks report it
		}
		first := time.Time{}
		for _, o := range c.Others {
			first = firstOf(first, settledAt[o])
		}
		switch {
		case !first.IsZero() && first.Before(end):
			out.Isolated++
		case disturbed(c.At.Add(-time.Second), end):
			out.Undecided++
		default:
			v.fail("retry-blocked", "event %s retried until %s, and the events of other keys of its partition behind it (%v) waited: first handled %s",
				c.Retrying, end.Format(tsFormat), c.Others, formatTime(first))
		}
	}
	return out
}

// firstOf is the earlier of two times, zero meaning none.
func firstOf(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(tsFormat)
}

// judgeTakeover fails (takeover-slow) on an event a killed replica was
// handling in an open transaction that was not settled within bound of
// the kill, and returns the longest time to settle. Events parked or held
// at some point before they settled are left out: they waited for an
// operator (a release the kill cut short leaves its head parked), not for
// the takeover. A bound of 0 judges nothing: the time is a figure only.
// With MongoDB's default transaction lifetime (60 s, -txn-lifetime 60s)
// and a bound below it, a takeover that waits for the dead replica's
// transactions to expire fails.
func judgeTakeover(cases []takeoverCase, settledAt, waitedAt map[string]time.Time, bound time.Duration, v *verdict) time.Duration {
	var longest time.Duration
	for _, c := range cases {
		for _, ref := range c.Events {
			at, ok := settledAt[ref]
			if !ok {
				continue // never settled: the lost check reports it
			}
			if w, ok := waitedAt[ref]; ok && w.Before(at) {
				continue
			}
			d := at.Sub(c.KilledAt)
			longest = max(longest, d)
			if bound > 0 && d > bound {
				v.fail("takeover-slow", "event %s, in an open transaction of %s when it was killed at %s, settled %s later (bound %s)",
					ref, c.Replica, c.KilledAt.Format(tsFormat), d.Round(time.Millisecond), bound)
			}
		}
	}
	return longest
}

// takeoverBound is the bound of judgeTakeover for a transaction lifetime:
// three quarters of it from 30 s up (a takeover that waits for the dead
// replica's transactions to expire takes about the whole lifetime), none
// below (the lifetime ends before a takeover could be told from it, and a
// loaded machine's rebalances take seconds).
func takeoverBound(lifetime time.Duration) time.Duration {
	if lifetime < 30*time.Second {
		return 0
	}
	return lifetime * 3 / 4
}

// judgeNoHandler fails (no-handler) on an event of the late-deployed type
// that was settled (handled, or acknowledged and dropped: purged) before
// its handler was deployed, and returns how many were parked or held
// before the deploy and handled after it. (One acknowledged without a
// handler and never redelivered has no effect: the lost check reports
// it.)
func judgeNoHandler(ids []string, deployedAt time.Time, waitedAt, settledAt map[string]time.Time, v *verdict) int {
	released := 0
	for _, id := range ids {
		ref := eventRef(chaosTopic(), id)
		w, s := waitedAt[ref], settledAt[ref]
		switch {
		case !s.IsZero() && s.Before(deployedAt):
			v.fail("no-handler", "event %s settled at %s, before its handler was deployed (%s)", ref, s.Format(tsFormat), deployedAt.Format(tsFormat))
		case !w.IsZero() && w.Before(deployedAt) && !s.IsZero():
			released++
		}
	}
	return released
}

// checkExtras judges the extra scenarios and fills their figures.
func (h *harness) checkExtras(ctx context.Context, res *result, or orderResult, byID map[string]*ledgerEntry, effectCount map[string]int, v *verdict) error {
	h.mu.Lock()
	res.EventOutboxNoID = h.eventOutboxNoID
	xf := h.xf
	xf.isoCases = slices.Clone(xf.isoCases)
	xf.takeovers = slices.Clone(xf.takeovers)
	xf.keylessHeld = slices.Clone(xf.keylessHeld)
	h.mu.Unlock()
	h.op.mu.Lock()
	res.RedrivesCancelled = h.op.cancelled
	h.op.mu.Unlock()

	for id, e := range byID {
		if !e.External || effectCount[id] == 0 {
			continue
		}
		if slices.Contains(eventOutboxKeyed, e.Key) {
			res.EventOutboxKeyed++
		} else {
			res.EventOutboxKeyless++
		}
	}
	for _, p := range xf.keylessHeld {
		ref := malformedRef(p)
		if or.HeldRefs[ref] {
			res.KeylessHeld++
			continue
		}
		h.logf("keyless-behind-held: record %s was not held (parked %s, settled %s)", ref,
			formatTime(or.ParkedAt[ref]), formatTime(or.SettledAt[ref]))
	}
	res.MassHolds = xf.massRuns
	if len(xf.newEvents) > 0 {
		res.NoHandlerReleased = judgeNoHandler(xf.newEvents, xf.deployedAt, or.WaitedAt, or.SettledAt, v)
	}
	iso := judgeRetryIsolation(xf.isoCases, or.ParkedAt, or.SettledAt, h.disturbed, v)
	res.RetryIsolated = iso.Isolated
	bound := takeoverBound(h.cfg.txnLifetime)
	if len(xf.takeovers) > 0 && bound == 0 {
		h.logf("kill-open-txns: with a transaction lifetime of %s takeover is measured, not judged: run with -txn-lifetime 60s to judge it",
			h.cfg.txnLifetime)
	}
	h.work.slowMu.Lock()
	slow := slices.Clone(h.work.slowLog)
	h.work.slowMu.Unlock()
	h.polls.mu.Lock()
	vv := judgeWaitsVisible(slow, h.polls.samples, h.rec.partitionOf, v)
	slowest := h.polls.slowest
	h.polls.mu.Unlock()
	res.WaitsSeen = vv.Seen
	h.logf("waits visible: %d slow runs seen in Status, %d without a poll of their replica while they ran, %d of an unknown partition; slowest Status call %s",
		vv.Seen, vv.Undecided, vv.Unknown, slowest.Round(time.Millisecond))
	res.Takeover = judgeTakeover(xf.takeovers, or.SettledAt, or.WaitedAt, bound, v)
	for _, c := range xf.takeovers {
		// Each case, for a long takeover to explain: when in the run, and
		// how long its events took (parked or held ones waited for an
		// operator; none settled means the lost check reports them).
		var last time.Duration
		settled, waited := 0, 0
		for _, ref := range c.Events {
			if w, ok := or.WaitedAt[ref]; ok && w.Before(or.SettledAt[ref]) {
				waited++
				continue
			}
			if at, ok := or.SettledAt[ref]; ok {
				settled++
				last = max(last, at.Sub(c.KilledAt))
			}
		}
		h.logf("kill-open-txns: %s killed %.1fs into the run with %d transactions open: %d settled, the last %s after the kill; %d parked or held first",
			c.Replica, c.KilledAt.Sub(h.began).Seconds(), len(c.Events), settled, last.Round(100*time.Millisecond), waited)
	}
	res.Takeovers = len(xf.takeovers)
	if h.cfg.migrated {
		f, err := h.migrationFacts(ctx)
		if err != nil {
			return err
		}
		res.DuplicatesRefused = int(judgeMigration(f, v))
	}
	return nil
}

// disturbed reports whether a kill, a stop or a rebalance happened
// between from and to.
func (h *harness) disturbed(from, to time.Time) bool {
	in := func(t time.Time) bool { return !t.Before(from) && !t.After(to) }
	h.klog.mu.Lock()
	for _, i := range h.klog.interruptions {
		if in(i.At) {
			h.klog.mu.Unlock()
			return true
		}
	}
	h.klog.mu.Unlock()
	h.genMu.Lock()
	defer h.genMu.Unlock()
	return slices.ContainsFunc(h.syncs, in)
}

// ignoredFacts are what judgeIgnored judges (-skip-unknown): the records
// of schemaIgnored in the topic, which are in no ledger, the inbox
// documents of that type at the end, and the inbox history.
type ignoredFacts struct {
	Records []topicRecord
	// Final is the state at the end of each inbox document of the type,
	// by idempotency key (none when every one was skipped on arrival).
	Final   map[string]inboxState
	Changes []inboxChange
}

// judgeIgnored fails (ignored) on an event of a type the replicas skip
// (Config.SkipUnknownEvents) that was parked or held at some point, or
// that ended neither skipped on arrival (no inbox document) nor skipped in
// a release (handled): such an event must be skipped wherever it meets its
// key, never held behind an earlier event nor holding the key's later
// ones. That each was consumed at all is the stalled check's: the group's
// offsets must reach the end of the topic. It returns how many there were.
func judgeIgnored(f *ignoredFacts, v *verdict) int {
	waited := map[string]inboxState{}
	for i := range f.Changes {
		c := &f.Changes[i]
		if c.ID.ContentSchema != schemaIgnored || !c.To.waiting() {
			continue
		}
		if _, ok := waited[c.ID.IdempotencyKey]; !ok {
			waited[c.ID.IdempotencyKey] = c.To
			v.fail("ignored", "%s (key %s, offset %d), of a type the replicas skip, was %s (reason %q): it must be skipped, never wait nor hold its key",
				c.ID.IdempotencyKey, c.Key, c.Offset, c.To, c.Reason)
		}
	}
	seen := map[string]bool{}
	for _, r := range f.Records {
		if seen[r.ID] {
			continue // produced again (a retried produce): one event
		}
		seen[r.ID] = true
		switch st := f.Final[r.ID]; st {
		case inboxAbsent, inboxHandled:
		default:
			v.fail("ignored", "%s (record %s), of a type the replicas skip, ended %s, not skipped", r.ID, malformedRef(r.recordPos), st)
		}
	}
	return len(seen)
}

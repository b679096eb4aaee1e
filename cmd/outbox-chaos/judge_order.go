package main

import (
	"fmt"
	"strings"
	"time"
)

// Per-key order over every kind of event, holds behind parked events, and
// the reasons of parked events, judged from the inbox history (history.go):
// the state changes of every inbox document in commit order.

// kindMalformed marks a malformed record in a key's sequence.
const kindMalformed = "malformed"

// seqKey names one key's sequence: its events on one topic.
type seqKey struct{ Topic, Key string }

// seqEvent is one event of a key's sequence.
type seqEvent struct {
	Ref    string // identity (eventRef, malformedRef)
	Kind   string // kindStep, kindPoison, kindFollow, kindMalformed
	Place  int64  // its place in the ledger (0 for a malformed record)
	Offset int64  // its first offset in the topic
}

func (e *seqEvent) String() string {
	if e.Kind == kindMalformed {
		return fmt.Sprintf("malformed record %s", e.Ref)
	}
	return fmt.Sprintf("%s %s (place %d)", e.Kind, e.Ref, e.Place)
}

// eventRef identifies a committed event: its topic and id.
func eventRef(topic, id string) string { return topic + "/" + id }

// malformedRef identifies a malformed record: its position.
func malformedRef(p recordPos) string {
	return fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.Offset)
}

// orderFacts are what judgeOrder judges.
type orderFacts struct {
	// Seqs are the keys' sequences: each key's events in the order they
	// must be handled (their first offsets in the topic).
	Seqs map[seqKey][]seqEvent
	// Changes is the inbox history.
	Changes []inboxChange
	// Ref identifies the event of a change's document ("" when it is no
	// event of the run: other checks judge those).
	Ref func(c *inboxChange) string
	// Outage lists the keys whose downstream had an outage.
	Outage map[string]bool
}

// orderResult counts what judgeOrder saw.
type orderResult struct {
	// Held and Parked count the distinct events held, and parked on their
	// own (heads), at some point.
	Held, Parked int
	// Violations counts the events handled while an earlier event of their
	// key was unsettled.
	Violations int
	// MaxHeldKeys is the most keys that had an event parked or held at
	// the same time.
	MaxHeldKeys int
	// HeldRefs are the events held at some point; SettledAt when each
	// event was first handled or purged, ParkedAt when each was first
	// parked on its own, WaitedAt when each was first parked or held (as
	// the history saw it).
	HeldRefs                      map[string]bool
	SettledAt, ParkedAt, WaitedAt map[string]time.Time
}

// judgeOrder replays the inbox history key by key and fails on:
//
//   - key-order: an event handled while an earlier event of its key was
//     not settled (not handled, not purged: absent, being retried, parked
//     or held). A purged event is settled: the key's later events may go
//     on after it.
//   - held-missing: an event run (attempted, or parked on its own) while
//     an earlier event of its key was parked or held: it should have been
//     held.
//   - held-unexpected: an event held although no earlier event of its key
//     was parked or held, unless it joined a release in progress (the
//     key's last settled event had been parked or held: its release was
//     still closing).
//   - promoted-early: a held event that became its key's head while an
//     earlier event of the key still waited.
//   - parked-unexplained: an event parked on its own that no scenario
//     explains: poison and malformed events are; a step event is when its
//     key had a downstream outage and its last error is the outage's; an
//     event of a type deployed late (no-handler-deploy) is when its park
//     reason is no_handler; an event that had been held is when the event
//     before it was purged, or when its own last error is the outage's. A
//     release cut short (a cancelled re-drive) that parks a healthy event
//     with its context's error fails here.
//   - parked-after-settled: a handled or purged event parked again.
//
// The expected held set is thus computed from the sequences and the parked
// heads as the history goes: an event must be held exactly when it arrives
// while an earlier event of its key is parked or held.
func judgeOrder(f *orderFacts, v *verdict) orderResult {
	type loc struct {
		key seqKey
		idx int
	}
	where := map[string]loc{}
	for k, seq := range f.Seqs {
		for i := range seq {
			where[seq[i].Ref] = loc{k, i}
		}
	}
	state := map[string]inboxState{}
	firstUnsettled := map[seqKey]int{} // every event before it is settled
	type settle struct {
		ref      string
		from, to inboxState
	}
	lastSettle := map[seqKey]settle{}
	held, parked := map[string]bool{}, map[string]bool{}
	res := orderResult{SettledAt: map[string]time.Time{}, ParkedAt: map[string]time.Time{}, WaitedAt: map[string]time.Time{}}
	waiting := map[seqKey]int{} // events parked or held, by key
	waitingKeys := 0
	downstream := errDownstream.Error()
	for i := range f.Changes {
		c := &f.Changes[i]
		ref := f.Ref(c)
		if ref == "" {
			continue
		}
		at, ok := where[ref]
		if !ok {
			continue // not in the topic: the lost check reports it
		}
		seq := f.Seqs[at.key]
		ev := &seq[at.idx]
		state[ref] = c.To
		if was, is := c.From.waiting(), c.To.waiting(); was != is {
			n := waiting[at.key]
			if is {
				waiting[at.key]++
			} else {
				waiting[at.key]--
			}
			switch {
			case n == 0 && is:
				waitingKeys++
				res.MaxHeldKeys = max(res.MaxHeldKeys, waitingKeys)
			case n == 1 && !is:
				waitingKeys--
			}
		}
		if _, ok := res.SettledAt[ref]; !ok && c.To.settled() {
			res.SettledAt[ref] = c.At
		}
		if _, ok := res.ParkedAt[ref]; !ok && c.To == inboxParked {
			res.ParkedAt[ref] = c.At
		}
		if _, ok := res.WaitedAt[ref]; !ok && c.To.waiting() {
			res.WaitedAt[ref] = c.At
		}
		// The first unsettled event before this one, and whether one
		// before it waits (parked or held).
		first := firstUnsettled[at.key]
		for first < len(seq) && state[seq[first].Ref].settled() {
			first++
		}
		firstUnsettled[at.key] = first
		var blocker, waiter *seqEvent
		for j := first; j < at.idx; j++ {
			s := state[seq[j].Ref]
			if s.settled() {
				continue
			}
			if blocker == nil {
				blocker = &seq[j]
			}
			if s.waiting() {
				waiter = &seq[j]
				break
			}
		}
		blockerState := func(e *seqEvent) inboxState { return state[e.Ref] }
		switch c.To {
		case inboxHandled:
			if blocker != nil {
				res.Violations++
				v.fail("key-order", "key %s on %s: %s handled while the earlier %s was %s",
					at.key.Key, at.key.Topic, ev, blocker, blockerState(blocker))
			}
		case inboxFailing:
			if c.From == inboxAbsent && waiter != nil {
				v.fail("held-missing", "key %s on %s: %s was run while the earlier %s was %s: it should have been held",
					at.key.Key, at.key.Topic, ev, waiter, blockerState(waiter))
			}
		case inboxHeld:
			held[ref] = true
			if waiter == nil {
				ls := lastSettle[at.key]
				if ls.ref == "" || !ls.from.waiting() {
					v.fail("held-unexpected", "key %s on %s: %s held although no earlier event of its key was parked or held",
						at.key.Key, at.key.Topic, ev)
				}
			}
		case inboxParked:
			parked[ref] = true
			explained := ev.Kind == kindPoison || ev.Kind == kindMalformed ||
				f.Outage[at.key.Key] && strings.Contains(c.LastError, downstream) ||
				ev.Kind == kindNew && c.Reason == reasonNoHandler
			switch {
			case c.From == inboxHeld:
				if waiter != nil {
					v.fail("promoted-early", "key %s on %s: %s became the head of its key while the earlier %s was %s",
						at.key.Key, at.key.Topic, ev, waiter, blockerState(waiter))
				}
				if ls := lastSettle[at.key]; ls.to == inboxDiscarded {
					explained = true // the event it waited for was purged
				}
			case c.From.settled():
				v.fail("parked-after-settled", "key %s on %s: %s parked after it was %s", at.key.Key, at.key.Topic, ev, c.From)
			case waiter != nil:
				v.fail("held-missing", "key %s on %s: %s parked on its own while the earlier %s was %s: it should have been held",
					at.key.Key, at.key.Topic, ev, waiter, blockerState(waiter))
			}
			if !explained {
				v.fail("parked-unexplained", "key %s on %s: %s parked (last error %q) and no scenario explains it",
					at.key.Key, at.key.Topic, ev, c.LastError)
			}
		}
		if c.To.settled() {
			lastSettle[at.key] = settle{ref: ref, from: c.From, to: c.To}
		}
	}
	res.Held, res.Parked = len(held), len(parked)
	res.HeldRefs = held
	return res
}

// reasonNoHandler is the park reason of an event no handler accepts.
const reasonNoHandler = "no_handler"

// redriveFact is one re-drive the operator made.
type redriveFact struct {
	Ref string
	How string // "request" (Admin.RequestRedrive) or "call" (Client.Redrive)
	// After is the event's state read right after Client.Redrive returned
	// nil (calls only).
	After inboxState
}

// judgeRedrives fails (redrive) on a re-drive that did not end in
// handled: a Client.Redrive that returned nil must leave its event handled
// at once, and every re-driven event must end handled (a re-drive that
// fails parks it again, and the operator re-drives it until it succeeds).
// Handled is judged by the inbox and by the handler's effect: effects
// tells, for a re-driven event whose handler leaves one, how many it left
// (ok false for the others: malformed records, poison events), and a
// handled event must have exactly one (an inbox entry flipped to handled
// without its handler running, or with it running twice, is no re-drive).
func judgeRedrives(redrives []redriveFact, final map[string]inboxState, effects func(ref string) (n int, ok bool), v *verdict) {
	judged := map[string]bool{}
	for _, r := range redrives {
		if r.How == "call" && r.After != inboxHandled {
			v.fail("redrive", "Client.Redrive of %s returned nil, and the event was %s right after", r.Ref, r.After)
		}
		s := final[r.Ref]
		if s != inboxHandled {
			v.fail("redrive", "re-drive (%s) of %s ended %s, not handled", r.How, r.Ref, s)
			continue
		}
		if judged[r.Ref] {
			continue // one line per event, however often it was re-driven
		}
		judged[r.Ref] = true
		if n, ok := effects(r.Ref); ok && n != 1 {
			v.fail("redrive", "re-drive (%s) of %s ended handled with %d effects of its handler, want 1", r.How, r.Ref, n)
		}
	}
}

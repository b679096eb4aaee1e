package main

import "strings"

// Chained events: the follow-ups step handlers record in their own
// transaction (workload.go).

// outboxFact is one outbox document as the chain check reads it.
type outboxFact struct {
	Published, Failed bool
}

// chainFacts are what judgeChains judges.
type chainFacts struct {
	ChainTopic string
	Ledger     []ledgerEntry
	// Chains tells the step events whose handling recorded a follow-up
	// (its effect says so).
	Chains func(id string) bool
	// Effects counts the effects of each event id.
	Effects map[string]int
	// Outbox lists the outbox documents of the chain topic by idempotency
	// key.
	Outbox map[string][]outboxFact
	// Published holds the eventRefs found in the topics.
	Published map[string]bool
	// Leaked receives the ids of the follow-ups that escaped an aborted
	// handling transaction (nil: not collected).
	Leaked map[string]bool
}

// leak notes an escaped follow-up.
func (f *chainFacts) leak(id string) {
	if f.Leaked != nil {
		f.Leaked[id] = true
	}
}

// judgeChains fails on:
//
//   - chain-missing: a handled step event that chains without exactly one
//     follow-up in the ledger and the outbox;
//   - leaked: a follow-up in the outbox more often than in the ledger (one
//     committed with its handling, the others written by attempts whose
//     transaction aborted: its ledger entry went with the transaction, the
//     outbox document did not), or in the outbox of a step event that was
//     not handled or does not chain, without a ledger entry;
//   - chain-unpublished: a follow-up not marked published, or not in the
//     chain topic;
//   - chain-handled: a follow-up not handled exactly once;
//   - chain-unexpected: a follow-up of a step event that does not chain,
//     or that was not handled (an attempt that did not commit recorded
//     it), or of no step event at all.
//
// Follow-ups keep their key's order: judgeOrder judges the chain topic's
// sequences like the others, the follow-up handler records out-of-order
// handlings, and the publish order check covers the chain topic.
//
// It returns the number of follow-ups handled exactly once.
func judgeChains(f *chainFacts, v *verdict) (chained int) {
	steps := map[string]bool{}
	follows := map[string][]ledgerEntry{} // by source
	for _, e := range f.Ledger {
		switch e.Kind {
		case kindStep:
			steps[e.ID] = true
		case kindFollow:
			follows[e.Source] = append(follows[e.Source], e)
		}
	}
	expected := map[string]bool{} // follow-up ids that may exist
	for _, e := range f.Ledger {
		if e.Kind != kindStep {
			continue
		}
		fid := followID(e.ID)
		lf, ob := follows[e.ID], f.Outbox[fid]
		handled := f.Effects[e.ID] > 0
		switch {
		case !handled || !f.Chains(e.ID):
			what := "was not handled"
			if handled {
				what = "did not chain"
			}
			switch {
			case len(lf) == 0 && len(ob) > 0:
				f.leak(fid)
				v.fail("leaked", "leaked: follow-up %s of %s, which %s, is in the outbox %d times and not in the ledger: written outside an aborted handling transaction",
					fid, e.ID, what, len(ob))
			case len(lf) > 0 || len(ob) > 0:
				v.fail("chain-unexpected", "step event %s %s, yet has %d follow-ups in the ledger and %d in the outbox", e.ID, what, len(lf), len(ob))
			}
		default:
			expected[fid] = true
			switch {
			case len(lf) == 1 && len(ob) > 1:
				f.leak(fid)
				v.fail("leaked", "leaked: follow-up %s of %s is in the outbox %d times, in the ledger once: the others were written outside aborted handling transactions",
					fid, e.ID, len(ob))
			case len(lf) != 1 || len(ob) != 1:
				v.fail("chain-missing", "step event %s handled: %d follow-ups in the ledger and %d in the outbox, want 1", e.ID, len(lf), len(ob))
			case !ob[0].Published:
				v.fail("chain-unpublished", "follow-up %s of %s not marked published (failed %v)", fid, e.ID, ob[0].Failed)
			case !f.Published[eventRef(f.ChainTopic, fid)]:
				v.fail("chain-unpublished", "follow-up %s of %s is not in the chain topic", fid, e.ID)
			case f.Effects[fid] != 1:
				v.fail("chain-handled", "follow-up %s of %s handled %d times, want once", fid, e.ID, f.Effects[fid])
			default:
				chained++
			}
		}
	}
	for src, lf := range follows {
		if !steps[src] {
			v.fail("chain-unexpected", "follow-up %s follows %s, which is no step event of the ledger", lf[0].ID, src)
		}
	}
	for fid := range f.Outbox {
		// Those of a step event were judged with it above.
		if src, ok := strings.CutSuffix(fid, followID("")); !expected[fid] && (!ok || !steps[src]) {
			v.fail("chain-unexpected", "follow-up %s is in the outbox without a step event it follows", fid)
		}
	}
	return chained
}

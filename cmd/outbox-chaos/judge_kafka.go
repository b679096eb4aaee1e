package main

import (
	"cmp"
	"slices"
	"time"
)

// Fencing and duplicate publications, judged from the records of the
// topics and what the replicas' clients logged (kafkalog.go); and the count
// of redeliveries.

// dupWindow is how close to an earlier publication of the same event a
// kill or a revoke of its producer must come to explain a duplicate: an
// acknowledged record is marked published within the publisher's mark
// delay (100 ms) plus a MongoDB write, so a replica that dies or loses the
// partition in that window leaves it to be published again. The window
// counts from the end of the publication's round (a batch is marked once
// all of it is acknowledged), and on a loaded machine, where marking takes
// longer, it is the time marking then took (published_at minus
// acknowledgement of the events published once), when longer.
const dupWindow = time.Second

// markLagSpan is how close in time the publications are whose marking
// measures the mark lag.
const markLagSpan = 5 * time.Second

// topicRecord is one record read from the topics.
type topicRecord struct {
	recordPos
	ID        string // its idempotency key header
	Key       string // its Kafka key
	Malformed bool   // written by the harness as a malformed record
	// At is the record's timestamp: its producer's clock (CreateTime).
	At time.Time
}

// fencingFacts are what judgeFencing judges.
type fencingFacts struct {
	Records       []topicRecord
	Produced      []pubRecord
	Owned         []ownership
	Interruptions []interruption
	// Gone is when each killed or ended replica could produce no more.
	Gone       map[string]time.Time
	Rogue      map[recordPos]bool
	RogueDoubt map[doubtKey]int
	// MarkedAt is when each event was marked published (the outbox's
	// published_at, by eventRef): for an event published once, how long
	// marking took.
	MarkedAt map[string]time.Time
}

// publication is a record of the topics and the produce that wrote it.
type publication struct {
	rec topicRecord
	by  *pubRecord
}

// fencingResult is what judgeFencing counts.
type fencingResult struct {
	// Duplicates counts the publications of events published before,
	// Violations the records produced by no replica, outside their
	// producer's ownership of the partition or while another replica
	// owned it (each record once), Unexplained the duplicates no kill,
	// stop, revoke or failed produce explains.
	Duplicates, Violations, Unexplained int
}

// judgeFencing attributes every record of the topics (but the harness's
// malformed and rogue ones) to the replica whose producer wrote it, and
// fails on:
//
//   - fence-unattributed: a record no replica's producer wrote (neither
//     acknowledged to one, nor failed on one and so in doubt); of several
//     failed produces of its event to its partition, it goes to one its
//     place among the acknowledged records allows (pickDoubt): a
//     replica killed long before cannot have written a record appended
//     after records handed over since;
//   - fence-outside: a record a replica handed to its producer outside
//     every interval in which it owned the partition;
//   - fence-overlap: a record a replica produced while another replica
//     owned the partition (killed and ended replicas own nothing after
//     they are gone);
//   - duplicate-unexplained: a publication of an event published before,
//     when the producer of no earlier publication was killed, stopped, or
//     lost or gave up the partition, or had a produce fail on that
//     partition (the publisher then produces the failed record and every
//     record after it again, some of which may have landed), between it
//     and dupWindow after the end of its round (or the time marking then
//     took, when longer), or later but before the publication again while
//     nothing of its round had been marked yet (the publisher was cut
//     before it could mark the round).
//
// It counts the duplicate publications (every publication of an event
// after its first), the records produced against the fence and the
// duplicate publications unexplained.
func judgeFencing(f *fencingFacts, v *verdict) (res fencingResult) {
	acked := map[recordPos]*pubRecord{}
	failed := map[doubtKey][]*pubRecord{}
	type failKey struct {
		replica, topic string
		partition      int32
	}
	failures := map[failKey][]time.Time{} // when a replica's produce failed on a partition
	for i := range f.Produced {
		p := &f.Produced[i]
		if p.Err {
			k := doubtKey{p.Topic, p.Partition, p.ID}
			failed[k] = append(failed[k], p)
			fk := failKey{p.Replica, p.Topic, p.Partition}
			failures[fk] = append(failures[fk], p.Done)
		} else {
			acked[recordPos{p.Topic, p.Partition, p.Offset}] = p
		}
	}
	type ownKey struct {
		topic     string
		partition int32
	}
	owners := map[ownKey][]ownership{}
	for _, o := range f.Owned {
		k := ownKey{o.Topic, o.Partition}
		owners[k] = append(owners[k], o)
	}
	rogueDoubt := map[doubtKey]int{}
	for k, n := range f.RogueDoubt {
		rogueDoubt[k] = n
	}
	records := slices.Clone(f.Records)
	slices.SortFunc(records, func(a, b topicRecord) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	after, before := appendBounds(records, acked)
	pubs := map[string][]publication{}
	var order []string
	for i, r := range records {
		if r.Malformed || f.Rogue[r.recordPos] {
			continue
		}
		by := acked[r.recordPos]
		if by == nil {
			k := doubtKey{r.Topic, r.Partition, r.ID}
			c := pickDoubt(failed[k], after[i], before[i])
			switch {
			case c >= 0:
				by = failed[k][c]
				failed[k] = slices.Delete(failed[k], c, c+1)
			case rogueDoubt[k] > 0:
				rogueDoubt[k]--
				continue
			default:
				res.Violations++
				v.fail("fence-unattributed", "record %s (event %s) was produced by no replica", malformedRef(r.recordPos), r.ID)
				continue
			}
		}
		ref := eventRef(r.Topic, r.ID)
		if len(pubs[ref]) == 0 {
			order = append(order, ref)
		}
		pubs[ref] = append(pubs[ref], publication{rec: r, by: by})
		inside, overlap := false, false
		for _, o := range owners[ownKey{r.Topic, r.Partition}] {
			if !o.From.After(by.Buffered) && (o.To.IsZero() || !by.Buffered.After(o.To)) {
				if o.Replica == by.Replica {
					inside = true
					continue
				}
				end := o.To
				if g, ok := f.Gone[o.Replica]; ok && (end.IsZero() || g.Before(end)) {
					end = g
				}
				if end.IsZero() || !by.Buffered.After(end) {
					overlap = true
					v.fail("fence-overlap", "record %s (event %s) produced by %s at %s while %s owned the partition (since %s)",
						malformedRef(r.recordPos), r.ID, by.Replica, by.Buffered.Format(tsFormat), o.Replica, o.From.Format(tsFormat))
				}
			}
		}
		if !inside {
			v.fail("fence-outside", "record %s (event %s) produced by %s at %s outside its ownership of %s/%d (%s)",
				malformedRef(r.recordPos), r.ID, by.Replica, by.Buffered.Format(tsFormat), r.Topic, r.Partition,
				intervalsOf(owners[ownKey{r.Topic, r.Partition}], by.Replica))
		}
		if overlap || !inside {
			res.Violations++
		}
	}
	// Duplicates, and what explains each.
	ends := map[string][]time.Time{} // replica -> kills, stops
	for _, in := range f.Interruptions {
		ends[in.Replica] = append(ends[in.Replica], in.At)
	}
	// A publisher marks a batch once every record of it is acknowledged:
	// the end of the round of a publication is the last acknowledgement
	// of the records its publisher had handed to its producer for that
	// partition by then (rounds of a partition follow one another).
	type roundKey struct {
		replica, topic string
		partition      int32
	}
	byRound := map[roundKey][]*pubRecord{}
	for i := range f.Produced {
		p := &f.Produced[i]
		k := roundKey{p.Replica, p.Topic, p.Partition}
		byRound[k] = append(byRound[k], p)
	}
	roundEnd := func(p *pubRecord) time.Time {
		end := p.Done
		for _, q := range byRound[roundKey{p.Replica, p.Topic, p.Partition}] {
			if !q.Buffered.After(p.Done) && q.Done.After(end) {
				end = q.Done
			}
		}
		return end
	}
	// roundMarkedBefore reports whether p's publisher marked, between p's
	// publication and t, any event of p's round or a later one on the
	// partition (it marks rounds in order: p's would have been marked).
	roundMarkedBefore := func(p *pubRecord, t time.Time) bool {
		for _, q := range byRound[roundKey{p.Replica, p.Topic, p.Partition}] {
			if q.Err || q.Done.Before(p.Buffered) {
				continue
			}
			if m, ok := f.MarkedAt[eventRef(q.Topic, q.ID)]; ok && !m.Before(p.Buffered) && m.Before(t) {
				return true
			}
		}
		return false
	}
	// How long marking took then: acknowledgement to mark of the events
	// published once, by any publisher (they share one MongoDB).
	type lag struct {
		done time.Time
		d    time.Duration
	}
	var lags []lag
	for _, ref := range order {
		if ps := pubs[ref]; len(ps) == 1 && !ps[0].by.Err {
			if m, ok := f.MarkedAt[ref]; ok {
				lags = append(lags, lag{ps[0].by.Done, m.Sub(ps[0].by.Done)})
			}
		}
	}
	window := func(p *pubRecord) time.Duration {
		w := dupWindow
		for _, l := range lags {
			if l.done.Sub(p.Done).Abs() <= markLagSpan {
				w = max(w, l.d)
			}
		}
		return w
	}
	for _, ref := range order {
		ps := pubs[ref]
		for k := 1; k < len(ps); k++ {
			res.Duplicates++
			explained := false
			for j := 0; j < k && !explained; j++ {
				e := ps[j].by
				lo, hi := e.Buffered, roundEnd(e).Add(window(e))
				// cut reports whether t, a kill, stop, revoke or loss of
				// e's publisher or a failed produce of it on the
				// partition, explains the duplicate: within the window;
				// or later, before the publication again, while the
				// publisher had marked nothing of e's round or after it
				// (it was still on that round when it was cut).
				cut := func(t time.Time) bool {
					switch {
					case t.Before(lo):
						return false
					case !t.After(hi):
						return true
					}
					return !t.After(ps[k].by.Buffered) && !roundMarkedBefore(e, t)
				}
				for _, t := range ends[e.Replica] {
					// A kill or stop is noted before the replica is torn
					// down, and its goroutines run on for a moment: what
					// it publishes after the note is a dying replica's,
					// which it may never mark.
					explained = explained || cut(t) || !t.After(lo)
				}
				for _, t := range failures[failKey{e.Replica, e.Topic, e.Partition}] {
					// The failed record may come before e in its batch.
					explained = explained || cut(t) || !t.Before(lo.Add(-dupWindow)) && !t.After(lo)
				}
				for _, o := range owners[ownKey{e.Topic, e.Partition}] {
					explained = explained || o.Replica == e.Replica && o.Ended != "" && cut(o.To)
				}
			}
			if !explained {
				res.Unexplained++
				p, e := ps[k], ps[k-1].by
				doubt := ""
				if p.by.Err {
					doubt = ", its produce failed: in doubt"
				}
				v.fail("duplicate-unexplained", "event %s published again at %s by %s (%s%s): no kill, stop, revoke or failed produce of an earlier publisher within %s of its publication, nor before it marked that publication's round: %s (%s: interrupted at [%s], %s)",
					ref, malformedRef(p.rec.recordPos), p.by.Replica, p.by.Buffered.Format(tsFormat), doubt, window(e).Round(time.Millisecond), describePubs(ps[:k]),
					e.Replica, formatTimes(ends[e.Replica]), intervalsOf(owners[ownKey{e.Topic, e.Partition}], e.Replica))
			}
		}
	}
	return res
}

// appendBounds returns, for each of records (sorted by partition and
// offset), the times between which Kafka appended it, as far as the
// acknowledged records around it tell: after the latest time a record
// acknowledged at a lower offset of its partition was handed to its
// producer (Kafka appended that one first, and after it was handed over),
// and before the earliest acknowledgement of a record at a higher offset
// (appended later, acknowledged after it was appended). A zero time bounds
// nothing.
func appendBounds(records []topicRecord, acked map[recordPos]*pubRecord) (after, before []time.Time) {
	after, before = make([]time.Time, len(records)), make([]time.Time, len(records))
	samePartition := func(i, j int) bool {
		return records[i].Topic == records[j].Topic && records[i].Partition == records[j].Partition
	}
	var t time.Time
	for i := range records {
		if i > 0 && !samePartition(i, i-1) {
			t = time.Time{}
		}
		after[i] = t
		if p := acked[records[i].recordPos]; p != nil && p.Buffered.After(t) {
			t = p.Buffered
		}
	}
	t = time.Time{}
	for i := len(records) - 1; i >= 0; i-- {
		if i < len(records)-1 && !samePartition(i, i+1) {
			t = time.Time{}
		}
		before[i] = t
		if p := acked[records[i].recordPos]; p != nil && (t.IsZero() || p.Done.Before(t)) {
			t = p.Done
		}
	}
	return after, before
}

// pickDoubt returns the index of the failed produce among cands (same
// partition and event) that wrote a record Kafka appended between after
// and before (appendBounds), or -1 when none can have. A produce handed
// over only after before cannot have. Of the others, one that was still
// in flight after after (its failure came later) is the likely writer;
// the one that failed first is taken, leaving the later ones to the
// later records. When every one had failed before after, the record was
// held up in a broker (a paused one answers what its socket held when it
// resumes): the one that failed last is taken.
func pickDoubt(cands []*pubRecord, after, before time.Time) int {
	best, late := -1, false
	for i, c := range cands {
		if !before.IsZero() && !c.Buffered.Before(before) {
			continue
		}
		inFlight := !c.Done.Before(after)
		switch {
		case best < 0, inFlight && !late:
			best, late = i, inFlight
		case inFlight && c.Done.Before(cands[best].Done), !late && c.Done.After(cands[best].Done):
			best = i
		}
	}
	return best
}

// tsFormat prints the times of FAIL lines.
const tsFormat = "15:04:05.000"

func intervalsOf(os []ownership, replica string) string {
	s := ""
	for _, o := range os {
		if o.Replica != replica {
			continue
		}
		to := "owned at the end"
		if !o.To.IsZero() {
			to = o.Ended + " " + o.To.Format(tsFormat)
		}
		if s != "" {
			s += ", "
		}
		s += o.From.Format(tsFormat) + " to " + to
	}
	if s == "" {
		return "never owned it"
	}
	return "owned " + s
}

func formatTimes(ts []time.Time) string {
	s := ""
	for _, t := range ts {
		if s != "" {
			s += " "
		}
		s += t.Format(tsFormat)
	}
	return s
}

func describePubs(ps []publication) string {
	s := ""
	for _, p := range ps {
		if s != "" {
			s += ", "
		}
		s += malformedRef(p.rec.recordPos) + " by " + p.by.Replica + " at " + p.by.Buffered.Format(tsFormat) + "-" + p.by.Done.Format(tsFormat)
		if p.by.Err {
			s += " (its produce failed: in doubt)"
		}
	}
	return s
}

// countRedelivered counts the deliveries of events polled by a consumer
// after the event was settled (handled or purged): settled gives, by
// eventRef, when the inbox history saw it settled.
func countRedelivered(polls []poll, settled map[string]time.Time) int {
	n := 0
	for _, p := range polls {
		if t, ok := settled[eventRef(p.Topic, p.ID)]; ok && p.At.After(t) {
			n++
		}
	}
	return n
}

package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// Quiescence: after the load, the run waits until every piece of work is
// settled, for as long as work progresses. It fails only when nothing
// progressed for cfg.stall, printing what is still unsettled: a slow or
// busy machine takes longer, a stuck framework stops progressing.

// settleState is one look at the outstanding work.
type settleState struct {
	settled bool
	// progress changes whenever any work moves: two looks with the same
	// progress saw nothing happen in between.
	progress string
	// summary says what is outstanding.
	summary string
}

// clock is time, for waitSettled's tests.
type clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time                                   { return time.Now() }
func (realClock) Sleep(ctx context.Context, d time.Duration) error { return sleepCtx(ctx, d) }

// waitSettled looks every `every` (or thrice as long as a look took, when
// longer) until two looks in a row report everything settled with the
// same progress (true), or until nothing progressed for stall (false, with the last
// look). Errors of look count as no progress; logf hears the state every
// few seconds, onIdle (when not nil) how long nothing progressed after
// each look.
func waitSettled(ctx context.Context, clk clock, every, stall time.Duration, look func(context.Context) (settleState, error),
	logf func(string, ...any), onIdle func(time.Duration)) (bool, settleState) {
	var last settleState
	lastProgress, lastLog := clk.Now(), time.Time{}
	seen := false
	for {
		began := clk.Now()
		st, err := look(ctx)
		took := clk.Now().Sub(began)
		if err == nil {
			// A look is several reads, not one snapshot: a handling that
			// commits between them can make one look settled while work
			// remains (the expected effects read before the commit, the
			// effects after it; its follow-up not yet counted). Settled
			// means two looks in a row settled with nothing moved between.
			if st.settled && seen && last.settled && st.progress == last.progress {
				logf("quiet: %s", st.summary)
				return true, st
			}
			if !seen || st.progress != last.progress {
				lastProgress = clk.Now()
			}
			last, seen = st, true
			if clk.Now().Sub(lastLog) > 5*time.Second {
				logf("quiescence: %s", st.summary)
				lastLog = clk.Now()
			}
		} else if !seen {
			last.summary = "unknown: " + err.Error()
		}
		if onIdle != nil {
			onIdle(clk.Now().Sub(lastProgress))
		}
		if clk.Now().Sub(lastProgress) >= stall || ctx.Err() != nil {
			return false, last
		}
		// A look scans the ledger, the effects and the outbox whole: once
		// they hold tens of thousands of documents it takes the embedded
		// server a while, so the looks are spaced to keep them under a
		// quarter of its time, leaving the rest to the replicas.
		if clk.Sleep(ctx, max(every, 3*took)) != nil {
			return false, last
		}
	}
}

// lookSettled is one look at the run's outstanding work: unpublished and
// failed outbox events, handled kinds without an effect, poison events and
// malformed records neither parked nor purged, held events, and partitions
// whose consumer group offset is behind.
func (h *harness) lookSettled(ctx context.Context) (settleState, error) {
	st, err := h.op.admin.StoreStatus(ctx)
	if err != nil {
		return settleState{}, err
	}
	nLedger := func(filter bson.D) (int64, error) { return h.db.Collection(collLedger).CountDocuments(ctx, filter) }
	handledKinds, err := nLedger(toBeHandled())
	if err != nil {
		return settleState{}, err
	}
	poisons, err := nLedger(bson.D{{Key: "kind", Value: kindPoison}})
	if err != nil {
		return settleState{}, err
	}
	effects := h.distinctEffects(ctx)
	recreated, err := h.db.Collection(collRecreated).CountDocuments(ctx, bson.D{})
	if err != nil {
		return settleState{}, err
	}
	recreatedEffects := h.distinctEvents(ctx, collRecreatedEffects)
	lags, err := h.lag(ctx)
	if err != nil {
		return settleState{}, err
	}
	behind, lagSum := 0, int64(0)
	for _, l := range lags {
		if l.Behind() > 0 {
			behind++
			lagSum += l.Behind()
		}
	}
	bySchema := h.rec.counts()
	done := func(schema string) int {
		m := bySchema[schema]
		return m[inboxParked] + m[inboxDiscarded]
	}
	changes, _ := h.rec.snapshotLen()
	h.inj.mu.Lock()
	malformed := h.inj.malformed
	h.inj.mu.Unlock()
	malformedDone := h.rec.malformedSettled()
	s := settleState{
		settled: st.Pending == 0 && st.Failed == 0 && st.Held == 0 && effects >= handledKinds && recreatedEffects >= recreated &&
			int64(done(schemaPoison)) >= poisons && malformedDone >= malformed && behind == 0,
		progress: fmt.Sprintf("%d/%d/%d/%d/%d/%d/%d/%d", st.Pending, st.Failed, st.Parked, effects, lagSum, changes, malformedDone, recreatedEffects),
		summary: fmt.Sprintf("unpublished=%d failed=%d effects=%d of %d recreated topic's effects=%d of %d poisons parked/purged=%d of %d malformed parked/purged=%d of %d parked=%d held=%d partitions behind=%d (%d records)",
			st.Pending, st.Failed, effects, handledKinds, recreatedEffects, recreated, done(schemaPoison), poisons, malformedDone, malformed, st.Parked, st.Held, behind, lagSum),
	}
	return s, nil
}

// toBeHandled selects the ledger entries that must end with an effect:
// step events, follow-ups, events of a type deployed late, and scheduled
// events not cancelled.
func toBeHandled() bson.D {
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "kind", Value: bson.D{{Key: "$in", Value: bson.A{kindStep, kindFollow, kindNew}}}}},
		bson.D{{Key: "kind", Value: kindScheduled}, {Key: "cancelled", Value: bson.D{{Key: "$ne", Value: true}}}},
	}}}
}

// dumpStacks writes every goroutine's stack to path (-stacks), to explain
// a stall.
func dumpStacks(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("goroutine").WriteTo(f, 2)
}

// unsettled lists what is outstanding in detail, for the FAIL line of a
// stall: the first unpublished events, handled kinds without an effect,
// parked and held events, and lagging partitions.
func (h *harness) unsettled(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var parts []string
	var pending []store.OutboxRecord
	if err := h.findAllLimit(ctx, "outbox", bson.D{{Key: store.OutboxPublished, Value: false}}, 10, &pending); err == nil && len(pending) > 0 {
		s := make([]string, len(pending))
		for i, p := range pending {
			s[i] = fmt.Sprintf("%s (%s/%d)", p.IdempotencyKey, p.Topic, p.Partition)
		}
		parts = append(parts, "unpublished: "+strings.Join(s, ", "))
	}
	var ledger []ledgerEntry
	var effects []struct {
		Event string `bson:"event"`
	}
	if h.findAll(ctx, collLedger, toBeHandled(), nil, &ledger) == nil &&
		h.findAll(ctx, collEffects, bson.D{}, bson.D{{Key: "event", Value: 1}}, &effects) == nil {
		has := map[string]bool{}
		for _, e := range effects {
			has[e.Event] = true
		}
		var s []string
		for _, e := range ledger {
			if !has[e.ID] {
				if len(s) < 10 {
					st, _ := h.inboxStateOf(ctx, outbox.InboxID{Topic: e.Topic, ContentSchema: schemaOf(e.Kind), IdempotencyKey: e.ID})
					s = append(s, fmt.Sprintf("%s %s (key %s place %d, inbox %s)", e.Kind, e.ID, e.Key, e.Place, st))
				} else {
					s = append(s, "...")
					break
				}
			}
		}
		if len(s) > 0 {
			parts = append(parts, "not handled: "+strings.Join(s, ", "))
		}
	}
	if ps, err := h.parkedNow(ctx, h.op.admin); err == nil && len(ps) > 0 {
		s := []string{}
		for i, p := range ps {
			if i == 10 {
				s = append(s, fmt.Sprintf("... %d in all", len(ps)))
				break
			}
			w := fmt.Sprintf("%s %s key %s (%q)", p.ID, p.State, p.PartitionKey, p.LastError)
			if i < 3 {
				// Whether the partition's owner knows the key is held (its
				// held keys, its waits): a held key its owner forgot is
				// released by no one.
				w += fmt.Sprintf(" [partition %d: %s]", p.Partition, h.handlersOf(ctx, topicPartition{Topic: h.env.topicPrefix + p.ID.Topic, Partition: p.Partition}))
			}
			s = append(s, w)
		}
		parts = append(parts, "parked: "+strings.Join(s, ", "))
	}
	if lags, err := h.lag(ctx); err == nil {
		var s []string
		for tp, l := range lags {
			if l.Behind() > 0 {
				s = append(s, fmt.Sprintf("%s/%d: %d (group committed %d, end %d; %s)", tp.Topic, tp.Partition, l.Behind(), l.Committed, l.End, h.handlersOf(ctx, tp)))
			}
		}
		if len(s) > 0 {
			parts = append(parts, "partitions behind: "+strings.Join(s, ", "))
		}
	}
	if len(parts) == 0 {
		return "nothing found outstanding"
	}
	return strings.Join(parts, "; ")
}

// handlersOf says which live replicas handle a partition and how far
// their worker got, from their status: to tell a partition no replica
// handles from one whose worker got no records, settles nothing, or does
// not commit what it settled (issue 31, item 7).
func (h *harness) handlersOf(ctx context.Context, tp topicPartition) string {
	h.mu.Lock()
	rs := slices.Collect(maps.Values(h.slots))
	h.mu.Unlock()
	var out []string
	for _, r := range rs {
		st, err := r.client.Status(ctx)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: status: %v", r.name, err))
			continue
		}
		// Status names bare topics; tp names the Kafka topic (-topic-prefix).
		bare := strings.TrimPrefix(tp.Topic, h.env.topicPrefix)
		for _, p := range st.Consumer {
			if p.Topic != bare || p.Partition != tp.Partition {
				continue
			}
			w := fmt.Sprintf("%s: committed %d, lowest unsettled %d, unsettled %d, in flight %d, held keys %d, paused %t, %s",
				r.name, p.Committed, p.LowestUnsettled, p.Unsettled, p.InFlight, p.HeldKeys, p.Paused,
				h.klog.fetchedBy(r.name, h.env.service, bare, tp.Partition))
			for _, wt := range st.Waiting {
				if wt.Topic == bare && wt.Partition == tp.Partition {
					w += fmt.Sprintf(", waits on %s at offset %d since %s (%s)", wt.What, wt.Offset, wt.Since.Format(tsFormat), wt.Detail)
				}
			}
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		return "handled by no live replica"
	}
	return strings.Join(out, "; ")
}

// schemaOf is the content schema of a ledger kind.
func schemaOf(kind string) string {
	switch kind {
	case kindPoison:
		return schemaPoison
	case kindFollow:
		return schemaFollow
	case kindNew:
		return schemaNew
	case kindScheduled:
		return schemaScheduled
	}
	return schemaStep
}

// findAllLimit is findAll with a limit and without a projection.
func (h *harness) findAllLimit(ctx context.Context, coll string, filter bson.D, limit int64, out any) error {
	cur, err := h.db.Collection(coll).Find(ctx, filter, options.Find().SetLimit(limit).SetProjection(bson.D{{Key: "payload", Value: 0}}))
	if err != nil {
		return err
	}
	return cur.All(ctx, out)
}

// distinctEffects counts the events with at least one effect.
func (h *harness) distinctEffects(ctx context.Context) int64 {
	return h.distinctEvents(ctx, collEffects)
}

// distinctEvents counts the distinct events of an effects collection (-1
// when it cannot).
func (h *harness) distinctEvents(ctx context.Context, coll string) int64 {
	cur, err := h.db.Collection(coll).Aggregate(ctx, mongo.Pipeline{
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$event"}}}},
		{{Key: "$count", Value: "n"}},
	})
	if err != nil {
		return -1
	}
	var out []struct {
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &out); err != nil {
		return -1
	}
	if len(out) == 0 {
		return 0
	}
	return out[0].N
}

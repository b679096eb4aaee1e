package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/schedule"
	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// The writes of delayed publication, crashed one at a time as
// crash_test.go does for the other operations: a process dies before (and,
// where it differs, after) each write of scheduling (Record with
// WithPublishAt), promotion (internal/schedule) and cancellation
// (CancelScheduled); then the dead process's sessions are ended, as a
// takeover does, the operation runs again in another process, and the
// scheduled events must end as the uncrashed run leaves them: each one
// either scheduled, or promoted exactly once into the outbox, or
// cancelled; never two outbox documents for one event, never a promoted
// mark without its outbox document.
func TestCrashScheduledWrites(t *testing.T) {
	t.Parallel()
	srv, err := mongofake.NewServer()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })

	events := []crashEvent{{Name: "S1", Key: "a"}, {Name: "S2", Key: "a"}, {Name: "S3", Key: "b"}}
	var due time.Time // the due time of the scheduled events, past when promoting
	schedule := func(p *crashProc) error {
		return p.c.Transact(p.ctx, func(ctx context.Context) error {
			for _, e := range events {
				if err := Record(ctx, e, WithIdempotencyKey(e.Name), WithPublishAt(due)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	promote := func(p *crashProc) error {
		st := scheduleStore(p)
		_, err := st.Promote(p.ctx, scheduleTP(), due.Add(time.Minute), 10)
		return err
	}
	cancelS2 := func(p *crashProc) error {
		err := p.c.Transact(p.ctx, func(ctx context.Context) error { return CancelScheduled(ctx, ordersTopic, "S2") })
		if errors.Is(err, ErrNotScheduled) {
			return nil // cancelled before the process died
		}
		return err
	}
	// twinS2 records, for immediate publication, an event with S2's key
	// under a unique index on the outbox, as a transaction racing S2's
	// scheduling would (Config.UniqueIdempotencyKeys): S2's promotion is
	// refused and S2 is marked failed.
	twinS2 := func(p *crashProc) error {
		if err := store.EnsureIndexes(p.ctx, p.c.outbox, store.OutboxIdempotencySpec()); err != nil {
			return err
		}
		return p.c.Transact(p.ctx, func(ctx context.Context) error {
			return Record(ctx, events[1], WithIdempotencyKey("S2"))
		})
	}
	// failS2 marks S2's outbox document failed, as a publisher does when
	// Kafka refuses it for good; discardS2 discards it (Admin.DiscardFailed).
	failS2 := func(p *crashProc) error {
		_, err := p.c.outbox.UpdateOne(p.ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: "S2"}},
			store.MarkFailedUpdate("refused", time.Now(), true))
		return err
	}
	discardS2 := func(p *crashProc) error {
		_, err := p.c.Admin().DiscardFailed(p.ctx, FailedFilter{}, nil, false)
		return err
	}
	// With claim, every event's payload goes out of band (a threshold of
	// one byte), and the chunks are judged too (chunkViolations).
	type op struct {
		name  string
		setup []func(*crashProc) error
		run   func(*crashProc) error
		claim bool
		// allowed are states that scheduledViolations does not judge.
		allowed []string
	}
	ops := []op{
		{"schedule", nil, schedule, false, nil},
		{"promote", []func(*crashProc) error{schedule}, promote, false, nil},
		{"promote-duplicate", []func(*crashProc) error{schedule, twinS2}, promote, false, []string{"S2 scheduled (outbox 1)"}},
		{"cancel", []func(*crashProc) error{schedule}, cancelS2, false, nil},
		{"discard-claim", []func(*crashProc) error{schedule, promote, failS2}, discardS2, true, []string{"S2 promoted (outbox 0)"}},
	}
	for _, o := range ops[:4] {
		o.name, o.claim = o.name+"-claim", true
		ops = append(ops, o)
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			due = time.Now().Add(time.Hour)
			sc := &crashScenario{name: "sched-" + op.name, indexes: true}
			if op.claim {
				sc.claimCheck = &ClaimCheck{Threshold: 1}
			}
			prepare := func(r *crashRig) {
				p := r.proc(r.db+"-setup", crashRole{}, nil)
				for _, s := range op.setup {
					require.NoError(t, s(p))
				}
			}
			rec := newCrashRig(t, srv, sc, "crash_sched_"+op.name+"_rec")
			prepare(rec)
			p := rec.proc(rec.db+"-main", crashRole{}, nil)
			require.NoError(t, op.run(p))
			writes := p.recorded()
			want := scheduledWorld(t, rec)
			if op.claim {
				require.Empty(t, chunkViolations(t, rec), "uncrashed")
				require.Contains(t, want, "chunks", "the payloads went out of band")
			}
			rec.close()
			require.NotEmpty(t, writes)
			var lines []string
			for i, w := range writes {
				lines = append(lines, fmt.Sprintf("%d. %s", i+1, w))
			}
			t.Logf("%s: %d writes\n%s", op.name, len(writes), strings.Join(lines, "\n"))
			points := 0
			for i, w := range writes {
				for _, after := range []bool{false, true} {
					if after && !w.afterMatters() {
						continue
					}
					points++
					r := newCrashRig(t, srv, sc, fmt.Sprintf("crash_sched_%s_%d", op.name, points))
					prepare(r)
					d := r.proc(r.db+"-dies", crashRole{}, &mongofake.Crash{Commands: crashWrites, At: i + 1, AfterRun: after})
					_ = op.run(d)
					require.True(t, d.dead(), "crash point %d (after %v) not reached", i+1, after)
					v := scheduledViolations(t, r, op.allowed)
					if op.claim {
						v = append(v, chunkViolations(t, r)...)
					}
					if len(v) > 0 {
						t.Errorf("crash at write %d %s (after %v): %s", i+1, w, after, strings.Join(v, "; "))
					}
					r.reap()
					q := r.proc(r.db+"-recovers", crashRole{}, nil)
					require.NoError(t, op.run(q), "rerun after a crash at write %d (after %v)", i+1, after)
					if got := scheduledWorld(t, r); got != want {
						t.Errorf("crash at write %d %s (after %v): the rerun ends elsewhere:\n got %s\nwant %s", i+1, w, after, got, want)
					}
					if v := chunkViolations(t, r); op.claim && len(v) > 0 {
						t.Errorf("crash at write %d %s (after %v), rerun: %s", i+1, w, after, strings.Join(v, "; "))
					}
					r.close()
				}
			}
			t.Logf("%s: %d crash points", op.name, points)
		})
	}
}

func scheduleStore(p *crashProc) schedule.Mongo {
	return schedule.Mongo{Client: p.mc, Scheduled: p.c.scheduled, Outbox: p.c.outbox}
}

func scheduleTP() schedule.TopicPartition {
	return schedule.TopicPartition{Topic: ordersTopic, Partition: 0}
}

// scheduledWorld describes each event: "scheduled", "promoted" (with its
// outbox documents counted) or "gone", then the payload chunks marked to
// expire, when there are chunks. It reads in one transaction: the
// dead process's last command may still be running (its driver returned
// when the process's context ended), and a read of its commit half before
// and half after would see a state that never was.
func scheduledWorld(t *testing.T, r *crashRig) string {
	t.Helper()
	c := r.checker.c
	return checkerRead(t, r, func(ctx context.Context) (any, error) {
		var b strings.Builder
		for _, name := range []string{"S1", "S2", "S3"} {
			var s store.ScheduledDoc
			err := c.scheduled.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: name}}).Decode(&s)
			if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
				return nil, err
			}
			n, cerr := c.outbox.CountDocuments(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: name}})
			if cerr != nil {
				return nil, cerr
			}
			switch {
			case err != nil:
				fmt.Fprintf(&b, "%s gone (outbox %d); ", name, n)
			case s.Failed:
				fmt.Fprintf(&b, "%s failed (outbox %d); ", name, n)
			case s.Promoted:
				fmt.Fprintf(&b, "%s promoted (outbox %d); ", name, n)
			default:
				fmt.Fprintf(&b, "%s scheduled (outbox %d); ", name, n)
			}
		}
		// The unmarked chunks are judged by chunkViolations: a rerun of a
		// scheduling whose commit went through schedules the events again,
		// with chunks of their own.
		payloads := r.checker.db.Collection(store.PayloadsCollection)
		all, err := payloads.CountDocuments(ctx, bson.D{})
		if err != nil {
			return nil, err
		}
		marked, err := payloads.CountDocuments(ctx, bson.D{{Key: store.PayloadPublished, Value: true}})
		if err != nil {
			return nil, err
		}
		if all > 0 {
			fmt.Fprintf(&b, "chunks marked %d; ", marked)
		}
		return b.String(), nil
	}).(string)
}

// checkerRead returns what read returns, run by r's checker in one
// transaction (see scheduledWorld).
func checkerRead(t *testing.T, r *crashRig, read func(ctx context.Context) (any, error)) any {
	t.Helper()
	ctx := context.Background()
	sess, err := r.checker.mc.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	out, err := sess.WithTransaction(ctx, read)
	require.NoError(t, err)
	return out
}

// scheduledViolations checks the state a crash left: a promoted event has
// exactly one outbox document, a scheduled or cancelled one none (a failed
// one, refused as the duplicate of an outbox event, is not judged; nor
// are the states of allowed, such as S2 waiting beside the outbox event of
// its key, or S2 promoted and then discarded).
func scheduledViolations(t *testing.T, r *crashRig, allowed []string) []string {
	t.Helper()
	var v []string
	for _, part := range strings.Split(strings.TrimSuffix(scheduledWorld(t, r), "; "), "; ") {
		promoted := strings.Contains(part, " promoted ")
		if strings.Contains(part, " failed ") || strings.HasPrefix(part, "chunks ") ||
			slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(part, a) }) {
			continue
		}
		if promoted != strings.Contains(part, "(outbox 1)") || strings.Contains(part, "(outbox 2)") {
			v = append(v, part)
		}
	}
	return v
}

// chunkViolations checks the payload chunks a crash left, read in one
// transaction as scheduledWorld reads: every event that may still be
// published (scheduled and waiting, or in the outbox unpublished) has its
// chunks, none marked (a marked chunk expires while its event waits);
// every unmarked chunk belongs to such an event (an unmarked chunk without
// one would never expire: a cancelled or discarded event's chunks are
// marked in the transaction that drops it).
func chunkViolations(t *testing.T, r *crashRig) []string {
	t.Helper()
	c := r.checker.c
	return checkerRead(t, r, func(ctx context.Context) (any, error) {
		live := map[bson.ObjectID]string{} // payload_ref -> the event's name
		for _, q := range []struct {
			coll   *mongo.Collection
			filter bson.D
		}{
			{c.scheduled, bson.D{{Key: store.ScheduledPromoted, Value: false}}},
			{c.outbox, bson.D{{Key: store.OutboxPublished, Value: false}}},
		} {
			var docs []store.OutboxDoc
			cur, err := q.coll.Find(ctx, q.filter)
			if err != nil {
				return nil, err
			}
			if err := cur.All(ctx, &docs); err != nil {
				return nil, err
			}
			for _, d := range docs {
				if d.PayloadRef == nil {
					return []string{d.IdempotencyKey + " has no payload_ref"}, nil
				}
				live[*d.PayloadRef] = d.IdempotencyKey
			}
		}
		var chunks []claimcheck.Chunk
		cur, err := r.checker.db.Collection(store.PayloadsCollection).Find(ctx, bson.D{})
		if err != nil {
			return nil, err
		}
		if err := cur.All(ctx, &chunks); err != nil {
			return nil, err
		}
		var v []string
		has := map[bson.ObjectID]bool{}
		for _, ch := range chunks {
			name, ok := live[ch.Ref]
			has[ch.Ref] = true
			switch {
			case ok && ch.Published:
				v = append(v, fmt.Sprintf("%s waits for publication with its chunk marked (it would expire)", name))
			case !ok && !ch.Published:
				v = append(v, fmt.Sprintf("chunk of %s unmarked with no event to publish (it never expires)", ch.Ref.Hex()))
			}
		}
		for ref, name := range live {
			if !has[ref] {
				v = append(v, fmt.Sprintf("%s waits for publication without its chunks", name))
			}
		}
		return v, nil
	}).([]string)
}

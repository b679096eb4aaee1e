package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// Crash every write: each write of each multi-write operation is crashed in a
// test, because a state a crash can leave half-done must be one that any
// replica resumes from without a sweep.
//
// For each scenario (one operation of the framework on a small partition)
// the harness first runs it uncrashed, recording the write commands its
// process sends (crashWrites, by a command monitor) and the outcome. Then,
// for each write in turn, it runs the scenario again on a fresh database
// with a process that dies at that write (mongofake.Server.Crash: the
// write and everything after it never reaches the data, and the process's
// open transactions stay open, as after kill -9), once before the write
// runs and, where it differs (a commit, a write outside a transaction),
// once after it ran with its reply lost. Then a fresh process takes over:
//
//  1. the partition's new owner runs the partition from the committed
//     offset (its consumer worker, or its publisher worker) until it is
//     quiescent, ending the dead process's sessions when it meets their
//     locks (internal/liveness/takeover.go), and the invariants are checked;
//  2. the operator issues again the call that was cut short (a re-drive, a
//     purge, a retry, the migration) and the scenario's later steps run;
//     the invariants are checked again and the outcome must be the
//     uncrashed run's.
//
// The invariants are those of crash_invariants_test.go. The test logs how
// many writes and crash points each operation has, and fails when a
// recorded write could not be crashed (the operation did not reach it
// again: its writes are not deterministic).
//
// The scenarios at KeyConcurrency 4 (crash_concurrent_test.go) run several
// units at once, whose writes interleave differently in each run: there a
// crash point is the nth write of a kind naming an event, not the nth write
// of the process, and the log says how many transactions were open at once.

// crashScenario is one operation on a small partition.
type crashScenario struct {
	name string
	op   string // the operation whose writes are crashed
	main crashRole
	// server are the options of the scenario's server.
	server []mongofake.Option
	// indexes: the framework's indexes are created first.
	indexes bool
	// claimCheck is the processes' Config.ClaimCheck (nil: none).
	claimCheck *ClaimCheck
	// records are the consumer partition's records; events the recorded
	// outbox events (publisher); discards the events the operator
	// discards.
	records  []crashRec
	events   []crashEvent
	discards map[string]bool
	// setup prepares the database with uncrashed processes.
	setup func(r *crashRig)
	// steps are the operation, and what follows it.
	steps []crashStep
	// owner is the run of the partition's new owner after a crash (nil:
	// none, the operator only calls again).
	owner *crashStep
	// check returns the violated invariants; final: every step ran.
	check func(r *crashRig, final bool) []string
	// outcome is compared between the uncrashed run and each recovery.
	outcome func(r *crashRig) string
	// keyConcurrency and batch are the consumer's KeyConcurrency and
	// HandleBatchSize (0: 1 and 10). Above 1, crash points are labelled
	// (crash_concurrent_test.go).
	keyConcurrency, batch int
	// barrier are events whose handlers wait for each other in the process
	// whose writes are crashed (crashBarrier).
	barrier []string
	// sharedTxn: the uncrashed run must commit a transaction shared by
	// several events.
	sharedTxn bool
	// gate, when set, runs before each handler of the process whose writes
	// are crashed; bug changes the consumer of that process (a defect
	// planted to prove the invariants: crash_concurrent_test.go).
	gate func(r *crashRig, p *crashProc, name string) error
	bug  func(p *crashProc, cfg *consume.Config)
}

// crashStep is a step of a scenario.
type crashStep struct {
	name string
	// admin: an operator's call, which the operator issues again when its
	// process died during it. Other steps are the owner's runs.
	admin bool
	run   func(r *crashRig, p *crashProc) error
}

var (
	consumeStep = crashStep{name: "consume", run: (*crashRig).consume}
	publishStep = crashStep{name: "publish", run: (*crashRig).publish}
)

func consumerCheck(r *crashRig, _ bool) []string { return r.consumerWorld().violations() }
func consumerOutcome(r *crashRig) string         { return r.consumerWorld().outcome() }
func publisherCheck(r *crashRig, final bool) []string {
	return r.publisherWorld(final).violations()
}
func publisherOutcome(r *crashRig) string { return r.publisherWorld(true).outcome() }

// setupConsume consumes the whole partition with an uncrashed process of
// role before the operation.
func setupConsume(role crashRole) func(r *crashRig) {
	return func(r *crashRig) {
		p := r.proc(r.db+"-setup", role, nil)
		require.NoError(r.t, r.consume(p))
	}
}

// heldChain is d1 parked by its handler (in a poisoned process), d2 and
// d3 held behind it, and e1 of another key.
var heldChain = []crashRec{{name: "d1", key: "d", mode: "poison"}, {name: "d2", key: "d"}, {name: "d3", key: "d", mode: "flaky"}, {name: "e1", key: "e"}}

func crashIDOf(name string) InboxID {
	return InboxID{Topic: ordersTopic, ContentSchema: crashEventSchema, IdempotencyKey: name}
}

// consumerScenario completes a scenario of the consumer: the partition's
// new owner consumes it, and the consumer's invariants are checked.
func consumerScenario(sc *crashScenario) *crashScenario {
	sc.indexes = true
	sc.owner = &consumeStep
	sc.check, sc.outcome = consumerCheck, consumerOutcome
	if sc.steps == nil {
		sc.steps = []crashStep{consumeStep}
	}
	return sc
}

func crashScenarios() []*crashScenario {
	publisher := func(sc *crashScenario) *crashScenario {
		sc.indexes = true
		sc.owner = &publishStep
		sc.check, sc.outcome = publisherCheck, publisherOutcome
		sc.setup = func(r *crashRig) {
			p := r.proc(r.db+"-setup", crashRole{}, nil)
			for _, e := range r.sc.events {
				require.NoError(r.t, p.c.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) }))
			}
		}
		if sc.discards == nil {
			sc.discards = map[string]bool{}
		}
		return sc
	}
	big := strings.Repeat("x", 2*crashKafkaLimit)
	pubEvents := []crashEvent{{Name: "A1", Key: "a"}, {Name: "A2", Key: "a"}, {Name: "B1", Key: "b"},
		{Name: "C1", Key: "c", Pad: big}, {Name: "C2", Key: "c"}, {Name: "D1", Key: "d"}}
	redrive := crashStep{name: "redrive d1", admin: true, run: func(r *crashRig, p *crashProc) error {
		return r.operator(p, func(ctx context.Context) error {
			err := p.c.Redrive(ctx, crashIDOf("d1"))
			if errors.Is(err, ErrNotParked) {
				return nil // re-drove before its process died
			}
			return err
		})
	}}
	purge := crashStep{name: "purge d1", admin: true, run: func(r *crashRig, p *crashProc) error {
		return r.operator(p, func(ctx context.Context) error {
			_, err := p.c.Admin().PurgeParked(ctx, ParkedFilter{IDs: []InboxID{crashIDOf("d1")}}, false)
			if errors.Is(err, ErrNotParked) {
				return nil
			}
			return err
		})
	}}
	raise := crashStep{name: "raise the topic's limit", admin: true, run: func(r *crashRig, _ *crashProc) error {
		r.kafka.raise()
		return nil
	}}
	retryFailed := crashStep{name: "retry failed", admin: true, run: func(_ *crashRig, p *crashProc) error {
		_, err := p.c.Admin().RetryFailed(p.ctx, FailedFilter{}, nil, false)
		return err
	}}
	discardFailed := crashStep{name: "discard failed", admin: true, run: func(_ *crashRig, p *crashProc) error {
		_, err := p.c.Admin().DiscardFailed(p.ctx, FailedFilter{}, nil, false)
		return err
	}}
	migrate := crashStep{name: "migrate", admin: true, run: func(_ *crashRig, p *crashProc) error {
		_, err := NewAdmin(p.db, libOutbox, libInbox).MigrateEventOutbox(p.ctx, map[string]int{paymentsTopic: 3}, false)
		return err
	}}
	return append([]*crashScenario{
		consumerScenario(&crashScenario{name: "claim", op: "handle-and-claim (single)",
			records: []crashRec{{name: "a1", key: "a"}}}),
		consumerScenario(&crashScenario{name: "claim-batch", op: "handle-and-claim (batch)",
			records: []crashRec{{name: "a1", key: "a"}, {name: "b1", key: "b"}, {name: "c1", key: "c"}, {name: "a2", key: "a"}}}),
		consumerScenario(&crashScenario{name: "park", op: "park (handler, malformed, no handler, failure noted)",
			records: []crashRec{{name: "p1", key: "p", mode: "poison"}, {name: "m1", key: "m", malformed: true},
				{name: "x1", key: "x", schema: "CrashUnknown.v1"}, {name: "f1", key: "f", mode: "flaky"}},
			main: crashRole{poisoned: true}}),
		consumerScenario(&crashScenario{name: "hold", op: "hold (append to a sequence)",
			records: []crashRec{{name: "p1", key: "p", mode: "poison"}, {name: "p2", key: "p"}, {name: "p3", key: "p", malformed: true},
				{name: "p4", key: "p", schema: "CrashUnknown.v1"}, {name: "k1", key: "k"}},
			main: crashRole{poisoned: true}}),
		consumerScenario(&crashScenario{name: "release", op: "release step",
			records: []crashRec{{name: "r1", key: "r", schema: crashAuditSchema}, {name: "r2", key: "r"}, {name: "r3", key: "r", mode: "flaky"},
				{name: "r4", key: "r"}, {name: "s1", key: "s"}},
			setup: setupConsume(crashRole{}), main: crashRole{audit: true}}),
		consumerScenario(&crashScenario{name: "redrive", op: "re-drive (Client.Redrive)", records: heldChain,
			setup: setupConsume(crashRole{poisoned: true}), steps: []crashStep{redrive, consumeStep}}),
		consumerScenario(&crashScenario{name: "purge", op: "purge (Admin.PurgeParked)", records: heldChain,
			setup: setupConsume(crashRole{poisoned: true}), steps: []crashStep{purge, consumeStep}}),
		publisher(&crashScenario{name: "publish-retry", op: "publisher mark / refuse / hold, release by RetryFailed", events: pubEvents,
			steps: []crashStep{publishStep, raise, retryFailed, publishStep}}),
		// DiscardFailed is an operator's tool too, whose transaction (it
		// marks the discarded events' payloads with their deletion) a dead
		// run leaves to the server's lifetime, as the migration's below.
		publisher(&crashScenario{name: "publish-discard", op: "publisher release by DiscardFailed", events: pubEvents,
			discards: map[string]bool{"C1": true}, steps: []crashStep{publishStep, discardFailed, publishStep},
			server: []mongofake.Option{mongofake.TransactionLifetime(time.Second)}}),
		// The migration is an operator's tool: no takeover ends the
		// sessions of a run that died; its transaction (with the locks on
		// the documents it converts) ends with the server's lifetime, which
		// a rerun waits for (the driver retries the write conflict). The
		// lifetime is short here so that the rerun does not wait 60 s.
		{name: "migrate", op: "event-outbox migration", steps: []crashStep{migrate},
			server: []mongofake.Option{mongofake.TransactionLifetime(time.Second)},
			setup: func(r *crashRig) {
				seedLibraryDatabase(r.t, r.checker.db)
				r.libIDs = r.migrationWorld().keys
			},
			check:   func(r *crashRig, _ bool) []string { return r.migrationWorld().violations() },
			outcome: func(r *crashRig) string { return r.migrationWorld().outcome() }},
	}, concurrentCrashScenarios()...)
}

// crashPoint is a write to crash, before it runs or after: the at-th write
// of the process, or (label set; several units at once) the nth write
// labelled label (writeCmd.labels).
type crashPoint struct {
	at    int // 1-based index in the recorded writes
	label string
	nth   int
	after bool
}

func (p crashPoint) String() string {
	where := "before"
	if p.after {
		where = "after"
	}
	if p.label != "" {
		return fmt.Sprintf("%s write %q #%d", where, p.label, p.nth)
	}
	return fmt.Sprintf("%s write %d", where, p.at)
}

// labelledPoints are the crash points of the writes of an uncrashed run
// with several units at once: each label of each write, before it and,
// where it differs, after it.
func labelledPoints(writes []writeCmd) (points []crashPoint, before, after int) {
	seen := map[string]int{}
	for _, w := range writes {
		for _, l := range w.labels() {
			seen[l]++
			points = append(points, crashPoint{label: l, nth: seen[l]})
			before++
			if w.afterMatters() {
				points = append(points, crashPoint{label: l, nth: seen[l], after: true})
				after++
			}
		}
	}
	return points, before, after
}

// errUnreached: a run did not meet its labelled crash point again.
var errUnreached = errors.New("the crash point was not reached")

// crashTally collects the crash points covered, by operation.
type crashTally struct {
	mu  sync.Mutex
	ops []string
	by  map[string]crashOpTally
}

// crashOpTally is the count of one operation.
type crashOpTally struct {
	writes, before, after int
	// With several units at once (slots > 1): the most transactions open
	// at once in the uncrashed run, the crash points at which the process
	// had two or more open when it died, and the crash points no run
	// reached (each also a failure).
	slots, maxOpen, overlapped, unreached int
}

func (c *crashTally) add(op string, n crashOpTally) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]crashOpTally{}
	}
	c.ops = append(c.ops, op)
	c.by[op] = n
}

func (c *crashTally) log(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sort.Strings(c.ops)
	total, conc, concOps, unreached, overlapped := 0, 0, 0, 0, 0
	var b strings.Builder
	for _, op := range c.ops {
		n := c.by[op]
		fmt.Fprintf(&b, "\n  %-60s %3d writes, %3d crash points (%d before the write, %d after it)", op, n.writes, n.before+n.after, n.before, n.after)
		total += n.before + n.after - n.unreached
		if n.slots > 1 {
			fmt.Fprintf(&b, "; up to %d transactions open at once uncrashed, 2 or more open at %d crash points, %d unreached",
				n.maxOpen, n.overlapped, n.unreached)
			conc += n.before + n.after - n.unreached
			concOps++
			unreached += n.unreached
			overlapped += n.overlapped
		}
	}
	t.Logf("crash points covered: %d in %d operations; of them on the concurrent path (KeyConcurrency > 1): %d in %d operations, "+
		"%d with 2 or more transactions open when the process died (and %d not reached, each a failure):%s",
		total, len(c.ops), conc, concOps, overlapped, unreached, b.String())
}

func TestCrashEveryWrite(t *testing.T) {
	t.Parallel()
	tally := &crashTally{}
	t.Cleanup(func() { tally.log(t) })
	for _, sc := range crashScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runCrashScenario(t, sc, tally)
		})
	}
}

func runCrashScenario(t *testing.T, sc *crashScenario, tally *crashTally) {
	srv, writes, want, maxOpen := recordCrashScenario(t, sc)
	var points []crashPoint
	n := crashOpTally{writes: len(writes), slots: sc.keyConcurrency, maxOpen: maxOpen}
	if sc.keyConcurrency > 1 {
		points, n.before, n.after = labelledPoints(writes)
	} else {
		for i, w := range writes {
			points = append(points, crashPoint{at: i + 1})
			n.before++
			if w.afterMatters() {
				points = append(points, crashPoint{at: i + 1, after: true})
				n.after++
			}
		}
	}
	var lines []string
	for i, w := range writes {
		lines = append(lines, fmt.Sprintf("%d. %s", i+1, w))
	}
	t.Logf("%s: %d writes, %d crash points\n%s", sc.op, len(writes), len(points), strings.Join(lines, "\n"))
	for i, pt := range points {
		open, err := runCrashPoint(t, srv, sc, writes, pt, want, i)
		if open >= 2 {
			n.overlapped++
		}
		if errors.Is(err, errUnreached) {
			n.unreached++
		}
		if err != nil {
			what := pt.String()
			if pt.label == "" {
				what += " (" + writes[pt.at-1].String() + ")"
			}
			t.Errorf("crash %s: %v", what, err)
		}
	}
	tally.add(sc.op, n)
}

// recordCrashScenario starts the scenario's server and runs the scenario
// uncrashed: it returns the server, the writes the operation's process
// sent, the outcome, and the most transactions the process had open at
// once (at least 2 with several units at once).
func recordCrashScenario(t *testing.T, sc *crashScenario) (srv *mongofake.Server, writes []writeCmd, outcome string, maxOpen int) {
	srv, err := mongofake.NewServer(sc.server...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	rec := newCrashRig(t, srv, sc, "crash_"+strings.ReplaceAll(sc.name, "-", "_")+"_rec")
	defer rec.close()
	if sc.setup != nil {
		sc.setup(rec)
	}
	p := rec.proc(rec.db+"-main", sc.main, nil)
	rec.crashable(p)
	for _, s := range sc.steps {
		require.NoError(t, s.run(rec, p), "uncrashed step %s", s.name)
	}
	writes = p.recorded()
	require.NotEmpty(t, writes)
	require.Empty(t, sc.check(rec, true), "the uncrashed run breaks an invariant")
	maxOpen, _ = p.overlap()
	if sc.keyConcurrency > 1 {
		require.GreaterOrEqual(t, maxOpen, 2, "with KeyConcurrency %d no two transactions were open at once", sc.keyConcurrency)
	}
	if sc.sharedTxn {
		require.True(t, slices.ContainsFunc(writes, func(w writeCmd) bool {
			return w.name == "commitTransaction" && len(w.labels()) > 1
		}), "no transaction was shared by several events: %v", writes)
	}
	return srv, writes, sc.outcome(rec), maxOpen
}

// A park, or a hold, that meets the locks of a process that died in the
// middle of the same write asks the host to end the dead process's
// sessions (Host.Reap), as a claim does. Before, only a claim, a lookup or
// a release did: the key waited for the server to abort the dead
// transaction (transactionLifetimeLimitSeconds, 60 s by default), past the
// harness's 20 s bound.
func TestCrashParkOrHoldMeetingADeadLockEndsItsSessions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scenario string
		// point tells the crash point: the nth write i of writes for which
		// it holds.
		point func(writes []writeCmd, i int) bool
		nth   int
	}{
		// The commit of the park of m1, a malformed record (parked without
		// a look-up first): its upsert holds m1's document.
		{"park", func(ws []writeCmd, i int) bool {
			return i > 0 && ws[i].name == "commitTransaction" && ws[i-1].name == "findAndModify"
		}, 2},
		// The insert of the hold of p2: the hold's write of its head, p1,
		// holds p1's document.
		{"hold", func(ws []writeCmd, i int) bool {
			return i > 0 && ws[i].name == "update" && ws[i-1].name == "update" && ws[i].inTxn && ws[i-1].inTxn && ws[i].target == "inbox"
		}, 1},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			t.Parallel()
			var sc *crashScenario
			for _, s := range crashScenarios() {
				if s.name == tc.scenario {
					sc = s
				}
			}
			srv, writes, want, _ := recordCrashScenario(t, sc)
			at, n := -1, 0
			for i := range writes {
				if tc.point(writes, i) {
					if n++; n == tc.nth {
						at = i
						break
					}
				}
			}
			require.GreaterOrEqual(t, at, 0, "no such write in %v", writes)
			_, err := runCrashPoint(t, srv, sc, writes, crashPoint{at: at + 1}, want, 0)
			require.NoError(t, err)
		})
	}
}

// runCrashPoint runs the scenario with a process that dies at pt, then the
// recovery, and checks the invariants and the outcome. It returns how many
// transactions the process had open when it died.
func runCrashPoint(t *testing.T, srv *mongofake.Server, sc *crashScenario, writes []writeCmd, pt crashPoint, want string, n int) (int, error) {
	r := newCrashRig(t, srv, sc, fmt.Sprintf("crash_%s_%d", strings.ReplaceAll(sc.name, "-", "_"), n))
	defer r.close()
	if sc.setup != nil {
		sc.setup(r)
	}
	var crash *mongofake.Crash
	if pt.label == "" {
		crash = &mongofake.Crash{Commands: crashWrites, At: pt.at, AfterRun: pt.after}
	}
	p := r.proc(r.db+"-dies", sc.main, crash)
	if pt.label != "" {
		p.mu.Lock()
		p.target = &pt
		p.mu.Unlock()
	}
	r.crashable(p)
	crashed := -1
	for i, s := range sc.steps {
		err := s.run(r, p)
		if p.dead() {
			crashed = i
			break
		}
		if err != nil {
			return 0, fmt.Errorf("step %s failed before the crash point: %w", s.name, err)
		}
	}
	_, open := p.overlap()
	got := p.recorded()
	switch {
	case pt.label != "" && crashed < 0:
		return 0, fmt.Errorf("%w: the run ended without it (writes %v)", errUnreached, got)
	case pt.label == "" && (crashed < 0 || len(got) < pt.at || !slices.Equal(got[:pt.at], writes[:pt.at])):
		return 0, fmt.Errorf("the crash point was not reached as recorded: the writes are not deterministic (got %v, want %v)", got, writes[:pt.at])
	}
	return open, recoverCrash(r, sc, crashed, want)
}

// recoverCrash runs the recovery of a process that died in step crashed,
// and checks the invariants and the outcome.
func recoverCrash(r *crashRig, sc *crashScenario, crashed int, want string) error {
	// The new owner takes over.
	q := r.proc(r.db+"-recovers", sc.main, nil)
	if sc.owner != nil {
		if err := sc.owner.run(r, q); err != nil {
			return fmt.Errorf("the new owner's %s: %w", sc.owner.name, err)
		}
		if v := sc.check(r, false); len(v) > 0 {
			return fmt.Errorf("after the new owner's %s (%s): %s", sc.owner.name, sc.steps[crashed].name, strings.Join(v, "; "))
		}
	}
	// The operator calls again what was cut short; the later steps follow.
	rest := sc.steps[crashed+1:]
	if sc.steps[crashed].admin {
		rest = sc.steps[crashed:]
	}
	for _, s := range rest {
		if err := s.run(r, q); err != nil {
			return fmt.Errorf("recovery step %s: %w", s.name, err)
		}
	}
	if v := sc.check(r, true); len(v) > 0 {
		return fmt.Errorf("after the recovery: %s", strings.Join(v, "; "))
	}
	if got := sc.outcome(r); got != want {
		return fmt.Errorf("the recovery ends elsewhere than the uncrashed run:\n got %s\nwant %s", got, want)
	}
	return nil
}

// migrationWorld is the state of the migrated collections.
type migrationWorld struct {
	// forms gives the form of each library outbox document, by _id:
	// "library" (untouched), "converted", or what else it looks like.
	forms map[string]string
	// want are the library documents seeded.
	want []string
	// keys gives the idempotency key of each library document, by _id.
	keys map[string]string
	// dump is the normalized state (creation times left out, seq as
	// order only).
	dump string
}

// violations: every library outbox document is there exactly once, whole
// in its library form or converted (a migration never loses an event nor
// leaves one half converted).
func (w migrationWorld) violations() []string {
	var out []string
	for _, id := range w.want {
		switch f := w.forms[id]; f {
		case "library", "converted":
		case "":
			out = append(out, fmt.Sprintf("library outbox document %s lost", id))
		default:
			out = append(out, fmt.Sprintf("library outbox document %s half converted: %s", id, f))
		}
	}
	return out
}

func (w migrationWorld) outcome() string { return w.dump }

func (r *crashRig) migrationWorld() migrationWorld {
	ctx := context.Background()
	db := r.checker.db
	w := migrationWorld{forms: map[string]string{}, keys: map[string]string{}}
	var b strings.Builder
	cur, err := db.Collection(libOutbox).Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}, {Key: "_id", Value: 1}}))
	require.NoError(r.t, err)
	var docs []bson.M
	require.NoError(r.t, cur.All(ctx, &docs))
	for _, d := range docs {
		id := fmt.Sprint(d["_id"])
		lib := false
		switch p := d["payload"].(type) {
		case bson.D:
			lib = true
			for _, e := range p {
				if e.Key == "idempotency_key" {
					w.keys[id] = fmt.Sprint(e.Value)
				}
			}
		case bson.M:
			lib = true
			w.keys[id] = fmt.Sprint(p["idempotency_key"])
		}
		_, topic := d["topic"]
		switch {
		case lib && !topic:
			w.forms[id] = "library"
		case topic && !lib && d["format"] == FormatEventOutbox.String() && d["idempotency_key"] != nil && d["payload"] != nil:
			w.forms[id] = "converted"
		default:
			w.forms[id] = fmt.Sprintf("%v", d)
		}
		fmt.Fprintf(&b, "%s\n", r.normalized(d))
	}
	cur, err = db.Collection(libInbox).Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id.idempotency_key", Value: 1}}))
	require.NoError(r.t, err)
	docs = nil
	require.NoError(r.t, cur.All(ctx, &docs))
	for _, d := range docs {
		fmt.Fprintf(&b, "inbox %s\n", r.normalized(d))
	}
	for _, coll := range []string{libOutbox, libInbox} {
		names, err := db.Collection(coll).Indexes().ListSpecifications(ctx)
		require.NoError(r.t, err)
		var ns []string
		for _, s := range names {
			ns = append(ns, s.Name)
		}
		sort.Strings(ns)
		fmt.Fprintf(&b, "indexes of %s: %v\n", coll, ns)
	}
	w.dump = b.String()
	for id := range r.libIDs {
		w.want = append(w.want, id)
	}
	sort.Strings(w.want)
	return w
}

// normalized is d as JSON with sorted keys, without the times a run sets
// (creation, publication, handling, seq: the order of the documents is
// compared instead) and with the seeded ids by their rank.
func (r *crashRig) normalized(d bson.M) string {
	for _, k := range []string{"created_at", "seq", "published_at", "handled_at"} {
		delete(d, k)
	}
	if key, ok := r.libIDs[fmt.Sprint(d["_id"])]; ok {
		d["_id"] = "library document " + key
	}
	out, err := json.Marshal(d)
	require.NoError(r.t, err)
	return string(out)
}

func TestCrashMigrationInvariantsCatchBadStates(t *testing.T) {
	t.Parallel()
	good := migrationWorld{forms: map[string]string{"1": "library", "2": "converted"}, want: []string{"1", "2"}}
	require.Empty(t, good.violations())
	lost := migrationWorld{forms: map[string]string{"1": "library"}, want: []string{"1", "2"}}
	require.Contains(t, strings.Join(lost.violations(), "\n"), "2 lost")
	half := migrationWorld{forms: map[string]string{"1": "library", "2": "map[_id:2 topic:payments]"}, want: []string{"1", "2"}}
	require.Contains(t, strings.Join(half.violations(), "\n"), "2 half converted")
}

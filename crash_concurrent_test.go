package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// The concurrent path in the crash harness: the crash points are also crashed
// with several units of a partition running at once, because the interleavings
// of their transactions are states the one-unit path never reaches.
//
// With Config.KeyConcurrency above 1 a partition runs several units at
// once, each its own transaction: the order in which their writes reach
// MongoDB, and which events share a transaction, change from run to run.
// "The Nth write of the process" is then a different write in each run, so
// these scenarios name a crash point by what it writes instead: each write
// is labelled by the events its statements name (an inbox document's
// idempotency key, the event a handler's effect pushes; a commit or an
// abort carries the events of its transaction), and a crash point is "the
// nth write of kind K naming event E" (crashPoint.label, nth), before it
// or after it. Each event's writes come in one order whatever the other
// keys do (a key's lane runs one unit at a time), so every crash point of
// the uncrashed run is met again in every run; one that is not is counted
// in the log and fails the test.
//
// The process dies at its crash point from its own command monitor: before
// the write is sent (in the Started event) or once its reply came back
// (Succeeded, Failed), it arms mongofake.Server.Crash to refuse every
// command it sends from then on, marks itself dead (no offset commit goes
// out after) and ends its context. A write of another unit already on its
// way to the server may still run or be refused: either is a state a kill
// -9 leaves (what ran is a prefix of what the server received), and it is
// why these crash points are not compared write by write with the
// uncrashed run.
//
// Overlap is shown, not assumed: the handlers of the scenario's barrier
// events (the first units, one per key) wait for each other in the process
// whose writes are crashed, so that their transactions are open at once;
// the monitor counts the transactions open at once in the uncrashed run
// (which must reach 2) and at each crash.

// crashAllCommands are the commands a dead process is refused: every
// command it may send (reads too: nothing it sends after its death runs).
var crashAllCommands = append(slices.Clone(crashWrites), "find", "aggregate", "getMore", "killCursors", "count",
	"distinct", "listIndexes", "listCollections", "killSessions", "endSessions", "refreshSessions", "ping", "create", "drop", "dropDatabase")

var crashWriteSet = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range crashWrites {
		m[w] = true
	}
	return m
}()

// started is the process's command monitor for a command it sends: it
// records the write commands, follows its transactions, and dies before
// the write of its crash point.
func (p *crashProc) started(_ context.Context, e *event.CommandStartedEvent) {
	if p.note(e) {
		p.die()
	}
}

// note records e and reports whether the process dies before sending it.
func (p *crashProc) note(e *event.CommandStartedEvent) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var lsid bson.Raw
	if id, err := e.Command.LookupErr("lsid"); err == nil {
		if doc, ok := id.DocumentOK(); ok {
			lsid = doc
			p.lsids[string(doc)] = slices.Clone(doc)
		}
	}
	_, err := e.Command.LookupErr("autocommit")
	inTxn := err == nil
	var txn string
	if inTxn {
		n, _ := e.Command.Lookup("txnNumber").AsInt64OK()
		txn = fmt.Sprintf("%x/%d", []byte(lsid), n)
	}
	var evs []string
	switch e.CommandName {
	case "commitTransaction", "abortTransaction":
		evs = p.txnEvents[txn]
		p.closing[e.RequestID] = txn
	default:
		evs = commandEvents(e.CommandName, e.Command)
		if inTxn {
			p.open[txn] = true
			p.maxOpen = max(p.maxOpen, len(p.open))
			for _, ev := range evs {
				if !slices.Contains(p.txnEvents[txn], ev) {
					p.txnEvents[txn] = append(p.txnEvents[txn], ev)
				}
			}
		}
	}
	if !crashWriteSet[e.CommandName] {
		return false
	}
	w := writeCmd{name: e.CommandName, inTxn: inTxn, events: strings.Join(evs, " ")}
	if v, err := e.Command.LookupErr(e.CommandName); err == nil {
		w.target, _ = v.StringValueOK()
	}
	p.writes = append(p.writes, w)
	die := false
	for _, l := range w.labels() {
		p.seen[l]++
		if t := p.target; t != nil && t.label == l && t.nth == p.seen[l] {
			if t.after {
				p.afterReq = e.RequestID
			} else {
				die = true
			}
		}
	}
	return die
}

// finished is the process's command monitor for a reply: a transaction
// whose commit or abort came back is closed; the process dies after the
// write of its crash point.
func (p *crashProc) finished(req int64) {
	p.mu.Lock()
	if txn, ok := p.closing[req]; ok {
		delete(p.closing, req)
		delete(p.open, txn)
	}
	die := req == p.afterReq
	p.mu.Unlock()
	if die {
		p.die()
	}
}

// die kills the process at its labelled crash point: the server refuses
// every command it sends from now on, it commits no offset, and its
// context ends.
func (p *crashProc) die() {
	p.dieOnce.Do(func() {
		cr, err := p.r.srv.Crash(mongofake.Crash{AppName: p.name, Commands: crashAllCommands, At: 1})
		if err != nil {
			p.r.t.Errorf("arm the crash of %s: %v", p.name, err)
		}
		p.mu.Lock()
		p.armed, p.openAtEnd = cr, len(p.open)
		p.mu.Unlock()
		close(p.died)
		p.cancel()
	})
}

// overlap returns the most transactions the process had open at once, and
// how many it had open when it died.
func (p *crashProc) overlap() (most, atDeath int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxOpen, p.openAtEnd
}

// labels are the crash-point labels of w: "event: kind" for each event it
// names (a key's sequence only when it names no event; "?" when it names
// nothing). A write that names several events is crashed once for each,
// so that every event's writes are crashed whichever transaction it shares
// in a run: a batch of one run may be two transactions in the next.
func (w writeCmd) labels() []string {
	var evs []string
	for _, e := range strings.Fields(w.events) {
		if !strings.HasPrefix(e, "key=") {
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		evs = strings.Fields(w.events)
	}
	if len(evs) == 0 {
		evs = []string{"?"}
	}
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e + ": " + w.kind()
	}
	return out
}

// commandEvents returns the events a command's statements name, in order,
// each once: the idempotency key of an inbox document (its _id), the event
// a handler's effect pushes, or else "key=K" for a statement that selects
// a key's sequence (a release's read of its head).
func commandEvents(name string, cmd bson.Raw) []string {
	var stmts [][2]bson.Raw // filter (or document), update
	doc := func(v bson.RawValue) bson.Raw { d, _ := v.DocumentOK(); return d }
	each := func(field string, f func(bson.Raw)) {
		arr, ok := cmd.Lookup(field).ArrayOK()
		if !ok {
			return
		}
		vals, _ := arr.Values()
		for _, v := range vals {
			f(doc(v))
		}
	}
	switch name {
	case "update":
		each("updates", func(d bson.Raw) { stmts = append(stmts, [2]bson.Raw{doc(d.Lookup("q")), doc(d.Lookup("u"))}) })
	case "delete":
		each("deletes", func(d bson.Raw) { stmts = append(stmts, [2]bson.Raw{doc(d.Lookup("q")), nil}) })
	case "insert":
		each("documents", func(d bson.Raw) { stmts = append(stmts, [2]bson.Raw{d, nil}) })
	case "findAndModify":
		stmts = append(stmts, [2]bson.Raw{doc(cmd.Lookup("query")), doc(cmd.Lookup("update"))})
	case "find":
		stmts = append(stmts, [2]bson.Raw{doc(cmd.Lookup("filter")), nil})
	}
	var out []string
	for _, st := range stmts {
		ev := statementEvent(st[0], st[1])
		if ev != "" && !slices.Contains(out, ev) {
			out = append(out, ev)
		}
	}
	return out
}

func statementEvent(q, u bson.Raw) string {
	str := func(d bson.Raw, path ...string) string {
		if d == nil {
			return ""
		}
		v, err := d.LookupErr(path...)
		if err != nil {
			return ""
		}
		s, _ := v.StringValueOK()
		return s
	}
	switch {
	case str(q, "_id", "idempotency_key") != "":
		return str(q, "_id", "idempotency_key")
	case str(q, "_id.idempotency_key") != "":
		return str(q, "_id.idempotency_key")
	case str(u, "$push", "handled") != "":
		return str(u, "$push", "handled")
	case str(q, "partition_key") != "":
		return "key=" + str(q, "partition_key")
	}
	return ""
}

// crashBarrier makes the handlers of its events wait until all of them
// run at once (each in its own transaction), or their context ends: in
// the process whose writes are crashed, so that its first units overlap.
type crashBarrier struct {
	mu      sync.Mutex
	want    map[string]bool
	arrived map[string]bool
	all     chan struct{}
}

func newCrashBarrier(names []string) *crashBarrier {
	if len(names) == 0 {
		return nil
	}
	b := &crashBarrier{want: map[string]bool{}, arrived: map[string]bool{}, all: make(chan struct{})}
	for _, n := range names {
		b.want[n] = true
	}
	return b
}

// wait returns at once for an event not in b (or a nil b).
func (b *crashBarrier) wait(ctx context.Context, name string) error {
	if b == nil || !b.want[name] {
		return nil
	}
	b.mu.Lock()
	if !b.arrived[name] {
		b.arrived[name] = true
		if len(b.arrived) == len(b.want) {
			close(b.all)
		}
	}
	n := len(b.arrived)
	b.mu.Unlock()
	t := time.NewTimer(crashQuietTimeout)
	defer t.Stop()
	select {
	case <-b.all:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("crash barrier: only %d of the %d handlers %v ran at once within %v", n, len(b.want), b.want, crashQuietTimeout)
	}
}

// crashable makes p the process whose writes are crashed: the scenario's
// barrier and gate run before its handlers, and its bug is planted.
func (r *crashRig) crashable(p *crashProc) {
	b := newCrashBarrier(r.sc.barrier)
	gate := r.sc.gate
	p.gate = func(ctx context.Context, name string) error {
		if err := b.wait(ctx, name); err != nil || gate == nil {
			return err
		}
		return gate(r, p, name)
	}
	p.bug = r.sc.bug
}

// concurrentCrashScenarios are the consumer's operations with several units
// at once (KeyConcurrency 4).
func concurrentCrashScenarios() []*crashScenario {
	const slots = 4
	return []*crashScenario{
		// Eight events of seven keys on four slots: the first four units
		// (one event each, counting its attempt first) overlap; when the
		// first of them ends, at least three lanes are ready for one free
		// slot, so the next unit takes them in one transaction (sharedTxn).
		consumerScenario(&crashScenario{name: "claim-concurrent", op: "handle-and-claim (KeyConcurrency 4, batched)",
			keyConcurrency: slots, barrier: []string{"a1", "b1", "c1", "d1"}, sharedTxn: true,
			records: []crashRec{{name: "a1", key: "a"}, {name: "b1", key: "b"}, {name: "c1", key: "c"}, {name: "d1", key: "d"},
				{name: "e1", key: "e"}, {name: "f1", key: "f"}, {name: "g1", key: "g"}, {name: "a2", key: "a"}}}),
		// Two keys parked at once by their handlers, held events of both
		// (one malformed, one without a handler) appended while other keys
		// run, a failure noted beside them. One event a transaction, so
		// that a rolled-back batch does not add claims of its neighbours.
		consumerScenario(&crashScenario{name: "park-hold-concurrent", op: "park and hold (KeyConcurrency 4)",
			keyConcurrency: slots, batch: 1, barrier: []string{"p1", "q1", "k1", "f1"}, main: crashRole{poisoned: true},
			records: []crashRec{{name: "p1", key: "p", mode: "poison"}, {name: "q1", key: "q", mode: "poison"}, {name: "k1", key: "k"},
				{name: "f1", key: "f", mode: "flaky"}, {name: "p2", key: "p"}, {name: "q2", key: "q", malformed: true},
				{name: "p3", key: "p", schema: "CrashUnknown.v1"}, {name: "q3", key: "q"}}}),
		// Three held keys released at once (their heads wait for the audit
		// handler, which the new process has), one with a failing event in
		// its sequence.
		consumerScenario(&crashScenario{name: "release-concurrent", op: "release steps (KeyConcurrency 4)",
			keyConcurrency: slots, batch: 1, barrier: []string{"r1", "s1", "t1"}, main: crashRole{audit: true},
			setup: setupConsume(crashRole{}),
			records: []crashRec{{name: "r1", key: "r", schema: crashAuditSchema}, {name: "s1", key: "s", schema: crashAuditSchema},
				{name: "t1", key: "t", schema: crashAuditSchema}, {name: "r2", key: "r"}, {name: "s2", key: "s", mode: "flaky"},
				{name: "t2", key: "t"}, {name: "r3", key: "r"}}}),
	}
}

// TestCrashInvariantsCatchConcurrencyBugs proves the consumer's invariants
// on the concurrent path by the bugs they catch: states of several keys
// that units running at once could leave, then crashed runs at
// KeyConcurrency 4 of a consumer with a planted defect, recovered by a
// sound one.
func TestCrashInvariantsCatchConcurrencyBugs(t *testing.T) {
	t.Parallel()
	// a1 b1 c1 a2 b2, all handled, a key's in offset order, the keys'
	// effects interleaved as units at once commit them.
	good := func() consumerWorld {
		w := consumerWorld{
			records: []crashRec{{name: "a1", key: "a"}, {name: "b1", key: "b"}, {name: "c1", key: "c"}, {name: "a2", key: "a"}, {name: "b2", key: "b"}},
			inbox:   map[string]crashInbox{},
			effects: map[string][]string{"a": {"a1", "a2"}, "b": {"b1", "b2"}, "c": {"c1"}}, committed: 5,
			handles: func(string) bool { return true },
		}
		for i, r := range w.records {
			w.inbox[r.name] = crashInbox{name: r.name, key: r.key, offset: int64(i), handled: true}
		}
		return w
	}
	require.Empty(t, good().violations(), "the good state passes")
	unsettled := func(w *consumerWorld, names ...string) {
		for _, n := range names {
			delete(w.inbox, n)
			for k, effs := range w.effects {
				w.effects[k] = slices.DeleteFunc(effs, func(e string) bool { return e == n })
			}
		}
	}
	for _, tc := range []struct {
		name  string
		spoil func(w *consumerWorld)
		want  string
	}{
		{"two units of one key at once, the later committed first", func(w *consumerWorld) { w.effects["a"] = []string{"a2", "a1"} },
			`key "a": a1 (offset 0) handled after an event at offset 3`},
		{"a key's later event handled while its first is in flight", func(w *consumerWorld) {
			unsettled(w, "a1")
			w.committed = 0
		}, `key "a": a2 (offset 3) handled while the earlier a1 (offset 0) waits`},
		{"the offset of the last settled event committed past an unsettled one of another key", func(w *consumerWorld) {
			unsettled(w, "a1", "a2")
		}, "offset 5 committed past a1 (offset 0), which is not settled"},
	} {
		w := good()
		tc.spoil(&w)
		require.Contains(t, strings.Join(w.violations(), "\n"), tc.want, tc.name)
	}

	// A crash point that a run does not meet fails, as unreached.
	t.Run("unreached", func(t *testing.T) {
		t.Parallel()
		srv, err := mongofake.NewServer()
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Close()) })
		sc := consumerScenario(&crashScenario{name: "unreached", keyConcurrency: 4, records: []crashRec{{name: "a1", key: "a"}, {name: "b1", key: "b"}}})
		_, err = runCrashPoint(t, srv, sc, nil, crashPoint{label: "a1: commitTransaction", nth: 3}, "", 0)
		require.ErrorIs(t, err, errUnreached)
	})

	// Crashed runs with a planted defect: the harness must fail them. The
	// same crash point of a sound consumer (its handler waiting for an
	// event of another key instead, which a sound consumer runs at once)
	// passes.
	effectOf := func(r *crashRig, key, name string) bool {
		n, err := r.checker.db.Collection(crashEffects).CountDocuments(context.Background(),
			bson.D{{Key: "_id", Value: key}, {Key: "handled", Value: name}})
		return err == nil && n > 0
	}
	// a1's handler waits until cond holds.
	a1Waits := func(what string, cond func(r *crashRig) bool) func(r *crashRig, p *crashProc, name string) error {
		return func(r *crashRig, p *crashProc, name string) error {
			if name != "a1" {
				return nil
			}
			return r.quiet(p, what, func() bool { return cond(r) })
		}
	}
	othersHandled := a1Waits("b1 and c1 handled", func(r *crashRig) bool { return effectOf(r, "b", "b1") && effectOf(r, "c", "c1") })
	for _, tc := range []struct {
		name  string
		bug   func(p *crashProc, cfg *consume.Config)
		gate  func(r *crashRig, p *crashProc, name string) error
		point crashPoint
		want  string
	}{
		// Each event its own lane: a key's events run at once. a1's handler
		// waits until a2's effect committed; the process dies once a1's
		// transaction committed too.
		{"a key's events in two lanes", func(_ *crashProc, cfg *consume.Config) { cfg.Host = laneEachHost{cfg.Host} },
			a1Waits("a2 handled", func(r *crashRig) bool { return effectOf(r, "a", "a2") }),
			crashPoint{label: "a1: commitTransaction", nth: 2, after: true},
			`key "a": a1 (offset 0) handled after an event at offset 3`},
		// The offset after each settled event committed, not the lowest
		// unsettled one: a1's handler waits until c1's next offset was
		// committed; the process dies before a1's transaction commits.
		{"each settled event's offset committed", func(p *crashProc, cfg *consume.Config) { cfg.Observer = commitEachSettled{cfg.Observer, p} },
			a1Waits("c1's offset committed", func(r *crashRig) bool { return r.commits.next() == 3 }),
			crashPoint{label: "a1: commitTransaction", nth: 2},
			"committed past a1 (offset 0), which is not settled"},
	} {
		sc := func(bug func(p *crashProc, cfg *consume.Config), gate func(r *crashRig, p *crashProc, name string) error) *crashScenario {
			return consumerScenario(&crashScenario{name: "bug", keyConcurrency: 4, bug: bug, gate: gate,
				records: []crashRec{{name: "a1", key: "a"}, {name: "b1", key: "b"}, {name: "c1", key: "c"}, {name: "a2", key: "a"}}})
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, err := mongofake.NewServer()
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, srv.Close()) })
			_, err = runCrashPoint(t, srv, sc(tc.bug, tc.gate), nil, tc.point, "", 0)
			require.ErrorContains(t, err, tc.want, "the planted defect")
			sound := sc(nil, othersHandled)
			// a1 and b1 meet in their handlers, so that the sound run has
			// two transactions open at once however the machine schedules
			// the units (recordCrashScenario requires it).
			sound.barrier = []string{"a1", "b1"}
			_, _, want, _ := recordCrashScenario(t, sound)
			_, err = runCrashPoint(t, srv, sound, nil, tc.point, want, 1)
			require.NoError(t, err, "the same crash point of a sound consumer")
		})
	}
}

// laneEachHost is a defect: it gives each event a partition key of its
// own, so that the scheduler runs a key's events at once.
type laneEachHost struct{ consume.Host }

func (h laneEachHost) Decode(rec *kgo.Record) *consume.Event {
	e := h.Host.Decode(rec)
	e.Key = fmt.Sprintf("%s#%d", e.Key, rec.Offset)
	return e
}

// commitEachSettled is a defect: it commits the offset after each event
// settled, past the events of other keys still running.
type commitEachSettled struct {
	consume.Observer
	p *crashProc
}

func (o commitEachSettled) Settled(tp consume.TopicPartition, e *consume.Event, how, reason string) {
	o.Observer.Settled(tp, e, how, reason)
	_ = o.p.r.commits.commit(o.p, e.Offset+1)
}

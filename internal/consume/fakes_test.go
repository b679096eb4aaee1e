package consume

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Fakes of the consumer's surroundings, for the Worker and Set tests: a
// Host that keeps the inbox and its key sequences in memory as the Host
// contract (consume.go) and internal/inboxhost's keyseq.go describe them, a
// Pauser that keeps pauses as kgo does, and an Observer that records.
//
// A record's Key is its partition key; its Value is "id|script" (then
// maybe "|" and padding, for its size): the
// event's identity in the inbox (its idempotency key) and what its handler
// does (see fakeScript). The fake checks the consumer's promises as it
// goes and records each breach in violations: per-key order (an event is
// handled only once every earlier event of its key is handled or
// skipped), no two units on a key at once, each event handled at most
// once, and no offset committed past an unsettled event.

// fakeDoc is an inbox document.
type fakeDoc struct {
	id       string
	tp       TopicPartition
	key      string
	offset   int64
	handled  bool
	parked   bool
	heldBy   string // the head the event was held behind; "" when not held
	reason   string // park reason
	attempts int
	failures int
	lastErr  string
}

// fakeScript is what an event's handler does, by run (runs counts the
// handler's runs, framework failures included):
//
//	ok             succeeds
//	fail:N         fails its first N runs (N = -1: for ever)
//	failto:N       fails while its attempt number is N or less
//	park           asks to park (a ParkError)
//	snooze:N       snoozes its first N runs
//	conflict:N     meets a write conflict in its first N runs
//	locked:N       the framework's claim meets a lock in its first N runs
//	infra:N        the framework's calls fail in its first N runs
//	block          waits until unblock(id) (or its context ends)
//	nohandler      no handler (until deploy()), then succeeds
//	malformed      the record cannot be decoded
type fakeScript struct {
	kind string
	n    int
	runs int
	gate chan struct{} // block: closed by unblock
}

func parseScript(s string) *fakeScript {
	kind, arg, _ := strings.Cut(s, ":")
	n := 0
	if arg != "" {
		var err error
		if n, err = strconv.Atoi(arg); err != nil {
			panic("bad script " + s)
		}
	}
	switch kind {
	case "ok", "fail", "failto", "park", "snooze", "conflict", "locked", "infra", "nohandler", "malformed":
	case "block":
		return &fakeScript{kind: kind, gate: make(chan struct{})}
	default:
		panic("bad script " + s)
	}
	return &fakeScript{kind: kind, n: n}
}

// handledRec is an entry of the global order log.
type handledRec struct {
	TP       TopicPartition
	Key      string
	Offset   int64
	ID       string
	Released bool // handled by a release step (Host.Release)
}

// lookupCall is a recorded Host.Lookup.
type lookupCall struct {
	IDs   []string
	Count bool
}

type seenRec struct {
	id  string
	key string
}

var (
	errFakeHandler = errors.New("handler failed")
	errFakeInfra   = errors.New("mongodb unreachable")
	errFakeCommit  = errors.New("commit refused")
)

// fakeHost is the fake Host. Safe for concurrent use.
type fakeHost struct {
	obs *recObserver
	// policy is every event's retry policy.
	policy Policy

	mu       sync.Mutex
	deployed bool // handlers of "nohandler" events are deployed
	// stream: the records are one consistent stream (each partition fed
	// from where its last owner committed), so commits are checked never
	// to pass an unsettled event, and handlings to keep each key's order.
	// Off for tests that feed records from wherever they are.
	stream  bool
	docs    map[string]*fakeDoc
	keyDocs map[string][]*fakeDoc // docs by tp/key, for first (see put)
	scripts map[string]*fakeScript
	seen    map[TopicPartition]map[int64]seenRec // decoded records
	// keyOffs is the offsets of each tp/key decoded, sorted; keyDone counts
	// those of its first ones known handled or skipped (both for good).
	keyOffs      map[string][]int64
	keyDone      map[string]int
	checkedTo    map[TopicPartition]int64 // commits checked below this offset
	busy         map[string]int           // running units by tp/key
	order        []handledRec
	handles      map[string]int   // handler commits by event
	attempts     map[string][]int // attempt numbers the handler saw, by event
	lookups      []lookupCall
	handleCalls  [][]string
	holds        []string // events held, in call order
	noteFailures int
	releaseFails []string // NoteReleaseFailure calls, by event
	commits      map[TopicPartition][]int64
	failCommits  int // the next commits that fail
	failOps      map[string]int
	reaps        int
	violations   []string
	trace        []string    // every call, for the failure messages
	blocked      chan string // ids of "block" events as their handler starts
	// seqGate, when set, makes Sequences wait for it after its read (a
	// read that MongoDB is slow to answer); seqRead is told of each read.
	seqGate  chan struct{}
	seqRead  chan struct{}
	seqCalls int
	// commitGate, when set, makes commits wait for it (a slow broker).
	commitGate chan struct{}
	atGate     atomic.Int32 // commits waiting for commitGate
	canceled   []string     // events whose handler saw its context end
}

func newFakeHost(obs *recObserver, policy Policy) *fakeHost {
	return &fakeHost{obs: obs, policy: policy, stream: true,
		docs: map[string]*fakeDoc{}, keyDocs: map[string][]*fakeDoc{}, scripts: map[string]*fakeScript{}, seen: map[TopicPartition]map[int64]seenRec{},
		keyOffs: map[string][]int64{}, keyDone: map[string]int{}, checkedTo: map[TopicPartition]int64{},
		busy: map[string]int{}, handles: map[string]int{}, attempts: map[string][]int{},
		commits: map[TopicPartition][]int64{}, failOps: map[string]int{}, blocked: make(chan string, 64)}
}

// fakeRecord is a record of tp at offset for the fake's Decode.
func fakeRecord(tp TopicPartition, offset int64, key, id, script string) *kgo.Record {
	return &kgo.Record{Topic: tp.Topic, Partition: tp.Partition, Offset: offset, LeaderEpoch: 1,
		Key: []byte(key), Value: []byte(id + "|" + script)}
}

func (f *fakeHost) violate(format string, args ...any) {
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

// maxTrace bounds the trace (the hammers make millions of calls).
const maxTrace = 100_000

// note adds to the trace. Under f.mu.
func (f *fakeHost) note(format string, args ...any) {
	if len(f.trace) < maxTrace {
		f.trace = append(f.trace, fmt.Sprintf(format, args...))
	}
}

// traceOf returns the trace entries that mention s.
func (f *fakeHost) traceOf(s string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.trace {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// Violations returns the breaches met so far.
func (f *fakeHost) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.violations)
}

func idOf(e *Event) string {
	id, _ := e.Data.(string)
	return id
}

// failOp reports whether op ("hold", "park", "note", "lookup", "lookup_locked",
// "sequences", "head") is to fail now. Under f.mu.
func (f *fakeHost) failOp(op string) bool {
	if f.failOps[op] > 0 {
		f.failOps[op]--
		return true
	}
	return false
}

func (f *fakeHost) Decode(rec *kgo.Record) *Event {
	id, sc, _ := strings.Cut(string(rec.Value), "|")
	sc, _, _ = strings.Cut(sc, "|") // padding may follow
	tp := TopicPartition{rec.Topic, rec.Partition}
	key := string(rec.Key)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen[tp] == nil {
		f.seen[tp] = map[int64]seenRec{}
	}
	if _, ok := f.seen[tp][rec.Offset]; !ok && key != "" {
		bk := tp.String() + "/" + key
		offs := f.keyOffs[bk]
		i, _ := slices.BinarySearch(offs, rec.Offset)
		f.keyOffs[bk] = slices.Insert(offs, i, rec.Offset)
		f.keyDone[bk] = min(f.keyDone[bk], i)
	}
	f.seen[tp][rec.Offset] = seenRec{id, key}
	f.note("decode %s [%s] %s", id, key, sc)
	s := f.scripts[id]
	if s == nil {
		s = parseScript(sc)
		f.scripts[id] = s
	}
	e := &Event{Key: key, Data: id, Policy: f.policy}
	switch {
	case s.kind == "malformed":
		e.Fault = errors.New("malformed record")
	case s.kind == "nohandler" && !f.deployed:
		e.NoHandler = true
	}
	return e
}

// doc returns the document of e, creating it as a delivery would. Under
// f.mu.
func (f *fakeHost) doc(tp TopicPartition, e *Event) *fakeDoc {
	id := idOf(e)
	if id == "" {
		f.violate("a settled event (offset %d) handed to the host again", e.Offset)
	}
	d := f.docs[id]
	if d == nil {
		d = &fakeDoc{id: id, tp: tp, key: e.Key, offset: e.Offset}
		f.put(d)
	}
	return d
}

// first returns the head of key's sequence in tp. Under f.mu.
// put stores a new document. Under f.mu.
func (f *fakeHost) put(d *fakeDoc) {
	f.docs[d.id] = d
	bk := d.tp.String() + "/" + d.key
	f.keyDocs[bk] = append(f.keyDocs[bk], d)
}

func (f *fakeHost) first(tp TopicPartition, key string) *fakeDoc {
	var h *fakeDoc
	for _, d := range f.keyDocs[tp.String()+"/"+key] {
		if d.parked && d.tp == tp && d.key == key && (h == nil || d.offset < h.offset) {
			h = d
		}
	}
	return h
}

// releasable: a held head, or one parked for want of a handler now here.
// Under f.mu.
func (f *fakeHost) releasable(d *fakeDoc) bool {
	return d.heldBy != "" || (d.reason == "no_handler" && f.deployed)
}

func (f *fakeHost) Sequences(ctx context.Context, tp TopicPartition) (map[string]Head, error) {
	heads, gate, err := f.sequences(tp)
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return heads, err
}

func (f *fakeHost) sequences(tp TopicPartition) (map[string]Head, chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seqCalls++
	if f.seqRead != nil {
		select {
		case f.seqRead <- struct{}{}:
		default:
		}
	}
	gate := f.seqGate
	if f.failOp("sequences") {
		return nil, gate, errFakeInfra
	}
	heads := map[string]Head{}
	for _, d := range f.docs {
		if !d.parked || d.tp != tp || d.key == "" {
			continue
		}
		if h, ok := heads[d.key]; ok && f.docs[h.ID].offset < d.offset {
			continue
		}
		heads[d.key] = Head{ID: d.id, Releasable: f.releasable(d)}
	}
	for k, h := range heads {
		f.note("sequences [%s]: head %s releasable=%v", k, h.ID, h.Releasable)
	}
	return heads, gate, nil
}

func (f *fakeHost) Head(ctx context.Context, tp TopicPartition, key string) (Head, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOp("head") {
		return Head{}, false, errFakeInfra
	}
	d := f.first(tp, key)
	if d == nil {
		return Head{}, false, nil
	}
	f.note("head [%s]: %s releasable=%v", key, d.id, f.releasable(d))
	return Head{ID: d.id, Releasable: f.releasable(d)}, true, nil
}

func (f *fakeHost) Hold(ctx context.Context, tp TopicPartition, e *Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOp("hold") {
		return errFakeInfra
	}
	h := f.first(tp, e.Key)
	if h == nil {
		f.note("hold %s [%s]: key free", idOf(e), e.Key)
		return ErrKeyFree
	}
	d := f.doc(tp, e)
	if d.handled || d.parked {
		return ErrDone
	}
	d.parked, d.heldBy, d.lastErr = true, h.id, "held behind "+h.id
	f.holds = append(f.holds, d.id)
	f.note("hold %s [%s] behind %s", d.id, d.key, h.id)
	return nil
}

func (f *fakeHost) Park(ctx context.Context, tp TopicPartition, e *Event, cause error, inc, fails int, reason string) (Tally, error) {
	return f.noteDelivery("park", tp, e, cause, inc, fails, reason)
}

func (f *fakeHost) NoteFailure(ctx context.Context, tp TopicPartition, e *Event, cause error, inc int) (Tally, error) {
	return f.noteDelivery("note", tp, e, cause, inc, 1, "")
}

// noteDelivery stores a delivered event's failure, as the root package's
// noteDelivery does: inc more attempts, fails more failures and the
// cause, parked for reason when one is given; ErrDone when the event is
// handled or parked.
func (f *fakeHost) noteDelivery(op string, tp TopicPartition, e *Event, cause error, inc, fails int, reason string) (Tally, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOp(op) {
		return Tally{}, errFakeInfra
	}
	d := f.doc(tp, e)
	if d.handled || d.parked {
		return Tally{}, ErrDone
	}
	if reason != "" {
		d.parked, d.reason = true, reason
	} else {
		f.noteFailures++
	}
	d.attempts += inc
	d.failures += fails
	d.lastErr = cause.Error()
	f.note("%s %s [%s] %s +%d = %d", op, d.id, d.key, reason, inc, d.attempts)
	return Tally{d.attempts, d.failures}, nil
}

func (f *fakeHost) Lookup(ctx context.Context, tp TopicPartition, evs []*Event, count bool) ([]Stored, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := lookupCall{Count: count}
	for _, e := range evs {
		call.IDs = append(call.IDs, idOf(e))
	}
	f.lookups = append(f.lookups, call)
	f.note("lookup %v %v count=%v", call.IDs, keysOf(evs), count)
	if f.failOp("lookup_locked") {
		return nil, fmt.Errorf("count attempts: %w", ErrLocked)
	}
	if f.failOp("lookup") {
		return nil, errFakeInfra
	}
	out := make([]Stored, len(evs))
	for i, e := range evs {
		d := f.docs[idOf(e)]
		if d != nil && (d.handled || d.parked) {
			out[i] = Stored{Done: true, Attempts: d.attempts, Failures: d.failures}
			continue
		}
		if count {
			d = f.doc(tp, e)
			d.attempts++
		}
		if d != nil {
			out[i].Attempts, out[i].Failures = d.attempts, d.failures
		}
	}
	return out, nil
}

// enter marks the keys of a unit busy, recording a violation when another
// unit holds one; exit frees them. Under f.mu.
func (f *fakeHost) enter(tp TopicPartition, keys []string) []string {
	var marked []string
	for _, k := range keys {
		if k == "" || slices.Contains(marked, tp.String()+"/"+k) {
			continue
		}
		bk := tp.String() + "/" + k
		if f.busy[bk] > 0 {
			f.violate("key %q of %s in two units at once", k, tp)
		}
		f.busy[bk]++
		marked = append(marked, bk)
	}
	return marked
}

func (f *fakeHost) exit(marked []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, bk := range marked {
		f.busy[bk]--
	}
}

// run runs the script of e once. Called without f.mu.
func (f *fakeHost) run(ctx context.Context, e *Event) Result {
	if ctx.Err() != nil {
		return Result{Kind: Canceled, Err: ctx.Err()}
	}
	id := idOf(e)
	f.mu.Lock()
	s := f.scripts[id]
	if s == nil {
		f.violate("event %q run without a script", id)
		f.mu.Unlock()
		return Result{Kind: Infra, Err: errFakeInfra}
	}
	s.runs++
	runs, kind, n, gate := s.runs, s.kind, s.n, s.gate
	before := kind == "locked" || kind == "infra"
	if !before || runs > n {
		f.attempts[id] = append(f.attempts[id], e.Attempt())
	}
	f.mu.Unlock()
	// Let other units interleave, as a handler's I/O would.
	runtime.Gosched()
	switch kind {
	case "fail":
		if n < 0 || runs <= n {
			return Result{Kind: Failed, Err: errFakeHandler}
		}
	case "failto":
		if e.Attempt() <= n {
			return Result{Kind: Failed, Err: errFakeHandler}
		}
	case "park":
		return Result{Kind: Failed, Err: errors.New("handler asked to park"), Park: true}
	case "snooze":
		if runs <= n {
			return Result{Kind: Snoozed, Err: errors.New("snoozed"), Snooze: time.Millisecond}
		}
	case "conflict":
		if runs <= n {
			return Result{Kind: Conflict, Err: errors.New("write conflict")}
		}
	case "locked":
		if runs <= n {
			return Result{Kind: Locked, Err: fmt.Errorf("claim: %w", ErrLocked)}
		}
	case "infra":
		if runs <= n {
			return Result{Kind: Infra, Err: errFakeInfra}
		}
	case "block":
		select {
		case f.blocked <- id:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			f.mu.Lock()
			f.canceled = append(f.canceled, id)
			f.mu.Unlock()
			return Result{Kind: Canceled, Err: ctx.Err()}
		}
	case "nohandler", "malformed":
		f.mu.Lock()
		deployed := f.deployed
		f.mu.Unlock()
		if kind == "malformed" || !deployed {
			f.mu.Lock()
			f.violate("event %q without a handler ran", id)
			f.mu.Unlock()
		}
	}
	return Result{Kind: Handled}
}

func (f *fakeHost) Handle(ctx context.Context, tp TopicPartition, evs []*Event) Result {
	f.mu.Lock()
	ids := make([]string, len(evs))
	keys := make([]string, len(evs))
	for i, e := range evs {
		ids[i], keys[i] = idOf(e), e.Key
		if i > 0 && e.Offset <= evs[i-1].Offset {
			f.violate("unit %v not in offset order", ids)
		}
		if ids[i] == "" {
			f.violate("a settled event (offset %d) handed to Handle", e.Offset)
		}
	}
	f.handleCalls = append(f.handleCalls, ids)
	f.note("handle %v %v", ids, keysOf(evs))
	// The claims, in order: one handled or parked already stops them.
	for i, e := range evs {
		if d := f.docs[idOf(e)]; d != nil && (d.handled || d.parked) {
			f.mu.Unlock()
			return Result{Kind: Duplicate, At: i}
		}
	}
	marked := f.enter(tp, keys)
	f.mu.Unlock()
	defer f.exit(marked)
	for i, e := range evs {
		res := f.run(ctx, e)
		if res.Kind != Handled {
			res.At = i
			f.mu.Lock()
			f.note("handle %v %v: %s at %s", ids, keysOf(evs), res.Kind, ids[i])
			f.mu.Unlock()
			return res
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ctx.Err() != nil {
		return Result{Kind: Canceled, Err: ctx.Err()}
	}
	for i, e := range evs {
		if d := f.docs[idOf(e)]; d != nil && (d.handled || d.parked) {
			f.violate("event %q claimed by two transactions at once", idOf(e))
			return Result{Kind: Duplicate, At: i}
		}
	}
	for _, e := range evs {
		f.commitHandled(tp, f.doc(tp, e), false)
	}
	return Result{Kind: Handled}
}

// commitHandled marks d handled, checking per-key order. Under f.mu.
func (f *fakeHost) commitHandled(tp TopicPartition, d *fakeDoc, released bool) {
	if d.key != "" && f.stream {
		bk := tp.String() + "/" + d.key
		offs := f.keyOffs[bk]
		done := func(off int64) bool {
			r := f.seen[tp][off]
			p := f.docs[r.id]
			return (p != nil && p.handled) || f.obs.wasSkipped(r.id)
		}
		i := f.keyDone[bk]
		for i < len(offs) && done(offs[i]) {
			i++
		}
		f.keyDone[bk] = i
		for ; i < len(offs) && offs[i] < d.offset; i++ {
			if !done(offs[i]) {
				f.violate("%s (offset %d) of key %q handled before %s (offset %d)", d.id, d.offset, d.key, f.seen[tp][offs[i]].id, offs[i])
			}
		}
	}
	f.note("handled %s [%s] released=%v", d.id, d.key, released)
	f.handles[d.id]++
	if f.handles[d.id] > 1 {
		f.violate("event %q handled %d times", d.id, f.handles[d.id])
	}
	d.handled, d.parked, d.heldBy = true, false, ""
	f.order = append(f.order, handledRec{TP: tp, Key: d.key, Offset: d.offset, ID: d.id, Released: released})
}

func (f *fakeHost) Release(ctx context.Context, tp TopicPartition, key string) (*Event, Result) {
	if ctx.Err() != nil {
		return nil, Result{Kind: Canceled, Err: ctx.Err()}
	}
	f.mu.Lock()
	d := f.first(tp, key)
	if d == nil {
		f.note("release [%s]: empty", key)
		f.mu.Unlock()
		return nil, Result{Kind: Empty}
	}
	if !f.releasable(d) {
		f.note("release [%s]: head %s parked", key, d.id)
		f.mu.Unlock()
		return nil, Result{Kind: HeadParked}
	}
	f.note("release [%s]: head %s", key, d.id)
	s := f.scripts[d.id]
	if s == nil {
		f.violate("release of %q, an event never decoded", d.id)
		f.mu.Unlock()
		return nil, Result{Kind: HeadParked}
	}
	if s.kind == "malformed" || (s.kind == "nohandler" && !f.deployed) {
		// It can never run here: parked for good, saying why.
		d.heldBy, d.reason = "", "no_handler"
		if s.kind == "malformed" {
			d.reason = "malformed"
		}
		f.mu.Unlock()
		return nil, Result{Kind: HeadParked}
	}
	e := &Event{Offset: d.offset, Key: d.key, Data: d.id, Policy: f.policy, Attempts: d.attempts, Failures: d.failures}
	marked := f.enter(tp, []string{key})
	f.mu.Unlock()
	defer f.exit(marked)
	res := f.run(ctx, e)
	if res.Kind != Handled {
		f.mu.Lock()
		f.note("release [%s]: %s %s", key, d.id, res.Kind)
		f.mu.Unlock()
		return e, res
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ctx.Err() != nil {
		return e, Result{Kind: Canceled, Err: ctx.Err()}
	}
	if f.first(tp, key) != d || d.handled {
		return e, Result{Kind: Empty} // handled by another releaser meanwhile
	}
	f.commitHandled(tp, d, true)
	return e, Result{Kind: Handled}
}

func (f *fakeHost) NoteReleaseFailure(ctx context.Context, tp TopicPartition, e *Event, cause error, inc int, park bool, reason string) (Tally, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseFails = append(f.releaseFails, idOf(e))
	d := f.docs[idOf(e)]
	if d == nil || !d.parked || d.handled {
		return Tally{}, ErrDone
	}
	d.attempts += inc
	d.failures += inc
	d.lastErr = cause.Error()
	if park {
		d.heldBy, d.reason = "", reason
	}
	f.note("release failure %s [%s] +%d = %d park=%v", d.id, d.key, inc, d.attempts, park)
	return Tally{d.attempts, d.failures}, nil
}

func (f *fakeHost) Commit(ctx context.Context, tp TopicPartition, offset int64, epoch int32) error {
	f.mu.Lock()
	gate := f.commitGate
	f.mu.Unlock()
	if gate != nil {
		f.atGate.Add(1)
		<-gate
		f.atGate.Add(-1)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cs := f.commits[tp]
	// A worker commits only forwards; the next owner of the partition may
	// commit the same offset again.
	if len(cs) > 0 && offset < cs[len(cs)-1] {
		f.violate("%s: commit of %d after %d", tp, offset, cs[len(cs)-1])
	}
	if f.stream {
		// Settled is for good: each offset is checked by the first commit
		// that passes it.
		for off := f.checkedTo[tp]; off < offset; off++ {
			r, ok := f.seen[tp][off]
			if !ok {
				continue
			}
			if d := f.docs[r.id]; (d == nil || !(d.handled || d.parked)) && !f.obs.wasSkipped(r.id) {
				f.violate("%s: commit of %d passes unsettled %s (offset %d)", tp, offset, r.id, off)
			}
		}
		f.checkedTo[tp] = max(f.checkedTo[tp], offset)
	}
	if f.failCommits > 0 {
		f.failCommits--
		return errFakeCommit
	}
	f.commits[tp] = append(cs, offset)
	return nil
}

func (f *fakeHost) Reap() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reaps++
}

// Test controls and readers.

// seedHandled stores an event as handled by an earlier owner.
func (f *fakeHost) seedHandled(tp TopicPartition, id, key string, offset int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put(&fakeDoc{id: id, tp: tp, key: key, offset: offset, handled: true})
}

// seedAttempts stores attempts of an event by an earlier owner: n runs,
// fails of them failed (the others ended without a result).
func (f *fakeHost) seedAttempts(tp TopicPartition, id, key string, offset int64, n, fails int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put(&fakeDoc{id: id, tp: tp, key: key, offset: offset, attempts: n, failures: fails})
}

// setScript replaces the script of an event.
func (f *fakeHost) setScript(id, script string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[id] = parseScript(script)
}

func (f *fakeHost) unblock(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.scripts[id].gate)
}

// deploy deploys the handler of "nohandler" events.
func (f *fakeHost) deploy() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deployed = true
}

// redrive handles a parked head as an operator's re-drive does.
func (f *fakeHost) redrive(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.docs[id]
	if d == nil || !d.parked || f.first(d.tp, d.key) != d {
		f.violate("re-drive of %q, not a parked head", id)
		return
	}
	f.commitHandled(d.tp, d, false)
}

// redriveStuck re-drives every parked event that heads its key and is not
// releasable (key-less parked events each on their own), as an operator
// would, and returns how many it re-drove.
func (f *fakeHost) redriveStuck() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, d := range f.docs {
		if !d.parked || f.releasable(d) || (d.key != "" && f.first(d.tp, d.key) != d) {
			continue
		}
		f.note("redrive %s [%s]", d.id, d.key)
		f.commitHandled(d.tp, d, false)
		n++
	}
	return n
}

// parkedCount counts the parked (and held) events.
func (f *fakeHost) parkedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, d := range f.docs {
		if d.parked {
			n++
		}
	}
	return n
}

func (f *fakeHost) get(id string) fakeDoc {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.docs[id]; d != nil {
		return *d
	}
	return fakeDoc{}
}

func (f *fakeHost) orderLog() []handledRec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.order)
}

// handledIDs returns the ids in the order log, in order.
func (f *fakeHost) handledIDs() []string {
	var out []string
	for _, r := range f.orderLog() {
		out = append(out, r.ID)
	}
	return out
}

func (f *fakeHost) committed(tp TopicPartition) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.commits[tp])
}

// lastCommit returns the last committed offset of tp, -1 before any.
func (f *fakeHost) lastCommit(tp TopicPartition) int64 {
	cs := f.committed(tp)
	if len(cs) == 0 {
		return -1
	}
	return cs[len(cs)-1]
}

func (f *fakeHost) lookupCalls() []lookupCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.lookups)
}

func (f *fakeHost) attemptsSeen(id string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.attempts[id])
}

func (f *fakeHost) reapCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reaps
}

// fakePauser stands for the kgo client's fetch pausing: it keeps the paused
// partitions as kgo does (a pause persists until resumed, whatever the
// assignment) and counts the calls.
type fakePauser struct {
	mu              sync.Mutex
	paused          map[TopicPartition]bool
	pauses, resumes int
	// beforePause, when set, runs at the start of every Pause (a test hook
	// that widens or fills the gap before the pause takes effect).
	beforePause func()
}

func newFakePauser() *fakePauser { return &fakePauser{paused: map[TopicPartition]bool{}} }

func (p *fakePauser) Pause(tp TopicPartition) {
	if p.beforePause != nil {
		p.beforePause()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pauses++
	p.paused[tp] = true
}

func (p *fakePauser) Resume(tp TopicPartition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumes++
	delete(p.paused, tp)
}

func (p *fakePauser) isPaused(tp TopicPartition) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused[tp]
}

func (p *fakePauser) calls() (pauses, resumes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pauses, p.resumes
}

// recObserver records what the Observer is told.
type recObserver struct {
	mu       sync.Mutex
	settled  []settledRec
	skipped  map[string]bool
	retries  []retryRec
	released []string
	errs     []error
}

type settledRec struct {
	ID, How, Reason string
	Offset          int64
}

type retryRec struct {
	ID, Reason string
	Err        error
}

func newRecObserver() *recObserver { return &recObserver{skipped: map[string]bool{}} }

func (o *recObserver) Settled(tp TopicPartition, e *Event, how, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.settled = append(o.settled, settledRec{ID: idOf(e), How: how, Reason: reason, Offset: e.Offset})
	if how == SettledSkipped {
		o.skipped[idOf(e)] = true
	}
}

func (o *recObserver) Retry(tp TopicPartition, e *Event, reason string, err error, delay time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retries = append(o.retries, retryRec{ID: idOf(e), Reason: reason, Err: err})
}

func (o *recObserver) Released(tp TopicPartition, e *Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.released = append(o.released, idOf(e))
}

func (o *recObserver) Error(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

func (o *recObserver) wasSkipped(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.skipped[id]
}

// settledOf returns how and why id was settled (its last report).
func (o *recObserver) settledOf(id string) (how, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.settled {
		if s.ID == id {
			how, reason = s.How, s.Reason
		}
	}
	return how, reason
}

// retryReasons returns the reasons of id's retries, in order.
func (o *recObserver) retryReasons(id string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, r := range o.retries {
		if r.ID == id {
			out = append(out, r.Reason)
		}
	}
	return out
}

func keysOf(evs []*Event) string {
	ks := make([]string, len(evs))
	for i, e := range evs {
		ks[i] = "[" + e.Key + "]"
	}
	return strings.Join(ks, "")
}

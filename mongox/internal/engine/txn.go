package engine

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TxnMeta identifies a transaction: the session and transaction number the
// oplog entries and change events carry.
type TxnMeta struct {
	LSID      bson.D
	TxnNumber int64
}

// TxnState is the state of a transaction.
type TxnState int

// Transaction states.
const (
	TxnActive TxnState = iota
	TxnCommitted
	TxnAborted
)

// Txn is a multi-document transaction with snapshot isolation. Its methods
// are safe for concurrent use, but a transaction runs one statement at a
// time (as a session does).
type Txn struct {
	e        *Engine
	id       uint64
	Meta     TxnMeta
	auto     bool // one auto-committed statement
	pin      bool // a read-only Snapshot holding history
	started  time.Time
	snapshot bson.Timestamp
	hasSnap  bool
	state    TxnState
	commitTS bson.Timestamp

	abortReason string
	writes      map[*chain]*pending
	order       []*chain // chains in first-write order
	inserted    []*chain // chains holding new records, in insertion order
	colls       map[*collection]struct{}
	created     []*collection // collections this transaction created implicitly
	ops         []Entry       // oplog entries, stamped at commit
	done        chan struct{}
}

// pending is a buffered write of a transaction.
type pending struct {
	doc    bson.D // nil: deleted
	rid    uint64 // record id the pending document belongs to
	newRec bool   // a new record (insert), appended to the natural order at commit
}

// Begin starts a transaction. Its snapshot is taken at its first operation.
func (e *Engine) Begin(meta TxnMeta) *Txn {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.newTxnLocked(false)
	t.Meta = meta
	return t
}

func (e *Engine) newTxnLocked(auto bool) *Txn {
	e.nextTxn++
	t := &Txn{
		e: e, id: e.nextTxn, auto: auto, started: e.opts.Now(),
		writes: map[*chain]*pending{}, colls: map[*collection]struct{}{},
		done: make(chan struct{}),
	}
	e.txns[t] = struct{}{}
	return t
}

// State returns the transaction's state.
func (t *Txn) State() TxnState {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	return t.state
}

// CommitTimestamp returns the commit timestamp of a committed transaction
// that wrote something (zero otherwise).
func (t *Txn) CommitTimestamp() bson.Timestamp {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	return t.commitTS
}

// Commit applies the transaction's writes atomically with one commit
// timestamp. Committing a committed transaction succeeds again; committing
// an aborted one returns 251 NoSuchTransaction.
func (t *Txn) Commit() error {
	e := t.e
	e.mu.Lock()
	defer e.mu.Unlock()
	switch t.state {
	case TxnCommitted:
		return nil
	case TxnAborted:
		return errNoSuchTxn(t)
	}
	if e.expiredLocked(t) {
		return errNoSuchTxn(t)
	}
	e.commitLocked(t)
	return nil
}

// Abort discards the transaction's writes. Aborting an ended transaction
// does nothing.
func (t *Txn) Abort() {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.state == TxnActive {
		t.e.abortLocked(t, "")
	}
}

// AbortWithReason aborts with a reason reported by later NoSuchTransaction errors.
func (t *Txn) AbortWithReason(reason string) {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.state == TxnActive {
		t.e.abortLocked(t, reason)
	}
}

func (e *Engine) expiredLocked(t *Txn) bool {
	if t.auto || e.opts.Now().Sub(t.started) <= e.lifetime(t) {
		return false
	}
	e.abortLocked(t, "transaction exceeded its lifetime")
	return true
}

func (e *Engine) endLocked(t *Txn) {
	delete(e.txns, t)
	close(t.done)
	e.pruneDirtyLocked(t)
}

func (e *Engine) abortLocked(t *Txn, reason string) {
	if t.state != TxnActive {
		return
	}
	t.state = TxnAborted
	t.abortReason = reason
	for _, c := range t.order {
		p := t.writes[c]
		c.owner = nil
		if p.doc != nil {
			for _, ix := range c.coll.indexes[1:] {
				ix.forget(c, []bson.D{p.doc})
			}
		}
		if len(c.versions) == 0 && !c.dead && c.coll.chains[c.key] == c {
			delete(c.coll.chains, c.key)
			c.dead = true
		}
	}
	// Collections the transaction created implicitly go away with it when
	// nothing else has used them.
	for _, c := range t.created {
		if c.pending == t {
			c.pending = nil
		}
		if e.collLocked(c.ns) == c && len(c.chains) == 0 && len(c.order) == 0 && len(c.indexes) == 1 && e.busyLocked(c, t) == nil {
			e.dropLocked(c)
		}
	}
	e.endLocked(t)
}

func (e *Engine) commitLocked(t *Txn) {
	t.state = TxnCommitted
	for c := range t.colls {
		c.pending = nil
	}
	for _, c := range t.created {
		c.pending = nil
	}
	if len(t.order) > 0 {
		ts := e.tick()
		t.commitTS = ts
		for _, c := range t.order {
			p := t.writes[c]
			c.owner = nil
			if c.dead {
				continue // collection dropped meanwhile
			}
			if p.doc == nil && len(c.versions) == 0 { // inserted and deleted by this transaction
				if c.coll.chains[c.key] == c {
					delete(c.coll.chains, c.key)
				}
				c.dead = true
				continue
			}
			c.versions = append(c.versions, version{ts: ts, rid: p.rid, doc: p.doc})
			if p.newRec && p.doc != nil {
				c.coll.order = append(c.coll.order, orderEntry{c: c, rid: p.rid})
			}
			if len(c.versions) > 1 || p.doc == nil {
				e.dirty[c] = struct{}{}
			}
		}
		wall := e.opts.Now()
		multi := !t.auto
		for i := range t.ops {
			op := &t.ops[i]
			op.TS = ts
			op.Wall = wall
			op.TxnOpIndex = int32(i)
			if multi {
				op.LSID = t.Meta.LSID
				n := t.Meta.TxnNumber
				op.TxnNumber = &n
			}
		}
		e.appendOplog(t.ops)
	}
	e.endLocked(t)
}

// minSnapshotLocked returns the oldest snapshot of an open transaction, and
// false when there is none.
func (e *Engine) minSnapshotLocked() (bson.Timestamp, bool) {
	var m bson.Timestamp
	found := false
	for t := range e.txns {
		if t.hasSnap && (!found || bsonkit.CompareTimestamps(t.snapshot, m) < 0) {
			m, found = t.snapshot, true
		}
	}
	return m, found
}

// pruneDirtyLocked drops versions no open snapshot can see: of the chains
// the ending transaction t touched, and of every dirty chain when the
// oldest open snapshot has moved since the last full sweep.
func (e *Engine) pruneDirtyLocked(t *Txn) {
	if len(e.dirty) == 0 {
		return
	}
	minTS, bounded := e.minSnapshotLocked()
	e.advanceFloorLocked(minTS, bounded)
	if bounded == e.pruneBounded && minTS == e.pruneMin {
		for _, c := range t.order {
			if _, ok := e.dirty[c]; ok && e.pruneLocked(c, minTS, bounded) {
				delete(e.dirty, c)
			}
		}
		return
	}
	e.pruneMin, e.pruneBounded = minTS, bounded
	for c := range e.dirty {
		if e.pruneLocked(c, minTS, bounded) {
			delete(e.dirty, c)
		}
	}
}

// pruneLocked prunes a chain; it reports whether the chain is now clean.
func (e *Engine) pruneLocked(c *chain, minTS bson.Timestamp, bounded bool) bool {
	if c.dead {
		return true
	}
	keep := len(c.versions) - 1
	if bounded {
		for keep > 0 && bsonkit.CompareTimestamps(c.versions[keep].ts, minTS) > 0 {
			keep--
		}
	}
	var dropped []bson.D
	removedRec := false
	if keep > 0 {
		for _, v := range c.versions[:keep] {
			if v.doc != nil {
				dropped = append(dropped, v.doc)
			}
		}
		if c.versions[keep].rid != c.versions[0].rid {
			removedRec = true
		}
		c.versions = append([]version(nil), c.versions[keep:]...)
	}
	if len(c.versions) == 1 && c.versions[0].doc == nil && c.owner == nil &&
		(!bounded || bsonkit.CompareTimestamps(c.versions[0].ts, minTS) <= 0) {
		c.versions = nil
		removedRec = true
		if c.coll.chains[c.key] == c {
			delete(c.coll.chains, c.key)
		}
		c.dead = true
	}
	for _, ix := range c.coll.indexes[1:] {
		ix.forget(c, dropped)
	}
	if removedRec {
		c.coll.stale++
		if c.coll.stale > 64 && c.coll.stale > len(c.coll.order)/2 {
			c.coll.compact()
		}
	}
	return c.dead || (len(c.versions) == 1 && c.versions[0].doc != nil)
}

// compact removes natural-order entries of records no longer retained.
func (c *collection) compact() {
	out := c.order[:0]
	for _, o := range c.order {
		if o.c.dead {
			continue
		}
		live := false
		for _, v := range o.c.versions {
			if v.rid == o.rid && v.doc != nil {
				live = true
				break
			}
		}
		if !live && o.c.owner != nil {
			if p := o.c.owner.writes[o.c]; p != nil && p.rid == o.rid {
				live = true
			}
		}
		if live {
			out = append(out, o)
		}
	}
	clear(c.order[len(out):])
	c.order = out
	c.stale = 0
}

// View is the access to data inside Engine.Read or Engine.Write: the
// snapshot of a transaction with its own writes, or the latest committed
// state for an auto-committed statement. A View is only valid inside the
// callback.
type View struct {
	e        *Engine
	t        *Txn
	readOnly bool
	latest   bool // read the latest committed state (no snapshot)
	blocked  *Txn // set when an auto-committed statement must wait
	failed   error
}

// errBlocked unwinds an auto-committed statement that must wait.
var errBlocked = errors.New("engine: blocked by an open transaction")

// Read runs fn with a read-only view: the transaction's snapshot (and own
// writes) when t is non-nil, else the latest committed state. It never
// blocks on open transactions.
func (e *Engine) Read(ctx context.Context, t *Txn, fn func(v *View) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	v := &View{e: e, t: t, readOnly: true, latest: t == nil}
	if t != nil {
		if err := e.useTxnLocked(t); err != nil {
			return err
		}
	}
	return fn(v)
}

func (e *Engine) useTxnLocked(t *Txn) error {
	if t.pin && (t.state != TxnActive || e.expiredLocked(t)) {
		return errSnapshotTooOld(t.snapshot)
	}
	if t.state == TxnAborted {
		return errNoSuchTxn(t)
	}
	if t.state == TxnCommitted {
		return &Error{Code: CodeTransactionCommitted, Name: "TransactionCommitted", Msg: "Transaction has been committed"}
	}
	if e.expiredLocked(t) {
		return errNoSuchTxn(t)
	}
	if !t.hasSnap {
		t.snapshot = e.last
		t.hasSnap = true
	}
	return nil
}

// Write runs fn with a writable view. With a transaction, writes are
// buffered in it; an error from fn aborts the transaction (as any write
// error does in MongoDB). Without one, fn is one auto-committed statement:
// its writes commit when it returns nil and are discarded otherwise; when
// it meets a document held by an open transaction, the engine waits for
// that transaction to end and runs fn again (bounded by ctx, error 50
// MaxTimeMSExpired on deadline).
func (e *Engine) Write(ctx context.Context, t *Txn, fn func(v *View) error) error {
	if t != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		if err := e.useTxnLocked(t); err != nil {
			return err
		}
		v := &View{e: e, t: t}
		err := fn(v)
		if err == nil {
			err = v.failed
		}
		if err != nil && t.state == TxnActive {
			reason := err.Error()
			e.abortLocked(t, reason)
		}
		return err
	}
	for {
		e.mu.Lock()
		at := e.newTxnLocked(true)
		at.snapshot, at.hasSnap = e.last, true
		v := &View{e: e, t: at, latest: true}
		err := fn(v)
		if v.blocked != nil {
			ch := v.blocked.done
			e.abortLocked(at, "")
			e.mu.Unlock()
			if err := waitCtx(ctx, ch); err != nil {
				return err
			}
			continue
		}
		if err == nil {
			err = v.failed
		}
		if err != nil {
			e.abortLocked(at, "")
		} else {
			e.commitLocked(at)
		}
		e.mu.Unlock()
		return err
	}
}

// Query selects documents of a collection.
type Query struct {
	// Filter is the query filter, used only to choose an index (an equality
	// on _id or on a unique index). May be nil.
	Filter bson.D
	// Match decides which documents are returned; nil matches all.
	Match func(doc bson.D) bool
	// Limit stops after this many matches (0: no limit).
	Limit int
}

// ClusterTime returns the newest timestamp issued.
func (v *View) ClusterTime() bson.Timestamp { return v.e.last }

// InTxn reports whether the view belongs to a multi-statement transaction.
func (v *View) InTxn() bool { return v.t != nil && !v.t.auto }

// Exists reports whether the collection exists.
func (v *View) Exists(ns NS) bool { return v.e.collLocked(ns) != nil }

// docOf returns the document of chain c as this view sees it.
func (v *View) docOf(c *chain) bson.D {
	if v.t != nil {
		if p := v.t.writes[c]; p != nil {
			return p.doc
		}
	}
	var ver *version
	if v.latest || v.t == nil {
		ver = c.latest()
	} else {
		ver = c.at(v.t.snapshot)
	}
	if ver == nil {
		return nil
	}
	return ver.doc
}

// Find returns the matching documents of a collection in natural order
// (nothing when the collection does not exist).
func (v *View) Find(ns NS, q Query) ([]bson.D, error) {
	c := v.e.collLocked(ns)
	if c == nil {
		return nil, nil
	}
	var out []bson.D
	emit := func(d bson.D) bool {
		if d == nil || (q.Match != nil && !q.Match(d)) {
			return true
		}
		out = append(out, d)
		return q.Limit <= 0 || len(out) < q.Limit
	}
	if cands, ok := v.candidates(c, q.Filter); ok {
		for _, ch := range cands {
			if !emit(v.docOf(ch)) {
				break
			}
		}
		return out, nil
	}
	for _, o := range c.order {
		if o.c.dead {
			continue
		}
		d, rid, newRec := v.stateOf(o.c)
		if d == nil || rid != o.rid || newRec {
			continue
		}
		if !emit(d) {
			return out, nil
		}
	}
	if v.t != nil {
		for _, ch := range v.t.inserted {
			if ch.coll != c {
				continue
			}
			if p := v.t.writes[ch]; p != nil && p.newRec && p.doc != nil {
				if !emit(p.doc) {
					return out, nil
				}
			}
		}
	}
	return out, nil
}

// stateOf returns the document, record id and pending-new-record flag of
// chain c as this view sees it.
func (v *View) stateOf(c *chain) (bson.D, uint64, bool) {
	if v.t != nil {
		if p := v.t.writes[c]; p != nil {
			return p.doc, p.rid, p.newRec
		}
	}
	var ver *version
	if v.latest {
		ver = c.latest()
	} else {
		ver = c.at(v.t.snapshot)
	}
	if ver == nil {
		return nil, 0, false
	}
	return ver.doc, ver.rid, false
}

// candidates returns the chains an equality on _id or on a plain unique
// index can match, in natural order; ok is false when no index applies.
func (v *View) candidates(c *collection, filter bson.D) ([]*chain, bool) {
	if filter == nil {
		return nil, false
	}
	if vals, ok := eqValues(filter, "_id"); ok {
		var out []*chain
		seen := map[*chain]bool{}
		for _, val := range vals {
			if ch := c.chains[bsonkit.Key(val)]; ch != nil && !seen[ch] {
				seen[ch] = true
				out = append(out, ch)
			}
		}
		return v.sortNatural(out), true
	}
	for _, ix := range c.indexes[1:] {
		if !ix.unique || ix.sparse || ix.filter != nil || len(ix.fields) != 1 {
			continue
		}
		vals, ok := eqValues(filter, ix.fields[0])
		if !ok {
			continue
		}
		var out []*chain
		seen := map[*chain]bool{}
		for _, val := range vals {
			for ch := range ix.entries[bsonkit.Key(val)] {
				if !seen[ch] && !ch.dead {
					seen[ch] = true
					out = append(out, ch)
				}
			}
		}
		return v.sortNatural(out), true
	}
	// A non-unique index whose leading fields the filter pins to single
	// values (and whose partial filter the filter implies): its prefix
	// entries hold every chain that can match. The smallest set wins.
	var best map[*chain]struct{}
	found := false
	for _, ix := range c.indexes[1:] {
		if ix.prefix == nil || !ix.impliesPartial(filter) {
			continue
		}
		h, n := "", 0
		for _, f := range ix.fields {
			vals, ok := eqValues(filter, f)
			if !ok || len(vals) != 1 {
				break
			}
			h += bsonkit.Key(vals[0])
			n++
		}
		if n == 0 {
			continue
		}
		if set := ix.prefix[h]; !found || len(set) < len(best) {
			best, found = set, true
		}
	}
	if found {
		out := make([]*chain, 0, len(best))
		for ch := range best {
			if !ch.dead {
				out = append(out, ch)
			}
		}
		return v.sortNatural(out), true
	}
	return nil, false
}

// sortNatural orders a few chains by their record ids (natural order).
func (v *View) sortNatural(cs []*chain) []*chain {
	if len(cs) < 2 {
		return cs
	}
	// Sort by record id, computed once per chain (candidate sets from a
	// non-unique index can be large).
	type ranked struct {
		rid uint64
		c   *chain
	}
	rs := make([]ranked, len(cs))
	for i, c := range cs {
		_, r, newRec := v.stateOf(c)
		if newRec {
			r += 1 << 62
		}
		rs[i] = ranked{r, c}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int { return cmp.Compare(a.rid, b.rid) })
	for i := range rs {
		cs[i] = rs[i].c
	}
	return cs
}

// FindID returns the document with the given _id, or nil.
func (v *View) FindID(ns NS, id any) bson.D {
	c := v.e.collLocked(ns)
	if c == nil {
		return nil
	}
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil {
		return nil
	}
	return v.docOf(ch)
}

// claim checks that this view may write chain c: it returns a
// WriteConflict for a transaction, or marks an auto-committed statement
// blocked (errBlocked), when another open transaction holds c or c was
// committed after the snapshot.
func (v *View) claim(c *chain) error {
	if c.owner != nil && c.owner != v.t {
		return v.conflict(c.owner)
	}
	if c.owner == nil && !v.t.auto {
		if l := c.latest(); l != nil && bsonkit.CompareTimestamps(l.ts, v.t.snapshot) > 0 {
			return v.conflict(nil)
		}
	}
	return nil
}

func (v *View) conflict(owner *Txn) error {
	if v.t.auto && owner != nil {
		v.blocked = owner
		return errBlocked
	}
	err := errWriteConflict()
	v.failed = err
	return err
}

func (v *View) writable(ns NS) (*collection, error) {
	if v.readOnly {
		return nil, errors.New("engine: write in a read-only view")
	}
	c, created, err := v.e.ensureLocked(ns)
	if err != nil {
		return nil, err
	}
	if created {
		// Stamped with the transaction's writes at commit.
		v.t.ops = append(v.t.ops, c.createEntry(bson.Timestamp{}))
		if !v.t.auto {
			v.t.created = append(v.t.created, c)
			c.pending = v.t
		}
	}
	return c, nil
}

// record buffers a write of chain c in the view's transaction.
func (v *View) record(c *chain, doc bson.D, newRec bool) *pending {
	t := v.t
	p := t.writes[c]
	if p == nil {
		_, rid, _ := v.stateOf(c)
		p = &pending{rid: rid}
		t.writes[c] = p
		t.order = append(t.order, c)
	}
	if newRec {
		if p.newRec {
			for i, x := range t.inserted {
				if x == c {
					t.inserted = append(t.inserted[:i:i], t.inserted[i+1:]...)
					break
				}
			}
		}
		v.e.nextRID++
		p.rid = v.e.nextRID
		p.newRec = true
		t.inserted = append(t.inserted, c)
	}
	old := p.doc
	p.doc = doc
	c.owner = t
	t.colls[c.coll] = struct{}{}
	if old != nil {
		for _, ix := range c.coll.indexes[1:] {
			ix.forget(c, []bson.D{old})
		}
	}
	return p
}

// checkUnique checks the unique secondary indexes for doc written to chain
// c, and registers doc's keys as candidates.
func (v *View) checkUnique(c *collection, ch *chain, doc bson.D) error {
	for _, ix := range c.indexes[1:] {
		if !ix.unique {
			continue
		}
		for _, k := range ix.keysOf(doc) {
			for other := range ix.entries[k.hash] {
				if other == ch || other.dead {
					continue
				}
				if other.owner != nil && other.owner != v.t {
					if p := other.owner.writes[other]; p != nil && p.doc != nil && ix.hasKey(p.doc, k.hash) {
						return v.conflict(other.owner)
					}
				}
				if other.owner == v.t {
					if p := v.t.writes[other]; p.doc != nil && ix.hasKey(p.doc, k.hash) {
						return v.dupKey(c, ix, k)
					}
					continue
				}
				l := other.latest()
				if l == nil || l.doc == nil || !ix.hasKey(l.doc, k.hash) {
					continue
				}
				if !v.t.auto && bsonkit.CompareTimestamps(l.ts, v.t.snapshot) > 0 {
					return v.conflict(nil)
				}
				return v.dupKey(c, ix, k)
			}
		}
	}
	for _, ix := range c.indexes[1:] {
		if ix.unique {
			for _, k := range ix.keysOf(doc) {
				ix.add(k.hash, ch)
			}
		} else {
			ix.addPrefixes(ch, doc)
		}
	}
	return nil
}

func (v *View) dupKey(c *collection, ix *index, k indexKey) error {
	err := errDupKey(c.ns, ix, ix.keyValue(k))
	return err
}

// Insert inserts a document, which must have an _id. Top-level fields
// holding Timestamp(0, 0) (other than _id) get a fresh clock tick. It
// returns 11000 DuplicateKey, WriteConflict, or (auto-committed statements)
// unwinds to wait for a transaction holding the key.
func (v *View) Insert(ns NS, doc bson.D) error {
	c, err := v.writable(ns)
	if err != nil {
		return err
	}
	id, ok := bsonkit.Get(doc, "_id")
	if !ok {
		return &Error{Code: CodeBadValue, Name: "BadValue", Msg: "document has no _id"}
	}
	if _, isArr := id.(bson.A); isArr {
		return &Error{Code: 53, Name: "InvalidIdField", Msg: "The '_id' value cannot be of type array"}
	}
	if _, isRe := id.(bson.Regex); isRe {
		return &Error{Code: 53, Name: "InvalidIdField", Msg: "can't use a regex for _id"}
	}
	key := bsonkit.Key(id)
	ch := c.chains[key]
	if ch != nil {
		if err := v.claim(ch); err != nil {
			return err
		}
		if v.docOf(ch) != nil {
			return errDupKey(ns, c.indexes[0], bson.D{{Key: "_id", Value: id}})
		}
	} else {
		ch = &chain{coll: c, key: key}
		c.chains[key] = ch
	}
	for i := range doc {
		if doc[i].Key == "_id" {
			continue
		}
		if ts, ok := doc[i].Value.(bson.Timestamp); ok && ts.T == 0 && ts.I == 0 {
			doc[i].Value = v.e.tick()
		}
	}
	if err := v.checkUnique(c, ch, doc); err != nil {
		if len(ch.versions) == 0 && ch.owner == nil {
			delete(c.chains, key)
			ch.dead = true
		}
		return err
	}
	v.record(ch, doc, true)
	v.t.ops = append(v.t.ops, Entry{Op: OpInsert, NS: ns, DocKey: bson.D{{Key: "_id", Value: id}}, Doc: doc, UUID: c.uuid})
	return nil
}

// UpdateDescription describes an update for the oplog and change streams.
type UpdateDescription struct {
	UpdatedFields bson.D
	RemovedFields []string
	// TruncatedArrays are {field, newSize} documents.
	TruncatedArrays bson.A
	// DisambiguatedPaths maps ambiguous paths to their components
	// (reported with showExpandedEvents).
	DisambiguatedPaths bson.D
}

// Update replaces the document with newDoc's _id by newDoc. desc nil
// records a replace, else an update with that description. The document
// must exist in the view.
func (v *View) Update(ns NS, newDoc bson.D, desc *UpdateDescription) error {
	c, err := v.writable(ns)
	if err != nil {
		return err
	}
	id, _ := bsonkit.Get(newDoc, "_id")
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil || v.docOf(ch) == nil {
		return &Error{Code: 8, Name: "UnknownError", Msg: "engine: update of a missing document"}
	}
	if err := v.claim(ch); err != nil {
		return err
	}
	if err := v.checkUnique(c, ch, newDoc); err != nil {
		return err
	}
	pre := v.docOf(ch)
	v.record(ch, newDoc, false)
	e := Entry{Op: OpReplace, NS: ns, DocKey: bson.D{{Key: "_id", Value: id}}, Doc: newDoc, UUID: c.uuid}
	if c.prePostImages {
		e.Pre, e.Images = pre, true
	}
	if desc != nil {
		e.Op = OpUpdate
		e.Update = desc
	}
	v.t.ops = append(v.t.ops, e)
	return nil
}

// Delete deletes the document with the given _id; it reports whether a
// document was deleted.
func (v *View) Delete(ns NS, id any) (bool, error) {
	if v.readOnly {
		return false, errors.New("engine: write in a read-only view")
	}
	c := v.e.collLocked(ns)
	if c == nil {
		return false, nil
	}
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil || v.docOf(ch) == nil {
		return false, nil
	}
	if err := v.claim(ch); err != nil {
		return false, err
	}
	pre := v.docOf(ch)
	v.record(ch, nil, false)
	e := Entry{Op: OpDelete, NS: ns, DocKey: bson.D{{Key: "_id", Value: id}}, UUID: c.uuid}
	if c.prePostImages {
		e.Pre, e.Images = pre, true
	}
	v.t.ops = append(v.t.ops, e)
	return true, nil
}

// EnsureCollection creates the collection when missing (implicit creation)
// and reports whether it did.
func (v *View) EnsureCollection(ns NS) (bool, error) {
	c, created, err := v.e.ensureLocked(ns)
	if created && v.t != nil && !v.t.auto {
		v.t.created = append(v.t.created, c)
		c.pending = v.t
	}
	return created, err
}

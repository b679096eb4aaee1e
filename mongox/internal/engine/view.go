package engine

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

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
	err := fn(v)
	if v.failed != nil {
		// A statement that could not take its collection aborts the
		// transaction, as any failed statement does.
		err = v.failed
		if t.state == TxnActive {
			e.abortLocked(t, abortReason(err))
		}
	}
	return err
}

func (e *Engine) useTxnLocked(t *Txn) error {
	if t.pin && (t.state != TxnActive || e.expiredLocked(t)) {
		return errSnapshotTooOld(t.snapshot)
	}
	if t.state == TxnAborted {
		return errNoSuchTxn(t)
	}
	if t.state == TxnCommitted {
		return &Error{Code: CodeTransactionCommitted, CodeName: "TransactionCommitted", Msg: "Transaction has been committed"}
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
			e.abortLocked(t, abortReason(err))
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

// Exists reports whether the view sees the collection.
func (v *View) Exists(ns NS) bool { return v.coll(ns) != nil }

// coll returns the collection of ns as the view sees it: for a transaction,
// the one it created itself, or the catalog's when it existed at the
// transaction's snapshot; otherwise the catalog's. nil when none.
//
// A transaction holds the collections it uses until it ends, as mongod's
// transactions hold their collection locks: catalog operations on them wait
// (see Engine.ddl), and while one waits, a transaction that has not used
// the collection yet cannot start using it: the view fails with 24
// LockTimeout (v.failed), as a transaction does after
// maxTransactionLockRequestTimeoutMillis.
func (v *View) coll(ns NS) *collection {
	t := v.t
	if t == nil || t.auto {
		return v.e.collLocked(ns)
	}
	for _, c := range t.created {
		if c.ns == ns {
			return c
		}
	}
	c := v.e.collLocked(ns)
	if c == nil || t.hasSnap && bsonkit.CompareTimestamps(c.createdTS, t.snapshot) > 0 {
		return nil
	}
	if t.pin {
		return c // snapshot reads take no locks
	}
	if _, ok := t.touched[c]; !ok {
		if c.ddlWaiting > 0 {
			v.failed = errLockTimeout(ns)
			return nil
		}
		if t.touched == nil {
			t.touched = map[*collection]struct{}{}
		}
		t.touched[c] = struct{}{}
	}
	return c
}

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
	var out []bson.D
	v.scan(ns, q, func(d bson.D, _ uint64) { out = append(out, d) })
	return out, nil
}

// Record is a document with its record id: its position in the
// collection's natural (insertion) order, as mongod's RecordId.
type Record struct {
	Doc bson.D
	RID int64
}

// FindRecords is Find with the record id of each document.
func (v *View) FindRecords(ns NS, q Query) []Record {
	var out []Record
	v.scan(ns, q, func(d bson.D, rid uint64) { out = append(out, Record{Doc: d, RID: int64(rid)}) })
	return out
}

// scan calls emit with the matching documents of a collection in natural
// order, stopping at q.Limit.
func (v *View) scan(ns NS, q Query, emit func(bson.D, uint64)) {
	c := v.coll(ns)
	if c == nil {
		return
	}
	n := 0
	take := func(d bson.D, rid uint64) bool {
		if d == nil || (q.Match != nil && !q.Match(d)) {
			return true
		}
		emit(d, rid)
		n++
		return q.Limit <= 0 || n < q.Limit
	}
	if cands, ok := v.candidates(c, q.Filter); ok {
		for _, ch := range cands {
			d, rid, _ := v.stateOf(ch)
			if !take(d, rid) {
				break
			}
		}
		return
	}
	v.live(c, func(d bson.D, rid uint64) bool { return take(d, rid) })
}

// live calls fn with the documents of c the view sees, in natural order
// (committed records, then the view's own new records), until fn returns
// false.
func (v *View) live(c *collection, fn func(bson.D, uint64) bool) {
	for _, o := range c.order {
		if o.c.dead {
			continue
		}
		d, rid, newRec := v.stateOf(o.c)
		if d == nil || rid != o.rid || newRec {
			continue
		}
		if !fn(d, rid) {
			return
		}
	}
	if v.t != nil {
		for _, ch := range v.t.inserted {
			if ch.coll != c {
				continue
			}
			if p := v.t.writes[ch]; p != nil && p.newRec && p.doc != nil {
				if !fn(p.doc, p.rid) {
					return
				}
			}
		}
	}
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
	// Record ids are distinct, so an unstable sort gives the one order.
	slices.SortFunc(rs, func(a, b ranked) int { return cmp.Compare(a.rid, b.rid) })
	for i := range rs {
		cs[i] = rs[i].c
	}
	return cs
}

// FindID returns the document with the given _id, or nil.
func (v *View) FindID(ns NS, id any) bson.D {
	c := v.coll(ns)
	if c == nil {
		return nil
	}
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil {
		return nil
	}
	return v.docOf(ch)
}

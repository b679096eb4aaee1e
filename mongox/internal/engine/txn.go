package engine

import (
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
	lifetime time.Duration // transactionLifetimeLimitSeconds when it started
	snapshot bson.Timestamp
	hasSnap  bool
	state    TxnState
	commitTS bson.Timestamp

	abortReason string
	writes      map[*chain]*pending
	order       []*chain                 // chains in first-write order
	inserted    []*chain                 // chains holding new records, in insertion order
	colls       map[*collection]struct{} // collections written
	touched     map[*collection]struct{} // catalog collections used (read or written)
	created     []*collection            // collections this transaction created implicitly
	ops         []Entry                  // oplog entries, stamped at commit
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
	// writes and colls are made at the first write (record): a read
	// never needs them.
	t := &Txn{
		e: e, id: e.nextTxn, auto: auto, started: e.opts.Now(),
		lifetime: e.opts.TransactionLifetime,
		done:     make(chan struct{}),
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
	if err := e.createConflictLocked(t); err != nil {
		e.abortLocked(t, abortReason(err))
		return err
	}
	e.commitLocked(t)
	return nil
}

// createConflictLocked returns a WriteConflict when a collection t created
// can no longer join the catalog: another transaction or statement created
// the namespace (first committer wins, as in MongoDB), or dropped or renamed
// one there, after t's snapshot.
func (e *Engine) createConflictLocked(t *Txn) error {
	for _, c := range t.created {
		if e.collLocked(c.ns) != nil {
			return errWriteConflict()
		}
		if at, ok := e.gone[c.ns]; ok && bsonkit.CompareTimestamps(at, t.snapshot) > 0 {
			return errWriteConflict()
		}
	}
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
	// The collections the transaction created were its own: they go away
	// with it.
	for _, c := range t.created {
		for _, ch := range c.chains {
			ch.dead = true
			delete(e.dirty, ch)
		}
	}
	e.endLocked(t)
}

func (e *Engine) commitLocked(t *Txn) {
	t.state = TxnCommitted
	if len(t.order) > 0 || len(t.created) > 0 {
		ts := e.tick()
		t.commitTS = ts
		for _, c := range t.created {
			e.attachLocked(c, ts)
		}
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

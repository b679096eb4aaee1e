package engine

import (
	"errors"
	"fmt"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

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

// writable returns the collection a write goes to, creating it when
// missing: in the catalog for an auto-committed statement, privately for a
// transaction (it joins the catalog at commit). A transaction whose
// snapshot predates a catalog change of the namespace (an index built or
// dropped, a drop or rename) cannot write it: 246 SnapshotUnavailable, as
// mongod answers; a collection another transaction or statement created
// after its snapshot is invisible to it, and creating its own fails at
// commit with a WriteConflict.
func (v *View) writable(ns NS) (*collection, error) {
	if v.readOnly {
		return nil, errors.New("engine: write in a read-only view")
	}
	if v.t.auto {
		c, created, err := v.e.ensureLocked(ns)
		if err != nil {
			return nil, err
		}
		if created {
			// Stamped with the statement's writes at commit.
			v.t.ops = append(v.t.ops, c.createEntry(bson.Timestamp{}))
		}
		return c, nil
	}
	if c := v.coll(ns); c != nil {
		if c.pending == nil && bsonkit.CompareTimestamps(c.catalogTS, v.t.snapshot) > 0 {
			return nil, v.snapshotUnavailable(ns)
		}
		if c.capped != nil {
			return nil, errCappedInTxn(ns)
		}
		return c, nil
	}
	if v.failed != nil {
		return nil, v.failed
	}
	if at, ok := v.e.gone[ns]; ok && bsonkit.CompareTimestamps(at, v.t.snapshot) > 0 {
		return nil, v.snapshotUnavailable(ns)
	}
	c, err := newCollection(ns)
	if err != nil {
		return nil, err
	}
	c.pending = v.t
	v.t.created = append(v.t.created, c)
	// Stamped with the transaction's writes at commit.
	v.t.ops = append(v.t.ops, c.createEntry(bson.Timestamp{}))
	return c, nil
}

func (v *View) snapshotUnavailable(ns NS) error {
	err := &Error{Code: CodeSnapshotUnavailable, CodeName: "SnapshotUnavailable",
		Msg: fmt.Sprintf("Unable to write to collection '%s' due to catalog changes; please retry the operation. Snapshot timestamp is %s.",
			ns, FormatValue(v.t.snapshot))}
	v.failed = err
	return err
}

// record buffers a write of chain c in the view's transaction.
func (v *View) record(c *chain, doc bson.D, newRec bool) *pending {
	t := v.t
	if t.writes == nil {
		t.writes = map[*chain]*pending{}
		t.colls = map[*collection]struct{}{}
	}
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

// idFirst returns doc with its _id field first, where MongoDB stores it in
// every document (whatever the order the client, an update or a pipeline
// produced). doc itself is returned when _id is already first or absent;
// otherwise a reordered copy.
func idFirst(doc bson.D) bson.D {
	for i := range doc {
		if doc[i].Key != "_id" {
			continue
		}
		if i == 0 {
			return doc
		}
		out := make(bson.D, 0, len(doc))
		out = append(out, doc[i])
		out = append(out, doc[:i]...)
		return append(out, doc[i+1:]...)
	}
	return doc
}

// Insert inserts a document, which must have an _id (stored first).
// Top-level fields holding Timestamp(0, 0) (other than _id) get a fresh
// clock tick. It returns 11000 DuplicateKey, WriteConflict, or
// (auto-committed statements) unwinds to wait for a transaction holding the
// key.
func (v *View) Insert(ns NS, doc bson.D) error {
	c, err := v.writable(ns)
	if err != nil {
		return err
	}
	id, ok := bsonkit.Get(doc, "_id")
	if !ok {
		return &Error{Code: CodeBadValue, CodeName: "BadValue", Msg: "document has no _id"}
	}
	if _, isArr := id.(bson.A); isArr {
		return &Error{Code: 53, CodeName: "InvalidIdField", Msg: "The '_id' value cannot be of type array"}
	}
	if _, isRe := id.(bson.Regex); isRe {
		return &Error{Code: 53, CodeName: "InvalidIdField", Msg: "can't use a regex for _id"}
	}
	doc = idFirst(doc)
	if err := checkCappedInsert(c, doc); err != nil {
		return err
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
	v.fillEmptyTimestamps(doc)
	if err := v.checkUnique(c, ch, doc); err != nil {
		if len(ch.versions) == 0 && ch.owner == nil {
			delete(c.chains, key)
			ch.dead = true
		}
		return err
	}
	p := v.record(ch, doc, true)
	v.t.ops = append(v.t.ops, Entry{Op: OpInsert, NS: ns, DocKey: bson.D{{Key: "_id", Value: id}}, Doc: doc, UUID: c.uuid})
	return v.trimCapped(c, p.rid)
}

// fillEmptyTimestamps gives the top-level fields of doc (other than _id)
// that hold Timestamp(0, 0) a fresh clock tick, as mongod does for inserted
// documents and replacements
// (https://www.mongodb.com/docs/v7.0/reference/bson-types/#timestamps).
func (v *View) fillEmptyTimestamps(doc bson.D) {
	for i := range doc {
		if doc[i].Key == "_id" {
			continue
		}
		if ts, ok := doc[i].Value.(bson.Timestamp); ok && ts.T == 0 && ts.I == 0 {
			doc[i].Value = v.e.tick()
		}
	}
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

// Update replaces the document with newDoc's _id by newDoc (its _id stored
// first). desc nil records a replace (whose top-level Timestamp(0, 0) fields
// are filled as Insert fills them), else an update with that description.
// The document must exist in the view.
func (v *View) Update(ns NS, newDoc bson.D, desc *UpdateDescription) error {
	c, err := v.writable(ns)
	if err != nil {
		return err
	}
	newDoc = idFirst(newDoc)
	if desc == nil {
		v.fillEmptyTimestamps(newDoc)
	}
	id, _ := bsonkit.Get(newDoc, "_id")
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil || v.docOf(ch) == nil {
		return &Error{Code: 8, CodeName: "UnknownError", Msg: "engine: update of a missing document"}
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
	c := v.coll(ns)
	if c == nil {
		return false, nil
	}
	ch := c.chains[bsonkit.Key(id)]
	if ch == nil || v.docOf(ch) == nil {
		return false, nil
	}
	if !v.t.auto && c.pending == nil && bsonkit.CompareTimestamps(c.catalogTS, v.t.snapshot) > 0 {
		return false, v.snapshotUnavailable(ns)
	}
	if !v.t.auto && c.capped != nil {
		return false, &Error{Code: CodeIllegalOperation, CodeName: "IllegalOperation",
			Msg: "Cannot remove from a capped collection in a multi-document transaction: " + ns.String()}
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

// EnsureCollection creates the collection when the view does not see it
// (see writable) and reports whether it did.
func (v *View) EnsureCollection(ns NS) (bool, error) {
	if v.coll(ns) != nil {
		return false, nil
	}
	_, err := v.writable(ns)
	return err == nil, err
}

package engine

import (
	"sort"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

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

// pruneBoundLocked returns the timestamp below which versions may go: the
// oldest open snapshot, or the start of the history window when that is
// older; bounded is false when neither exists (only the latest versions
// stay).
func (e *Engine) pruneBoundLocked() (bson.Timestamp, bool) {
	minTS, bounded := e.minSnapshotLocked()
	if w := e.opts.HistoryWindow; w > 0 {
		secs := e.opts.Now().Add(-w).Unix()
		floor := bson.Timestamp{T: uint32(max(secs, 0))}
		if !bounded || bsonkit.CompareTimestamps(floor, minTS) < 0 {
			minTS, bounded = floor, true
		}
	}
	return minTS, bounded
}

// pruneDirtyLocked drops versions no open snapshot can see: of the chains
// the ending transaction t touched, and of every dirty chain when the
// oldest open snapshot has moved since the last full sweep.
func (e *Engine) pruneDirtyLocked(t *Txn) {
	if len(e.dirty) == 0 {
		return
	}
	minTS, bounded := e.pruneBoundLocked()
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
		// The newest version at or before minTS stays (versions ascend by
		// timestamp; a history window can leave many on a hot document, so
		// search rather than scan).
		keep = max(sort.Search(len(c.versions), func(i int) bool {
			return bsonkit.CompareTimestamps(c.versions[i].ts, minTS) > 0
		})-1, 0)
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

package engine

import "go.mongodb.org/mongo-driver/v2/bson"

// Tail returns the documents of a collection inserted after record rid
// (0: from the start) that match (nil: all), in natural order, and the
// last record id scanned (rid when none). lost reports that record rid is
// gone (a capped collection wrapped past it, or it was deleted): a
// tailable cursor positioned there cannot resume (136 CappedPositionLost);
// exists is false when the collection does not exist.
func (v *View) Tail(ns NS, rid int64, match func(bson.D) bool) (docs []bson.D, last int64, lost, exists bool) {
	last = rid
	c := v.coll(ns)
	if c == nil {
		return nil, last, false, false
	}
	found := rid == 0
	v.live(c, func(d bson.D, r uint64) bool {
		switch {
		case int64(r) == rid:
			found = true
		case int64(r) > rid:
			if !found {
				return false
			}
			last = int64(r)
			if match == nil || match(d) {
				docs = append(docs, d)
			}
		}
		return true
	})
	if !found {
		return nil, rid, true, true
	}
	return docs, last, false, true
}

// IsCapped reports whether the view sees a capped collection at ns.
func (v *View) IsCapped(ns NS) bool {
	c := v.coll(ns)
	return c != nil && c.capped != nil
}

// Changed returns a channel that closes at the next committed write (read
// it in the same view as the data, so that no write falls in between).
func (v *View) Changed() <-chan struct{} { return v.e.oplog.signal }

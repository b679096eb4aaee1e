package engine

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// RunTTL runs one TTL pass now: it deletes the documents whose TTL-indexed
// field is a date (or an array whose earliest date is) older than now minus
// expireAfterSeconds and that match the index's partial filter. Each
// deletion is a normal auto-committed delete (oplog, change streams).
// Documents held by open transactions are skipped until the next pass. It
// returns the number of deleted documents.
func (e *Engine) RunTTL() int {
	type victim struct {
		ns     NS
		id     any
		ix     *index
		cutoff time.Time
	}
	now := e.opts.Now()
	var victims []victim
	e.mu.Lock()
	for _, db := range e.dbs {
		for _, c := range db.colls {
			for _, ix := range c.indexes[1:] {
				if ix.ttl == nil || len(ix.fields) != 1 {
					continue
				}
				cutoff := now.Add(-time.Duration(*ix.ttl) * time.Second)
				for _, ch := range c.chains {
					l := ch.latest()
					if l == nil || l.doc == nil || ch.owner != nil || !ix.expired(l.doc, cutoff) {
						continue
					}
					id, _ := ch.latestID()
					victims = append(victims, victim{c.ns, id, ix, cutoff})
				}
			}
		}
	}
	e.mu.Unlock()
	n := 0
	seen := map[string]bool{}
	for _, vi := range victims {
		k := vi.ns.String() + "\x00" + FormatValue(vi.id)
		if seen[k] {
			continue
		}
		seen[k] = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		deleted := false
		err := e.Write(ctx, nil, func(v *View) error {
			if d := v.FindID(vi.ns, vi.id); d == nil || !vi.ix.expired(d, vi.cutoff) {
				return nil
			}
			ok, err := v.Delete(vi.ns, vi.id)
			deleted = ok
			return err
		})
		cancel()
		if err == nil && deleted {
			n++
		}
	}
	return n
}

func (c *chain) latestID() (any, bool) {
	l := c.latest()
	if l == nil || l.doc == nil {
		return nil, false
	}
	for _, e := range l.doc {
		if e.Key == "_id" {
			return e.Value, true
		}
	}
	return nil, false
}

// expired reports whether doc's TTL field holds a date (earliest of an
// array) before cutoff, and doc matches the partial filter.
func (ix *index) expired(doc bson.D, cutoff time.Time) bool {
	if ix.filter != nil && !ix.filter.Match(doc) {
		return false
	}
	vals, ok := pathValues(doc, ix.fields[0])
	if !ok {
		return false
	}
	var earliest *time.Time
	for _, v := range vals {
		if d, ok := v.(bson.DateTime); ok {
			t := d.Time()
			if earliest == nil || t.Before(*earliest) {
				earliest = &t
			}
		}
	}
	return earliest != nil && earliest.Before(cutoff)
}

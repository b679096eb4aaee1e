package plan

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// blocking reports a query whose sort the plan does not provide: every
// match is read before the first result (a SORT stage).
func (p *Plan) blocking(q Query) bool { return len(q.Sort) > 0 && !p.ProvidesSort }

// wanted is how many matches end the scan early (0: all).
func wanted(q Query) int64 {
	if q.Limit <= 0 {
		return 0
	}
	return q.Skip + q.Limit
}

// finish computes Returned from Matched.
func (p *Plan) finish(q Query) {
	n := max(p.Matched-q.Skip, 0)
	if q.Limit > 0 {
		n = min(n, q.Limit)
	}
	p.Returned = n
}

func match(q Query, d bson.D) bool { return q.Match == nil || q.Match(d) }

func (p *Plan) runCollScan(docs []bson.D, q Query) {
	stop := wanted(q)
	for k := range docs {
		i := k
		if p.Backward {
			i = len(docs) - 1 - k
		}
		p.DocsExamined++
		if match(q, docs[i]) {
			p.Matched++
			if stop > 0 && !p.blocking(q) && p.Matched >= stop {
				break
			}
		}
	}
	p.finish(q)
}

func (p *Plan) runIDHack(docs []bson.D, id any, q Query) {
	p.KeysExamined = 1
	p.Keys = map[int]bson.D{}
	for i, d := range docs {
		v, ok := bsonkit.Get(d, "_id")
		if !ok || !bsonkit.Equal(v, id) {
			continue
		}
		p.DocsExamined = 1
		if match(q, d) {
			p.Matched = 1
			p.Keys[i] = bson.D{{Key: "_id", Value: v}}
		}
		break
	}
	p.finish(q)
}

// entry is one index key of a document.
type entry struct {
	key []any
	doc int
}

func (p *Plan) runIndexScan(docs []bson.D, q Query) {
	ix := p.Index
	var entries []entry
	for i, d := range docs {
		for _, k := range keysOf(d, ix.Key) {
			if p.inBounds(k) {
				entries = append(entries, entry{key: k, doc: i})
			}
		}
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		c := compareKeys(a.key, b.key, ix.Key)
		if p.Backward {
			c = -c
		}
		return c
	})
	p.Keys = map[int]bson.D{}
	seen := map[int]bool{}
	stop := wanted(q)
	for _, e := range entries {
		p.KeysExamined++
		if seen[e.doc] {
			continue
		}
		seen[e.doc] = true
		p.DocsExamined++
		if !match(q, docs[e.doc]) {
			continue
		}
		p.Matched++
		key := make(bson.D, len(ix.Key))
		for f, k := range ix.Key {
			key[f] = bson.E{Key: k.Key, Value: e.key[f]}
		}
		p.Keys[e.doc] = key
		if stop > 0 && !p.blocking(q) && p.Matched >= stop {
			break
		}
	}
	p.finish(q)
}

func (p *Plan) inBounds(key []any) bool {
	for f, v := range key {
		if !p.Bounds[f].contains(v) {
			return false
		}
	}
	return true
}

// compareKeys orders two index keys by the key pattern's directions.
func compareKeys(a, b []any, pattern bson.D) int {
	for f := range a {
		c := bsonkit.Compare(a[f], b[f])
		if isNegative(pattern[f].Value) {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

// keysOf returns the index keys of a document: one value per key field,
// several keys when fields hold arrays (one per element). A missing field
// is indexed as null, an empty array as undefined.
func keysOf(doc bson.D, pattern bson.D) [][]any {
	out := [][]any{{}}
	for _, k := range pattern {
		vals := pathValues(doc, k.Key)
		next := make([][]any, 0, len(out)*len(vals))
		for _, prefix := range out {
			for _, v := range vals {
				key := append(slices.Clone(prefix), v)
				next = append(next, key)
			}
		}
		out = next
	}
	return out
}

// pathValues returns the values an index holds for a path: arrays along
// the path contribute each element.
func pathValues(doc bson.D, path string) []any {
	var out []any
	collect(doc, strings.Split(path, "."), &out)
	if len(out) == 0 {
		return []any{nil}
	}
	return out
}

func collect(cur any, parts []string, out *[]any) {
	if len(parts) == 0 {
		if a, ok := cur.(bson.A); ok {
			if len(a) == 0 {
				*out = append(*out, bson.Undefined{})
				return
			}
			for _, x := range a {
				*out = append(*out, x)
			}
			return
		}
		*out = append(*out, cur)
		return
	}
	switch c := cur.(type) {
	case bson.D:
		v, ok := bsonkit.Get(c, parts[0])
		if !ok {
			*out = append(*out, nil)
			return
		}
		collect(v, parts[1:], out)
	case bson.A:
		for _, x := range c {
			collect(x, parts, out)
		}
	default:
		*out = append(*out, nil)
	}
}

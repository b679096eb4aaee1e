package query

import (
	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Sort is a compiled sort specification. It is immutable and safe for
// concurrent use.
type Sort struct {
	keys []sortKey
}

type sortKey struct {
	parts []string
	desc  bool
}

// CompileSort parses a sort specification such as {a: 1, "b.c": -1}.
// Orderings must be the number 1 or -1 (any numeric type); {$meta: ...}
// orderings are not supported. An empty specification compares every pair
// of documents as equal.
func CompileSort(spec bson.D) (*Sort, error) {
	s := &Sort{keys: make([]sortKey, 0, len(spec))}
	for _, e := range spec {
		if e.Key == "" {
			return nil, badValue("$sort field names cannot be empty")
		}
		if dv, ok := asDoc(e.Value); ok {
			if len(dv) > 0 && dv[0].Key == "$meta" {
				return nil, unsupported("sort by $meta")
			}
			return nil, badValue("Illegal key in $sort specification: %s", e.Key)
		}
		f, ok := numberValue(e.Value)
		if !ok || (f != 1 && f != -1) {
			return nil, badValue("$sort key ordering must be 1 (for ascending) or -1 (for descending)")
		}
		s.keys = append(s.keys, sortKey{parts: splitPath(e.Key), desc: f < 0})
	}
	return s, nil
}

// Compare orders two documents: negative when a sorts before b, positive
// after, 0 when they tie. Missing fields sort as null; a field holding an
// array sorts by its smallest element ascending and its largest descending;
// an empty array sorts before null.
func (s *Sort) Compare(a, b bson.D) int {
	for _, k := range s.keys {
		c := compareSortValues(sortValue(a, k), sortValue(b, k))
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

// Key extracts the sort key of doc once, for callers sorting many
// documents; compare keys with CompareKeys.
func (s *Sort) Key(doc bson.D) []any {
	out := make([]any, len(s.keys))
	for i, k := range s.keys {
		out[i] = sortValue(doc, k)
	}
	return out
}

// CompareKeys compares two keys produced by Key, with Compare's result.
func (s *Sort) CompareKeys(a, b []any) int {
	for i, k := range s.keys {
		c := compareSortValues(a[i], b[i])
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

// emptyArrayT is the sort value of an empty array: below null, above
// MinKey.
type emptyArrayT struct{}

func compareSortValues(a, b any) int {
	_, ea := a.(emptyArrayT)
	_, eb := b.(emptyArrayT)
	switch {
	case ea && eb:
		return 0
	case ea:
		if bsonkit.Rank(b) == bsonkit.RankMinKey {
			return 1
		}
		return -1
	case eb:
		if bsonkit.Rank(a) == bsonkit.RankMinKey {
			return -1
		}
		return 1
	}
	return bsonkit.Compare(a, b)
}

// sortCollector keeps the smallest (ascending) or largest (descending)
// value a path resolves to.
type sortCollector struct {
	best any
	has  bool
	desc bool
}

func (c *sortCollector) consider(v any) {
	if !c.has {
		c.best, c.has = v, true
		return
	}
	r := compareSortValues(v, c.best)
	if (c.desc && r > 0) || (!c.desc && r < 0) {
		c.best = v
	}
}

func (c *sortCollector) leaf(v any) bool {
	if isMissing(v) {
		c.consider(nil)
		return false
	}
	if arr, ok := asArr(v); ok {
		if len(arr) == 0 {
			c.consider(emptyArrayT{})
			return false
		}
		for _, e := range arr {
			c.consider(e)
		}
		return false
	}
	c.consider(v)
	return false
}

func sortValue(doc bson.D, k sortKey) any {
	// Fast path: a top-level scalar field.
	if len(k.parts) == 1 {
		v, ok := field(doc, k.parts[0])
		if !ok {
			return nil
		}
		if _, isArr := asArr(v); !isArr {
			return v
		}
	}
	c := sortCollector{desc: k.desc}
	walkDoc(doc, k.parts, &c)
	if !c.has {
		return nil
	}
	return c.best
}

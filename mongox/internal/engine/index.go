package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// IndexSpec describes an index as createIndexes and listIndexes show it.
type IndexSpec struct {
	Name   string
	Key    bson.D // key pattern, e.g. {a: 1, b: -1}
	Unique bool
	Sparse bool
	// PartialFilter is the partialFilterExpression, nil when absent.
	PartialFilter bson.D
	// ExpireAfterSeconds is the TTL, nil when the index is not a TTL index.
	ExpireAfterSeconds *int64
}

// DefaultIndexName returns MongoDB's default index name for a key pattern:
// "a_1_b_-1".
func DefaultIndexName(key bson.D) string {
	parts := make([]string, 0, 2*len(key))
	for _, e := range key {
		parts = append(parts, e.Key, fmt.Sprint(e.Value))
	}
	return strings.Join(parts, "_")
}

// index is one index of a collection. Unique indexes keep a map from index
// key to the chains that have (or had, in a retained or pending version)
// that key: a superset, rechecked against the versions on every use.
type index struct {
	name    string
	keys    bson.D
	fields  []string
	unique  bool
	sparse  bool
	partial bson.D
	filter  *query.Matcher
	ttl     *int64
	entries map[string]map[*chain]struct{} // unique indexes only
	// prefix maps the hash of each leading run of key values (first
	// field, first two fields, ...) to the chains with a retained or
	// pending version that has it: a superset of the documents an equality
	// query on those fields can match. Non-unique indexes only; see
	// View.candidates.
	prefix map[string]map[*chain]struct{}
}

func newIndex(s IndexSpec) (*index, error) {
	ix := &index{name: s.Name, keys: s.Key, unique: s.Unique, sparse: s.Sparse, partial: s.PartialFilter}
	if s.ExpireAfterSeconds != nil {
		v := *s.ExpireAfterSeconds
		ix.ttl = &v
	}
	for _, e := range s.Key {
		ix.fields = append(ix.fields, e.Key)
	}
	if s.PartialFilter != nil {
		m, err := query.Compile(s.PartialFilter)
		if err != nil {
			return nil, &Error{Code: CodeCannotCreateIndex, CodeName: "CannotCreateIndex", Msg: "bad partialFilterExpression: " + err.Error()}
		}
		ix.filter = m
	}
	if ix.unique {
		ix.entries = map[string]map[*chain]struct{}{}
	} else {
		ix.prefix = map[string]map[*chain]struct{}{}
	}
	return ix, nil
}

func (ix *index) spec() IndexSpec {
	s := IndexSpec{Name: ix.name, Key: ix.keys, Unique: ix.unique, Sparse: ix.sparse, PartialFilter: ix.partial}
	if ix.ttl != nil {
		v := *ix.ttl
		s.ExpireAfterSeconds = &v
	}
	return s
}

// covers reports whether doc belongs in the index (sparse and partial rules).
func (ix *index) covers(doc bson.D) bool {
	if ix.filter != nil && !ix.filter.Match(doc) {
		return false
	}
	if ix.sparse {
		for _, f := range ix.fields {
			if _, ok := pathValues(doc, f); ok {
				return true
			}
		}
		return false
	}
	return true
}

// indexKey is one key of a document in an index: its hash and its values.
type indexKey struct {
	hash   string
	values []any
	// prefixes[i] is the hash of values[:i+1]; the last one is hash.
	prefixes []string
}

// keysOf returns the index keys of doc (several for multikey documents);
// nil when the document is not in the index.
func (ix *index) keysOf(doc bson.D) []indexKey {
	if doc == nil || !ix.covers(doc) {
		return nil
	}
	out := []indexKey{{}}
	for _, f := range ix.fields {
		vals, ok := pathValues(doc, f)
		if !ok {
			vals = []any{nil}
		}
		next := make([]indexKey, 0, len(out)*len(vals))
		seen := map[string]bool{}
		for _, k := range out {
			for _, v := range vals {
				h := k.hash + bsonkit.Key(v)
				if seen[h] {
					continue
				}
				seen[h] = true
				next = append(next, indexKey{hash: h, values: append(append([]any(nil), k.values...), v),
					prefixes: append(append([]string(nil), k.prefixes...), h)})
			}
		}
		out = next
	}
	return out
}

func (ix *index) hasKey(doc bson.D, hash string) bool {
	for _, k := range ix.keysOf(doc) {
		if k.hash == hash {
			return true
		}
	}
	return false
}

func (ix *index) keyValue(k indexKey) bson.D {
	d := make(bson.D, len(ix.fields))
	for i, f := range ix.fields {
		d[i] = bson.E{Key: f, Value: k.values[i]}
	}
	return d
}

func (ix *index) add(hash string, c *chain) {
	m := ix.entries[hash]
	if m == nil {
		m = map[*chain]struct{}{}
		ix.entries[hash] = m
	}
	m[c] = struct{}{}
}

// addPrefixes registers c under every key prefix of doc.
func (ix *index) addPrefixes(c *chain, doc bson.D) {
	for _, k := range ix.keysOf(doc) {
		for _, p := range k.prefixes {
			m := ix.prefix[p]
			if m == nil {
				m = map[*chain]struct{}{}
				ix.prefix[p] = m
			}
			m[c] = struct{}{}
		}
	}
}

// forgetPrefixes removes c from the prefixes of docs that none of its
// retained or pending versions still has.
func (ix *index) forgetPrefixes(c *chain, docs []bson.D) {
	var held map[string]bool
	for _, d := range docs {
		for _, k := range ix.keysOf(d) {
			for _, p := range k.prefixes {
				if held == nil {
					held = c.prefixesHeld(ix)
				}
				if held[p] {
					continue
				}
				if m := ix.prefix[p]; m != nil {
					delete(m, c)
					if len(m) == 0 {
						delete(ix.prefix, p)
					}
				}
			}
		}
	}
}

// impliesPartial reports whether every document filter matches is in the
// index's partial filter, judged conservatively: each condition of the
// partial filter must be a plain {field: value} equality that filter
// repeats with an equal value.
func (ix *index) impliesPartial(filter bson.D) bool {
	for _, e := range ix.partial {
		if strings.HasPrefix(e.Key, "$") || !plainValue(e.Value) {
			return false
		}
		if d, ok := e.Value.(bson.D); ok && len(d) > 0 && strings.HasPrefix(d[0].Key, "$") {
			return false
		}
		vals, ok := eqValues(filter, e.Key)
		if !ok || len(vals) != 1 || !bsonkit.Equal(vals[0], e.Value) {
			return false
		}
	}
	return true
}

// forget removes c from the entries of keys that none of its retained or
// pending versions still has.
func (ix *index) forget(c *chain, docs []bson.D) {
	if ix.prefix != nil {
		ix.forgetPrefixes(c, docs)
	}
	if ix.entries == nil {
		return
	}
	for _, d := range docs {
		for _, k := range ix.keysOf(d) {
			if c.anyVersionHas(ix, k.hash) {
				continue
			}
			if m := ix.entries[k.hash]; m != nil {
				delete(m, c)
				if len(m) == 0 {
					delete(ix.entries, k.hash)
				}
			}
		}
	}
}

// pathValues returns the values a dotted path reaches in doc, fanning out
// over arrays as multikey indexes do: an array at the end of the path
// contributes its elements (an empty array contributes undefined). ok is
// false when the path reaches nothing.
func pathValues(doc bson.D, path string) ([]any, bool) {
	var out []any
	collect(doc, strings.Split(path, "."), &out)
	if len(out) == 0 {
		return nil, false
	}
	return out, true
}

func collect(cur any, parts []string, out *[]any) {
	if len(parts) == 0 {
		if a, ok := cur.(bson.A); ok {
			if len(a) == 0 {
				*out = append(*out, bson.Undefined{})
			}
			*out = append(*out, a...)
			return
		}
		*out = append(*out, cur)
		return
	}
	switch c := cur.(type) {
	case bson.D:
		if v, ok := bsonkit.Get(c, parts[0]); ok {
			collect(v, parts[1:], out)
		}
	case bson.A:
		if i, err := strconv.Atoi(parts[0]); err == nil && i >= 0 && i < len(c) {
			collect(c[i], parts[1:], out)
		}
		for _, el := range c {
			if d, ok := el.(bson.D); ok {
				collect(d, parts, out)
			}
		}
	}
}

// eqValues returns the plain values a filter allows for field: one through
// {field: v} or {field: {$eq: v}}, the list for $in.
func eqValues(filter bson.D, field string) ([]any, bool) {
	for _, e := range filter {
		if e.Key != field {
			continue
		}
		if d, ok := e.Value.(bson.D); ok && len(d) > 0 && strings.HasPrefix(d[0].Key, "$") {
			if len(d) != 1 {
				return nil, false
			}
			switch d[0].Key {
			case "$eq":
				if plainValue(d[0].Value) {
					return []any{d[0].Value}, true
				}
			case "$in":
				arr, ok := d[0].Value.(bson.A)
				if !ok {
					return nil, false
				}
				for _, v := range arr {
					if !plainValue(v) {
						return nil, false
					}
				}
				return arr, true
			}
			return nil, false
		}
		if plainValue(e.Value) {
			return []any{e.Value}, true
		}
		return nil, false
	}
	return nil, false
}

// plainValue reports whether equality on v is a plain key lookup (no
// regex, array or null semantics).
func plainValue(v any) bool {
	switch v.(type) {
	case nil, bson.A, bson.Regex, bson.Undefined, bson.MinKey, bson.MaxKey:
		return false
	case bson.D:
		return true
	}
	return true
}

// Package plan chooses, for a query of the embedded MongoDB server, the
// plan MongoDB's query planner would choose among the collection's indexes,
// and describes it as explain does: the winning plan (collection scan,
// _id lookup or index scan with its bounds), the rejected plans, and the
// keys and documents that plan examines.
//
// The engine answers queries from its own structures (hash lookups by _id
// and unique keys, scans otherwise); the figures here are those of the
// chosen plan run over the collection's documents in index order, so that
// a test asserting "this query uses index x and examines n keys" gets the
// answer MongoDB gives for the common cases. The choice follows MongoDB's
// rules in simplified form: an _id equality is IDHACK; indexes whose
// leading field the filter constrains are candidates (sparse indexes only
// when the filter excludes missing values, partial indexes only when the
// filter implies their filter), and so is an index providing the sort; the
// candidate with the most results per unit of work wins (MongoDB's trial
// period), an index that provides the sort winning ties.
package plan

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
)

// Index describes an index of the collection.
type Index struct {
	Name          string
	Key           bson.D
	Unique        bool
	Sparse        bool
	PartialFilter bson.D // nil when the index is not partial
	// Special is the index type of a non-ordered index ("text",
	// "2dsphere", "hashed", ...): such indexes are not planned here.
	Special string
}

// Query is what a plan is chosen for.
type Query struct {
	Filter bson.D
	Sort   bson.D
	// Hint is an index name, a key pattern or {$natural: ±1}; nil for none.
	Hint        any
	Skip, Limit int64
	// Match decides whether a document matches Filter; nil matches all.
	Match func(bson.D) bool
}

// Kind is the access path of a plan.
type Kind string

// The access paths.
const (
	CollScan Kind = "COLLSCAN"
	IDHack   Kind = "IDHACK"
	IxScan   Kind = "IXSCAN"
)

// Plan is a candidate access path with what it examined over the
// collection's documents.
type Plan struct {
	Kind  Kind
	Index *Index
	// Bounds are the intervals of each index field, in key order.
	Bounds []intervals
	// Backward scans the index (or the collection) in reverse.
	Backward bool
	// ProvidesSort: the index order is the requested sort (no SORT stage).
	ProvidesSort bool
	// Multikey reports an index with an array along some key field, and
	// MultikeyPaths the fields that hold arrays.
	Multikey      bool
	MultikeyPaths map[string]bool

	// Figures of a run of the plan over the documents.
	KeysExamined int64
	DocsExamined int64
	// Matched is how many documents matched the filter before skip and
	// limit; Returned how many the plan returned.
	Matched, Returned int64
	// Keys maps the position of each matching document (in the slice given
	// to Choose) to the index key the plan found it by; nil for scans
	// without an index.
	Keys map[int]bson.D

	eqFields int // leading index fields bound to points
}

// Choose returns the winning plan for q over docs (the collection's
// documents in natural order) and the rejected candidates.
func Choose(indexes []Index, docs []bson.D, q Query) (*Plan, []*Plan, error) {
	if q.Hint != nil {
		p, err := hinted(indexes, docs, q)
		if err != nil {
			return nil, nil, err
		}
		return p, nil, nil
	}
	if id, ok := idEquality(q); ok {
		p := &Plan{Kind: IDHack, Index: idIndex(indexes)}
		p.runIDHack(docs, id, q)
		return p, nil, nil
	}
	preds := fieldPreds(q.Filter)
	var cands []*Plan
	for i := range indexes {
		ix := &indexes[i]
		if ix.Special != "" {
			continue
		}
		if p := candidate(ix, preds, docs, q); p != nil {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		p := &Plan{Kind: CollScan}
		p.runCollScan(docs, q)
		return p, nil, nil
	}
	for _, p := range cands {
		p.runIndexScan(docs, q)
	}
	slices.SortStableFunc(cands, func(a, b *Plan) int { return better(a, b, q) })
	return cands[0], cands[1:], nil
}

// better orders plans best first: most results per unit of work, then
// the one providing the sort, then more equality-bound fields.
func better(a, b *Plan, q Query) int {
	pa, pb := a.productivity(), b.productivity()
	if pa != pb {
		if pa > pb {
			return -1
		}
		return 1
	}
	if len(q.Sort) > 0 && a.ProvidesSort != b.ProvidesSort {
		if a.ProvidesSort {
			return -1
		}
		return 1
	}
	return b.eqFields - a.eqFields
}

func (p *Plan) productivity() float64 {
	return float64(p.Matched+1) / float64(p.KeysExamined+p.DocsExamined+1)
}

func idIndex(indexes []Index) *Index {
	for i := range indexes {
		if indexes[i].Name == "_id_" {
			return &indexes[i]
		}
	}
	return &Index{Name: "_id_", Key: bson.D{{Key: "_id", Value: int32(1)}}, Unique: true}
}

// idEquality reports a query MongoDB answers by _id lookup (IDHACK): a
// filter of one _id equality to a scalar, with no sort.
func idEquality(q Query) (any, bool) {
	if len(q.Filter) != 1 || q.Filter[0].Key != "_id" || len(q.Sort) > 0 {
		return nil, false
	}
	v := q.Filter[0].Value
	if ops, ok := isOperatorDoc(v); ok {
		if len(ops) != 1 || ops[0].Key != "$eq" {
			return nil, false
		}
		v = ops[0].Value
	}
	switch v.(type) {
	case bson.D, bson.A, bson.Regex, nil:
		return nil, false
	}
	return v, true
}

// hinted builds the plan a hint forces.
func hinted(indexes []Index, docs []bson.D, q Query) (*Plan, error) {
	if d, ok := q.Hint.(bson.D); ok && len(d) == 1 && d[0].Key == "$natural" {
		p := &Plan{Kind: CollScan, Backward: isNegative(d[0].Value)}
		p.runCollScan(docs, q)
		return p, nil
	}
	for i := range indexes {
		ix := &indexes[i]
		if name, ok := q.Hint.(string); ok && ix.Name != name {
			continue
		}
		if key, ok := q.Hint.(bson.D); ok && !bsonkit.Equal(ix.Key, key) {
			continue
		}
		if ix.Special != "" {
			break
		}
		p := &Plan{Kind: IxScan, Index: ix}
		p.multikey(docs)
		p.bounds(fieldPreds(q.Filter))
		p.sortOrder(q.Sort)
		p.runIndexScan(docs, q)
		return p, nil
	}
	return nil, mongoerr.New(2, "error processing query: planner returned error :: caused by :: hint provided does not correspond to an existing index")
}

func isNegative(v any) bool {
	n, ok := bsonkit.ToFloat64(v)
	return ok && n < 0
}

// candidate returns the index scan of ix when the planner would consider
// it: its leading field is constrained by the filter, or it provides the
// sort.
func candidate(ix *Index, preds map[string][]pred, docs []bson.D, q Query) *Plan {
	if len(ix.Key) == 0 {
		return nil
	}
	p := &Plan{Kind: IxScan, Index: ix}
	lead := ix.Key[0].Key
	_, constrained := preds[lead]
	if ix.Sparse && !excludesMissing(preds[lead]) {
		constrained = false
	}
	if ix.PartialFilter != nil && !implies(preds, fieldPreds(ix.PartialFilter)) {
		return nil
	}
	p.multikey(docs)
	p.bounds(preds)
	p.sortOrder(q.Sort)
	if !constrained && !(p.ProvidesSort && !ix.Sparse) {
		return nil
	}
	return p
}

// excludesMissing reports predicates no document without the field
// (or with null) can satisfy.
func excludesMissing(ps []pred) bool {
	if len(ps) == 0 {
		return false
	}
	for _, p := range ps {
		if !p.nullable && !p.ivs.contains(nil) {
			return true
		}
	}
	return false
}

// implies reports whether the filter's predicates are at least as strict
// as the partial filter's, field by field.
func implies(filter, partial map[string][]pred) bool {
	for field, ps := range partial {
		want := intervals{full}
		for _, p := range ps {
			want = want.intersect(p.ivs)
		}
		got := intervals{full}
		fps, ok := filter[field]
		if !ok {
			return false
		}
		for _, p := range fps {
			got = got.intersect(p.ivs)
		}
		if !want.covers(got) {
			return false
		}
	}
	return true
}

// bounds sets the intervals of each index field from the predicates.
func (p *Plan) bounds(preds map[string][]pred) {
	p.Bounds = make([]intervals, len(p.Index.Key))
	leading := true
	for i, k := range p.Index.Key {
		ivs := intervals{full}
		for _, pr := range preds[k.Key] {
			if p.Multikey && p.MultikeyPaths[k.Key] && !ivs.isFull() {
				break // a multikey field keeps the bounds of one predicate
			}
			ivs = ivs.intersect(pr.ivs)
		}
		p.Bounds[i] = ivs
		if leading && ivs.allPoints() && len(ivs) == 1 {
			p.eqFields++
		} else {
			leading = false
		}
	}
}

// sortOrder decides whether the index order provides the sort: the sort
// fields follow the equality-bound leading fields of the key pattern, all
// in the key's directions or all reversed.
func (p *Plan) sortOrder(sortSpec bson.D) {
	if len(sortSpec) == 0 || p.Multikey {
		return
	}
	key := p.Index.Key[p.eqFields:]
	if len(sortSpec) > len(key) {
		// Fields bound to points may also appear in the sort.
		return
	}
	dir := 0
	for i, s := range sortSpec {
		if key[i].Key != s.Key {
			return
		}
		same := isNegative(key[i].Value) == isNegative(s.Value)
		d := 1
		if !same {
			d = -1
		}
		if dir != 0 && d != dir {
			return
		}
		dir = d
	}
	p.ProvidesSort = true
	p.Backward = dir < 0
}

// multikey finds the key fields that hold arrays in some document.
func (p *Plan) multikey(docs []bson.D) {
	p.MultikeyPaths = map[string]bool{}
	for _, k := range p.Index.Key {
		for _, d := range docs {
			if throughArray(d, k.Key) {
				p.MultikeyPaths[k.Key] = true
				p.Multikey = true
				break
			}
		}
	}
}

// throughArray reports whether a path meets an array in doc.
func throughArray(doc bson.D, path string) bool {
	var cur any = doc
	for part := range strings.SplitSeq(path, ".") {
		d, ok := cur.(bson.D)
		if !ok {
			return false
		}
		v, ok := bsonkit.Get(d, part)
		if !ok {
			return false
		}
		if _, isArr := v.(bson.A); isArr {
			return true
		}
		cur = v
	}
	return false
}

package pipeline

import (
	"container/heap"
	"math"
	"slices"

	"github.com/event-outbox/outbox/mongox/internal/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// --- $match ---

type matchStage struct{ m *query.Matcher }

func parseMatch(arg any, vars bson.D) (stage, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(15959, "the match filter must be an expression in an object")
	}
	m, err := query.CompileWithVars(d, vars)
	if err != nil {
		return nil, asPipelineError(err)
	}
	return &matchStage{m: m}, nil
}

func (s *matchStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	out := make([]bson.D, 0, len(in))
	for _, d := range in {
		if s.m.Match(d) {
			out = append(out, d)
		}
	}
	return out, nil
}

// --- $sort ---

type sortStage struct {
	s *query.Sort
	// limit, when positive, is the $limit that directly follows: only the
	// first limit documents are kept (top-k instead of a full sort).
	limit int64
}

func parseSort(arg any, vars bson.D) (stage, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(15973, "the $sort key specification must be an object")
	}
	if len(d) == 0 {
		return nil, errf(15976, "$sort stage must have at least one sort key")
	}
	s, err := query.CompileSort(d)
	if err != nil {
		return nil, asPipelineError(err)
	}
	return &sortStage{s: s}, nil
}

type sortKeyed struct {
	key []any
	pos int
	doc bson.D
}

// topK is a max-heap (worst document on top) holding the best k documents.
type topK struct {
	s     *query.Sort
	items []sortKeyed
}

func (h *topK) less(a, b sortKeyed) int {
	if c := h.s.CompareKeys(a.key, b.key); c != 0 {
		return c
	}
	return a.pos - b.pos
}
func (h *topK) Len() int           { return len(h.items) }
func (h *topK) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) > 0 }
func (h *topK) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *topK) Push(x any)         { h.items = append(h.items, x.(sortKeyed)) }
func (h *topK) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

func (s *sortStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	var ks []sortKeyed
	if s.limit > 0 && s.limit < int64(len(in)) {
		h := &topK{s: s.s, items: make([]sortKeyed, 0, s.limit)}
		for i, d := range in {
			k := sortKeyed{s.s.Key(d), i, d}
			if int64(h.Len()) < s.limit {
				heap.Push(h, k)
			} else if h.less(k, h.items[0]) < 0 {
				h.items[0] = k
				heap.Fix(h, 0)
			}
		}
		ks = h.items
	} else {
		ks = make([]sortKeyed, len(in))
		for i, d := range in {
			ks[i] = sortKeyed{s.s.Key(d), i, d}
		}
	}
	slices.SortFunc(ks, func(a, b sortKeyed) int {
		if c := s.s.CompareKeys(a.key, b.key); c != 0 {
			return c
		}
		return a.pos - b.pos
	})
	out := make([]bson.D, len(ks))
	for i, k := range ks {
		out[i] = k.doc
	}
	return out, nil
}

// --- $skip and $limit ---

// stageInt reads the non-negative whole-number argument of $skip/$limit.
func stageInt(name string, arg any) (int64, error) {
	if !isNum(arg) {
		return 0, errf(15957, "argument to %s stage must be a number", name)
	}
	n, ok := wholeNumber(arg)
	if !ok {
		if f := toF(arg); f >= math.MaxInt64 {
			return math.MaxInt64, nil
		}
		return 0, errf(15957, "invalid argument to %s stage: Cannot represent as a 64-bit integer: %s: %s", name, name, render(arg))
	}
	return n, nil
}

type skipStage struct{ n int64 }

func parseSkip(arg any, vars bson.D) (stage, error) {
	n, err := stageInt("$skip", arg)
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errf(15956, "invalid argument to $skip stage: Expected a non-negative number in: $skip: %d", n)
	}
	return &skipStage{n: n}, nil
}

func (s *skipStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	if s.n >= int64(len(in)) {
		return nil, nil
	}
	return in[s.n:len(in):len(in)], nil
}

type limitStage struct{ n int64 }

func parseLimit(arg any, vars bson.D) (stage, error) {
	n, err := stageInt("$limit", arg)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, errf(15958, "the limit must be positive")
	}
	return &limitStage{n: n}, nil
}

func (s *limitStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	if s.n >= int64(len(in)) {
		return in, nil
	}
	return in[:s.n:s.n], nil
}

// --- $count ---

type countStage struct{ field string }

func parseCount(arg any, vars bson.D) (stage, error) {
	s, ok := arg.(string)
	if !ok {
		return nil, errf(40156, "the count field must be a non-empty string")
	}
	switch {
	case s == "":
		return nil, errf(40157, "the count field must be a non-empty string")
	case s[0] == '$':
		return nil, errf(40158, "the count field cannot be a $-prefixed path")
	case containsDot(s):
		return nil, errf(40160, "the count field cannot contain '.'")
	}
	return &countStage{field: s}, nil
}

func containsDot(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return true
		}
	}
	return false
}

func (s *countStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	if len(in) == 0 {
		return nil, nil
	}
	return []bson.D{{{Key: s.field, Value: intResult(int64(len(in)))}}}, nil
}

// --- $replaceRoot / $replaceWith ---

type replaceRootStage struct{ expr evalFn }

func parseReplaceRoot(arg any, vars bson.D) (stage, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40229, "expected an object as specification for $replaceRoot stage, got %s", typeName(arg))
	}
	var newRoot any
	found := false
	for _, e := range d {
		if e.Key != "newRoot" {
			return nil, errf(40415, "BSON field '$replaceRoot.%s' is an unknown field.", e.Key)
		}
		newRoot, found = e.Value, true
	}
	if !found {
		return nil, errf(40414, "BSON field '$replaceRoot.newRoot' is missing but a required field")
	}
	return parseReplaceWith(newRoot, vars)
}

func parseReplaceWith(arg any, vars bson.D) (stage, error) {
	p := parser{vars: vars}
	fn, err := p.parse(arg)
	if err != nil {
		return nil, err
	}
	return &replaceRootStage{expr: fn}, nil
}

func (s *replaceRootStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out := make([]bson.D, 0, len(in))
	for _, d := range in {
		c.reset(d)
		v, err := s.expr(c)
		if err != nil {
			return nil, err
		}
		nd, ok := asDoc(v)
		if !ok {
			return nil, errf(40228, "'newRoot' expression must evaluate to an object, but resulting value was: %s. Type of resulting value: '%s'. Input document: %s", render(v), typeName(v), render(d))
		}
		out = append(out, nd)
	}
	return out, nil
}

// --- $redact ---

type redactStage struct{ expr evalFn }

func parseRedact(arg any, vars bson.D) (stage, error) {
	p := parser{vars: vars}
	fn, err := p.parse(arg)
	if err != nil {
		return nil, err
	}
	return &redactStage{expr: fn}, nil
}

func (s *redactStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out := make([]bson.D, 0, len(in))
	for _, d := range in {
		c.reset(d)
		r, keep, err := s.redact(d, c)
		if err != nil {
			return nil, err
		}
		if keep {
			out = append(out, r)
		}
	}
	return out, nil
}

// redact applies the expression at one document level.
func (s *redactStage) redact(d bson.D, c *ctx) (bson.D, bool, error) {
	c.current = d
	v, err := s.expr(c)
	if err != nil {
		return nil, false, err
	}
	switch v {
	case redactMarker("KEEP"):
		return d, true, nil
	case redactMarker("PRUNE"):
		return nil, false, nil
	case redactMarker("DESCEND"):
	default:
		return nil, false, errf(17053, "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned %s", render(v))
	}
	out := make(bson.D, 0, len(d))
	for _, e := range d {
		switch x := e.Value.(type) {
		case bson.D:
			r, keep, err := s.redact(x, c)
			if err != nil {
				return nil, false, err
			}
			if keep {
				out = append(out, bson.E{Key: e.Key, Value: r})
			}
		case bson.A:
			arr, err := s.redactArray(x, c)
			if err != nil {
				return nil, false, err
			}
			out = append(out, bson.E{Key: e.Key, Value: arr})
		default:
			out = append(out, e)
		}
	}
	return out, true, nil
}

func (s *redactStage) redactArray(a bson.A, c *ctx) (bson.A, error) {
	out := make(bson.A, 0, len(a))
	for _, e := range a {
		switch x := e.(type) {
		case bson.D:
			r, keep, err := s.redact(x, c)
			if err != nil {
				return nil, err
			}
			if keep {
				out = append(out, r)
			}
		case bson.A:
			r, err := s.redactArray(x, c)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		default:
			out = append(out, e)
		}
	}
	return out, nil
}

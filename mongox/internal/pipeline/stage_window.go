package pipeline

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// --- $setWindowFields ---
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/setWindowFields/
//
// Supported: partitionBy, sortBy, and output fields computed by the
// accumulators ($sum, $avg, $min, $max, $count, $push, $addToSet, $first,
// $last, $stdDevPop, $stdDevSamp) over the whole partition or a window of
// documents ([lo, hi] positions relative to the current document) or of
// range ([lo, hi] added to the current document's single sortBy value,
// without unit), and the order functions $rank, $denseRank,
// $documentNumber and $shift. Other window functions ($derivative,
// $integral, $expMovingAvg, $linearFill, $locf, $covariance..., time
// units) are refused as not supported.

// bound is one end of a window: unbounded, the current document, or an
// offset (a position for documents windows, a value for range windows).
type bound struct {
	unbounded, current bool
	n                  any
}

type windowField struct {
	name string
	op   string
	arg  evalFn // the accumulator's argument, or $shift's output
	// by and def are $shift's offset and default.
	by  int
	def evalFn
	// kind is "" (the whole partition), "documents" or "range".
	kind   string
	lo, hi bound
}

type windowStage struct {
	partitionBy evalFn
	sortSpec    bson.D
	sort        *query.Sort
	fields      []windowField
}

// orderFunctions need a sortBy and take no window.
var orderFunctions = map[string]bool{"$rank": true, "$denseRank": true, "$documentNumber": true, "$shift": true}

func parseSetWindowFields(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(codeFailedToParse, "the $setWindowFields stage specification must be an object, found %s", typeName(arg))
	}
	s := &windowStage{}
	p := parser{vars: vars}
	var output bson.D
	for _, e := range spec {
		switch e.Key {
		case "partitionBy":
			fn, err := p.parse(e.Value)
			if err != nil {
				return nil, err
			}
			s.partitionBy = fn
		case "sortBy":
			d, ok := e.Value.(bson.D)
			if !ok {
				return nil, errf(codeTypeMismatch, "BSON field '$setWindowFields.sortBy' is the wrong type '%s', expected type 'object'", typeName(e.Value))
			}
			srt, err := query.CompileSort(d)
			if err != nil {
				return nil, asPipelineError(err)
			}
			s.sortSpec, s.sort = d, srt
		case "output":
			d, ok := e.Value.(bson.D)
			if !ok {
				return nil, errf(codeTypeMismatch, "BSON field '$setWindowFields.output' is the wrong type '%s', expected type 'object'", typeName(e.Value))
			}
			output = d
		default:
			return nil, errf(40415, "BSON field '$setWindowFields.%s' is an unknown field.", e.Key)
		}
	}
	if output == nil {
		return nil, errf(40414, "BSON field '$setWindowFields.output' is missing but a required field")
	}
	for _, o := range output {
		f, err := s.parseOutput(o, p)
		if err != nil {
			return nil, err
		}
		s.fields = append(s.fields, f)
	}
	return s, nil
}

func (s *windowStage) parseOutput(o bson.E, p parser) (windowField, error) {
	f := windowField{name: o.Key}
	d, ok := o.Value.(bson.D)
	if !ok {
		return f, errf(codeFailedToParse, "The field '%s' must be an object", o.Key)
	}
	var window bson.D
	for _, e := range d {
		if e.Key == "window" {
			w, ok := e.Value.(bson.D)
			if !ok {
				return f, errf(codeFailedToParse, "'window' field must be an object")
			}
			window = w
			continue
		}
		if f.op != "" {
			return f, errf(codeFailedToParse, "Window function found an unknown argument: %s", e.Key)
		}
		f.op = e.Key
		switch {
		case e.Key == "$count":
			f.arg = constant(int32(1))
		case e.Key == "$rank" || e.Key == "$denseRank" || e.Key == "$documentNumber":
			if a, ok := e.Value.(bson.D); !ok || len(a) != 0 {
				return f, errf(5371603, "%s must be specified with '{}' as the value", e.Key)
			}
		case e.Key == "$shift":
			a, ok := e.Value.(bson.D)
			if !ok {
				return f, errf(5532400, "Argument to $shift must be an object")
			}
			hasOutput, hasBy := false, false
			for _, x := range a {
				switch x.Key {
				case "output":
					fn, err := p.parse(x.Value)
					if err != nil {
						return f, err
					}
					f.arg, hasOutput = fn, true
				case "by":
					n, ok := bsonkit.ToInt64(x.Value)
					if !ok {
						return f, errf(5532402, "'$shift:by' field must be an integer, but found %v", x.Value)
					}
					f.by, hasBy = int(n), true
				case "default":
					fn, err := p.parse(x.Value)
					if err != nil {
						return f, err
					}
					f.def = fn
				default:
					return f, errf(5532404, "Unknown argument in $shift: %s", x.Key)
				}
			}
			if !hasOutput || !hasBy {
				return f, errf(5532401, "$shift requires 'output' and 'by' fields")
			}
		default:
			if _, ok := accumulators[e.Key]; !ok {
				return f, errf(codeNotImplemented, "window function %s is not supported by the embedded MongoDB server", e.Key)
			}
			fn, err := p.parse(e.Value)
			if err != nil {
				return f, err
			}
			f.arg = fn
		}
	}
	if f.op == "" {
		return f, errf(codeFailedToParse, "Expected a window function in the output field '%s'", o.Key)
	}
	if orderFunctions[f.op] {
		if s.sort == nil {
			return f, errf(5371602, "%s must be specified with a top level sortBy expression with exactly one element", f.op)
		}
		if window != nil {
			return f, errf(5371601, "%s does not accept a 'window' field", f.op)
		}
		if f.op != "$documentNumber" && f.op != "$shift" && len(s.sortSpec) != 1 {
			return f, errf(5371602, "%s must be specified with a top level sortBy expression with exactly one element", f.op)
		}
		return f, nil
	}
	for _, w := range window {
		switch w.Key {
		case "documents", "range":
			if f.kind != "" {
				return f, errf(5339800, "Window bounds can specify either 'documents' or 'range', not both")
			}
			a, ok := w.Value.(bson.A)
			if !ok || len(a) != 2 {
				return f, errf(codeFailedToParse, "Window bounds must be a 2-element array")
			}
			lo, err := parseBound(w.Key, a[0])
			if err != nil {
				return f, err
			}
			hi, err := parseBound(w.Key, a[1])
			if err != nil {
				return f, err
			}
			f.kind, f.lo, f.hi = w.Key, lo, hi
		case "unit":
			return f, errf(codeNotImplemented, "$setWindowFields window 'unit' (time-based range) is not supported by the embedded MongoDB server")
		default:
			return f, errf(codeFailedToParse, "'window' field that is not 'documents', 'range' or 'unit': %s", w.Key)
		}
	}
	if f.kind != "" && s.sort == nil && !(f.lo.unbounded && f.hi.unbounded) {
		return f, errf(5339901, "Document-based bounds require a sortBy")
	}
	if f.kind == "range" && len(s.sortSpec) != 1 {
		return f, errf(5339902, "Range-based bounds require sortBy a single field")
	}
	return f, nil
}

func parseBound(kind string, v any) (bound, error) {
	if s, ok := v.(string); ok {
		switch s {
		case "unbounded":
			return bound{unbounded: true}, nil
		case "current":
			return bound{current: true}, nil
		}
		return bound{}, errf(codeFailedToParse, "Window bounds must be 'unbounded', 'current', or a number, found '%s'", s)
	}
	if kind == "documents" {
		n, ok := bsonkit.ToInt64(v)
		if !ok {
			return bound{}, errf(codeFailedToParse, "Numeric document-based bounds must be an integer")
		}
		return bound{n: n}, nil
	}
	if !bsonkit.IsNumber(v) {
		return bound{}, errf(codeFailedToParse, "Range-based bounds expression must be a number")
	}
	return bound{n: v}, nil
}

func (s *windowStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	type part struct {
		key  any
		docs []bson.D
	}
	index := map[string]int{}
	var parts []*part
	for _, d := range in {
		var key any
		if s.partitionBy != nil {
			c.reset(d)
			v, err := s.partitionBy(c)
			if err != nil {
				return nil, err
			}
			key = orNull(v)
		}
		k := bsonkit.Key(key)
		i, ok := index[k]
		if !ok {
			i = len(parts)
			index[k] = i
			parts = append(parts, &part{key: key})
		}
		parts[i].docs = append(parts[i].docs, d)
	}
	// Partitions in partitionBy order, each sorted by sortBy.
	slices.SortStableFunc(parts, func(a, b *part) int { return cmpValues(a.key, b.key) })
	out := make([]bson.D, 0, len(in))
	for _, p := range parts {
		docs := p.docs
		var keys [][]any
		if s.sort != nil {
			ks := make([]sortKeyed, len(docs))
			for i, d := range docs {
				ks[i] = sortKeyed{s.sort.Key(d), i, d}
			}
			slices.SortStableFunc(ks, func(a, b sortKeyed) int { return s.sort.CompareKeys(a.key, b.key) })
			keys = make([][]any, len(ks))
			for i, k := range ks {
				docs[i], keys[i] = k.doc, k.key
			}
		}
		vals := make([][]any, len(s.fields))
		for j, f := range s.fields {
			v, err := s.compute(f, docs, keys, c)
			if err != nil {
				return nil, err
			}
			vals[j] = v
		}
		for i, d := range docs {
			nd := append(bson.D{}, d...)
			for j, f := range s.fields {
				nd = setField(nd, f.name, vals[j][i])
			}
			out = append(out, nd)
		}
	}
	return out, nil
}

// compute returns the value of one output field for each document of a
// sorted partition.
func (s *windowStage) compute(f windowField, docs []bson.D, keys [][]any, c *ctx) ([]any, error) {
	out := make([]any, len(docs))
	switch f.op {
	case "$documentNumber":
		for i := range docs {
			out[i] = int32(i + 1)
		}
		return out, nil
	case "$rank", "$denseRank":
		rank, dense := 0, 0
		for i := range docs {
			if i == 0 || s.sort.CompareKeys(keys[i-1], keys[i]) != 0 {
				rank, dense = i+1, dense+1
			}
			if f.op == "$rank" {
				out[i] = int32(rank)
			} else {
				out[i] = int32(dense)
			}
		}
		return out, nil
	case "$shift":
		for i := range docs {
			j := i + f.by
			if j >= 0 && j < len(docs) {
				c.reset(docs[j])
				v, err := f.arg(c)
				if err != nil {
					return nil, err
				}
				out[i] = orNull(v)
				continue
			}
			out[i] = nil
			if f.def != nil {
				c.reset(docs[i])
				v, err := f.def(c)
				if err != nil {
					return nil, err
				}
				out[i] = orNull(v)
			}
		}
		return out, nil
	}
	// The argument of each document, evaluated once.
	args := make([]any, len(docs))
	for i, d := range docs {
		c.reset(d)
		v, err := f.arg(c)
		if err != nil {
			return nil, err
		}
		args[i] = v
	}
	mk := accumulators[f.op]
	if f.op == "$count" {
		mk = accumulators["$sum"]
	}
	for i := range docs {
		lo, hi := s.window(f, i, docs, keys)
		acc := mk()
		for j := lo; j <= hi; j++ {
			if err := acc.add(args[j]); err != nil {
				return nil, err
			}
		}
		out[i] = acc.result()
	}
	return out, nil
}

// window returns the positions [lo, hi] of the window of document i
// (hi < lo when empty).
func (s *windowStage) window(f windowField, i int, docs []bson.D, keys [][]any) (int, int) {
	n := len(docs)
	switch f.kind {
	case "documents":
		pos := func(b bound, unbounded int) int {
			switch {
			case b.unbounded:
				return unbounded
			case b.current:
				return i
			}
			return i + int(b.n.(int64))
		}
		return max(pos(f.lo, 0), 0), min(pos(f.hi, n-1), n-1)
	case "range":
		cur := keys[i][0]
		inRange := func(j int) bool {
			v := keys[j][0]
			if !bsonkit.IsNumber(v) || !bsonkit.IsNumber(cur) {
				return false
			}
			if !f.lo.unbounded {
				lo := cur
				if !f.lo.current {
					lo = add(cur, f.lo.n)
				}
				if bsonkit.CompareNumbers(v, lo) < 0 {
					return false
				}
			}
			if !f.hi.unbounded {
				hi := cur
				if !f.hi.current {
					hi = add(cur, f.hi.n)
				}
				if bsonkit.CompareNumbers(v, hi) > 0 {
					return false
				}
			}
			return true
		}
		lo, hi := -1, -2
		for j := range docs {
			if inRange(j) {
				if lo < 0 {
					lo = j
				}
				hi = j
			}
		}
		if lo < 0 {
			return 0, -1
		}
		return lo, hi
	}
	return 0, n - 1
}

// add returns a + b for two numbers, as a double.
func add(a, b any) any {
	x, _ := bsonkit.ToFloat64(a)
	y, _ := bsonkit.ToFloat64(b)
	return x + y
}

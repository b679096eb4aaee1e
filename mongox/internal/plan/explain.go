package plan

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// Explain renders a chosen plan as explain does
// (https://www.mongodb.com/docs/v7.0/reference/explain-results/).
type Explain struct {
	Plan     *Plan
	Rejected []*Plan
	Query    Query
	// Projection is the find projection (nil for none); Covered reports
	// one the index answers without fetching documents.
	Projection bson.D
	Covered    bool
	// Root is the stage on top of the plan: "" for a find, or "COUNT",
	// "UPDATE", "DELETE".
	Root string
	// RootStats are the root stage's own execution figures (nCounted,
	// nMatched, nWouldModify, ...).
	RootStats bson.D
}

// stage is one node of a plan tree.
type stage struct {
	name     string
	fields   bson.D // plan description
	stats    bson.D // execution figures specific to the stage
	returned int64
	input    *stage
}

// tree builds the stage tree of a plan for the query.
func (x *Explain) tree(p *Plan) *stage {
	q := x.Query
	var top *stage
	switch p.Kind {
	case IDHack:
		top = &stage{name: "IDHACK", returned: p.Matched,
			stats: bson.D{{Key: "keysExamined", Value: p.KeysExamined}, {Key: "docsExamined", Value: p.DocsExamined}}}
	case CollScan:
		f := bson.D{}
		if len(q.Filter) > 0 {
			f = append(f, bson.E{Key: "filter", Value: ParsedQuery(q.Filter)})
		}
		dir := "forward"
		if p.Backward {
			dir = "backward"
		}
		f = append(f, bson.E{Key: "direction", Value: dir})
		top = &stage{name: "COLLSCAN", fields: f, returned: p.Matched,
			stats: bson.D{{Key: "docsExamined", Value: p.DocsExamined}}}
	default:
		ix := &stage{name: "IXSCAN", fields: x.ixscanFields(p), returned: p.DocsExamined,
			stats: bson.D{{Key: "keysExamined", Value: p.KeysExamined}, {Key: "seeks", Value: int64(1)},
				{Key: "dupsTested", Value: dupsTested(p)}, {Key: "dupsDropped", Value: p.KeysExamined - p.DocsExamined}}}
		top = ix
		if !x.Covered {
			f := bson.D{}
			if r := residual(q.Filter, p); len(r) > 0 {
				f = append(f, bson.E{Key: "filter", Value: ParsedQuery(r)})
			}
			top = &stage{name: "FETCH", fields: f, returned: p.Matched, input: ix,
				stats: bson.D{{Key: "docsExamined", Value: p.DocsExamined}, {Key: "alreadyHasObj", Value: int64(0)}}}
		}
	}
	switch x.Root {
	case "COUNT":
		return &stage{name: "COUNT", input: top, returned: 0, stats: x.RootStats}
	case "UPDATE", "DELETE":
		return &stage{name: x.Root, input: top, returned: 0, stats: x.RootStats}
	}
	matched := top.returned
	if p.blocking(q) {
		f := bson.D{{Key: "sortPattern", Value: q.Sort}, {Key: "memLimit", Value: int64(104857600)}}
		n := matched
		if w := wanted(q); w > 0 {
			f = append(f, bson.E{Key: "limitAmount", Value: w})
			n = min(n, w)
		}
		f = append(f, bson.E{Key: "type", Value: "simple"})
		top = &stage{name: "SORT", fields: f, input: top, returned: n,
			stats: bson.D{{Key: "usedDisk", Value: false}, {Key: "spills", Value: int64(0)}}}
	}
	if q.Skip > 0 {
		top = &stage{name: "SKIP", fields: bson.D{{Key: "skipAmount", Value: q.Skip}}, input: top,
			returned: max(top.returned-q.Skip, 0)}
	}
	if len(x.Projection) > 0 {
		name := "PROJECTION_DEFAULT"
		switch {
		case x.Covered:
			name = "PROJECTION_COVERED"
		case simpleProjection(x.Projection):
			name = "PROJECTION_SIMPLE"
		}
		top = &stage{name: name, fields: bson.D{{Key: "transformBy", Value: x.Projection}}, input: top, returned: top.returned}
	}
	if q.Limit > 0 && !p.blocking(q) {
		top = &stage{name: "LIMIT", fields: bson.D{{Key: "limitAmount", Value: q.Limit}}, input: top,
			returned: min(top.returned, q.Limit)}
	}
	return top
}

func dupsTested(p *Plan) int64 {
	if p.Multikey {
		return p.KeysExamined
	}
	return 0
}

func (x *Explain) ixscanFields(p *Plan) bson.D {
	ix := p.Index
	dir := "forward"
	if p.Backward {
		dir = "backward"
	}
	paths := bson.D{}
	bounds := bson.D{}
	for i, k := range ix.Key {
		mk := bson.A{}
		if p.MultikeyPaths[k.Key] {
			mk = append(mk, k.Key)
		}
		paths = append(paths, bson.E{Key: k.Key, Value: mk})
		reverse := isNegative(k.Value) != p.Backward
		bounds = append(bounds, bson.E{Key: k.Key, Value: formatIntervals(p.Bounds[i], reverse)})
	}
	return bson.D{
		{Key: "keyPattern", Value: ix.Key},
		{Key: "indexName", Value: ix.Name},
		{Key: "isMultiKey", Value: p.Multikey},
		{Key: "multiKeyPaths", Value: paths},
		{Key: "isUnique", Value: ix.Unique},
		{Key: "isSparse", Value: ix.Sparse},
		{Key: "isPartial", Value: ix.PartialFilter != nil},
		{Key: "indexVersion", Value: int32(2)},
		{Key: "direction", Value: dir},
		{Key: "indexBounds", Value: bounds},
	}
}

// residual is the part of the filter the index bounds do not answer
// exactly, which FETCH applies.
func residual(filter bson.D, p *Plan) bson.D {
	exact := map[string]bool{}
	for _, k := range p.Index.Key {
		if !p.MultikeyPaths[k.Key] {
			exact[k.Key] = true
		}
	}
	var out bson.D
	for _, e := range filter {
		if exact[e.Key] && boundedExactly(e.Value) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// boundedExactly reports predicates that index bounds answer exactly:
// equalities, $in and ranges on scalars.
func boundedExactly(v any) bool {
	ops, ok := isOperatorDoc(v)
	if !ok {
		switch v.(type) {
		case bson.Regex, bson.A, nil:
			return false
		}
		return true
	}
	for _, op := range ops {
		switch op.Key {
		case "$eq", "$gt", "$gte", "$lt", "$lte":
			switch op.Value.(type) {
			case bson.Regex, bson.A, bson.D, nil:
				return false
			}
		case "$in":
			a, _ := op.Value.(bson.A)
			for _, x := range a {
				switch x.(type) {
				case bson.Regex, bson.A, bson.D, nil:
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

func simpleProjection(p bson.D) bool {
	for _, e := range p {
		if strings.Contains(e.Key, ".") || strings.HasPrefix(e.Key, "$") {
			return false
		}
		switch e.Value.(type) {
		case bool, int32, int64, float64:
		default:
			return false
		}
	}
	return true
}

// render writes a stage tree: the plan description, with the execution
// figures when stats is set.
func render(s *stage, stats bool) bson.D {
	out := bson.D{{Key: "stage", Value: s.name}}
	if !stats {
		out = append(out, s.fields...)
	} else {
		works := s.returned + 1
		for in := s.input; in != nil; in = in.input {
			works = max(works, in.returned+1)
		}
		out = append(out,
			bson.E{Key: "nReturned", Value: s.returned},
			bson.E{Key: "executionTimeMillisEstimate", Value: int64(0)},
			bson.E{Key: "works", Value: works},
			bson.E{Key: "advanced", Value: s.returned},
			bson.E{Key: "needTime", Value: works - s.returned - 1},
			bson.E{Key: "needYield", Value: int64(0)},
			bson.E{Key: "saveState", Value: int64(0)},
			bson.E{Key: "restoreState", Value: int64(0)},
			bson.E{Key: "isEOF", Value: int32(1)},
		)
		out = append(out, s.fields...)
		out = append(out, s.stats...)
	}
	if s.input != nil {
		out = append(out, bson.E{Key: "inputStage", Value: render(s.input, stats)})
	}
	return out
}

// WinningPlan is queryPlanner.winningPlan.
func (x *Explain) WinningPlan() bson.D { return render(x.tree(x.Plan), false) }

// RejectedPlans is queryPlanner.rejectedPlans.
func (x *Explain) RejectedPlans() bson.A {
	out := bson.A{}
	for _, p := range x.Rejected {
		out = append(out, render(x.tree(p), false))
	}
	return out
}

// ExecutionStats is the executionStats section; allPlans adds
// allPlansExecution (the figures of every candidate).
func (x *Explain) ExecutionStats(millis int64, allPlans bool) bson.D {
	p := x.Plan
	root := x.tree(p)
	out := bson.D{
		{Key: "executionSuccess", Value: true},
		{Key: "nReturned", Value: root.returned},
		{Key: "executionTimeMillis", Value: millis},
		{Key: "totalKeysExamined", Value: p.KeysExamined},
		{Key: "totalDocsExamined", Value: p.DocsExamined},
		{Key: "executionStages", Value: render(root, true)},
	}
	if allPlans {
		all := bson.A{}
		if len(x.Rejected) > 0 {
			for _, c := range append([]*Plan{p}, x.Rejected...) {
				all = append(all, bson.D{
					{Key: "nReturned", Value: c.Returned},
					{Key: "executionTimeMillisEstimate", Value: int64(0)},
					{Key: "totalKeysExamined", Value: c.KeysExamined},
					{Key: "totalDocsExamined", Value: c.DocsExamined},
					{Key: "executionStages", Value: render(x.tree(c), true)},
				})
			}
		}
		out = append(out, bson.E{Key: "allPlansExecution", Value: all})
	}
	return out
}

// QueryHash is a stable hash of the query's shape, as queryHash and
// planCacheKey show it (eight hex digits).
func QueryHash(parts ...any) string {
	h := fnv.New32a()
	for _, p := range parts {
		fmt.Fprint(h, shape(p), "|")
	}
	return strings.ToUpper(fmt.Sprintf("%08x", h.Sum32()))
}

// shape replaces the values of a query by their types.
func shape(v any) string {
	switch x := v.(type) {
	case bson.D:
		var b strings.Builder
		b.WriteString("{")
		for _, e := range x {
			b.WriteString(e.Key + ":" + shape(e.Value) + ",")
		}
		b.WriteString("}")
		return b.String()
	case bson.A:
		var b strings.Builder
		b.WriteString("[")
		for _, e := range x {
			b.WriteString(shape(e) + ",")
		}
		b.WriteString("]")
		return b.String()
	}
	return fmt.Sprintf("%T", v)
}

// ParsedQuery is the filter as explain's parsedQuery shows it: each
// field's condition as operators ({a: 1} is {a: {$eq: 1}}), several
// conditions under $and.
func ParsedQuery(filter bson.D) bson.D {
	var parts []bson.D
	for _, e := range filter {
		if strings.HasPrefix(e.Key, "$") {
			if e.Key == "$and" {
				if a, ok := e.Value.(bson.A); ok {
					for _, x := range a {
						if d, ok := x.(bson.D); ok {
							parts = append(parts, splitParsed(ParsedQuery(d))...)
						}
					}
					continue
				}
			}
			parts = append(parts, bson.D{e})
			continue
		}
		if ops, ok := isOperatorDoc(e.Value); ok {
			for _, op := range ops {
				if op.Key == "$options" {
					continue
				}
				val := op.Value
				if op.Key == "$regex" {
					opts, _ := bsonkit.Get(ops, "$options")
					s, _ := opts.(string)
					val = regexValue(op.Value, s)
				}
				parts = append(parts, bson.D{{Key: e.Key, Value: bson.D{{Key: op.Key, Value: val}}}})
			}
			continue
		}
		if re, ok := e.Value.(bson.Regex); ok {
			parts = append(parts, bson.D{{Key: e.Key, Value: bson.D{{Key: "$regex", Value: re}}}})
			continue
		}
		parts = append(parts, bson.D{{Key: e.Key, Value: bson.D{{Key: "$eq", Value: e.Value}}}})
	}
	switch len(parts) {
	case 0:
		return bson.D{}
	case 1:
		return parts[0]
	}
	a := make(bson.A, len(parts))
	for i, p := range parts {
		a[i] = p
	}
	return bson.D{{Key: "$and", Value: a}}
}

func splitParsed(d bson.D) []bson.D {
	if len(d) == 1 && d[0].Key == "$and" {
		a, _ := d[0].Value.(bson.A)
		out := make([]bson.D, 0, len(a))
		for _, x := range a {
			out = append(out, x.(bson.D))
		}
		return out
	}
	if len(d) == 0 {
		return nil
	}
	return []bson.D{d}
}

// formatIntervals renders bounds as explain shows them ("[1, 1]",
// "(5, inf.0]"), in scan order.
func formatIntervals(ivs intervals, reverse bool) bson.A {
	ivs = slices.Clone(ivs)
	if reverse {
		slices.Reverse(ivs)
	}
	out := make(bson.A, len(ivs))
	for i, iv := range ivs {
		lo, hi, loIncl, hiIncl := iv.lo, iv.hi, iv.loIncl, iv.hiIncl
		if reverse {
			lo, hi, loIncl, hiIncl = hi, lo, hiIncl, loIncl
		}
		open, closing := "(", ")"
		if loIncl {
			open = "["
		}
		if hiIncl {
			closing = "]"
		}
		out[i] = open + formatBound(lo) + ", " + formatBound(hi) + closing
	}
	return out
}

// formatBound renders a bound value as mongod's explain does.
func formatBound(v any) string {
	switch x := v.(type) {
	case bson.MinKey:
		return "MinKey"
	case bson.MaxKey:
		return "MaxKey"
	case nil:
		return "null"
	case bson.Undefined:
		return "undefined"
	case float64:
		switch {
		case math.IsInf(x, 1):
			return "inf.0"
		case math.IsInf(x, -1):
			return "-inf.0"
		case math.IsNaN(x):
			return "nan.0"
		case x == math.Trunc(x) && math.Abs(x) < 1e15:
			return strconv.FormatFloat(x, 'f', 1, 64)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return strconv.Quote(x)
	case bson.DateTime:
		return "new Date(" + strconv.FormatInt(int64(x), 10) + ")"
	case bson.ObjectID:
		return "ObjectId('" + x.Hex() + "')"
	case bson.Regex:
		return "/" + x.Pattern + "/" + x.Options
	case bson.D:
		if len(x) == 0 {
			return "{}"
		}
	case bson.A:
		if len(x) == 0 {
			return "[]"
		}
	}
	return formatValue(v)
}

// formatValue renders other values in the shell's notation.
func formatValue(v any) string {
	switch x := v.(type) {
	case bson.D:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = e.Key + ": " + formatBound(e.Value)
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case bson.A:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = formatBound(e)
		}
		return "[ " + strings.Join(parts, ", ") + " ]"
	case bool:
		return strconv.FormatBool(x)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case int64:
		return strconv.FormatInt(x, 10)
	case bson.Timestamp:
		return fmt.Sprintf("Timestamp(%d, %d)", x.T, x.I)
	}
	return fmt.Sprint(v)
}

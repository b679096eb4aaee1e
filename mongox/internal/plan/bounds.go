package plan

import (
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// interval is a range of index key values in BSON order.
type interval struct {
	lo, hi         any
	loIncl, hiIncl bool
}

// full is the interval of every value, [MinKey, MaxKey].
var full = interval{lo: bson.MinKey{}, hi: bson.MaxKey{}, loIncl: true, hiIncl: true}

func point(v any) interval { return interval{lo: v, hi: v, loIncl: true, hiIncl: true} }

// contains reports whether v is inside the interval.
func (iv interval) contains(v any) bool {
	c := bsonkit.Compare(v, iv.lo)
	if c < 0 || (c == 0 && !iv.loIncl) {
		return false
	}
	c = bsonkit.Compare(v, iv.hi)
	return c < 0 || (c == 0 && iv.hiIncl)
}

// isPoint reports a single-value interval.
func (iv interval) isPoint() bool {
	return iv.loIncl && iv.hiIncl && bsonkit.Compare(iv.lo, iv.hi) == 0
}

func (iv interval) empty() bool {
	c := bsonkit.Compare(iv.lo, iv.hi)
	return c > 0 || (c == 0 && !(iv.loIncl && iv.hiIncl))
}

// intersect returns the common part of two intervals (possibly empty).
func (iv interval) intersect(o interval) interval {
	out := iv
	if c := bsonkit.Compare(o.lo, iv.lo); c > 0 || (c == 0 && !o.loIncl) {
		out.lo, out.loIncl = o.lo, o.loIncl
	}
	if c := bsonkit.Compare(o.hi, iv.hi); c < 0 || (c == 0 && !o.hiIncl) {
		out.hi, out.hiIncl = o.hi, o.hiIncl
	}
	return out
}

// intervals is an ordered union of disjoint intervals.
type intervals []interval

func (s intervals) contains(v any) bool {
	for _, iv := range s {
		if iv.contains(v) {
			return true
		}
	}
	return false
}

// intersect returns the values in both unions.
func (s intervals) intersect(o intervals) intervals {
	var out intervals
	for _, a := range s {
		for _, b := range o {
			if x := a.intersect(b); !x.empty() {
				out = append(out, x)
			}
		}
	}
	return normalize(out)
}

// covers reports whether every value of o is in s (o ⊆ s).
func (s intervals) covers(o intervals) bool {
	for _, b := range o {
		inside := false
		for _, a := range s {
			if x := a.intersect(b); !x.empty() && bsonkit.Compare(x.lo, b.lo) == 0 && x.loIncl == b.loIncl &&
				bsonkit.Compare(x.hi, b.hi) == 0 && x.hiIncl == b.hiIncl {
				inside = true
				break
			}
		}
		if !inside {
			return false
		}
	}
	return true
}

func (s intervals) allPoints() bool {
	for _, iv := range s {
		if !iv.isPoint() {
			return false
		}
	}
	return len(s) > 0
}

func (s intervals) isFull() bool {
	return len(s) == 1 && bsonkit.Rank(s[0].lo) == bsonkit.RankMinKey && bsonkit.Rank(s[0].hi) == bsonkit.RankMaxKey
}

// normalize sorts intervals by their start and merges overlapping ones.
func normalize(s intervals) intervals {
	s = slices.DeleteFunc(s, func(iv interval) bool { return iv.empty() })
	slices.SortFunc(s, func(a, b interval) int {
		if c := bsonkit.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		if a.loIncl == b.loIncl {
			return 0
		}
		if a.loIncl {
			return -1
		}
		return 1
	})
	var out intervals
	for _, iv := range s {
		if n := len(out); n > 0 {
			last := &out[n-1]
			c := bsonkit.Compare(iv.lo, last.hi)
			if c < 0 || (c == 0 && (iv.loIncl || last.hiIncl)) {
				if d := bsonkit.Compare(iv.hi, last.hi); d > 0 || (d == 0 && iv.hiIncl) {
					last.hi, last.hiIncl = iv.hi, iv.hiIncl
				}
				continue
			}
		}
		out = append(out, iv)
	}
	return out
}

// complement returns every value outside the points (for $ne and $nin).
func complement(points []any) intervals {
	slices.SortFunc(points, bsonkit.Compare)
	out := intervals{}
	var lo any = bson.MinKey{}
	loIncl := true
	for _, p := range points {
		out = append(out, interval{lo: lo, hi: p, loIncl: loIncl, hiIncl: false})
		lo, loIncl = p, false
	}
	out = append(out, interval{lo: lo, hi: bson.MaxKey{}, loIncl: loIncl, hiIncl: true})
	return normalize(out)
}

// typeBracket returns the lowest and highest values of v's type, as mongod
// brackets a one-sided range to the type of its bound ($gt: 5 is
// (5, inf.0]).
func typeBracket(v any) (lo, hi any, loIncl, hiIncl bool) {
	switch bsonkit.Rank(v) {
	case bsonkit.RankNumber:
		return math.Inf(-1), math.Inf(1), true, true
	case bsonkit.RankString:
		return "", bson.D{}, true, false
	case bsonkit.RankDate:
		return bson.DateTime(math.MinInt64), bson.DateTime(math.MaxInt64), true, true
	case bsonkit.RankObjectID:
		lo := bson.ObjectID{}
		var hi bson.ObjectID
		for i := range hi {
			hi[i] = 0xff
		}
		return lo, hi, true, true
	case bsonkit.RankTimestamp:
		return bson.Timestamp{}, bson.Timestamp{T: math.MaxUint32, I: math.MaxUint32}, true, true
	case bsonkit.RankBool:
		return false, true, true, true
	}
	return bson.MinKey{}, bson.MaxKey{}, true, true
}

// pred is what a filter says about one field: its index intervals, and
// whether a document missing the field (or holding null) can match.
type pred struct {
	ivs intervals
	// eq: the predicate is an equality or $in (point intervals).
	eq bool
	// nullable: documents without the field may match ($exists: false,
	// equality to null, $ne, $nin, $not): a sparse index cannot answer it.
	nullable bool
}

// fieldPreds collects the predicates of a filter's top level (and of its
// top-level $and) by field path. Fields the planner cannot bound get the
// full interval; $or, $nor, $where, $expr and $text are not indexed.
func fieldPreds(filter bson.D) map[string][]pred {
	out := map[string][]pred{}
	var walk func(d bson.D)
	walk = func(d bson.D) {
		for _, e := range d {
			if e.Key == "$and" {
				if a, ok := e.Value.(bson.A); ok {
					for _, x := range a {
						if sub, ok := x.(bson.D); ok {
							walk(sub)
						}
					}
				}
				continue
			}
			if strings.HasPrefix(e.Key, "$") {
				continue
			}
			out[e.Key] = append(out[e.Key], valuePred(e.Value))
		}
	}
	walk(filter)
	return out
}

// isOperatorDoc reports a document of query operators ({$gt: 1}).
func isOperatorDoc(v any) (bson.D, bool) {
	d, ok := v.(bson.D)
	if !ok || len(d) == 0 || !strings.HasPrefix(d[0].Key, "$") {
		return nil, false
	}
	return d, true
}

// valuePred turns the value of a filter field into a predicate.
func valuePred(v any) pred {
	ops, ok := isOperatorDoc(v)
	if !ok {
		return eqPred(v)
	}
	p := pred{ivs: intervals{full}}
	first := true
	and := func(q pred) {
		if first {
			p, first = q, false
			return
		}
		p = pred{ivs: p.ivs.intersect(q.ivs), eq: p.eq && q.eq, nullable: p.nullable && q.nullable}
	}
	var regexOpts string
	for _, op := range ops {
		if op.Key == "$options" {
			regexOpts, _ = op.Value.(string)
		}
	}
	for _, op := range ops {
		switch op.Key {
		case "$eq":
			and(eqPred(op.Value))
		case "$in":
			a, _ := op.Value.(bson.A)
			q := pred{eq: true}
			for _, x := range a {
				e := eqPred(x)
				q.ivs = append(q.ivs, e.ivs...)
				q.nullable = q.nullable || e.nullable
				q.eq = q.eq && e.eq
			}
			q.ivs = normalize(q.ivs)
			and(q)
		case "$gt", "$gte", "$lt", "$lte":
			and(rangePred(op.Key, op.Value))
		case "$exists":
			if truthy(op.Value) {
				and(pred{ivs: intervals{full}})
			} else {
				and(pred{ivs: intervals{point(nil)}, nullable: true})
			}
		case "$ne":
			and(pred{ivs: complement([]any{op.Value}), nullable: op.Value != nil})
		case "$nin":
			a, _ := op.Value.(bson.A)
			pts := make([]any, 0, len(a))
			nullable := true
			for _, x := range a {
				if _, isRe := x.(bson.Regex); isRe {
					continue
				}
				if x == nil {
					nullable = false
				}
				pts = append(pts, x)
			}
			and(pred{ivs: complement(pts), nullable: nullable})
		case "$regex":
			and(regexPred(regexValue(op.Value, regexOpts)))
		case "$options":
		case "$not", "$type", "$size", "$all", "$elemMatch", "$mod", "$bitsAllSet", "$bitsAnySet",
			"$bitsAllClear", "$bitsAnyClear":
			and(pred{ivs: intervals{full}, nullable: op.Key == "$not"})
		default:
			and(pred{ivs: intervals{full}})
		}
	}
	return p
}

func truthy(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case nil:
		return false
	}
	if n, ok := bsonkit.ToFloat64(v); ok {
		return n != 0
	}
	return true
}

func eqPred(v any) pred {
	switch x := v.(type) {
	case bson.Regex:
		return regexPred(x)
	case nil, bson.Null:
		return pred{ivs: intervals{point(nil)}, eq: true, nullable: true}
	case bson.A:
		// An array equals the whole array, or an element of an indexed array.
		ivs := intervals{point(x)}
		if len(x) > 0 {
			ivs = append(ivs, point(x[0]))
		} else {
			ivs = append(ivs, point(bson.Undefined{}))
		}
		return pred{ivs: normalize(ivs)}
	}
	return pred{ivs: intervals{point(v)}, eq: true}
}

func rangePred(op string, v any) pred {
	lo, hi, loIncl, hiIncl := typeBracket(v)
	switch op {
	case "$gt":
		lo, loIncl = v, false
	case "$gte":
		lo, loIncl = v, true
	case "$lt":
		hi, hiIncl = v, false
	case "$lte":
		hi, hiIncl = v, true
	}
	return pred{ivs: normalize(intervals{{lo: lo, hi: hi, loIncl: loIncl, hiIncl: hiIncl}})}
}

func regexValue(v any, opts string) bson.Regex {
	switch x := v.(type) {
	case bson.Regex:
		if opts != "" {
			x.Options = opts
		}
		return x
	case string:
		return bson.Regex{Pattern: x, Options: opts}
	}
	return bson.Regex{}
}

// regexPred bounds a regular expression: a case-sensitive anchored prefix
// (/^abc/) to the strings starting with it, any other to all strings (and
// the regex itself, which an index holds as a value).
func regexPred(re bson.Regex) pred {
	if prefix, ok := literalPrefix(re); ok && prefix != "" {
		return pred{ivs: intervals{{lo: prefix, hi: prefixEnd(prefix), loIncl: true, hiIncl: false}}}
	}
	return pred{ivs: normalize(intervals{{lo: "", hi: bson.D{}, loIncl: true, hiIncl: false}, point(re)})}
}

// literalPrefix returns the literal prefix of a ^-anchored regex without
// options that change matching.
func literalPrefix(re bson.Regex) (string, bool) {
	if !strings.HasPrefix(re.Pattern, "^") || strings.ContainsAny(re.Options, "imx") {
		return "", false
	}
	var b strings.Builder
	for _, r := range re.Pattern[1:] {
		if strings.ContainsRune(`\.^$|?*+()[]{}`, r) {
			break
		}
		b.WriteRune(r)
	}
	return b.String(), true
}

// prefixEnd returns the smallest string greater than every string
// starting with prefix.
func prefixEnd(prefix string) any {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return bson.D{}
}

package pipeline

import (
	"math"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// accumulator folds values into one result ($group accumulators, and the
// array forms of $sum, $avg, $min, $max in expressions).
type accumulator interface {
	add(v any) error
	result() any
}

// sumAcc sums numbers with MongoDB's result typing: int while every input
// is an int and the total fits, long while inputs are ints or longs and the
// total fits, double otherwise, decimal when any input is decimal.
// Non-numeric values are ignored.
type sumAcc struct {
	kind     numKind
	count    int64
	i        int64
	overflow bool
	f        float64
	hasDec   bool
	dec      bson.Decimal128
}

func (s *sumAcc) add(v any) error {
	k, ok := kindOf(v)
	if !ok {
		return nil
	}
	s.count++
	s.kind = max(s.kind, k)
	switch k {
	case kInt, kLong:
		n := toI64(v)
		if !s.overflow {
			r := s.i + n
			if (r > s.i) == (n > 0) || n == 0 {
				s.i = r
				return nil
			}
			s.overflow = true
			s.f += float64(s.i)
			s.i = 0
		}
		s.f += float64(n)
	case kDouble:
		s.f += v.(float64)
	case kDecimal:
		if !s.hasDec {
			s.hasDec, s.dec = true, v.(bson.Decimal128)
		} else {
			s.dec = decAdd(s.dec, v.(bson.Decimal128))
		}
	}
	return nil
}

// result returns the sum as a value of the right type.
func (s *sumAcc) result() any {
	switch {
	case s.kind == kDecimal:
		var rest any = s.f + float64(s.i)
		if !s.overflow && s.f == 0 {
			rest = s.i
		}
		return decAdd(s.dec, toDec(rest))
	case s.kind == kDouble || s.overflow:
		return s.f + float64(s.i)
	case s.kind == kLong:
		return s.i
	}
	return intResult(s.i)
}

// avgAcc averages the numeric inputs; null when there are none.
type avgAcc struct{ sum sumAcc }

func (a *avgAcc) add(v any) error { return a.sum.add(v) }

func (a *avgAcc) result() any {
	if a.sum.count == 0 {
		return nil
	}
	t := a.sum.result()
	if a.sum.kind == kDecimal {
		return decDiv(toDec(t), toDec(a.sum.count))
	}
	if a.sum.kind != kDouble && !a.sum.overflow {
		return float64(a.sum.i) / float64(a.sum.count)
	}
	return toF(t) / float64(a.sum.count)
}

// minMaxAcc keeps the smallest (sign -1) or largest (sign +1) non-null value.
type minMaxAcc struct {
	sign int
	has  bool
	v    any
}

func (m *minMaxAcc) add(v any) error {
	if isNullish(v) {
		return nil
	}
	if !m.has || bsonkit.Compare(v, m.v)*m.sign > 0 {
		m.has, m.v = true, v
	}
	return nil
}

func (m *minMaxAcc) result() any {
	if !m.has {
		return nil
	}
	return m.v
}

type firstAcc struct {
	has bool
	v   any
}

func (f *firstAcc) add(v any) error {
	if !f.has {
		f.has, f.v = true, orNull(v)
	}
	return nil
}
func (f *firstAcc) result() any { return f.v }

type lastAcc struct{ v any }

func (l *lastAcc) add(v any) error { l.v = orNull(v); return nil }
func (l *lastAcc) result() any     { return l.v }

type pushAcc struct{ out bson.A }

func (p *pushAcc) add(v any) error {
	if !isMissing(v) {
		p.out = append(p.out, v)
	}
	return nil
}

func (p *pushAcc) result() any {
	if p.out == nil {
		return bson.A{}
	}
	return p.out
}

type addToSetAcc struct {
	seen map[string]bool
	out  bson.A
}

func (s *addToSetAcc) add(v any) error {
	if isMissing(v) {
		return nil
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	k := bsonkit.Key(v)
	if !s.seen[k] {
		s.seen[k] = true
		s.out = append(s.out, v)
	}
	return nil
}

func (s *addToSetAcc) result() any {
	if s.out == nil {
		return bson.A{}
	}
	return s.out
}

type mergeAcc struct{ out bson.D }

func (m *mergeAcc) add(v any) error {
	if isNullish(v) {
		return nil
	}
	d, ok := asDoc(v)
	if !ok {
		return errf(40400, "$mergeObjects requires object inputs, but input %s is of type %s", render(v), typeName(v))
	}
	if m.out == nil {
		m.out = bson.D{}
	}
	for _, e := range d {
		m.out = setField(m.out, e.Key, e.Value)
	}
	return nil
}

func (m *mergeAcc) result() any {
	if m.out == nil {
		return bson.D{}
	}
	return m.out
}

// stdDevAcc computes the population or sample standard deviation of the
// numeric inputs (Welford's method).
type stdDevAcc struct {
	sample bool
	n      float64
	mean   float64
	m2     float64
}

func (s *stdDevAcc) add(v any) error {
	if !isNum(v) {
		return nil
	}
	x := toF(v)
	s.n++
	d := x - s.mean
	s.mean += d / s.n
	s.m2 += d * (x - s.mean)
	return nil
}

func (s *stdDevAcc) result() any {
	if s.n == 0 || (s.sample && s.n < 2) {
		return nil
	}
	div := s.n
	if s.sample {
		div--
	}
	return math.Sqrt(s.m2 / div)
}

// accumulators lists the accumulators $group supports.
var accumulators = map[string]func() accumulator{
	"$sum":          func() accumulator { return &sumAcc{} },
	"$avg":          func() accumulator { return &avgAcc{} },
	"$min":          func() accumulator { return &minMaxAcc{sign: -1} },
	"$max":          func() accumulator { return &minMaxAcc{sign: 1} },
	"$first":        func() accumulator { return &firstAcc{} },
	"$last":         func() accumulator { return &lastAcc{} },
	"$push":         func() accumulator { return &pushAcc{} },
	"$addToSet":     func() accumulator { return &addToSetAcc{} },
	"$mergeObjects": func() accumulator { return &mergeAcc{} },
	"$stdDevPop":    func() accumulator { return &stdDevAcc{} },
	"$stdDevSamp":   func() accumulator { return &stdDevAcc{sample: true} },
}

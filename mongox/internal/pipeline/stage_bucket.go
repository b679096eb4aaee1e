package pipeline

import (
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// --- $bucket ---
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/bucket/

// bucketStage groups documents by the interval of boundaries their
// groupBy value falls in ([b[i], b[i+1])), or into the default bucket.
type bucketStage struct {
	groupBy    evalFn
	boundaries bson.A
	def        any
	hasDef     bool
	g          *groupStage // the output accumulators; its id is unused
}

// parseBucketOutput compiles the output accumulators of $bucket and
// $bucketAuto ({count: {$sum: 1}} when absent) as $group fields.
func parseBucketOutput(stageName string, out any, hasOut bool, vars bson.D) (*groupStage, error) {
	spec := bson.D{{Key: "_id", Value: nil}}
	if !hasOut {
		spec = append(spec, bson.E{Key: "count", Value: bson.D{{Key: "$sum", Value: int32(1)}}})
	} else {
		d, ok := out.(bson.D)
		if !ok {
			return nil, errf(40196, "The $%s 'output' field must be an object, but found type: %s", stageName, typeName(out))
		}
		spec = append(spec, d...)
	}
	st, err := parseGroup(spec, vars)
	if err != nil {
		return nil, err
	}
	return st.(*groupStage), nil
}

// parseGroupBy compiles groupBy: a $-prefixed path or an operator
// expression object.
func parseGroupBy(stageName string, v any, vars bson.D) (evalFn, error) {
	ok := false
	switch x := v.(type) {
	case string:
		ok = strings.HasPrefix(x, "$")
	case bson.D:
		ok = isOperatorDoc(x)
	}
	if !ok {
		code := int32(40202)
		if stageName == "bucketAuto" {
			code = 40239
		}
		return nil, errf(code, "The $%s 'groupBy' field must be defined as a $-prefixed path or an expression, but found: %v", stageName, v)
	}
	p := parser{vars: vars}
	return p.parse(v)
}

func parseBucket(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40201, "Argument to $bucket stage must be an object, but found type: %s.", typeName(arg))
	}
	s := &bucketStage{}
	var groupBy, out any
	var hasGroupBy, hasBoundaries, hasOut bool
	for _, e := range spec {
		switch e.Key {
		case "groupBy":
			groupBy, hasGroupBy = e.Value, true
		case "boundaries":
			a, ok := e.Value.(bson.A)
			if !ok {
				return nil, errf(40200, "The $bucket 'boundaries' field must be an array, but found type: %s.", typeName(e.Value))
			}
			s.boundaries, hasBoundaries = a, true
		case "default":
			s.def, s.hasDef = e.Value, true
		case "output":
			out, hasOut = e.Value, true
		default:
			return nil, errf(40197, "Unrecognized option to $bucket: %s.", e.Key)
		}
	}
	if !hasGroupBy || !hasBoundaries {
		return nil, errf(40198, "$bucket requires 'groupBy' and 'boundaries' to be specified.")
	}
	fn, err := parseGroupBy("bucket", groupBy, vars)
	if err != nil {
		return nil, err
	}
	s.groupBy = fn
	if len(s.boundaries) < 2 {
		return nil, errf(40192, "The $bucket 'boundaries' field must have at least 2 values, but found %d value(s).", len(s.boundaries))
	}
	for i := 1; i < len(s.boundaries); i++ {
		a, b := s.boundaries[i-1], s.boundaries[i]
		if bsonkit.Rank(a) != bsonkit.Rank(b) {
			return nil, errf(40193, "All values in the the 'boundaries' option to $bucket must have the same type. Found conflicting types %s and %s.", typeName(a), typeName(b))
		}
		if cmpValues(a, b) >= 0 {
			return nil, errf(40194, "The 'boundaries' option to $bucket must be sorted in ascending order, but elements %d and %d are not in ascending order (%v is not less than %v).", i-1, i, a, b)
		}
	}
	if s.hasDef && bsonkit.Rank(s.def) == bsonkit.Rank(s.boundaries[0]) &&
		cmpValues(s.def, s.boundaries[0]) >= 0 && cmpValues(s.def, s.boundaries[len(s.boundaries)-1]) < 0 {
		return nil, errf(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary.")
	}
	if s.g, err = parseBucketOutput("bucket", out, hasOut, vars); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *bucketStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	last := s.boundaries[len(s.boundaries)-1]
	g := &groupStage{fields: s.g.fields, id: func(c *ctx) (any, error) {
		v, err := s.groupBy(c)
		if err != nil {
			return nil, err
		}
		v = orNull(v)
		if cmpValues(v, s.boundaries[0]) >= 0 && cmpValues(v, last) < 0 {
			i, _ := slices.BinarySearchFunc(s.boundaries, v, func(b, v any) int {
				if cmpValues(b, v) <= 0 {
					return -1
				}
				return 1
			})
			return s.boundaries[i-1], nil
		}
		if !s.hasDef {
			return nil, errf(40066, "$switch could not find a matching branch for an input, and no default was specified.")
		}
		return s.def, nil
	}}
	out, err := g.run(in, c)
	if err != nil {
		return nil, err
	}
	// Buckets in boundary order, the default bucket last.
	slices.SortStableFunc(out, func(a, b bson.D) int {
		ad, bd := s.isDefault(a[0].Value), s.isDefault(b[0].Value)
		switch {
		case ad && !bd:
			return 1
		case bd && !ad:
			return -1
		}
		return cmpValues(a[0].Value, b[0].Value)
	})
	return out, nil
}

// isDefault reports whether a bucket _id is the default bucket's (a
// boundary is never equal to the default, which lies outside them).
func (s *bucketStage) isDefault(id any) bool {
	return s.hasDef && bsonkit.Equal(id, s.def) && bsonkit.Rank(id) == bsonkit.Rank(s.def)
}

// --- $bucketAuto ---
// https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/bucketAuto/

type bucketAutoStage struct {
	groupBy evalFn
	buckets int
	g       *groupStage
}

func parseBucketAuto(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40240, "The argument to $bucketAuto must be an object, but found type: %s.", typeName(arg))
	}
	s := &bucketAutoStage{}
	var groupBy, out any
	var hasGroupBy, hasBuckets, hasOut bool
	for _, e := range spec {
		switch e.Key {
		case "groupBy":
			groupBy, hasGroupBy = e.Value, true
		case "buckets":
			n, ok := bsonkit.ToInt64(e.Value)
			if !ok || float64(n) != toF(e.Value) || n <= 0 || n > 1<<31-1 {
				return nil, errf(40243, "The $bucketAuto 'buckets' field must be greater than 0, but found: %v", e.Value)
			}
			s.buckets, hasBuckets = int(n), true
		case "output":
			out, hasOut = e.Value, true
		case "granularity":
			return nil, errf(codeNotImplemented, "$bucketAuto 'granularity' is not supported by the embedded MongoDB server")
		default:
			return nil, errf(40245, "Unrecognized option to $bucketAuto: %s.", e.Key)
		}
	}
	if !hasGroupBy || !hasBuckets {
		return nil, errf(40246, "$bucketAuto requires 'groupBy' and 'buckets' to be specified")
	}
	fn, err := parseGroupBy("bucketAuto", groupBy, vars)
	if err != nil {
		return nil, err
	}
	s.groupBy = fn
	if s.g, err = parseBucketOutput("bucketAuto", out, hasOut, vars); err != nil {
		return nil, err
	}
	return s, nil
}

// run sorts the documents by their groupBy value and cuts them into
// buckets of about len/buckets documents, never splitting equal values;
// each bucket is {_id: {min, max}} where max is the next bucket's min (the
// last bucket's own maximum value).
func (s *bucketAutoStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	type keyed struct {
		v any
		d bson.D
	}
	ks := make([]keyed, 0, len(in))
	for _, d := range in {
		c.reset(d)
		v, err := s.groupBy(c)
		if err != nil {
			return nil, err
		}
		ks = append(ks, keyed{orNull(v), d})
	}
	if len(ks) == 0 {
		return []bson.D{}, nil
	}
	slices.SortStableFunc(ks, func(a, b keyed) int { return cmpValues(a.v, b.v) })
	// mongod's approximate bucket size: documents per bucket, rounded.
	size := max(int(math.Round(float64(len(ks))/float64(s.buckets))), 1)
	type bucket struct {
		min, max any
		docs     []bson.D
	}
	var bs []*bucket
	for i := 0; i < len(ks); {
		b := &bucket{min: ks[i].v}
		end := min(i+size, len(ks))
		if len(bs) == s.buckets-1 {
			end = len(ks)
		}
		for end < len(ks) && cmpValues(ks[end].v, ks[end-1].v) == 0 {
			end++
		}
		for _, k := range ks[i:end] {
			b.docs = append(b.docs, k.d)
		}
		b.max = ks[end-1].v
		if len(bs) > 0 {
			bs[len(bs)-1].max = b.min
		}
		bs = append(bs, b)
		i = end
	}
	out := make([]bson.D, 0, len(bs))
	for _, b := range bs {
		g := &groupStage{fields: s.g.fields, id: constant(nil)}
		res, err := g.run(b.docs, c)
		if err != nil {
			return nil, err
		}
		d := res[0]
		d[0].Value = bson.D{{Key: "min", Value: b.min}, {Key: "max", Value: b.max}}
		out = append(out, d)
	}
	return out, nil
}

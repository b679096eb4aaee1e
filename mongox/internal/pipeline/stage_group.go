package pipeline

import (
	"slices"
	"strings"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// --- $group ---

type groupField struct {
	name string
	mk   func() accumulator
	expr evalFn
}

type groupStage struct {
	id     evalFn
	fields []groupField
}

func parseGroup(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(15947, "a group's fields must be specified in an object")
	}
	g := &groupStage{}
	p := parser{vars: vars}
	seen := map[string]bool{}
	for _, e := range spec {
		if e.Key == "_id" {
			fn, err := p.parse(e.Value)
			if err != nil {
				return nil, err
			}
			g.id = fn
			continue
		}
		if strings.HasPrefix(e.Key, "$") {
			return nil, errf(40236, "The field name '%s' cannot be an operator name", e.Key)
		}
		if strings.Contains(e.Key, ".") {
			return nil, errf(40235, "The field name '%s' cannot contain '.'", e.Key)
		}
		if seen[e.Key] {
			return nil, errf(16406, "duplicate field name specified in object literal: %s", e.Key)
		}
		seen[e.Key] = true
		d, ok := e.Value.(bson.D)
		if !ok {
			return nil, errf(40234, "The field '%s' must be an accumulator object", e.Key)
		}
		if len(d) != 1 {
			return nil, errf(40238, "The field '%s' must specify one accumulator", e.Key)
		}
		op, accArg := d[0].Key, d[0].Value
		if op == "$count" {
			if ad, ok := accArg.(bson.D); !ok || len(ad) != 0 {
				return nil, errf(codeTypeMismatch, "$count takes no arguments, i.e. $count:{}")
			}
			g.fields = append(g.fields, groupField{name: e.Key, mk: accumulators["$sum"], expr: constant(int32(1))})
			continue
		}
		mk, ok := accumulators[op]
		if !ok {
			return nil, errf(15952, "unknown group operator '%s'", op)
		}
		if _, isArr := accArg.(bson.A); isArr {
			return nil, errf(40237, "The %s accumulator is a unary operator", op)
		}
		fn, err := p.parse(accArg)
		if err != nil {
			return nil, err
		}
		g.fields = append(g.fields, groupField{name: e.Key, mk: mk, expr: fn})
	}
	if g.id == nil {
		return nil, errf(15955, "a group specification must include an _id")
	}
	return g, nil
}

type groupState struct {
	id   any
	accs []accumulator
}

func (g *groupStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	index := map[string]int{}
	var groups []*groupState
	for _, d := range in {
		c.reset(d)
		id, err := g.id(c)
		if err != nil {
			return nil, err
		}
		id = orNull(id)
		key := bsonkit.Key(id)
		i, ok := index[key]
		if !ok {
			st := &groupState{id: id, accs: make([]accumulator, len(g.fields))}
			for j, f := range g.fields {
				st.accs[j] = f.mk()
			}
			i = len(groups)
			index[key] = i
			groups = append(groups, st)
		}
		st := groups[i]
		for j, f := range g.fields {
			v, err := f.expr(c)
			if err != nil {
				return nil, err
			}
			if err := st.accs[j].add(v); err != nil {
				return nil, err
			}
		}
	}
	out := make([]bson.D, len(groups))
	for i, st := range groups {
		d := make(bson.D, 0, len(g.fields)+1)
		d = append(d, bson.E{Key: "_id", Value: st.id})
		for j, f := range g.fields {
			d = append(d, bson.E{Key: f.name, Value: st.accs[j].result()})
		}
		out[i] = d
	}
	return out, nil
}

// --- $sortByCount ---

type sortByCountStage struct{ g *groupStage }

func parseSortByCount(arg any, vars bson.D) (stage, error) {
	switch x := arg.(type) {
	case string:
		if !strings.HasPrefix(x, "$") {
			return nil, errf(40148, "the sortByCount field must be defined as a $-prefixed path or an expression")
		}
	case bson.D:
		if !isOperatorDoc(x) {
			return nil, errf(40147, "the sortByCount field must be specified as an expression")
		}
	default:
		return nil, errf(40149, "the sortByCount field must be defined as a $-prefixed path or an expression")
	}
	p := parser{vars: vars}
	fn, err := p.parse(arg)
	if err != nil {
		return nil, err
	}
	return &sortByCountStage{g: &groupStage{
		id:     fn,
		fields: []groupField{{name: "count", mk: accumulators["$sum"], expr: constant(int32(1))}},
	}}, nil
}

func (s *sortByCountStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out, err := s.g.run(in, c)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b bson.D) int { return cmpValues(b[1].Value, a[1].Value) })
	return out, nil
}

// --- $facet ---

type facetStage struct {
	names []string
	subs  []*Pipeline
}

var notInFacet = map[string]bool{
	"$facet": true, "$out": true, "$merge": true, "$geoNear": true, "$collStats": true,
	"$indexStats": true, "$changeStream": true, "$currentOp": true, "$listSessions": true,
}

func parseFacet(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(15947, "the $facet specification must be a non-empty object")
	}
	if len(spec) == 0 {
		return nil, errf(40169, "the $facet specification must be a non-empty object")
	}
	f := &facetStage{}
	for _, e := range spec {
		if e.Key == "" || strings.HasPrefix(e.Key, "$") || strings.Contains(e.Key, ".") {
			return nil, errf(40170, "$facet output field name '%s' must not be empty, start with '$' or contain '.'", e.Key)
		}
		arr, ok := e.Value.(bson.A)
		if !ok {
			return nil, errf(40170, "arguments to $facet must be arrays, %s is type %s", e.Key, typeName(e.Value))
		}
		for _, s := range arr {
			if d, ok := s.(bson.D); ok && len(d) == 1 && notInFacet[d[0].Key] {
				return nil, errf(40600, "%s is not allowed to be used within a $facet stage", d[0].Key)
			}
		}
		sub, err := Compile(arr, Env{Vars: vars})
		if err != nil {
			return nil, err
		}
		f.names = append(f.names, e.Key)
		f.subs = append(f.subs, sub)
	}
	return f, nil
}

func (f *facetStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out := make(bson.D, len(f.names))
	for i, sub := range f.subs {
		docs := in
		for _, st := range sub.stages {
			var err error
			if docs, err = st.run(docs, c); err != nil {
				return nil, err
			}
		}
		arr := make(bson.A, len(docs))
		for j, d := range docs {
			arr[j] = d
		}
		out[i] = bson.E{Key: f.names[i], Value: arr}
	}
	return []bson.D{out}, nil
}

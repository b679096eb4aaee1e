package pipeline

import (
	"math"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$size"] = parseSize
	operators["$arrayElemAt"] = parseArrayElemAt
	operators["$first"] = parseFirstLast(true)
	operators["$last"] = parseFirstLast(false)
	operators["$in"] = parseIn
	operators["$isArray"] = parseIsArray
	operators["$concatArrays"] = parseConcatArrays
	operators["$slice"] = parseSlice
	operators["$filter"] = parseFilter
	operators["$map"] = parseMap
	operators["$reduce"] = parseReduce
	operators["$reverseArray"] = unaryNullish(reverseArray)
	operators["$range"] = parseRange
	operators["$indexOfArray"] = parseIndexOfArray
}

func parseSize(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.nargs(name, arg, 1, 1)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := fns[0](c)
		if err != nil {
			return nil, err
		}
		arr, ok := asArray(v)
		if !ok {
			return nil, errf(17124, "The argument to $size must be an array. Type of argument: %s", typeName(v))
		}
		return int32(len(arr)), nil
	}, nil
}

// elemAt indexes an array, negative indexes counting from the end;
// out of range yields missing.
func elemAt(arr bson.A, i int64) any {
	if i < 0 {
		i += int64(len(arr))
	}
	if i < 0 || i >= int64(len(arr)) {
		return missing
	}
	return arr[i]
}

var parseArrayElemAt = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	arr, ok := asArray(vs[0])
	if !ok {
		return nil, errf(28689, "$arrayElemAt's first argument must be an array, but is %s", typeName(vs[0]))
	}
	if !isNum(vs[1]) {
		return nil, errf(28690, "$arrayElemAt's second argument must be a numeric value, but is %s", typeName(vs[1]))
	}
	i, ok := wholeNumber(vs[1])
	if !ok || i > math.MaxInt32 || i < math.MinInt32 {
		return nil, errf(28691, "$arrayElemAt's second argument must be representable as a 32-bit integer: %s", render(vs[1]))
	}
	return elemAt(arr, i), nil
})

func parseFirstLast(first bool) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.nargs(name, arg, 1, 1)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			v, err := fns[0](c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			arr, ok := asArray(v)
			if !ok {
				return nil, errf(28689, "%s's argument must be an array, but is %s", name, typeName(v))
			}
			if first {
				return elemAt(arr, 0), nil
			}
			return elemAt(arr, -1), nil
		}, nil
	}
}

func parseIn(p *parser, name string, arg any) (evalFn, error) {
	return evaluatedArgs(2, 2, func(name string, vs []any) (any, error) {
		arr, ok := asArray(vs[1])
		if !ok {
			return nil, errf(40081, "$in requires an array as a second argument, found: %s", typeName(vs[1]))
		}
		for _, e := range arr {
			if cmpValues(vs[0], e) == 0 {
				return true, nil
			}
		}
		return false, nil
	})(p, name, arg)
}

func parseIsArray(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.nargs(name, arg, 1, 1)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := fns[0](c)
		if err != nil {
			return nil, err
		}
		_, ok := asArray(v)
		return ok, nil
	}, nil
}

func parseConcatArrays(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		out := bson.A{}
		for _, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			arr, ok := asArray(v)
			if !ok {
				return nil, errf(28664, "$concatArrays only supports arrays, not %s", typeName(v))
			}
			out = append(out, arr...)
		}
		return out, nil
	}, nil
}

var parseSlice = nullishArgs(2, 3, func(_ string, vs []any) (any, error) {
	arr, ok := asArray(vs[0])
	if !ok {
		return nil, errf(28724, "First argument to $slice must be an array, but is of type: %s", typeName(vs[0]))
	}
	a, ok := wholeNumber(vs[1])
	if !ok {
		return nil, errf(28725, "Second argument to $slice must be a numeric value, but is of type: %s", typeName(vs[1]))
	}
	n := int64(len(arr))
	var start, end int64
	if len(vs) == 2 {
		if a >= 0 {
			start, end = 0, min(a, n)
		} else {
			start, end = max(n+max(a, -n), 0), n
		}
	} else {
		cnt, ok := wholeNumber(vs[2])
		if !ok {
			return nil, errf(28725, "Third argument to $slice must be numeric, but is of type: %s", typeName(vs[2]))
		}
		if cnt <= 0 {
			return nil, errf(28729, "Third argument to $slice must be positive: %s", render(vs[2]))
		}
		cnt = min(cnt, n)
		if a >= 0 {
			start = min(a, n)
		} else {
			start = max(n+max(a, -n), 0)
		}
		end = min(start+cnt, n)
	}
	out := make(bson.A, end-start)
	copy(out, arr[start:end])
	return out, nil
})

// iterArgs parses the {input, as, <body>} shape of $filter and $map;
// the extra named arguments are compiled after the body, in order (nil
// when absent).
func (p *parser) iterArgs(name string, arg any, body string, extra ...string) (input, bodyFn evalFn, as string, more map[string]evalFn, err error) {
	allowed := append([]string{"input", "as", body}, extra...)
	m, err := p.objArgs(name, arg, allowed, "input", body)
	if err != nil {
		return
	}
	if input, err = p.parse(m["input"]); err != nil {
		return
	}
	as = "this"
	if a, ok := m["as"]; ok {
		s, ok := a.(string)
		if !ok {
			err = errf(codeFailedToParse, "%s: 'as' must be a string", name)
			return
		}
		if err = checkVarName(s); err != nil {
			return
		}
		as = s
	}
	pop := p.push(as)
	bodyFn, err = p.parse(m[body])
	pop()
	if err != nil {
		return
	}
	more, err = p.compileArgs(m, extra...)
	return
}

func parseFilter(p *parser, name string, arg any) (evalFn, error) {
	input, cond, as, more, err := p.iterArgs(name, arg, "cond", "limit")
	if err != nil {
		return nil, err
	}
	limit := more["limit"]
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			return nil, nil
		}
		arr, ok := asArray(v)
		if !ok {
			return nil, errf(28651, "input to $filter must be an array not %s", typeName(v))
		}
		max := int64(len(arr))
		if limit != nil {
			lv, err := limit(c)
			if err != nil {
				return nil, err
			}
			if !isNullish(lv) {
				l, ok := wholeNumber(lv)
				if !ok || l < 1 {
					return nil, errf(327391, "$filter: limit must be greater than 0: %s", render(lv))
				}
				max = l
			}
		}
		out := bson.A{}
		n := len(c.vars)
		c.vars = append(c.vars, binding{as, nil})
		defer func() { c.vars = c.vars[:n] }()
		for _, e := range arr {
			if int64(len(out)) >= max {
				break
			}
			c.vars[n].val = e
			keep, err := cond(c)
			if err != nil {
				return nil, err
			}
			if truthy(keep) {
				out = append(out, e)
			}
		}
		return out, nil
	}, nil
}

func parseMap(p *parser, name string, arg any) (evalFn, error) {
	input, in, as, _, err := p.iterArgs(name, arg, "in")
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			return nil, nil
		}
		arr, ok := asArray(v)
		if !ok {
			return nil, errf(16883, "input to $map must be an array not %s", typeName(v))
		}
		out := make(bson.A, len(arr))
		n := len(c.vars)
		c.vars = append(c.vars, binding{as, nil})
		defer func() { c.vars = c.vars[:n] }()
		for i, e := range arr {
			c.vars[n].val = e
			r, err := in(c)
			if err != nil {
				return nil, err
			}
			out[i] = orNull(r)
		}
		return out, nil
	}, nil
}

func parseReduce(p *parser, name string, arg any) (evalFn, error) {
	m, err := p.objArgs(name, arg, []string{"input", "initialValue", "in"}, "input", "initialValue", "in")
	if err != nil {
		return nil, err
	}
	input, err := p.parse(m["input"])
	if err != nil {
		return nil, err
	}
	initial, err := p.parse(m["initialValue"])
	if err != nil {
		return nil, err
	}
	pop := p.push("this", "value")
	in, err := p.parse(m["in"])
	pop()
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			return nil, nil
		}
		arr, ok := asArray(v)
		if !ok {
			return nil, errf(40080, "$reduce requires that 'input' be an array, found: %s", render(v))
		}
		acc, err := initial(c)
		if err != nil {
			return nil, err
		}
		n := len(c.vars)
		c.vars = append(c.vars, binding{"this", nil}, binding{"value", nil})
		defer func() { c.vars = c.vars[:n] }()
		for _, e := range arr {
			c.vars[n].val, c.vars[n+1].val = e, acc
			if acc, err = in(c); err != nil {
				return nil, err
			}
		}
		return acc, nil
	}, nil
}

func reverseArray(v any) (any, error) {
	arr, ok := asArray(v)
	if !ok {
		return nil, errf(34435, "The argument to $reverseArray must be an array, but was of type: %s", typeName(v))
	}
	out := make(bson.A, len(arr))
	for i, e := range arr {
		out[len(arr)-1-i] = e
	}
	return out, nil
}

// maxRangeElements mirrors MongoDB's 64 MB $range memory limit at 16 bytes
// per element.
const maxRangeElements = 64 << 20 / 16

func parseRange(p *parser, name string, arg any) (evalFn, error) {
	return evaluatedArgs(2, 3, func(name string, vs []any) (any, error) {
		vals := []int64{0, 0, 1}
		for i, v := range vs {
			n, ok := wholeNumber(v)
			if !ok || n > math.MaxInt32 || n < math.MinInt32 {
				return nil, errf(34443, "$range requires a numeric argument representable as a 32-bit integer, found value %s", render(v))
			}
			vals[i] = n
		}
		start, end, step := vals[0], vals[1], vals[2]
		if step == 0 {
			return nil, errf(34449, "$range requires a non-zero step value")
		}
		count := int64(0)
		if (step > 0 && end > start) || (step < 0 && end < start) {
			count = (end-start)/step + 1
			if (end-start)%step == 0 {
				count--
			}
		}
		if count > maxRangeElements {
			return nil, errf(codeExceededMemoryLimit, "$range would use too much memory (%d bytes) and cannot spill to disk. Memory limit: %d bytes", count*16, maxRangeElements*16)
		}
		out := make(bson.A, 0, count)
		for i := start; int64(len(out)) < count; i += step {
			out = append(out, int32(i))
		}
		return out, nil
	})(p, name, arg)
}

func parseIndexOfArray(p *parser, name string, arg any) (evalFn, error) {
	return evaluatedArgs(2, 4, func(name string, vs []any) (any, error) {
		if isNullish(vs[0]) {
			return nil, nil
		}
		arr, ok := asArray(vs[0])
		if !ok {
			return nil, errf(40090, "$indexOfArray requires an array as a first argument, found: %s", typeName(vs[0]))
		}
		start, end := int64(0), int64(len(arr))
		if len(vs) > 2 {
			n, ok := wholeNumber(vs[2])
			if !ok || n < 0 {
				return nil, errf(40097, "$indexOfArray requires a nonnegative integral starting index, found: %s", render(vs[2]))
			}
			start = n
		}
		if len(vs) > 3 {
			n, ok := wholeNumber(vs[3])
			if !ok || n < 0 {
				return nil, errf(40097, "$indexOfArray requires a nonnegative integral ending index, found: %s", render(vs[3]))
			}
			end = min(n, end)
		}
		for i := start; i < end; i++ {
			if bsonkit.Equal(arr[i], orNull(vs[1])) && !isMissing(vs[1]) {
				return int32(i), nil
			}
		}
		return int32(-1), nil
	})(p, name, arg)
}

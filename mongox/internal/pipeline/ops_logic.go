package pipeline

import (
	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$eq"] = parseCompare(func(c int) any { return c == 0 })
	operators["$ne"] = parseCompare(func(c int) any { return c != 0 })
	operators["$gt"] = parseCompare(func(c int) any { return c > 0 })
	operators["$gte"] = parseCompare(func(c int) any { return c >= 0 })
	operators["$lt"] = parseCompare(func(c int) any { return c < 0 })
	operators["$lte"] = parseCompare(func(c int) any { return c <= 0 })
	operators["$cmp"] = parseCompare(func(c int) any { return int32(c) })
	operators["$and"] = parseAndOr(true)
	operators["$or"] = parseAndOr(false)
	operators["$not"] = parseNot
	operators["$cond"] = parseCond
	operators["$ifNull"] = parseIfNull
	operators["$switch"] = parseSwitch
	operators["$literal"] = func(p *parser, name string, arg any) (evalFn, error) { return constant(arg), nil }
	operators["$let"] = parseLet
}

func parseCompare(res func(int) any) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.nargs(name, arg, 2, 2)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			a, err := fns[0](c)
			if err != nil {
				return nil, err
			}
			b, err := fns[1](c)
			if err != nil {
				return nil, err
			}
			return res(cmpValues(a, b)), nil
		}, nil
	}
}

func parseAndOr(isAnd bool) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.args(arg)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			for _, fn := range fns {
				v, err := fn(c)
				if err != nil {
					return nil, err
				}
				if truthy(v) != isAnd {
					return !isAnd, nil
				}
			}
			return isAnd, nil
		}, nil
	}
}

func parseNot(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.nargs(name, arg, 1, 1)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := fns[0](c)
		if err != nil {
			return nil, err
		}
		return !truthy(v), nil
	}, nil
}

func parseCond(p *parser, name string, arg any) (evalFn, error) {
	var ifE, thenE, elseE any
	switch x := arg.(type) {
	case bson.A:
		if len(x) != 3 {
			return nil, errf(16020, "Expression $cond takes exactly 3 arguments. %d were passed in.", len(x))
		}
		ifE, thenE, elseE = x[0], x[1], x[2]
	case bson.D:
		m := map[string]any{}
		for _, e := range x {
			switch e.Key {
			case "if", "then", "else":
				m[e.Key] = e.Value
			default:
				return nil, errf(17083, "Unrecognized parameter to $cond: %s", e.Key)
			}
		}
		for i, k := range []string{"if", "then", "else"} {
			if _, ok := m[k]; !ok {
				return nil, errf(17080+int32(i), "Missing '%s' parameter to $cond", k)
			}
		}
		ifE, thenE, elseE = m["if"], m["then"], m["else"]
	default:
		return nil, errf(16020, "Expression $cond takes exactly 3 arguments. 1 were passed in.")
	}
	fi, err := p.parse(ifE)
	if err != nil {
		return nil, err
	}
	ft, err := p.parse(thenE)
	if err != nil {
		return nil, err
	}
	fe, err := p.parse(elseE)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		v, err := fi(c)
		if err != nil {
			return nil, err
		}
		if truthy(v) {
			return ft(c)
		}
		return fe(c)
	}, nil
}

func parseIfNull(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	if len(fns) < 2 {
		return nil, errf(1257300, "$ifNull needs at least two arguments, had: %d", len(fns))
	}
	return func(c *ctx) (any, error) {
		for i, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if i == len(fns)-1 || !isNullish(v) {
				return v, nil
			}
		}
		return nil, nil
	}, nil
}

func parseSwitch(p *parser, name string, arg any) (evalFn, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40060, "$switch requires an object as an argument, found: %s", typeName(arg))
	}
	type branch struct{ cond, then evalFn }
	var branches []branch
	var def evalFn
	for _, e := range d {
		switch e.Key {
		case "branches":
			arr, ok := e.Value.(bson.A)
			if !ok {
				return nil, errf(40061, "$switch expected an array for 'branches', found: %s", typeName(e.Value))
			}
			for _, b := range arr {
				bd, ok := b.(bson.D)
				if !ok {
					return nil, errf(40062, "$switch expected each branch to be an object, found: %s", typeName(b))
				}
				var br branch
				for _, f := range bd {
					fn, err := p.parse(f.Value)
					if err != nil {
						return nil, err
					}
					switch f.Key {
					case "case":
						br.cond = fn
					case "then":
						br.then = fn
					default:
						return nil, errf(40063, "$switch found an unknown argument to a branch: %s", f.Key)
					}
				}
				if br.cond == nil {
					return nil, errf(40064, "$switch requires each branch have a 'case' expression")
				}
				if br.then == nil {
					return nil, errf(40065, "$switch requires each branch have a 'then' expression.")
				}
				branches = append(branches, br)
			}
		case "default":
			fn, err := p.parse(e.Value)
			if err != nil {
				return nil, err
			}
			def = fn
		default:
			return nil, errf(40067, "$switch found an unknown argument: %s", e.Key)
		}
	}
	if len(branches) == 0 {
		return nil, errf(40068, "$switch requires at least one branch.")
	}
	return func(c *ctx) (any, error) {
		for _, b := range branches {
			v, err := b.cond(c)
			if err != nil {
				return nil, err
			}
			if truthy(v) {
				return b.then(c)
			}
		}
		if def == nil {
			return nil, errf(40066, "$switch could not find a matching branch for an input, and no default was specified.")
		}
		return def(c)
	}, nil
}

func parseLet(p *parser, name string, arg any) (evalFn, error) {
	m, err := p.objArgs(name, arg, []string{"vars", "in"}, "vars", "in")
	if err != nil {
		return nil, err
	}
	vd, ok := m["vars"].(bson.D)
	if !ok {
		return nil, errf(10065, "invalid parameter: expected an object (vars)")
	}
	names := make([]string, len(vd))
	fns := make([]evalFn, len(vd))
	for i, e := range vd {
		if err := checkVarName(e.Key); err != nil {
			return nil, err
		}
		fn, err := p.parse(e.Value)
		if err != nil {
			return nil, err
		}
		names[i], fns[i] = e.Key, fn
	}
	pop := p.push(names...)
	in, err := p.parse(m["in"])
	pop()
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		vals := make([]any, len(fns))
		for i, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			vals[i] = v
		}
		n := len(c.vars)
		for i, name := range names {
			c.vars = append(c.vars, binding{name, vals[i]})
		}
		v, err := in(c)
		c.vars = c.vars[:n]
		return v, err
	}, nil
}

// checkVarName validates a user variable name: it starts with a lowercase
// letter or a non-ASCII character and holds letters, digits and '_'.
func checkVarName(name string) error {
	if name == "" {
		return errf(16866, "empty variable names are not allowed")
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r > 127
		if i > 0 {
			ok = ok || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_'
		}
		if !ok {
			return errf(16867, "'%s' starts with an invalid character for a user variable name", name)
		}
	}
	return nil
}

package pipeline

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$mergeObjects"] = parseMergeObjects
	operators["$getField"] = parseGetField
	operators["$setField"] = parseSetField
	operators["$unsetField"] = parseSetField
	operators["$objectToArray"] = unaryNullish(objectToArray)
	operators["$arrayToObject"] = unaryNullish(arrayToObject)
}

func parseMergeObjects(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		acc := &mergeAcc{}
		for _, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if err := acc.add(v); err != nil {
				return nil, err
			}
		}
		return acc.result(), nil
	}, nil
}

func parseGetField(p *parser, name string, arg any) (evalFn, error) {
	var field any
	var input evalFn = func(c *ctx) (any, error) { return c.current, nil }
	if d, ok := arg.(bson.D); ok && len(d) > 0 && (d[0].Key == "field" || d[0].Key == "input") {
		m, err := p.objArgs(name, arg, []string{"field", "input"}, "field")
		if err != nil {
			return nil, err
		}
		field = m["field"]
		if in, ok := m["input"]; ok {
			if input, err = p.parse(in); err != nil {
				return nil, err
			}
		}
	} else {
		field = arg
	}
	literal := false
	if lit, ok := field.(bson.D); ok && len(lit) == 1 && lit[0].Key == "$literal" {
		field, literal = lit[0].Value, true
	}
	key, ok := field.(string)
	if !ok {
		return nil, errf(5654602, "$getField requires 'field' to evaluate to type String, but got %s", typeName(field))
	}
	if !literal && strings.HasPrefix(key, "$") {
		return nil, errf(5654602, "$getField requires 'field' to be a constant string; use {$literal: %q} for a field starting with '$'", key)
	}
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			return missing, nil
		}
		d, ok := asDoc(v)
		if !ok {
			return nil, errf(3041705, "$getField requires 'input' to evaluate to type Object, but got %s", typeName(v))
		}
		return getField(d, key), nil
	}, nil
}

func objectToArray(v any) (any, error) {
	d, ok := asDoc(v)
	if !ok {
		return nil, errf(40390, "$objectToArray requires a document input, found: %s", typeName(v))
	}
	out := make(bson.A, len(d))
	for i, e := range d {
		out[i] = bson.D{{Key: "k", Value: e.Key}, {Key: "v", Value: e.Value}}
	}
	return out, nil
}

func arrayToObject(v any) (any, error) {
	arr, ok := asArray(v)
	if !ok {
		return nil, errf(40386, "$arrayToObject requires an array input, found: %s", typeName(v))
	}
	out := bson.D{}
	for _, e := range arr {
		var k, val any
		switch x := e.(type) {
		case bson.A:
			if len(x) != 2 {
				return nil, errf(40397, "$arrayToObject requires an array of size 2 arrays,found array of size: %d", len(x))
			}
			k, val = x[0], x[1]
		case bson.D:
			if len(x) != 2 {
				return nil, errf(40392, "$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:%d", len(x))
			}
			kv, vv := getField(x, "k"), getField(x, "v")
			if isMissing(kv) || isMissing(vv) {
				return nil, errf(40393, "$arrayToObject requires an object with keys 'k' and 'v'.")
			}
			k, val = kv, vv
		default:
			return nil, errf(40398, "Unrecognised input type format for $arrayToObject: %s", typeName(e))
		}
		ks, ok := k.(string)
		if !ok {
			return nil, errf(40395, "$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: %s", typeName(k))
		}
		out = setField(out, ks, val)
	}
	return out, nil
}

// parseSetField compiles $setField {field, input, value} and $unsetField
// {field, input}: a copy of input with the field (named by a constant
// string, which may start with '$' or contain '.') set or removed. A value
// of $$REMOVE removes the field; a null or missing input gives null.
func parseSetField(p *parser, name string, arg any) (evalFn, error) {
	allowed := []string{"field", "input", "value"}
	required := []string{"field", "input", "value"}
	unset := name == "$unsetField"
	if unset {
		allowed, required = allowed[:2], required[:2]
	}
	m, err := p.objArgs(name, arg, allowed, required...)
	if err != nil {
		return nil, err
	}
	field := m["field"]
	if lit, ok := field.(bson.D); ok && len(lit) == 1 && lit[0].Key == "$literal" {
		field = lit[0].Value
	} else if s, ok := field.(string); ok && strings.HasPrefix(s, "$") {
		return nil, errf(4161106, "%s: 'field' must be a constant string; use {$literal: %q} for a field starting with '$'", name, s)
	}
	key, ok := field.(string)
	if !ok {
		return nil, errf(4161107, "%s requires 'field' to evaluate to type String, but got %s", name, typeName(field))
	}
	input, err := p.parse(m["input"])
	if err != nil {
		return nil, err
	}
	value := constant(missing)
	if !unset {
		if value, err = p.parse(m["value"]); err != nil {
			return nil, err
		}
	}
	return func(c *ctx) (any, error) {
		in, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(in) {
			return nil, nil
		}
		d, ok := asDoc(in)
		if !ok {
			return nil, errf(4161105, "%s requires 'input' to evaluate to type Object", name)
		}
		v, err := value(c)
		if err != nil {
			return nil, err
		}
		out := make(bson.D, 0, len(d)+1)
		found := false
		for _, e := range d {
			if e.Key == key {
				found = true
				if isMissing(v) {
					continue
				}
				e.Value = v
			}
			out = append(out, e)
		}
		if !found && !isMissing(v) {
			out = append(out, bson.E{Key: key, Value: v})
		}
		return out, nil
	}, nil
}

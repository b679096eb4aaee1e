package pipeline

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

type unwindStage struct {
	path          []string
	indexField    []string
	preserveEmpty bool
}

func parseUnwind(arg any, vars bson.D) (stage, error) {
	s := &unwindStage{}
	var path string
	switch x := arg.(type) {
	case string:
		path = x
	case bson.D:
		for _, e := range x {
			switch e.Key {
			case "path":
				p, ok := e.Value.(string)
				if !ok {
					return nil, errf(28808, "expected a string as the path for $unwind stage, got %s", typeName(e.Value))
				}
				path = p
			case "includeArrayIndex":
				f, ok := e.Value.(string)
				if !ok {
					return nil, errf(28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage, got %s", typeName(e.Value))
				}
				if f == "" {
					return nil, errf(28810, "expected a non-empty string for the includeArrayIndex option to $unwind stage")
				}
				if strings.HasPrefix(f, "$") {
					return nil, errf(28822, "includeArrayIndex option to $unwind stage should not be prefixed with a '$': %s", f)
				}
				parts, err := splitFieldPath(f)
				if err != nil {
					return nil, err
				}
				s.indexField = parts
			case "preserveNullAndEmptyArrays":
				b, ok := e.Value.(bool)
				if !ok {
					return nil, errf(28809, "expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got %s", typeName(e.Value))
				}
				s.preserveEmpty = b
			default:
				return nil, errf(28811, "unrecognized option to $unwind stage: %s", e.Key)
			}
		}
		if path == "" {
			return nil, errf(28812, "no path specified to $unwind stage")
		}
	default:
		return nil, errf(15981, "expected either a string or an object as specification for $unwind stage, got %s", typeName(arg))
	}
	if !strings.HasPrefix(path, "$") {
		return nil, errf(28818, "path option to $unwind stage should be prefixed with a '$': %s", path)
	}
	parts, err := splitFieldPath(path[1:])
	if err != nil {
		return nil, err
	}
	s.path = parts
	return s, nil
}

// nestedGet follows a path through subdocuments only.
func nestedGet(d bson.D, parts []string) any {
	var cur any = d
	for _, p := range parts {
		doc, ok := cur.(bson.D)
		if !ok {
			return missing
		}
		cur = getField(doc, p)
	}
	return cur
}

// nestedSet returns a copy of d with the value at path replaced (missing
// removes it), copying only the documents along the path.
func nestedSet(d bson.D, parts []string, v any) bson.D {
	out := append(make(bson.D, 0, len(d)+1), d...)
	if len(parts) == 1 {
		return setField(out, parts[0], v)
	}
	child, _ := getField(d, parts[0]).(bson.D)
	return setField(out, parts[0], nestedSet(child, parts[1:], v))
}

func (s *unwindStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	out := make([]bson.D, 0, len(in))
	for _, d := range in {
		v := nestedGet(d, s.path)
		arr, isArr := asArray(v)
		switch {
		case isArr && len(arr) > 0:
			for i, e := range arr {
				nd := nestedSet(d, s.path, e)
				if s.indexField != nil {
					nd = nestedSet(nd, s.indexField, int64(i))
				}
				out = append(out, nd)
			}
		case isArr || isNullish(v):
			if !s.preserveEmpty {
				continue
			}
			nd := d
			if isArr {
				nd = nestedSet(d, s.path, missing)
			}
			if s.indexField != nil {
				nd = nestedSet(nd, s.indexField, nil)
			}
			out = append(out, nd)
		default:
			nd := d
			if s.indexField != nil {
				nd = nestedSet(nd, s.indexField, nil)
			}
			out = append(out, nd)
		}
	}
	return out, nil
}

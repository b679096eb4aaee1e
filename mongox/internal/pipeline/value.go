package pipeline

import (
	"math"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// missingType marks an absent value (a field that does not exist, or
// $$REMOVE). It never leaves the package: outputs drop it or turn it into
// null.
type missingType struct{}

var missing any = missingType{}

func isMissing(v any) bool { _, ok := v.(missingType); return ok }

// isNullish reports whether v is null, undefined or missing.
func isNullish(v any) bool {
	switch v.(type) {
	case nil, missingType, bson.Undefined, bson.Null:
		return true
	}
	return false
}

// orNull turns missing into null.
func orNull(v any) any {
	if isMissing(v) {
		return nil
	}
	return v
}

// truthy is MongoDB's coercion to bool: false, null, undefined, missing and
// numeric zero are false; everything else is true.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil, missingType, bson.Undefined, bson.Null:
		return false
	case bool:
		return x
	case int32:
		return x != 0
	case int64:
		return x != 0
	case float64:
		return x != 0
	case bson.Decimal128:
		return !x.IsZero()
	}
	return true
}

// cmpValues compares two values as aggregation expressions do: missing
// sorts after MinKey and before null, everything else as bsonkit.Compare.
func cmpValues(a, b any) int {
	am, bm := isMissing(a), isMissing(b)
	if am || bm {
		if am && bm {
			return 0
		}
		other := b
		sign := -1
		if bm {
			other, sign = a, 1
		}
		if _, ok := other.(bson.Undefined); ok {
			return 0
		}
		if _, ok := other.(bson.MinKey); ok {
			return -sign
		}
		return sign
	}
	_, au := a.(bson.Undefined)
	_, bu := b.(bson.Undefined)
	if au || bu {
		switch {
		case au && bu:
			return 0
		case au:
			if _, ok := b.(bson.MinKey); ok {
				return 1
			}
			return -1
		default:
			if _, ok := a.(bson.MinKey); ok {
				return -1
			}
			return 1
		}
	}
	return bsonkit.Compare(a, b)
}

// typeName is the $type name of v: "missing" for an absent value, and
// "object" for a type BSON has no alias for.
func typeName(v any) string {
	if _, ok := v.(missingType); ok {
		return "missing"
	}
	if n, ok := mongoerr.TypeAlias(v); ok {
		return n
	}
	return "object"
}

// normalize converts Go conveniences a caller may put into a spec (bson.M,
// []any, int, float32) into the driver's canonical decoded types.
func normalize(v any) any {
	switch x := v.(type) {
	case bson.M:
		d := make(bson.D, 0, len(x))
		for k, e := range x {
			d = append(d, bson.E{Key: k, Value: normalize(e)})
		}
		return d
	case bson.D:
		out := make(bson.D, len(x))
		for i, e := range x {
			out[i] = bson.E{Key: e.Key, Value: normalize(e.Value)}
		}
		return out
	case bson.Raw:
		if d := bsonkit.AsDoc(x); d != nil {
			return normalize(d)
		}
		return x
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case []any:
		return normalize(bson.A(x))
	case int:
		if x >= math.MinInt32 && x <= math.MaxInt32 {
			return int32(x)
		}
		return int64(x)
	case float32:
		return float64(x)
	case bson.Null:
		return nil
	}
	return v
}

// asDoc returns v as a document.
func asDoc(v any) (bson.D, bool) {
	switch x := v.(type) {
	case bson.D:
		return x, true
	case bson.M, bson.Raw:
		d := bsonkit.AsDoc(x)
		return d, d != nil
	}
	return nil, false
}

// asArray returns v as an array.
func asArray(v any) (bson.A, bool) {
	switch x := v.(type) {
	case bson.A:
		return x, true
	case []any:
		return bson.A(x), true
	}
	return nil, false
}

// getField returns a top-level field, or missing.
func getField(d bson.D, key string) any {
	for i := range d {
		if d[i].Key == key {
			return d[i].Value
		}
	}
	return missing
}

// setField sets a top-level field of a document the caller owns; missing
// removes it.
func setField(d bson.D, key string, v any) bson.D {
	if isMissing(v) {
		return bsonkit.Delete(d, key)
	}
	for i := range d {
		if d[i].Key == key {
			d[i].Value = v
			return d
		}
	}
	return append(d, bson.E{Key: key, Value: v})
}

// walkPath follows field-path parts as aggregation field paths do: arrays
// of documents fan out into arrays of the found values; numeric parts are
// field names, not indexes.
func walkPath(v any, parts []string) any {
	if len(parts) == 0 {
		return v
	}
	switch x := v.(type) {
	case bson.D:
		return walkPath(getField(x, parts[0]), parts[1:])
	case bson.A:
		out := bson.A{}
		for _, e := range x {
			if _, ok := asDoc(e); !ok {
				continue
			}
			if r := walkPath(e, parts); !isMissing(r) {
				out = append(out, r)
			}
		}
		return out
	case bson.M, bson.Raw, []any:
		return walkPath(normalize(x), parts)
	}
	return missing
}

// exportValue turns an internal result into a value for callers.
func exportValue(v any) any { return orNull(v) }

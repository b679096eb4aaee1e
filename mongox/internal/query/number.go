package query

import (
	"math"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// normValue converts Go-only types a caller's filter may hold into the
// types the bson package decodes, so fast paths apply.
func normValue(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case float32:
		return float64(x)
	case []any:
		return bson.A(x)
	case bson.M:
		return docFromM(x)
	}
	return v
}

// compareNumbers compares two numbers, avoiding bsonkit's exact (and
// allocating) path for the common int/double mixes.
func compareNumbers(a, b any) int {
	if ia, ok := smallInt(a); ok {
		switch y := b.(type) {
		case float64:
			if !math.IsNaN(y) {
				return cmpF(float64(ia), y)
			}
		case int32:
			return cmpF(float64(ia), float64(y))
		case int64:
			if ib, ok := smallInt(b); ok {
				return cmpF(float64(ia), float64(ib))
			}
		}
	} else if x, ok := a.(float64); ok && !math.IsNaN(x) {
		if ib, ok := smallInt(b); ok {
			return cmpF(x, float64(ib))
		}
	}
	return bsonkit.CompareNumbers(a, b)
}

const maxExactInt = 1 << 53

// smallInt returns v as an int64 when it is an int32 or an int64 that a
// float64 represents exactly.
func smallInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		if x >= -maxExactInt && x <= maxExactInt {
			return x, true
		}
	}
	return 0, false
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

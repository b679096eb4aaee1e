package bsonkit

import (
	"bytes"
	"math"
	"math/big"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Canonical type ranks, in MongoDB's comparison order
// (https://www.mongodb.com/docs/manual/reference/bson-type-comparison-order/).
const (
	RankMinKey    = 1
	RankNull      = 5 // null and undefined
	RankNumber    = 10
	RankString    = 15 // string and symbol
	RankObject    = 20
	RankArray     = 25
	RankBinary    = 30
	RankObjectID  = 35
	RankBool      = 40
	RankDate      = 45
	RankTimestamp = 47
	RankRegex     = 50
	RankDBPointer = 55
	RankCode      = 60
	RankCodeScope = 65
	RankMaxKey    = 127
)

// Rank returns the canonical type rank of v. Unknown Go types rank with
// objects; the server only stores what the bson package decodes.
func Rank(v any) int {
	switch v.(type) {
	case bson.MinKey:
		return RankMinKey
	case nil, bson.Null, bson.Undefined:
		return RankNull
	case int32, int64, float64, bson.Decimal128, int, float32:
		return RankNumber
	case string, bson.Symbol:
		return RankString
	case bson.D, bson.M, bson.Raw:
		return RankObject
	case bson.A, []any:
		return RankArray
	case bson.Binary, []byte:
		return RankBinary
	case bson.ObjectID:
		return RankObjectID
	case bool:
		return RankBool
	case bson.DateTime:
		return RankDate
	case bson.Timestamp:
		return RankTimestamp
	case bson.Regex:
		return RankRegex
	case bson.DBPointer:
		return RankDBPointer
	case bson.JavaScript:
		return RankCode
	case bson.CodeWithScope:
		return RankCodeScope
	case bson.MaxKey:
		return RankMaxKey
	}
	return RankObject
}

// IsNumber reports whether v is a BSON number.
func IsNumber(v any) bool { return Rank(v) == RankNumber }

// Compare orders two BSON values as MongoDB does: first by canonical type
// rank, then by value. It returns -1, 0 or +1.
func Compare(a, b any) int {
	ra, rb := Rank(a), Rank(b)
	if ra != rb {
		return cmpInt(ra, rb)
	}
	switch ra {
	case RankMinKey, RankNull, RankMaxKey:
		return 0
	case RankNumber:
		return CompareNumbers(a, b)
	case RankString:
		return strings.Compare(stringOf(a), stringOf(b))
	case RankObject:
		return compareDocs(AsDoc(a), AsDoc(b))
	case RankArray:
		return compareArrays(AsArray(a), AsArray(b))
	case RankBinary:
		ba, bb := binaryOf(a), binaryOf(b)
		if len(ba.Data) != len(bb.Data) {
			return cmpInt(len(ba.Data), len(bb.Data))
		}
		if ba.Subtype != bb.Subtype {
			return cmpInt(int(ba.Subtype), int(bb.Subtype))
		}
		return bytes.Compare(ba.Data, bb.Data)
	case RankObjectID:
		oa, ob := a.(bson.ObjectID), b.(bson.ObjectID)
		return bytes.Compare(oa[:], ob[:])
	case RankBool:
		ba, bb := a.(bool), b.(bool)
		switch {
		case ba == bb:
			return 0
		case !ba:
			return -1
		}
		return 1
	case RankDate:
		return cmpInt64(int64(a.(bson.DateTime)), int64(b.(bson.DateTime)))
	case RankTimestamp:
		return CompareTimestamps(a.(bson.Timestamp), b.(bson.Timestamp))
	case RankRegex:
		ra, rb := a.(bson.Regex), b.(bson.Regex)
		if c := strings.Compare(ra.Pattern, rb.Pattern); c != 0 {
			return c
		}
		return strings.Compare(ra.Options, rb.Options)
	case RankDBPointer:
		pa, pb := a.(bson.DBPointer), b.(bson.DBPointer)
		if c := strings.Compare(pa.DB, pb.DB); c != 0 {
			return c
		}
		return bytes.Compare(pa.Pointer[:], pb.Pointer[:])
	case RankCode:
		return strings.Compare(string(a.(bson.JavaScript)), string(b.(bson.JavaScript)))
	case RankCodeScope:
		ca, cb := a.(bson.CodeWithScope), b.(bson.CodeWithScope)
		if c := strings.Compare(string(ca.Code), string(cb.Code)); c != 0 {
			return c
		}
		return Compare(ca.Scope, cb.Scope)
	}
	return 0
}

// Equal reports whether two values are equal under Compare.
func Equal(a, b any) bool { return Compare(a, b) == 0 }

// CompareTimestamps orders BSON timestamps by (T, I).
func CompareTimestamps(a, b bson.Timestamp) int {
	if a.T != b.T {
		return cmpInt64(int64(a.T), int64(b.T))
	}
	return cmpInt64(int64(a.I), int64(b.I))
}

func compareDocs(a, b bson.D) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := cmpInt(Rank(a[i].Value), Rank(b[i].Value)); c != 0 {
			return c
		}
		if c := strings.Compare(a[i].Key, b[i].Key); c != 0 {
			return c
		}
		if c := Compare(a[i].Value, b[i].Value); c != 0 {
			return c
		}
	}
	return cmpInt(len(a), len(b))
}

func compareArrays(a, b bson.A) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmpInt(len(a), len(b))
}

// CompareNumbers compares two BSON numbers by value. NaN is equal to NaN
// and less than every other number, as in MongoDB.
func CompareNumbers(a, b any) int {
	// Fast paths for the common integer and double cases.
	switch x := a.(type) {
	case int32:
		switch y := b.(type) {
		case int32:
			return cmpInt64(int64(x), int64(y))
		case int64:
			return cmpInt64(int64(x), y)
		}
	case int64:
		switch y := b.(type) {
		case int32:
			return cmpInt64(x, int64(y))
		case int64:
			return cmpInt64(x, y)
		}
	case float64:
		if y, ok := b.(float64); ok {
			return cmpFloat(x, y)
		}
	}
	na, nb := toBig(a), toBig(b)
	switch {
	case na.nan && nb.nan:
		return 0
	case na.nan:
		return -1
	case nb.nan:
		return 1
	}
	return na.f.Cmp(nb.f)
}

type bigNum struct {
	f   *big.Float
	nan bool
}

// toBig converts a BSON number to an exact big.Float (NaN flagged).
func toBig(v any) bigNum {
	f := new(big.Float).SetPrec(256)
	switch x := v.(type) {
	case int32:
		f.SetInt64(int64(x))
	case int64:
		f.SetInt64(x)
	case int:
		f.SetInt64(int64(x))
	case float32:
		return toBig(float64(x))
	case float64:
		if math.IsNaN(x) {
			return bigNum{nan: true}
		}
		f.SetFloat64(x) // handles ±Inf
	case bson.Decimal128:
		if x.IsNaN() {
			return bigNum{nan: true}
		}
		if inf := x.IsInf(); inf != 0 {
			f.SetInf(inf < 0)
			break
		}
		bi, exp, err := x.BigInt()
		if err != nil {
			return bigNum{nan: true}
		}
		f.SetInt(bi)
		if exp != 0 {
			p := new(big.Float).SetPrec(256).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(exp))), nil))
			if exp > 0 {
				f.Mul(f, p)
			} else {
				f.Quo(f, p)
			}
		}
	}
	return bigNum{f: f}
}

// ToFloat64 converts a BSON number to float64 (lossy for large int64 and
// decimal128). ok is false when v is not a number.
func ToFloat64(v any) (float64, bool) {
	switch x := v.(type) {
	case int32:
		return float64(x), true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	case float32:
		return float64(x), true
	case float64:
		return x, true
	case bson.Decimal128:
		n := toBig(x)
		if n.nan {
			return math.NaN(), true
		}
		f, _ := n.f.Float64()
		return f, true
	}
	return 0, false
}

// ToInt64 converts a whole BSON number to int64. ok is false for non-numbers,
// fractions and values out of range.
func ToInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case int:
		return int64(x), true
	case float64:
		if x != math.Trunc(x) || math.IsNaN(x) || x < math.MinInt64 || x >= math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case bson.Decimal128:
		n := toBig(x)
		if n.nan || !n.f.IsInt() {
			return 0, false
		}
		i, acc := n.f.Int64()
		return i, acc == big.Exact
	}
	return 0, false
}

func cmpFloat(x, y float64) int {
	xn, yn := math.IsNaN(x), math.IsNaN(y)
	switch {
	case xn && yn:
		return 0
	case xn:
		return -1
	case yn:
		return 1
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func stringOf(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bson.Symbol:
		return string(x)
	}
	return ""
}

func binaryOf(v any) bson.Binary {
	switch x := v.(type) {
	case bson.Binary:
		return x
	case []byte:
		return bson.Binary{Data: x}
	}
	return bson.Binary{}
}

// AsDoc returns v as a bson.D when it is a document (bson.D, bson.M or
// bson.Raw), else nil.
func AsDoc(v any) bson.D {
	switch x := v.(type) {
	case bson.D:
		return x
	case bson.M:
		d := make(bson.D, 0, len(x))
		for k, val := range x {
			d = append(d, bson.E{Key: k, Value: val})
		}
		return d
	case bson.Raw:
		var d bson.D
		if err := bson.Unmarshal(x, &d); err != nil {
			return nil
		}
		return d
	}
	return nil
}

// AsArray returns v as a bson.A when it is an array, else nil.
func AsArray(v any) bson.A {
	switch x := v.(type) {
	case bson.A:
		return x
	case []any:
		return bson.A(x)
	}
	return nil
}

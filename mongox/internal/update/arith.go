package update

import (
	"math"
	"math/big"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// numeric widths, in promotion order.
const (
	kInt32 = iota
	kInt64
	kDouble
	kDecimal
)

func numKind(v any) int {
	switch v.(type) {
	case int32:
		return kInt32
	case int64:
		return kInt64
	case float64:
		return kDouble
	case bson.Decimal128:
		return kDecimal
	}
	return -1
}

// arith computes a+b (mul false) or a*b (mul true) with MongoDB's type
// promotion: the wider type wins; int32 results that overflow become int64;
// int64 overflow fails (ok false).
func arith(a, b any, mul bool) (any, bool) {
	k := max(numKind(a), numKind(b))
	switch k {
	case kInt32, kInt64:
		x, y := toInt64(a), toInt64(b)
		var r int64
		if mul {
			ok, p := mul64(x, y)
			if !ok {
				return nil, false
			}
			r = p
		} else {
			r = x + y
			if (r > x) != (y > 0) {
				return nil, false
			}
		}
		if k == kInt32 && r >= math.MinInt32 && r <= math.MaxInt32 {
			return int32(r), true
		}
		return r, true
	case kDouble:
		x, y := toFloat(a), toFloat(b)
		if mul {
			return x * y, true
		}
		return x + y, true
	case kDecimal:
		return decArith(toDecimal(a), toDecimal(b), mul), true
	}
	return nil, false
}

// mul64 multiplies with overflow detection (ok false on overflow).
func mul64(x, y int64) (bool, int64) {
	if x == 0 || y == 0 {
		return true, 0
	}
	r := x * y
	if r/y != x || (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) {
		return false, 0
	}
	return true, r
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int32:
		return int64(x)
	case int64:
		return x
	}
	return 0
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case float64:
		return x
	case bson.Decimal128:
		f, err := strconv.ParseFloat(x.String(), 64)
		if err != nil {
			return math.NaN()
		}
		return f
	}
	return 0
}

// toDecimal converts a number to decimal128; doubles keep 15 significant
// digits, as MongoDB converts them.
func toDecimal(v any) bson.Decimal128 {
	switch x := v.(type) {
	case bson.Decimal128:
		return x
	case int32:
		d, _ := bson.ParseDecimal128FromBigInt(big.NewInt(int64(x)), 0)
		return d
	case int64:
		d, _ := bson.ParseDecimal128FromBigInt(big.NewInt(x), 0)
		return d
	case float64:
		return floatToDecimal(x)
	}
	return bson.Decimal128{}
}

func floatToDecimal(f float64) bson.Decimal128 {
	var s string
	switch {
	case math.IsNaN(f):
		s = "NaN"
	case math.IsInf(f, 1):
		s = "Infinity"
	case math.IsInf(f, -1):
		s = "-Infinity"
	default:
		s = strconv.FormatFloat(f, 'g', 15, 64)
	}
	d, err := bson.ParseDecimal128(s)
	if err != nil {
		d, _ = bson.ParseDecimal128("NaN")
	}
	return d
}

// decArith adds or multiplies decimals exactly, rounding to 34 significant
// digits (half to even). NaN and infinities follow float semantics.
func decArith(a, b bson.Decimal128, mul bool) bson.Decimal128 {
	if a.IsNaN() || b.IsNaN() || a.IsInf() != 0 || b.IsInf() != 0 {
		x, y := toFloat(a), toFloat(b)
		if mul {
			return floatToDecimal(x * y)
		}
		return floatToDecimal(x + y)
	}
	ai, ae, err1 := a.BigInt()
	bi, be, err2 := b.BigInt()
	if err1 != nil || err2 != nil {
		return floatToDecimal(math.NaN())
	}
	var r *big.Int
	var e int
	if mul {
		r, e = new(big.Int).Mul(ai, bi), ae+be
	} else {
		e = min(ae, be)
		ai = scale(ai, ae-e)
		bi = scale(bi, be-e)
		r = new(big.Int).Add(ai, bi)
	}
	return roundDecimal(r, e)
}

func scale(x *big.Int, digits int) *big.Int {
	if digits == 0 {
		return x
	}
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(digits)), nil)
	return new(big.Int).Mul(x, p)
}

var (
	bigTen    = big.NewInt(10)
	maxDecSig = new(big.Int).Exp(big.NewInt(10), big.NewInt(34), nil) // 10^34
)

func roundDecimal(r *big.Int, e int) bson.Decimal128 {
	neg := r.Sign() < 0
	m := new(big.Int).Abs(r)
	for m.Cmp(maxDecSig) >= 0 {
		q, rem := new(big.Int).QuoRem(m, bigTen, new(big.Int))
		d := rem.Int64()
		if d > 5 || (d == 5 && q.Bit(0) == 1) {
			q.Add(q, big.NewInt(1))
		}
		m = q
		e++
	}
	// Bring very small exponents into range, dropping digits.
	for e < -6176 && m.Sign() != 0 {
		m.Quo(m, bigTen)
		e++
	}
	if neg {
		m.Neg(m)
	}
	d, ok := bson.ParseDecimal128FromBigInt(m, e)
	if !ok {
		if neg {
			d, _ = bson.ParseDecimal128("-Infinity")
		} else {
			d, _ = bson.ParseDecimal128("Infinity")
		}
	}
	return d
}

// zeroLike returns zero of v's numeric type ($mul on a missing field).
func zeroLike(v any) any {
	switch v.(type) {
	case int32:
		return int32(0)
	case int64:
		return int64(0)
	case float64:
		return 0.0
	case bson.Decimal128:
		d, _ := bson.ParseDecimal128("0")
		return d
	}
	return int32(0)
}

package pipeline

import (
	"math"
	"math/big"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// numKind orders the numeric types by MongoDB's widening rules.
type numKind int

const (
	kInt numKind = iota
	kLong
	kDouble
	kDecimal
)

func kindOf(v any) (numKind, bool) {
	switch v.(type) {
	case int32:
		return kInt, true
	case int64:
		return kLong, true
	case float64:
		return kDouble, true
	case bson.Decimal128:
		return kDecimal, true
	}
	return 0, false
}

func isNum(v any) bool { _, ok := kindOf(v); return ok }

// toF returns a number as float64.
func toF(v any) float64 {
	switch x := v.(type) {
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case float64:
		return x
	case bson.Decimal128:
		f, _ := strconv.ParseFloat(x.String(), 64)
		if x.IsNaN() {
			return math.NaN()
		}
		if s := x.IsInf(); s != 0 {
			return math.Inf(s)
		}
		return f
	}
	return math.NaN()
}

// toI64 returns an int32 or int64 as int64.
func toI64(v any) int64 {
	switch x := v.(type) {
	case int32:
		return int64(x)
	case int64:
		return x
	}
	return 0
}

// intResult narrows an int64 to int32 when it fits.
func intResult(n int64) any {
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		return int32(n)
	}
	return n
}

// --- decimal128 arithmetic (exact for + - *, rounded to 34 digits) ---

type decVal struct {
	coef *big.Int
	exp  int
}

var decNaN, _ = bson.ParseDecimal128("NaN")

func decSpecial(d bson.Decimal128) bool { return d.IsNaN() || d.IsInf() != 0 }

// toDec converts a number to decimal128 (doubles keep 15 significant digits,
// as MongoDB does).
func toDec(v any) bson.Decimal128 {
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
		switch {
		case math.IsNaN(x):
			return decNaN
		case math.IsInf(x, 1):
			d, _ := bson.ParseDecimal128("Infinity")
			return d
		case math.IsInf(x, -1):
			d, _ := bson.ParseDecimal128("-Infinity")
			return d
		}
		d, err := bson.ParseDecimal128(strconv.FormatFloat(x, 'e', 14, 64))
		if err != nil {
			return decNaN
		}
		return d
	}
	return decNaN
}

func decParts(d bson.Decimal128) decVal {
	c, e, err := d.BigInt()
	if err != nil {
		return decVal{coef: new(big.Int), exp: 0}
	}
	return decVal{coef: c, exp: e}
}

var bigTen = big.NewInt(10)

func pow10(n int) *big.Int { return new(big.Int).Exp(bigTen, big.NewInt(int64(n)), nil) }

// decFinish rounds a coefficient to 34 digits (half to even) and packs it.
func decFinish(c *big.Int, exp int) bson.Decimal128 {
	digits := len(new(big.Int).Abs(c).String())
	if digits > 34 {
		drop := digits - 34
		q, r := new(big.Int).QuoRem(c, pow10(drop), new(big.Int))
		half := new(big.Int).Mul(big.NewInt(5), pow10(drop-1))
		cmp := new(big.Int).Abs(r).Cmp(half)
		if cmp > 0 || (cmp == 0 && q.Bit(0) == 1) {
			if c.Sign() < 0 {
				q.Sub(q, big.NewInt(1))
			} else {
				q.Add(q, big.NewInt(1))
			}
		}
		c, exp = q, exp+drop
	}
	for exp < -6176 && c.Sign() != 0 {
		c = new(big.Int).Quo(c, bigTen)
		exp++
	}
	if d, ok := bson.ParseDecimal128FromBigInt(c, exp); ok {
		return d
	}
	if c.Sign() < 0 {
		d, _ := bson.ParseDecimal128("-Infinity")
		return d
	}
	d, _ := bson.ParseDecimal128("Infinity")
	return d
}

// decFloatOp handles NaN and infinities by falling back to float64.
func decFloatOp(a, b bson.Decimal128, op func(x, y float64) float64) bson.Decimal128 {
	return toDec(op(toF(a), toF(b)))
}

func decAdd(a, b bson.Decimal128) bson.Decimal128 {
	if decSpecial(a) || decSpecial(b) {
		return decFloatOp(a, b, func(x, y float64) float64 { return x + y })
	}
	x, y := decParts(a), decParts(b)
	exp := min(x.exp, y.exp)
	cx := new(big.Int).Mul(x.coef, pow10(x.exp-exp))
	cy := new(big.Int).Mul(y.coef, pow10(y.exp-exp))
	return decFinish(cx.Add(cx, cy), exp)
}

func decNeg(a bson.Decimal128) bson.Decimal128 {
	if decSpecial(a) {
		return toDec(-toF(a))
	}
	x := decParts(a)
	return decFinish(new(big.Int).Neg(x.coef), x.exp)
}

func decMul(a, b bson.Decimal128) bson.Decimal128 {
	if decSpecial(a) || decSpecial(b) {
		return decFloatOp(a, b, func(x, y float64) float64 { return x * y })
	}
	x, y := decParts(a), decParts(b)
	return decFinish(new(big.Int).Mul(x.coef, y.coef), x.exp+y.exp)
}

// decDiv divides; the caller rejects a zero divisor.
func decDiv(a, b bson.Decimal128) bson.Decimal128 {
	if decSpecial(a) || decSpecial(b) {
		return decFloatOp(a, b, func(x, y float64) float64 { return x / y })
	}
	x, y := decParts(a), decParts(b)
	preferred := x.exp - y.exp
	// Scale the dividend so the quotient carries at least 36 digits.
	scale := 36 + len(y.coef.String()) - len(new(big.Int).Abs(x.coef).String())
	scale = max(scale, 0)
	num := new(big.Int).Mul(x.coef, pow10(scale))
	q, r := new(big.Int).QuoRem(num, y.coef, new(big.Int))
	exp := preferred - scale
	if r.Sign() == 0 {
		// Exact: drop trailing zeros down to the preferred exponent.
		for exp < preferred {
			qq, rr := new(big.Int).QuoRem(q, bigTen, new(big.Int))
			if rr.Sign() != 0 {
				break
			}
			q, exp = qq, exp+1
		}
		return decFinish(q, exp)
	}
	// Inexact: a sticky digit keeps rounding honest.
	q.Mul(q, bigTen)
	if q.Sign() < 0 || (q.Sign() == 0 && (x.coef.Sign() < 0) != (y.coef.Sign() < 0)) {
		q.Sub(q, big.NewInt(1))
	} else {
		q.Add(q, big.NewInt(1))
	}
	return decFinish(q, exp-1)
}

func decCmpZero(d bson.Decimal128) int {
	if d.IsNaN() {
		return 0
	}
	if s := d.IsInf(); s != 0 {
		return s
	}
	return decParts(d).coef.Sign()
}

// --- generic arithmetic with MongoDB's type promotion ---

// numAdd adds two numbers: int32 widens to int64 on overflow, int64 to
// double, any double makes a double, any decimal a decimal.
func numAdd(a, b any) any {
	ka, _ := kindOf(a)
	kb, _ := kindOf(b)
	switch max(ka, kb) {
	case kDecimal:
		return decAdd(toDec(a), toDec(b))
	case kDouble:
		return toF(a) + toF(b)
	case kLong:
		x, y := toI64(a), toI64(b)
		s := x + y
		if (s > x) != (y > 0) {
			return float64(x) + float64(y)
		}
		return s
	}
	return intResult(toI64(a) + toI64(b))
}

func numSub(a, b any) any {
	ka, _ := kindOf(a)
	kb, _ := kindOf(b)
	switch max(ka, kb) {
	case kDecimal:
		return decAdd(toDec(a), decNeg(toDec(b)))
	case kDouble:
		return toF(a) - toF(b)
	case kLong:
		x, y := toI64(a), toI64(b)
		s := x - y
		if (s < x) != (y > 0) {
			return float64(x) - float64(y)
		}
		return s
	}
	return intResult(toI64(a) - toI64(b))
}

func numMul(a, b any) any {
	ka, _ := kindOf(a)
	kb, _ := kindOf(b)
	switch max(ka, kb) {
	case kDecimal:
		return decMul(toDec(a), toDec(b))
	case kDouble:
		return toF(a) * toF(b)
	case kLong:
		x, y := toI64(a), toI64(b)
		if x == 0 || y == 0 {
			return int64(0)
		}
		p := x * y
		if p/y != x || (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) {
			return float64(x) * float64(y)
		}
		return p
	}
	p := toI64(a) * toI64(b)
	return intResult(p)
}

func isZeroNum(v any) bool {
	switch x := v.(type) {
	case int32:
		return x == 0
	case int64:
		return x == 0
	case float64:
		return x == 0
	case bson.Decimal128:
		return x.IsZero()
	}
	return false
}

func isNaNNum(v any) bool {
	switch x := v.(type) {
	case float64:
		return math.IsNaN(x)
	case bson.Decimal128:
		return x.IsNaN()
	}
	return false
}

package pipeline

import (
	"math"
	"math/big"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$add"] = parseAdd
	operators["$subtract"] = parseSubtract
	operators["$multiply"] = parseMultiply
	operators["$divide"] = parseDivide
	operators["$mod"] = parseMod
	operators["$abs"] = unaryNum(numAbs)
	operators["$ceil"] = unaryNum(func(v any) (any, error) { return roundNum(v, 0, roundCeil), nil })
	operators["$floor"] = unaryNum(func(v any) (any, error) { return roundNum(v, 0, roundFloor), nil })
	operators["$round"] = parseRound(roundHalfEven)
	operators["$trunc"] = parseRound(roundTrunc)
	operators["$sqrt"] = unaryNum(func(v any) (any, error) {
		if cmpValues(v, int32(0)) < 0 && !isNaNNum(v) {
			return nil, errf(28714, "$sqrt's argument must be greater than or equal to 0")
		}
		return floatOrDec(v, math.Sqrt(toF(v))), nil
	})
	operators["$exp"] = unaryNum(func(v any) (any, error) { return floatOrDec(v, math.Exp(toF(v))), nil })
	operators["$ln"] = unaryNum(func(v any) (any, error) {
		if toF(v) <= 0 {
			return nil, errf(28766, "$ln's argument must be a positive number, but is %s", render(v))
		}
		return floatOrDec(v, math.Log(toF(v))), nil
	})
	operators["$log10"] = unaryNum(func(v any) (any, error) {
		if toF(v) <= 0 {
			return nil, errf(28761, "$log10's argument must be a positive number, but is %s", render(v))
		}
		return floatOrDec(v, math.Log10(toF(v))), nil
	})
	operators["$pow"] = parsePow
	operators["$sum"] = parseArrayAccumulator(func() accumulator { return &sumAcc{} })
	operators["$avg"] = parseArrayAccumulator(func() accumulator { return &avgAcc{} })
	operators["$min"] = parseArrayAccumulator(func() accumulator { return &minMaxAcc{sign: -1} })
	operators["$max"] = parseArrayAccumulator(func() accumulator { return &minMaxAcc{sign: 1} })
	operators["$stdDevPop"] = parseArrayAccumulator(func() accumulator { return &stdDevAcc{} })
	operators["$stdDevSamp"] = parseArrayAccumulator(func() accumulator { return &stdDevAcc{sample: true} })
}

// floatOrDec returns f, as a decimal when the input was a decimal.
func floatOrDec(in any, f float64) any {
	if _, ok := in.(bson.Decimal128); ok {
		return toDec(f)
	}
	return f
}

func parseAdd(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		var total any = int32(0)
		var date *bson.DateTime
		for _, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			switch x := v.(type) {
			case bson.DateTime:
				if date != nil {
					return nil, errf(16612, "only one date allowed in an $add expression")
				}
				date = &x
			default:
				if isNullish(v) {
					return nil, nil
				}
				if !isNum(v) {
					return nil, errf(16554, "$add only supports numeric or date types, not %s", typeName(v))
				}
				total = numAdd(total, v)
			}
		}
		if date != nil {
			ms, err := millisOf(total)
			if err != nil {
				return nil, err
			}
			return bson.DateTime(int64(*date) + ms), nil
		}
		return total, nil
	}, nil
}

// millisOf converts a number to whole milliseconds for date arithmetic.
func millisOf(v any) (int64, error) {
	switch x := v.(type) {
	case int32, int64:
		return toI64(x), nil
	}
	f := math.Round(toF(v))
	if math.IsNaN(f) || f >= math.MaxInt64 || f < math.MinInt64 {
		return 0, errf(codeOverflow, "date overflow in $add")
	}
	return int64(f), nil
}

var parseSubtract = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	a, b := vs[0], vs[1]
	if isNum(a) && isNum(b) {
		return numSub(a, b), nil
	}
	if da, ok := a.(bson.DateTime); ok {
		switch y := b.(type) {
		case bson.DateTime:
			return int64(da) - int64(y), nil
		default:
			if isNum(b) {
				ms, err := millisOf(b)
				if err != nil {
					return nil, err
				}
				return bson.DateTime(int64(da) - ms), nil
			}
		}
	}
	return nil, errf(16556, "cant $subtract %s from %s", typeName(b), typeName(a))
})

func parseMultiply(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		var prod any = int32(1)
		for _, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			if !isNum(v) {
				return nil, errf(16555, "$multiply only supports numeric types, not %s", typeName(v))
			}
			prod = numMul(prod, v)
		}
		return prod, nil
	}, nil
}

var parseDivide = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	a, b := vs[0], vs[1]
	if !isNum(a) || !isNum(b) {
		return nil, errf(16609, "$divide only supports numeric types, not %s and %s", typeName(a), typeName(b))
	}
	if isZeroNum(b) {
		return nil, errf(16608, "can't $divide by zero")
	}
	_, da := a.(bson.Decimal128)
	_, db := b.(bson.Decimal128)
	if da || db {
		return decDiv(toDec(a), toDec(b)), nil
	}
	return toF(a) / toF(b), nil
})

var parseMod = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	a, b := vs[0], vs[1]
	if !isNum(a) || !isNum(b) {
		return nil, errf(16611, "$mod only supports numeric types, not %s and %s", typeName(a), typeName(b))
	}
	if isZeroNum(b) {
		return nil, errf(16610, "can't $mod by zero")
	}
	ka, _ := kindOf(a)
	kb, _ := kindOf(b)
	switch max(ka, kb) {
	case kDecimal:
		return toDec(math.Mod(toF(a), toF(b))), nil
	case kDouble:
		return math.Mod(toF(a), toF(b)), nil
	case kLong:
		return toI64(a) % toI64(b), nil
	}
	return int32(toI64(a) % toI64(b)), nil
})

// unaryNullish builds a one-argument operator that answers null for a null
// or missing argument and f(v) otherwise.
func unaryNullish(f func(v any) (any, error)) opParser {
	return nullishArgs(1, 1, func(_ string, vs []any) (any, error) { return f(vs[0]) })
}

// evaluatedArgs builds an operator of min to max arguments: every argument
// is evaluated and f sees the values.
func evaluatedArgs(min, max int, f func(name string, vs []any) (any, error)) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.nargs(name, arg, min, max)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			vs, err := evalAll(c, fns)
			if err != nil {
				return nil, err
			}
			return f(name, vs)
		}, nil
	}
}

// nullishArgs is evaluatedArgs where null or missing in any argument gives
// null, and f sees the values otherwise.
func nullishArgs(min, max int, f func(name string, vs []any) (any, error)) opParser {
	return evaluatedArgs(min, max, func(name string, vs []any) (any, error) {
		for _, v := range vs {
			if isNullish(v) {
				return nil, nil
			}
		}
		return f(name, vs)
	})
}

// unaryNum builds a one-argument numeric operator: null in, null out;
// non-numbers fail naming the operator.
func unaryNum(f func(v any) (any, error)) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		return unaryNullish(func(v any) (any, error) {
			if !isNum(v) {
				return nil, errf(28765, "%s only supports numeric types, not %s", name, typeName(v))
			}
			return f(v)
		})(p, name, arg)
	}
}

func numAbs(v any) (any, error) {
	switch x := v.(type) {
	case int32:
		if x == math.MinInt32 {
			return -int64(x), nil
		}
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case int64:
		if x == math.MinInt64 {
			return nil, errf(28680, "can't take $abs of long long min")
		}
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case float64:
		return math.Abs(x), nil
	case bson.Decimal128:
		if decCmpZero(x) < 0 {
			return decNeg(x), nil
		}
		return x, nil
	}
	return v, nil
}

type roundMode int

const (
	roundHalfEven roundMode = iota
	roundTrunc
	roundFloor
	roundCeil
)

// roundCoef rounds coef*10^exp to 10^-place according to mode.
func roundCoef(coef *big.Int, exp, place int, mode roundMode) (*big.Int, int) {
	if exp >= -place {
		return coef, exp
	}
	drop := -place - exp
	q, r := new(big.Int).QuoRem(coef, pow10(drop), new(big.Int))
	if r.Sign() != 0 {
		neg := coef.Sign() < 0
		up := false // away from zero
		switch mode {
		case roundHalfEven:
			half := new(big.Int).Mul(big.NewInt(5), pow10(drop-1))
			c := new(big.Int).Abs(r).Cmp(half)
			up = c > 0 || (c == 0 && q.Bit(0) == 1)
		case roundFloor:
			up = neg
		case roundCeil:
			up = !neg
		}
		if up {
			if neg {
				q.Sub(q, big.NewInt(1))
			} else {
				q.Add(q, big.NewInt(1))
			}
		}
	}
	return q, -place
}

// roundNum rounds a number to place decimal digits, keeping its type.
func roundNum(v any, place int, mode roundMode) any {
	switch x := v.(type) {
	case int32, int64:
		if place >= 0 {
			return x
		}
		q, e := roundCoef(big.NewInt(toI64(x)), 0, place, mode)
		q.Mul(q, pow10(e))
		if !q.IsInt64() {
			f, _ := new(big.Float).SetInt(q).Float64()
			return f
		}
		if _, ok := x.(int32); ok {
			return intResult(q.Int64())
		}
		return q.Int64()
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return x
		}
		if place == 0 {
			switch mode {
			case roundFloor:
				return math.Floor(x)
			case roundCeil:
				return math.Ceil(x)
			case roundTrunc:
				return math.Trunc(x)
			}
		}
		d := toDec(x)
		parts := decParts(d)
		q, e := roundCoef(parts.coef, parts.exp, place, mode)
		return toF(decFinish(q, e))
	case bson.Decimal128:
		if decSpecial(x) {
			return x
		}
		parts := decParts(x)
		q, e := roundCoef(parts.coef, parts.exp, place, mode)
		return decFinish(q, e)
	}
	return v
}

func parseRound(mode roundMode) opParser {
	return evaluatedArgs(1, 2, func(name string, vs []any) (any, error) {
		place := 0
		if len(vs) == 2 {
			if isNullish(vs[1]) {
				return nil, nil
			}
			n, ok := wholeNumber(vs[1])
			if !ok || n < -20 || n > 100 {
				return nil, errf(51083, "cannot apply %s with precision value %s value must be in [-20, 100]", name, render(vs[1]))
			}
			place = int(n)
		}
		if isNullish(vs[0]) {
			return nil, nil
		}
		if !isNum(vs[0]) {
			return nil, errf(51081, "%s only supports numeric types, not %s", name, typeName(vs[0]))
		}
		return roundNum(vs[0], place, mode), nil
	})
}

// wholeNumber returns v as an int64 when it is a number with no fraction.
func wholeNumber(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case float64:
		if x != math.Trunc(x) || math.IsNaN(x) || math.IsInf(x, 0) || x >= math.MaxInt64 || x < math.MinInt64 {
			return 0, false
		}
		return int64(x), true
	case bson.Decimal128:
		return wholeNumber(toF(x))
	}
	return 0, false
}

var parsePow = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	b, e := vs[0], vs[1]
	if !isNum(b) || !isNum(e) {
		return nil, errf(28762, "$pow's base and exponent must be numeric, found %s and %s", typeName(b), typeName(e))
	}
	if isZeroNum(b) && cmpValues(e, int32(0)) < 0 {
		return nil, errf(28764, "$pow cannot take a base of 0 and a negative exponent")
	}
	kb, _ := kindOf(b)
	ke, _ := kindOf(e)
	k := max(kb, ke)
	if k <= kLong && toI64(e) >= 0 && (toI64(e) <= 64 || toI64(b) >= -1 && toI64(b) <= 1) {
		r := new(big.Int).Exp(big.NewInt(toI64(b)), big.NewInt(toI64(e)), nil)
		if r.IsInt64() {
			if k == kInt {
				return intResult(r.Int64()), nil
			}
			return r.Int64(), nil
		}
	}
	f := math.Pow(toF(b), toF(e))
	if k == kDecimal {
		return toDec(f), nil
	}
	return f, nil
})

// parseArrayAccumulator is the expression form of $sum, $avg, $min, $max:
// one argument that is an array folds its elements; otherwise the
// arguments themselves are folded.
func parseArrayAccumulator(mk func() accumulator) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.args(arg)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			acc := mk()
			if len(fns) == 1 {
				v, err := fns[0](c)
				if err != nil {
					return nil, err
				}
				if arr, ok := asArray(v); ok {
					for _, e := range arr {
						if err := acc.add(e); err != nil {
							return nil, err
						}
					}
				} else if err := acc.add(v); err != nil {
					return nil, err
				}
				return acc.result(), nil
			}
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
}

package pipeline

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$concat"] = parseConcat
	operators["$toLower"] = parseCase(strings.ToLower)
	operators["$toUpper"] = parseCase(strings.ToUpper)
	operators["$substr"] = parseSubstr(false)
	operators["$substrBytes"] = parseSubstr(false)
	operators["$substrCP"] = parseSubstr(true)
	operators["$strLenBytes"] = parseStrLen(false)
	operators["$strLenCP"] = parseStrLen(true)
	operators["$split"] = parseSplit
	operators["$trim"] = parseTrim(true, true)
	operators["$ltrim"] = parseTrim(true, false)
	operators["$rtrim"] = parseTrim(false, true)
	operators["$strcasecmp"] = parseStrcasecmp
	operators["$indexOfBytes"] = parseIndexOf(false)
	operators["$indexOfCP"] = parseIndexOf(true)
}

func parseConcat(p *parser, name string, arg any) (evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		var b strings.Builder
		for _, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			s, ok := v.(string)
			if !ok {
				return nil, errf(16702, "$concat only supports strings, not %s", typeName(v))
			}
			b.WriteString(s)
		}
		return b.String(), nil
	}, nil
}

// coerceToString is MongoDB's string coercion for string operators:
// null becomes "", numbers, dates and timestamps are formatted.
func coerceToString(name string, v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bson.Symbol:
		return string(x), nil
	case int32, int64, float64, bson.Decimal128:
		return numberString(x), nil
	case bson.DateTime:
		return formatISODate(x), nil
	case bson.Timestamp:
		return strconv.FormatUint(uint64(x.T), 10) + ":" + strconv.FormatUint(uint64(x.I), 10), nil
	case bson.JavaScript:
		return string(x), nil
	}
	if isNullish(v) {
		return "", nil
	}
	return "", errf(16007, "can't convert from BSON type %s to String", typeName(v))
}

func parseCase(f func(string) string) opParser {
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
			s, err := coerceToString(name, v)
			if err != nil {
				return nil, err
			}
			return f(s), nil
		}, nil
	}
}

func parseSubstr(codePoints bool) opParser {
	return evaluatedArgs(3, 3, func(name string, vs []any) (any, error) {
		s, err := coerceToString(name, vs[0])
		if err != nil {
			return nil, err
		}
		if !isNum(vs[1]) {
			return nil, errf(16034, "%s: starting index must be a numeric type (is BSON type %s)", name, typeName(vs[1]))
		}
		if !isNum(vs[2]) {
			return nil, errf(16035, "%s: length must be a numeric type (is BSON type %s)", name, typeName(vs[2]))
		}
		start, _ := wholeNumber(roundNum(vs[1], 0, roundTrunc))
		length, _ := wholeNumber(roundNum(vs[2], 0, roundTrunc))
		length = min(length, int64(len(s))) // no overflow in start+length
		if codePoints {
			if start < 0 {
				return nil, errf(34455, "%s: starting index must be non-negative (got: %d)", name, start)
			}
			if length < 0 {
				return nil, errf(34456, "%s: length must be non-negative (got: %d)", name, length)
			}
			r := []rune(s)
			if start >= int64(len(r)) {
				return "", nil
			}
			end := min(start+length, int64(len(r)))
			return string(r[start:end]), nil
		}
		if start < 0 || start >= int64(len(s)) {
			return "", nil
		}
		if !utf8.RuneStart(s[start]) {
			return nil, errf(28656, "%s: Invalid range, starting index is a UTF-8 continuation byte.", name)
		}
		end := int64(len(s))
		if length >= 0 && start+length < end {
			end = start + length
			if end < int64(len(s)) && !utf8.RuneStart(s[end]) {
				return nil, errf(28657, "%s: Invalid range, ending index is in the middle of a UTF-8 character.", name)
			}
		}
		return s[start:end], nil
	})
}

func parseStrLen(codePoints bool) opParser {
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
			s, ok := v.(string)
			if !ok {
				return nil, errf(34471, "%s requires a string argument, found: %s", name, typeName(v))
			}
			if codePoints {
				return int32(utf8.RuneCountInString(s)), nil
			}
			return int32(len(s)), nil
		}, nil
	}
}

var parseSplit = nullishArgs(2, 2, func(_ string, vs []any) (any, error) {
	s, ok := vs[0].(string)
	if !ok {
		return nil, errf(40085, "$split requires an expression that evaluates to a string as a first argument, found: %s", typeName(vs[0]))
	}
	sep, ok := vs[1].(string)
	if !ok {
		return nil, errf(40086, "$split requires an expression that evaluates to a string as a second argument, found: %s", typeName(vs[1]))
	}
	if sep == "" {
		return nil, errf(40087, "$split requires a non-empty separator")
	}
	parts := strings.Split(s, sep)
	out := make(bson.A, len(parts))
	for i, part := range parts {
		out[i] = part
	}
	return out, nil
})

// defaultTrimChars are the characters $trim removes by default: the null
// character and Unicode whitespace MongoDB lists.
const defaultTrimChars = "\x00 \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"

// trimArgs are the named arguments of $trim, $ltrim and $rtrim.
var trimArgs = &argSpec{
	allowed:  []string{"input", "chars"},
	required: []string{"input"},
	compile:  []string{"input", "chars"},
}

func parseTrim(left, right bool) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		args, err := p.namedArgs(name, arg, trimArgs)
		if err != nil {
			return nil, err
		}
		input, chars := args["input"], args["chars"]
		return func(c *ctx) (any, error) {
			v, err := input(c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			s, ok := v.(string)
			if !ok {
				return nil, errf(50699, "%s requires its input to be a string, got %s (of type %s) instead.", name, render(v), typeName(v))
			}
			cut := defaultTrimChars
			if chars != nil {
				cv, err := chars(c)
				if err != nil {
					return nil, err
				}
				if isNullish(cv) {
					return nil, nil
				}
				cs, ok := cv.(string)
				if !ok {
					return nil, errf(50700, "%s requires 'chars' to be a string, got %s (of type %s) instead.", name, render(cv), typeName(cv))
				}
				cut = cs
			}
			if left {
				s = strings.TrimLeft(s, cut)
			}
			if right {
				s = strings.TrimRight(s, cut)
			}
			return s, nil
		}, nil
	}
}

func parseStrcasecmp(p *parser, name string, arg any) (evalFn, error) {
	return evaluatedArgs(2, 2, func(name string, vs []any) (any, error) {
		a, err := coerceToString(name, vs[0])
		if err != nil {
			return nil, err
		}
		b, err := coerceToString(name, vs[1])
		if err != nil {
			return nil, err
		}
		return int32(strings.Compare(strings.ToUpper(a), strings.ToUpper(b))), nil
	})(p, name, arg)
}

func parseIndexOf(codePoints bool) opParser {
	return evaluatedArgs(2, 4, func(name string, vs []any) (any, error) {
		if isNullish(vs[0]) {
			return nil, nil
		}
		s, ok := vs[0].(string)
		if !ok {
			return nil, errf(40091, "%s requires a string as the first argument, found: %s", name, typeName(vs[0]))
		}
		sub, ok := vs[1].(string)
		if !ok {
			return nil, errf(40092, "%s requires a string as the second argument, found: %s", name, typeName(vs[1]))
		}
		var units []string // code points, or bytes as one-byte strings
		if codePoints {
			for _, r := range s {
				units = append(units, string(r))
			}
		}
		n := int64(len(s))
		if codePoints {
			n = int64(len(units))
		}
		start, end := int64(0), n
		if len(vs) > 2 {
			v, ok := wholeNumber(vs[2])
			if !ok || v < 0 {
				return nil, errf(40097, "%s requires a nonnegative integral starting index, found: %s", name, render(vs[2]))
			}
			start = v
		}
		if len(vs) > 3 {
			v, ok := wholeNumber(vs[3])
			if !ok || v < 0 {
				return nil, errf(40097, "%s requires a nonnegative integral ending index, found: %s", name, render(vs[3]))
			}
			end = min(v, n)
		}
		if start > end || start > n {
			return int32(-1), nil
		}
		if codePoints {
			hay := strings.Join(units[start:end], "")
			i := strings.Index(hay, sub)
			if i < 0 {
				return int32(-1), nil
			}
			return int32(start) + int32(utf8.RuneCountInString(hay[:i])), nil
		}
		i := strings.Index(s[start:end], sub)
		if i < 0 {
			return int32(-1), nil
		}
		return int32(start) + int32(i), nil
	})
}

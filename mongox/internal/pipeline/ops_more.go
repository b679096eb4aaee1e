package pipeline

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$setUnion"] = parseSetOp(setUnion)
	operators["$setIntersection"] = parseSetOp(setIntersection)
	operators["$setDifference"] = parseSetOp(setDifference)
	operators["$setEquals"] = parseSetOp(setEquals)
	operators["$setIsSubset"] = parseSetOp(setIsSubset)
	operators["$allElementsTrue"] = parseElementsTrue(true)
	operators["$anyElementTrue"] = parseElementsTrue(false)
	operators["$regexMatch"] = parseRegexMatch
	operators["$dateFromString"] = parseDateFromString
	operators["$dateAdd"] = parseDateAdd(1)
	operators["$dateSubtract"] = parseDateAdd(-1)
	operators["$rand"] = func(p *parser, name string, arg any) (evalFn, error) {
		if d, ok := arg.(bson.D); !ok || len(d) != 0 {
			return nil, errf(10065, "invalid parameter: expected an object ($rand)")
		}
		return func(*ctx) (any, error) { return rand.Float64(), nil }, nil
	}
	for _, op := range []string{
		"$dateDiff", "$dateTrunc", "$dateFromParts", "$dateToParts", "$regexFind", "$regexFindAll",
		"$replaceOne", "$replaceAll", "$zip", "$sortArray", "$firstN", "$lastN", "$maxN", "$minN",
		"$top", "$bottom", "$topN", "$bottomN", "$function", "$accumulator", "$meta",
		"$binarySize", "$bsonSize", "$toHashedIndexKey", "$median",
		"$percentile", "$sin", "$cos", "$tan", "$asin", "$acos", "$atan", "$atan2", "$sinh", "$cosh",
		"$tanh", "$asinh", "$acosh", "$atanh", "$degreesToRadians", "$radiansToDegrees", "$log",
		"$bitAnd", "$bitOr", "$bitXor", "$bitNot", "$tsSecond", "$tsIncrement", "$toUUID",
	} {
		if _, ok := operators[op]; !ok {
			operators[op] = notImplementedOp
		}
	}
}

func notImplementedOp(p *parser, name string, arg any) (evalFn, error) {
	return nil, errf(codeNotImplemented, "expression operator %s is not supported by the embedded MongoDB server", name)
}

func parseSetOp(f func(name string, sets []bson.A) (any, error)) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.args(arg)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			vs, err := evalAll(c, fns)
			if err != nil {
				return nil, err
			}
			sets := make([]bson.A, len(vs))
			for i, v := range vs {
				if isNullish(v) {
					if name == "$setEquals" || name == "$setIsSubset" {
						return nil, errf(17044, "All operands of %s must be arrays. One argument is of type: %s", name, typeName(v))
					}
					return nil, nil
				}
				arr, ok := asArray(v)
				if !ok {
					return nil, errf(17044, "All operands of %s must be arrays. One argument is of type: %s", name, typeName(v))
				}
				sets[i] = arr
			}
			return f(name, sets)
		}, nil
	}
}

func keySet(a bson.A) map[string]bool {
	m := make(map[string]bool, len(a))
	for _, e := range a {
		m[bsonkit.Key(e)] = true
	}
	return m
}

func setUnion(_ string, sets []bson.A) (any, error) {
	seen := map[string]bool{}
	out := bson.A{}
	for _, s := range sets {
		for _, e := range s {
			if k := bsonkit.Key(e); !seen[k] {
				seen[k] = true
				out = append(out, e)
			}
		}
	}
	return out, nil
}

func setIntersection(_ string, sets []bson.A) (any, error) {
	out := bson.A{}
	if len(sets) == 0 {
		return out, nil
	}
	others := make([]map[string]bool, len(sets)-1)
	for i, s := range sets[1:] {
		others[i] = keySet(s)
	}
	seen := map[string]bool{}
	for _, e := range sets[0] {
		k := bsonkit.Key(e)
		if seen[k] {
			continue
		}
		seen[k] = true
		all := true
		for _, o := range others {
			all = all && o[k]
		}
		if all {
			out = append(out, e)
		}
	}
	return out, nil
}

func setDifference(name string, sets []bson.A) (any, error) {
	if len(sets) != 2 {
		return nil, errf(16020, "Expression %s takes exactly 2 arguments. %d were passed in.", name, len(sets))
	}
	other := keySet(sets[1])
	seen := map[string]bool{}
	out := bson.A{}
	for _, e := range sets[0] {
		k := bsonkit.Key(e)
		if !other[k] && !seen[k] {
			seen[k] = true
			out = append(out, e)
		}
	}
	return out, nil
}

func setEquals(name string, sets []bson.A) (any, error) {
	if len(sets) < 2 {
		return nil, errf(17045, "$setEquals needs at least two arguments had: %d", len(sets))
	}
	first := keySet(sets[0])
	for _, s := range sets[1:] {
		o := keySet(s)
		if len(o) != len(first) {
			return false, nil
		}
		for k := range o {
			if !first[k] {
				return false, nil
			}
		}
	}
	return true, nil
}

func setIsSubset(name string, sets []bson.A) (any, error) {
	if len(sets) != 2 {
		return nil, errf(16020, "Expression %s takes exactly 2 arguments. %d were passed in.", name, len(sets))
	}
	super := keySet(sets[1])
	for _, e := range sets[0] {
		if !super[bsonkit.Key(e)] {
			return false, nil
		}
	}
	return true, nil
}

func parseElementsTrue(all bool) opParser {
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
			arr, ok := asArray(v)
			if !ok {
				return nil, errf(17040, "%s's argument must be an array, but is %s", name, typeName(v))
			}
			for _, e := range arr {
				if truthy(e) != all {
					return !all, nil
				}
			}
			return all, nil
		}, nil
	}
}

// compileRegex translates a MongoDB (PCRE) pattern and options to Go's
// regexp; patterns RE2 cannot express fail with a clear error.
func compileRegex(pattern, options string) (*regexp.Regexp, error) {
	flags := ""
	for _, o := range options {
		switch o {
		case 'i', 'm', 's':
			flags += string(o)
		case 'x':
			// Extended mode: drop unescaped whitespace and # comments.
			pattern = stripExtended(pattern)
		case 'u':
		default:
			return nil, errf(51108, "$regexMatch invalid flag in regex options: %c", o)
		}
	}
	if flags != "" {
		pattern = "(?" + flags + ")" + pattern
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, errf(51111, "Invalid Regex in $regexMatch: %v", err)
	}
	return re, nil
}

func stripExtended(p string) string {
	var b strings.Builder
	inClass, comment := false, false
	for i := 0; i < len(p); i++ {
		ch := p[i]
		switch {
		case comment:
			if ch == '\n' {
				comment = false
			}
		case ch == '\\' && i+1 < len(p):
			b.WriteByte(ch)
			i++
			b.WriteByte(p[i])
		case ch == '[':
			inClass = true
			b.WriteByte(ch)
		case ch == ']':
			inClass = false
			b.WriteByte(ch)
		case !inClass && (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'):
		case !inClass && ch == '#':
			comment = true
		default:
			b.WriteByte(ch)
		}
	}
	return b.String()
}

func parseRegexMatch(p *parser, name string, arg any) (evalFn, error) {
	m, err := p.objArgs(name, arg, []string{"input", "regex", "options"}, "input", "regex")
	if err != nil {
		return nil, err
	}
	input, err := p.parse(m["input"])
	if err != nil {
		return nil, err
	}
	regex, err := p.parse(m["regex"])
	if err != nil {
		return nil, err
	}
	options, err := p.optional(m, "options")
	if err != nil {
		return nil, err
	}
	return func(c *ctx) (any, error) {
		in, err := input(c)
		if err != nil {
			return nil, err
		}
		rv, err := regex(c)
		if err != nil {
			return nil, err
		}
		var pattern, opts string
		switch x := rv.(type) {
		case string:
			pattern = x
		case bson.Regex:
			pattern, opts = x.Pattern, x.Options
		default:
			if isNullish(rv) {
				return false, nil
			}
			return nil, errf(51105, "$regexMatch needs 'regex' to be of type string or regex")
		}
		if options != nil {
			ov, err := options(c)
			if err != nil {
				return nil, err
			}
			if s, ok := ov.(string); ok {
				if opts != "" && s != "" {
					return nil, errf(51107, "$regexMatch found regex option(s) specified in both 'regex' and 'option' fields")
				}
				opts += s
			} else if !isNullish(ov) {
				return nil, errf(51106, "$regexMatch needs 'options' to be of type string")
			}
		}
		if isNullish(in) {
			return false, nil
		}
		s, ok := in.(string)
		if !ok {
			return nil, errf(51104, "$regexMatch needs 'input' to be of type string")
		}
		re, err := compileRegex(pattern, opts)
		if err != nil {
			return nil, err
		}
		return re.MatchString(s), nil
	}, nil
}

// dateFromStringArgs are the named arguments of $dateFromString.
var dateFromStringArgs = &argSpec{
	allowed:  []string{"dateString", "format", "timezone", "onError", "onNull"},
	required: []string{"dateString"},
	refused:  map[string]string{"format": "$dateFromString: the 'format' option is not supported by the embedded MongoDB server"},
	compile:  []string{"dateString", "timezone", "onError", "onNull"},
}

func parseDateFromString(p *parser, name string, arg any) (evalFn, error) {
	args, err := p.namedArgs(name, arg, dateFromStringArgs)
	if err != nil {
		return nil, err
	}
	input, tzFn, onError, onNull := args["dateString"], args["timezone"], args["onError"], args["onNull"]
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			if onNull != nil {
				return onNull(c)
			}
			return nil, nil
		}
		s, ok := v.(string)
		if !ok {
			if onError != nil {
				return onError(c)
			}
			return nil, errf(codeConversionFailure, "$dateFromString requires that 'dateString' be a string, found: %s with value %s", typeName(v), render(v))
		}
		loc := time.UTC
		if tzFn != nil {
			tz, err := tzFn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(tz) {
				return nil, nil
			}
			if loc, err = parseTimezone(tz); err != nil {
				return nil, err
			}
		}
		t, err := parseDateStringIn(s, loc)
		if err != nil {
			if onError != nil {
				return onError(c)
			}
			return nil, errf(codeConversionFailure, "Error parsing date string '%s'", s)
		}
		return bson.NewDateTimeFromTime(t), nil
	}, nil
}

// parseDateStringIn parses a date string; strings without a zone are in loc.
func parseDateStringIn(s string, loc *time.Location) (time.Time, error) {
	for _, l := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999Z0700"} {
		if t, err := time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	var err error
	for _, l := range []string{"2006-01-02T15:04:05.999999999", "2006-01-02T15:04", "2006-01-02 15:04:05.999999999", "2006-01-02"} {
		var t time.Time
		if t, err = time.ParseInLocation(l, s, loc); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// dateAddArgs are the named arguments of $dateAdd and $dateSubtract.
var dateAddArgs = &argSpec{
	allowed:  []string{"startDate", "unit", "amount", "timezone"},
	required: []string{"startDate", "unit", "amount"},
	compile:  []string{"startDate", "unit", "amount", "timezone"},
}

func parseDateAdd(sign int) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		args, err := p.namedArgs(name, arg, dateAddArgs)
		if err != nil {
			return nil, err
		}
		start, unit, amount, tzFn := args["startDate"], args["unit"], args["amount"], args["timezone"]
		return func(c *ctx) (any, error) {
			sv, err := start(c)
			if err != nil {
				return nil, err
			}
			uv, err := unit(c)
			if err != nil {
				return nil, err
			}
			av, err := amount(c)
			if err != nil {
				return nil, err
			}
			if isNullish(sv) || isNullish(uv) || isNullish(av) {
				return nil, nil
			}
			t, err := toTime(name, sv)
			if err != nil {
				return nil, err
			}
			n, ok := wholeNumber(av)
			if !ok {
				return nil, errf(5166405, "%s expects integer amount of time units", name)
			}
			n *= int64(sign)
			if tzFn != nil {
				tz, err := tzFn(c)
				if err != nil {
					return nil, err
				}
				if !isNullish(tz) {
					loc, err := parseTimezone(tz)
					if err != nil {
						return nil, err
					}
					t = t.In(loc)
				}
			}
			u, _ := uv.(string)
			switch u {
			case "year":
				t = t.AddDate(int(n), 0, 0)
			case "quarter":
				t = t.AddDate(0, 3*int(n), 0)
			case "month":
				t = t.AddDate(0, int(n), 0)
			case "week":
				t = t.AddDate(0, 0, 7*int(n))
			case "day":
				t = t.AddDate(0, 0, int(n))
			case "hour":
				t = t.Add(time.Duration(n) * time.Hour)
			case "minute":
				t = t.Add(time.Duration(n) * time.Minute)
			case "second":
				t = t.Add(time.Duration(n) * time.Second)
			case "millisecond":
				t = t.Add(time.Duration(n) * time.Millisecond)
			default:
				return nil, errf(codeFailedToParse, "%s: unknown time unit value: %s", name, render(uv))
			}
			return bson.NewDateTimeFromTime(t), nil
		}, nil
	}
}

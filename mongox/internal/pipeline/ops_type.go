package pipeline

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	operators["$type"] = func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.nargs(name, arg, 1, 1)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			v, err := fns[0](c)
			if err != nil {
				return nil, err
			}
			return typeName(v), nil
		}, nil
	}
	operators["$isNumber"] = func(p *parser, name string, arg any) (evalFn, error) {
		fns, err := p.nargs(name, arg, 1, 1)
		if err != nil {
			return nil, err
		}
		return func(c *ctx) (any, error) {
			v, err := fns[0](c)
			if err != nil {
				return nil, err
			}
			return isNum(v), nil
		}, nil
	}
	for op, target := range map[string]string{
		"$toString": "string", "$toInt": "int", "$toLong": "long", "$toDouble": "double",
		"$toDecimal": "decimal", "$toBool": "bool", "$toDate": "date", "$toObjectId": "objectId",
	} {
		operators[op] = parseToType(target)
	}
	operators["$convert"] = parseConvert
}

// numberString formats a number as MongoDB's $toString does.
func numberString(v any) string {
	switch x := v.(type) {
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		switch {
		case math.IsNaN(x):
			return "NaN"
		case math.IsInf(x, 1):
			return "Infinity"
		case math.IsInf(x, -1):
			return "-Infinity"
		}
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if x == math.Trunc(x) && math.Abs(x) < 1e15 {
			s = strconv.FormatFloat(x, 'f', -1, 64)
		}
		return s
	case bson.Decimal128:
		return x.String()
	}
	return ""
}

// formatISODate formats a date as ISO-8601 with milliseconds, in UTC.
func formatISODate(d bson.DateTime) string {
	return d.Time().UTC().Format("2006-01-02T15:04:05.000Z")
}

func parseToType(target string) opParser {
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
			if isNullish(v) {
				return nil, nil
			}
			return convertTo(v, target)
		}, nil
	}
}

// typeAliases maps $convert's numeric type codes to names.
var typeAliases = map[int64]string{
	1: "double", 2: "string", 7: "objectId", 8: "bool", 9: "date", 16: "int", 18: "long", 19: "decimal",
}

// convertArgs are the named arguments of $convert.
var convertArgs = &argSpec{
	allowed:  []string{"input", "to", "onError", "onNull", "format", "base", "byteOrder"},
	required: []string{"input", "to"},
	refused:  map[string]string{"format": "$convert: the 'format' option is not supported by the embedded server"},
	compile:  []string{"input", "to", "onError", "onNull"},
}

func parseConvert(p *parser, name string, arg any) (evalFn, error) {
	args, err := p.namedArgs(name, arg, convertArgs)
	if err != nil {
		return nil, err
	}
	input, to, onError, onNull := args["input"], args["to"], args["onError"], args["onNull"]
	return func(c *ctx) (any, error) {
		v, err := input(c)
		if err != nil {
			return nil, err
		}
		tv, err := to(c)
		if err != nil {
			return nil, err
		}
		if isNullish(tv) {
			return nil, nil
		}
		var target string
		switch t := tv.(type) {
		case string:
			target = t
		default:
			if n, ok := wholeNumber(t); ok {
				target = typeAliases[n]
			}
			if target == "" {
				if !isNum(t) {
					return nil, errf(50689, "$convert's 'to' argument must be a string or number, but is %s", typeName(tv))
				}
				return nil, errf(codeFailedToParse, "In $convert, numeric 'to' argument is not an integer")
			}
		}
		if isNullish(v) {
			if onNull != nil {
				return onNull(c)
			}
			return nil, nil
		}
		out, err := convertTo(v, target)
		if err != nil {
			if e, ok := err.(*mongoerr.Error); ok && e.Code == codeConversionFailure && onError != nil {
				return onError(c)
			}
			return nil, err
		}
		return out, nil
	}, nil
}

func convFail(v any, target string, detail string) error {
	msg := "Unsupported conversion from " + typeName(v) + " to " + target + " in $convert with no onError value"
	if detail != "" {
		msg = "Failed to parse " + target + " in $convert with no onError value: " + detail
	}
	return errf(codeConversionFailure, "%s", msg)
}

// convertTo implements $convert for non-null input.
func convertTo(v any, target string) (any, error) {
	switch target {
	case "double":
		switch x := v.(type) {
		case int32, int64, float64:
			return toF(x), nil
		case bson.Decimal128:
			f := toF(x)
			if math.IsInf(f, 0) && x.IsInf() == 0 {
				return nil, convFail(v, target, "Conversion would overflow target type")
			}
			return f, nil
		case bool:
			if x {
				return 1.0, nil
			}
			return 0.0, nil
		case bson.DateTime:
			return float64(x), nil
		case string:
			f, err := strconv.ParseFloat(x, 64)
			if err != nil || strings.TrimSpace(x) != x {
				return nil, convFail(v, target, "Failed to parse number '"+x+"'")
			}
			return f, nil
		}
	case "int", "long":
		bits := 32
		if target == "long" {
			bits = 64
		}
		var n int64
		switch x := v.(type) {
		case int32:
			n = int64(x)
		case int64:
			n = x
		case float64, bson.Decimal128:
			f := toF(x)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, convFail(v, target, "Attempt to convert NaN or infinity value to integer")
			}
			f = math.Trunc(f)
			if f >= math.Ldexp(1, bits-1) || f < -math.Ldexp(1, bits-1) {
				return nil, convFail(v, target, "Conversion would overflow target type")
			}
			n = int64(f)
		case bool:
			if x {
				n = 1
			}
		case bson.DateTime:
			if target == "int" {
				return nil, convFail(v, target, "")
			}
			n = int64(x)
		case string:
			i, err := strconv.ParseInt(x, 10, bits)
			if err != nil {
				if strings.Contains(err.Error(), "range") {
					return nil, convFail(v, target, "Overflow")
				}
				return nil, convFail(v, target, "Failed to parse number '"+x+"'")
			}
			n = i
		default:
			return nil, convFail(v, target, "")
		}
		if bits == 32 {
			if n > math.MaxInt32 || n < math.MinInt32 {
				return nil, convFail(v, target, "Conversion would overflow target type")
			}
			return int32(n), nil
		}
		return n, nil
	case "decimal":
		switch x := v.(type) {
		case int32, int64, float64, bson.Decimal128:
			return toDec(x), nil
		case bool:
			if x {
				return toDec(int32(1)), nil
			}
			return toDec(int32(0)), nil
		case bson.DateTime:
			return toDec(int64(x)), nil
		case string:
			d, err := bson.ParseDecimal128(x)
			if err != nil {
				return nil, convFail(v, target, "Failed to parse number '"+x+"'")
			}
			return d, nil
		}
	case "bool":
		switch x := v.(type) {
		case bool:
			return x, nil
		case int32, int64, float64, bson.Decimal128:
			return truthy(x), nil
		}
		return true, nil
	case "string":
		switch x := v.(type) {
		case bool:
			return strconv.FormatBool(x), nil
		case bson.ObjectID:
			return x.Hex(), nil
		case bson.DateTime:
			return formatISODate(x), nil
		case string, bson.Symbol, int32, int64, float64, bson.Decimal128, bson.JavaScript:
			return coerceToString("$convert", x)
		}
	case "date":
		switch x := v.(type) {
		case bson.DateTime:
			return x, nil
		case int64:
			return bson.DateTime(x), nil
		case float64, bson.Decimal128:
			f := toF(x)
			if math.IsNaN(f) || math.IsInf(f, 0) || f >= math.MaxInt64 || f < math.MinInt64 {
				return nil, convFail(v, target, "Conversion would overflow target type")
			}
			return bson.DateTime(int64(f)), nil
		case bson.ObjectID:
			return bson.NewDateTimeFromTime(x.Timestamp()), nil
		case bson.Timestamp:
			return bson.DateTime(int64(x.T) * 1000), nil
		case string:
			t, err := parseDateString(x)
			if err != nil {
				return nil, convFail(v, target, "Error parsing date string '"+x+"'")
			}
			return bson.NewDateTimeFromTime(t), nil
		}
	case "objectId":
		switch x := v.(type) {
		case bson.ObjectID:
			return x, nil
		case string:
			id, err := bson.ObjectIDFromHex(x)
			if err != nil {
				return nil, convFail(v, target, "Invalid string length for parsing to OID, expected 24 but found "+strconv.Itoa(len(x)))
			}
			return id, nil
		}
	default:
		return nil, errf(codeBadValue, "Unknown type name: %s", target)
	}
	return nil, convFail(v, target, "")
}

// parseDateString parses the ISO-8601 shapes MongoDB accepts most often.
func parseDateString(s string) (time.Time, error) {
	layouts := []string{
		time.RFC3339Nano,
		"2006-01-02T15:04:05.999999999Z0700",
		"2006-01-02T15:04:05.999999999",
		"2006-01-02T15:04:05Z07:00",
		"2006-01-02T15:04:05",
		"2006-01-02T15:04",
		"2006-01-02 15:04:05.999999999Z07:00",
		"2006-01-02 15:04:05.999999999",
		"2006-01-02",
	}
	var err error
	for _, l := range layouts {
		var t time.Time
		if t, err = time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

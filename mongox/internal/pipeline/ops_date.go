package pipeline

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func init() {
	parts := map[string]func(t time.Time) any{
		"$year":        func(t time.Time) any { return int32(t.Year()) },
		"$month":       func(t time.Time) any { return int32(t.Month()) },
		"$dayOfMonth":  func(t time.Time) any { return int32(t.Day()) },
		"$hour":        func(t time.Time) any { return int32(t.Hour()) },
		"$minute":      func(t time.Time) any { return int32(t.Minute()) },
		"$second":      func(t time.Time) any { return int32(t.Second()) },
		"$millisecond": func(t time.Time) any { return int32(t.Nanosecond() / 1e6) },
		"$dayOfWeek":   func(t time.Time) any { return int32(t.Weekday()) + 1 },
		"$dayOfYear":   func(t time.Time) any { return int32(t.YearDay()) },
		"$week":        func(t time.Time) any { return int32(weekOfYear(t)) },
		"$isoWeek":     func(t time.Time) any { _, w := t.ISOWeek(); return int32(w) },
		"$isoWeekYear": func(t time.Time) any { y, _ := t.ISOWeek(); return int64(y) },
		"$isoDayOfWeek": func(t time.Time) any {
			return int32((int(t.Weekday())+6)%7) + 1
		},
	}
	for name, f := range parts {
		operators[name] = parseDatePart(f)
	}
	operators["$dateToString"] = parseDateToString
}

// weekOfYear is %U: weeks start on Sunday; days before the first Sunday
// are week 0.
func weekOfYear(t time.Time) int {
	return (t.YearDay() + 6 - int(t.Weekday())) / 7
}

// toTime converts a date-like value (date, timestamp, ObjectID).
func toTime(name string, v any) (time.Time, error) {
	switch x := v.(type) {
	case bson.DateTime:
		return x.Time().UTC(), nil
	case bson.Timestamp:
		return time.Unix(int64(x.T), 0).UTC(), nil
	case bson.ObjectID:
		return x.Timestamp().UTC(), nil
	}
	return time.Time{}, errf(16006, "can't convert from BSON type %s to Date", typeName(v))
}

// parseTimezone reads an Olson name or a UTC offset (+hh, +hhmm, +hh:mm).
func parseTimezone(v any) (*time.Location, error) {
	s, ok := v.(string)
	if !ok {
		return nil, errf(40517, "timezone must evaluate to a string, found %s", typeName(v))
	}
	if s == "" || s == "UTC" || s == "GMT" || s == "Z" {
		return time.UTC, nil
	}
	if s[0] == '+' || s[0] == '-' {
		digits := strings.ReplaceAll(s[1:], ":", "")
		var h, m int
		var err error
		switch len(digits) {
		case 2:
			h, err = strconv.Atoi(digits)
		case 4:
			h, err = strconv.Atoi(digits[:2])
			if err == nil {
				m, err = strconv.Atoi(digits[2:])
			}
		default:
			err = fmt.Errorf("bad offset")
		}
		if err != nil {
			return nil, errf(40485, "unrecognized time zone identifier: \"%s\"", s)
		}
		off := h*3600 + m*60
		if s[0] == '-' {
			off = -off
		}
		return time.FixedZone(s, off), nil
	}
	loc, err := time.LoadLocation(s)
	if err != nil {
		return nil, errf(40485, "unrecognized time zone identifier: \"%s\"", s)
	}
	return loc, nil
}

func parseDatePart(f func(time.Time) any) opParser {
	return func(p *parser, name string, arg any) (evalFn, error) {
		var dateFn, tzFn evalFn
		if d, ok := arg.(bson.D); ok && len(d) > 0 && d[0].Key == "date" {
			m, err := p.objArgs(name, arg, []string{"date", "timezone"}, "date")
			if err != nil {
				return nil, err
			}
			if dateFn, err = p.parse(m["date"]); err != nil {
				return nil, err
			}
			if tzFn, err = p.optional(m, "timezone"); err != nil {
				return nil, err
			}
		} else {
			fns, err := p.nargs(name, arg, 1, 1)
			if err != nil {
				return nil, err
			}
			dateFn = fns[0]
		}
		return func(c *ctx) (any, error) {
			v, err := dateFn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(v) {
				return nil, nil
			}
			t, err := toTime(name, v)
			if err != nil {
				return nil, err
			}
			if tzFn != nil {
				tz, err := tzFn(c)
				if err != nil {
					return nil, err
				}
				if isNullish(tz) {
					return nil, nil
				}
				loc, err := parseTimezone(tz)
				if err != nil {
					return nil, err
				}
				t = t.In(loc)
			}
			return f(t), nil
		}, nil
	}
}

const defaultDateFormat = "%Y-%m-%dT%H:%M:%S.%LZ"

func parseDateToString(p *parser, name string, arg any) (evalFn, error) {
	m, err := p.objArgs(name, arg, []string{"date", "format", "timezone", "onNull"}, "date")
	if err != nil {
		return nil, err
	}
	dateFn, err := p.parse(m["date"])
	if err != nil {
		return nil, err
	}
	formatFn, err := p.optional(m, "format")
	if err != nil {
		return nil, err
	}
	tzFn, err := p.optional(m, "timezone")
	if err != nil {
		return nil, err
	}
	onNull, err := p.optional(m, "onNull")
	if err != nil {
		return nil, err
	}
	if f, ok := m["format"].(string); ok {
		if err := checkDateFormat(f); err != nil {
			return nil, err
		}
	}
	return func(c *ctx) (any, error) {
		format := defaultDateFormat
		if formatFn != nil {
			fv, err := formatFn(c)
			if err != nil {
				return nil, err
			}
			if isNullish(fv) {
				return nil, nil
			}
			s, ok := fv.(string)
			if !ok {
				return nil, errf(18533, "$dateToString requires that 'format' be a string, found: %s with value %s", typeName(fv), render(fv))
			}
			if err := checkDateFormat(s); err != nil {
				return nil, err
			}
			format = s
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
		v, err := dateFn(c)
		if err != nil {
			return nil, err
		}
		if isNullish(v) {
			if onNull != nil {
				return onNull(c)
			}
			return nil, nil
		}
		t, err := toTime(name, v)
		if err != nil {
			return nil, err
		}
		return formatDate(format, t.In(loc)), nil
	}, nil
}

func checkDateFormat(f string) error {
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			continue
		}
		if i+1 >= len(f) {
			return errf(18535, "Unmatched '%%' at end of format string")
		}
		i++
		if !strings.ContainsRune("dGHjLmMSuUVwYzZ%bB", rune(f[i])) {
			return errf(18536, "Invalid format character '%%%c' in format string", f[i])
		}
	}
	return nil
}

// formatDate expands the % specifiers of $dateToString.
func formatDate(f string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'G':
			y, _ := t.ISOWeek()
			fmt.Fprintf(&b, "%04d", y)
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'L':
			fmt.Fprintf(&b, "%03d", t.Nanosecond()/1e6)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'u':
			fmt.Fprintf(&b, "%d", (int(t.Weekday())+6)%7+1)
		case 'U':
			fmt.Fprintf(&b, "%02d", weekOfYear(t))
		case 'V':
			_, w := t.ISOWeek()
			fmt.Fprintf(&b, "%02d", w)
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday())+1)
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			_, off := t.Zone()
			fmt.Fprintf(&b, "%d", off/60)
		case 'b':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

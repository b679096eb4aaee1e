package query

import (
	"regexp"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// regexPred matches strings and symbols against a regular expression, and a
// stored regex value when pattern and options are identical.
type regexPred struct {
	re      *regexp.Regexp
	pattern string
	options string
}

func newRegexPred(pattern, options string) (*regexPred, error) {
	re, err := buildRegex(pattern, options)
	if err != nil {
		return nil, err
	}
	return &regexPred{re: re, pattern: pattern, options: options}, nil
}

func (p *regexPred) test(x any) bool {
	switch v := x.(type) {
	case string:
		return p.re.MatchString(v)
	case bson.Symbol:
		return p.re.MatchString(string(v))
	case bson.Regex:
		return v.Pattern == p.pattern && v.Options == p.options
	}
	return false
}

// regexFromOps builds the predicate of a {$regex, $options} pair.
func regexFromOps(rv, ov any, optSeen bool) (*regexPred, error) {
	var pattern, options string
	switch r := rv.(type) {
	case string:
		pattern = r
	case bson.Regex:
		pattern, options = r.Pattern, r.Options
	default:
		return nil, badValue("$regex has to be a string")
	}
	if optSeen {
		o, ok := ov.(string)
		if !ok {
			return nil, badValue("$options has to be a string")
		}
		if o != "" {
			if options != "" {
				return nil, badValue("options set in both $regex and $options")
			}
			options = o
		}
	}
	return newRegexPred(pattern, options)
}

// buildRegex compiles a MongoDB (PCRE) regex with options i, m, s, x and u
// into Go's RE2. Patterns using PCRE-only features (backreferences,
// lookaround) fail with MongoDB's invalid-regex code.
func buildRegex(pattern, options string) (*regexp.Regexp, error) {
	var flags strings.Builder
	extended := false
	for _, c := range options {
		switch c {
		case 'i', 'm', 's':
			if !strings.ContainsRune(flags.String(), c) {
				flags.WriteRune(c)
			}
		case 'x':
			extended = true
		case 'u':
		default:
			return nil, newErr(51108, "invalid flag in regex options: %c", c)
		}
	}
	if strings.IndexByte(pattern, 0) >= 0 {
		return nil, newErr(51091, "Regular expression is invalid: pattern contains a null byte")
	}
	if extended {
		pattern = stripExtended(pattern)
	}
	src := pattern
	if flags.Len() > 0 {
		src = "(?" + flags.String() + ")" + pattern
	}
	re, err := regexp.Compile(src)
	if err != nil {
		return nil, newErr(CodeInvalidRegex, "Regular expression is invalid: %v", err)
	}
	return re, nil
}

// stripExtended removes unescaped whitespace and #-comments outside
// character classes, which is what the x option means.
func stripExtended(p string) string {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			b.WriteByte(c)
			b.WriteByte(p[i+1])
			i++
		case inClass:
			if c == ']' {
				inClass = false
			}
			b.WriteByte(c)
		case c == '[':
			inClass = true
			b.WriteByte(c)
			// A ']' right after '[' or '[^' is literal.
			if i+1 < len(p) && p[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				b.WriteByte(']')
				i++
			}
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
		case c == '#':
			for i < len(p) && p[i] != '\n' {
				i++
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

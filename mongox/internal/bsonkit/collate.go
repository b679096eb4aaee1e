package bsonkit

import (
	"fmt"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"golang.org/x/text/collate"
	"golang.org/x/text/language"
)

// Collation is a parsed non-simple MongoDB collation: strings compare by
// the CLDR collation of a locale (golang.org/x/text/collate) at a strength.
// Callers compare collated values by mapping every string to its collation
// key with Value or Doc: keys compare byte-wise as the collation orders the
// strings, so the ordinary comparison (Compare, the query matcher, sorts)
// then follows the collation. Key strings are for comparison only, never
// for output. It is safe for concurrent use.
type Collation struct {
	spec bson.D
	mu   sync.Mutex
	c    *collate.Collator
	buf  collate.Buffer
}

// CollationError is a collation MongoDB rejects (code 2 BadValue) or one
// this server does not implement (code 238 NotImplemented).
type CollationError struct {
	Code int32
	Msg  string
}

func (e *CollationError) Error() string { return e.Msg }

// ParseCollation parses a collation document. It returns nil for the
// simple collation (absent, empty, or {locale: "simple"}). Supported:
// locale, strength 1-3, numericOrdering, and the defaults of caseLevel
// (false), caseFirst ("off"), alternate ("non-ignorable"), backwards
// (false) and normalization (false); other values fail naming the option.
func ParseCollation(d bson.D) (*Collation, error) {
	if len(d) == 0 {
		return nil, nil
	}
	var locale string
	strength := int64(3)
	var opts []collate.Option
	for _, e := range d {
		switch e.Key {
		case "locale":
			s, ok := e.Value.(string)
			if !ok {
				return nil, &CollationError{2, "collation locale must be a string"}
			}
			locale = s
		case "strength":
			n, ok := ToInt64(e.Value)
			if !ok || n < 1 || n > 5 {
				return nil, &CollationError{2, "collation strength must be an integer from 1 to 5"}
			}
			if n > 3 {
				return nil, &CollationError{238, fmt.Sprintf("mongofake: collation strength %d is not supported; use 1, 2 or 3", n)}
			}
			strength = n
		case "numericOrdering":
			b, ok := e.Value.(bool)
			if !ok {
				return nil, &CollationError{2, "collation numericOrdering must be a bool"}
			}
			if b {
				opts = append(opts, collate.Numeric)
			}
		case "caseLevel", "backwards", "normalization":
			b, ok := e.Value.(bool)
			if !ok {
				return nil, &CollationError{2, "collation " + e.Key + " must be a bool"}
			}
			if b {
				return nil, &CollationError{238, "mongofake: collation option " + e.Key + ": true is not supported"}
			}
		case "caseFirst":
			if s, _ := e.Value.(string); s != "off" {
				return nil, &CollationError{238, fmt.Sprintf("mongofake: collation caseFirst %v is not supported; only \"off\" is", e.Value)}
			}
		case "alternate":
			if s, _ := e.Value.(string); s != "non-ignorable" {
				return nil, &CollationError{238, fmt.Sprintf("mongofake: collation alternate %v is not supported; only \"non-ignorable\" is", e.Value)}
			}
		case "maxVariable":
			// Meaningful only with alternate "shifted".
		case "version":
		default:
			return nil, &CollationError{40415, "BSON field 'collation." + e.Key + "' is an unknown field."}
		}
	}
	if locale == "" {
		return nil, &CollationError{40414, "BSON field 'collation.locale' is missing but a required field"}
	}
	if locale == "simple" {
		if len(d) > 1 {
			return nil, &CollationError{2, "If 'locale' is set to 'simple', no other collation options may be specified"}
		}
		return nil, nil
	}
	tag, err := language.Parse(locale)
	if err != nil {
		return nil, &CollationError{2, fmt.Sprintf("Field 'locale' is invalid in: %v", FormatCollation(d))}
	}
	switch strength {
	case 1:
		opts = append(opts, collate.IgnoreCase, collate.IgnoreDiacritics, collate.IgnoreWidth)
	case 2:
		opts = append(opts, collate.IgnoreCase, collate.IgnoreWidth)
	}
	return &Collation{spec: d, c: collate.New(tag, opts...)}, nil
}

// FormatCollation renders a collation document for messages.
func FormatCollation(d bson.D) string {
	b, err := bson.MarshalExtJSON(d, false, false)
	if err != nil {
		return fmt.Sprint(d)
	}
	return string(b)
}

// Spec returns the collation document as given.
func (c *Collation) Spec() bson.D { return c.spec }

// Key returns the collation key of s.
func (c *Collation) Key(s string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := string(c.c.KeyFromString(&c.buf, s))
	c.buf.Reset()
	return k
}

// Value maps every string in v (nested in documents and arrays, not field
// names) to its collation key. A nil Collation returns v unchanged.
func (c *Collation) Value(v any) any {
	if c == nil {
		return v
	}
	switch x := v.(type) {
	case string:
		return c.Key(x)
	case bson.D:
		return c.Doc(x)
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = c.Value(e)
		}
		return out
	}
	return v
}

// Doc is Value for a document.
func (c *Collation) Doc(d bson.D) bson.D {
	if c == nil || d == nil {
		return d
	}
	out := make(bson.D, len(d))
	for i, e := range d {
		out[i] = bson.E{Key: e.Key, Value: c.Value(e.Value)}
	}
	return out
}

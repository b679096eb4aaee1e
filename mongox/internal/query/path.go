package query

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// missingT marks a path that resolves to nothing. Predicates receive the
// sentinel value missing for such paths.
type missingT struct{}

var missing any = missingT{}

// visitor receives the values a path resolves to; returning true stops the
// walk (a match was found).
type visitor interface {
	leaf(v any) bool
}

func splitPath(p string) []string { return strings.Split(p, ".") }

// field returns the value of key in d.
func field(d bson.D, key string) (any, bool) {
	for i := range d {
		if d[i].Key == key {
			return d[i].Value, true
		}
	}
	return nil, false
}

// asArr returns v as an array.
func asArr(v any) (bson.A, bool) {
	switch x := v.(type) {
	case bson.A:
		return x, true
	case []any:
		return bson.A(x), true
	}
	return nil, false
}

// asDoc returns v as a document (bson.D or bson.M; the server only stores
// bson.D, bson.M appears in Go callers' filters).
func asDoc(v any) (bson.D, bool) {
	switch x := v.(type) {
	case bson.D:
		return x, true
	case bson.M:
		return docFromM(x), true
	}
	return nil, false
}

// arrayIndex parses a path component that is a non-negative decimal array
// index (no sign, no leading zeros except "0").
func arrayIndex(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// walk resolves parts starting at cur the way MongoDB's element path does:
// subdocuments are entered, arrays of subdocuments fan out (nested arrays do
// not), numeric components also index arrays, and a path that stops at a
// non-document yields missing. Leaf values are passed to vis unexpanded; the
// visitor decides whether to look into a leaf array.
func walk(cur any, parts []string, vis visitor) bool {
	if len(parts) == 0 {
		return vis.leaf(cur)
	}
	switch c := cur.(type) {
	case bson.D:
		return walkDoc(c, parts, vis)
	case bson.A:
		return walkArray(c, parts, vis)
	case []any:
		return walkArray(bson.A(c), parts, vis)
	case bson.M:
		return walkDoc(docFromM(c), parts, vis)
	}
	return vis.leaf(missing)
}

// walkDoc is walk starting at a document (parts is non-empty). It avoids
// boxing the document into an interface.
func walkDoc(d bson.D, parts []string, vis visitor) bool {
	v, ok := field(d, parts[0])
	if !ok {
		return vis.leaf(missing)
	}
	return walk(v, parts[1:], vis)
}

func walkArray(arr bson.A, parts []string, vis visitor) bool {
	for _, e := range arr {
		switch e.(type) {
		case bson.D, bson.M:
			if walk(e, parts, vis) {
				return true
			}
		}
	}
	if idx, ok := arrayIndex(parts[0]); ok && idx < len(arr) {
		return walk(arr[idx], parts[1:], vis)
	}
	return false
}

func docFromM(m bson.M) bson.D {
	d := make(bson.D, 0, len(m))
	for k, v := range m {
		d = append(d, bson.E{Key: k, Value: v})
	}
	return d
}

package bsonkit

import (
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Get returns the value of a top-level field.
func Get(doc bson.D, key string) (any, bool) {
	for _, e := range doc {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

// Lookup follows a dotted path through subdocuments, and through arrays only
// where a path part is a numeric index. It does not fan out over array
// elements (the query matcher does that itself).
func Lookup(doc bson.D, path string) (any, bool) {
	var cur any = doc
	for part := range strings.SplitSeq(path, ".") {
		switch c := cur.(type) {
		case bson.D:
			v, ok := Get(c, part)
			if !ok {
				return nil, false
			}
			cur = v
		case bson.A:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Set sets a top-level field, replacing it in place or appending it.
func Set(doc bson.D, key string, v any) bson.D {
	for i := range doc {
		if doc[i].Key == key {
			doc[i].Value = v
			return doc
		}
	}
	return append(doc, bson.E{Key: key, Value: v})
}

// Delete removes a top-level field.
func Delete(doc bson.D, key string) bson.D {
	for i := range doc {
		if doc[i].Key == key {
			return append(doc[:i:i], doc[i+1:]...)
		}
	}
	return doc
}

// Copy returns a deep copy of a BSON value; documents and arrays are copied,
// scalars are immutable and shared.
func Copy(v any) any {
	switch x := v.(type) {
	case bson.D:
		return CopyDoc(x)
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = Copy(e)
		}
		return out
	case bson.Binary:
		return bson.Binary{Subtype: x.Subtype, Data: append([]byte(nil), x.Data...)}
	}
	return v
}

// CopyDoc returns a deep copy of a document.
func CopyDoc(d bson.D) bson.D {
	if d == nil {
		return nil
	}
	out := make(bson.D, len(d))
	for i, e := range d {
		out[i] = bson.E{Key: e.Key, Value: Copy(e.Value)}
	}
	return out
}

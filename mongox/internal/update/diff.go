package update

import (
	"bytes"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// Diff describes old -> new as a change stream's updateDescription does:
// updated holds every changed or added field under its dotted path
// (subdocuments are compared field by field, arrays are reported whole when
// anything in them changed) and removed lists the dotted paths of fields
// that disappeared. Values in updated are copies. A value that changes type
// (1 -> 1.0) counts as changed.
func Diff(old, new bson.D) (updated bson.D, removed []string) {
	d := DiffDescription(old, new)
	return d.Updated, d.Removed
}

// Description is a full updateDescription.
type Description struct {
	Updated bson.D
	Removed []string
	// Truncated lists arrays that only lost trailing elements.
	Truncated []Truncation
	// Disambiguated maps each ambiguous path (one with an array index, a
	// numeric field name or a field name holding a dot) to its components:
	// strings for field names, int32 for array indexes.
	Disambiguated bson.D
}

// Truncation is one entry of truncatedArrays.
type Truncation struct {
	Field   string
	NewSize int32
}

// DiffDescription is Diff with truncatedArrays and disambiguatedPaths: an
// array that only lost trailing elements is reported as truncated, and
// equal-length arrays whose changed elements are all documents are
// compared element by element.
func DiffDescription(old, new bson.D) Description {
	d := Description{Updated: bson.D{}, Removed: []string{}, Disambiguated: bson.D{}}
	d.diffDoc("", nil, old, new)
	return d
}

func (d *Description) note(path string, parts []any) {
	ambiguous := false
	for _, p := range parts {
		switch x := p.(type) {
		case int32:
			ambiguous = true
		case string:
			if strings.Contains(x, ".") || isNumeric(x) {
				ambiguous = true
			}
		}
	}
	if ambiguous {
		a := make(bson.A, len(parts))
		copy(a, parts)
		d.Disambiguated = append(d.Disambiguated, bson.E{Key: path, Value: a})
	}
}

func isNumeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (d *Description) diffDoc(prefix string, parts []any, o, n bson.D) {
	for _, e := range n {
		path := prefix + e.Key
		p := append(slices.Clone(parts), e.Key)
		ov, ok := bsonkit.Get(o, e.Key)
		if !ok {
			d.Updated = append(d.Updated, bson.E{Key: path, Value: bsonkit.Copy(e.Value)})
			d.note(path, p)
			continue
		}
		d.diffValue(path, p, ov, e.Value)
	}
	for _, e := range o {
		if _, ok := bsonkit.Get(n, e.Key); !ok {
			path := prefix + e.Key
			d.Removed = append(d.Removed, path)
			d.note(path, append(slices.Clone(parts), e.Key))
		}
	}
}

func (d *Description) diffValue(path string, parts []any, ov, nv any) {
	od, oIsDoc := ov.(bson.D)
	nd, nIsDoc := nv.(bson.D)
	if oIsDoc && nIsDoc {
		d.diffDoc(path+".", parts, od, nd)
		return
	}
	if identical(ov, nv) {
		return
	}
	oa, oIsArr := ov.(bson.A)
	na, nIsArr := nv.(bson.A)
	if oIsArr && nIsArr {
		if len(na) < len(oa) && identical(oa[:len(na)], na) {
			d.Truncated = append(d.Truncated, Truncation{Field: path, NewSize: int32(len(na))})
			d.note(path, parts)
			return
		}
		if len(na) == len(oa) && docsWhereChanged(oa, na) {
			for i := range na {
				if identical(oa[i], na[i]) {
					continue
				}
				d.diffDoc(path+"."+strconv.Itoa(i)+".", append(slices.Clone(parts), int32(i)), oa[i].(bson.D), na[i].(bson.D))
			}
			return
		}
	}
	d.Updated = append(d.Updated, bson.E{Key: path, Value: bsonkit.Copy(nv)})
	d.note(path, parts)
}

// docsWhereChanged reports whether every differing element pair of two
// equal-length arrays is a pair of documents.
func docsWhereChanged(a, b bson.A) bool {
	for i := range a {
		if identical(a[i], b[i]) {
			continue
		}
		_, ad := a[i].(bson.D)
		_, bd := b[i].(bson.D)
		if !ad || !bd {
			return false
		}
	}
	return true
}

// identical is strict equality: same types, same values, same field order.
func identical(a, b any) bool {
	switch x := a.(type) {
	case bson.D:
		y, ok := b.(bson.D)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].Key != y[i].Key || !identical(x[i].Value, y[i].Value) {
				return false
			}
		}
		return true
	case bson.A:
		y, ok := b.(bson.A)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !identical(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y && math.Signbit(x) == math.Signbit(y) || math.IsNaN(x) && math.IsNaN(y))
	case bson.Binary:
		y, ok := b.(bson.Binary)
		return ok && x.Subtype == y.Subtype && bytes.Equal(x.Data, y.Data)
	}
	return reflect.DeepEqual(a, b)
}

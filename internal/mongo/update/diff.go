package update

import (
	"bytes"
	"math"
	"reflect"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/mongo/bsonkit"
)

// Diff describes old -> new as a change stream's updateDescription does:
// updated holds every changed or added field under its dotted path
// (subdocuments are compared field by field, arrays are reported whole when
// anything in them changed) and removed lists the dotted paths of fields
// that disappeared. Values in updated are copies. A value that changes type
// (1 -> 1.0) counts as changed.
func Diff(old, new bson.D) (updated bson.D, removed []string) {
	updated = bson.D{}
	removed = []string{}
	diffDoc("", old, new, &updated, &removed)
	return updated, removed
}

func diffDoc(prefix string, o, n bson.D, updated *bson.D, removed *[]string) {
	for _, e := range n {
		path := prefix + e.Key
		ov, ok := bsonkit.Get(o, e.Key)
		if !ok {
			*updated = append(*updated, bson.E{Key: path, Value: bsonkit.Copy(e.Value)})
			continue
		}
		od, oIsDoc := ov.(bson.D)
		nd, nIsDoc := e.Value.(bson.D)
		if oIsDoc && nIsDoc {
			diffDoc(path+".", od, nd, updated, removed)
			continue
		}
		if !identical(ov, e.Value) {
			*updated = append(*updated, bson.E{Key: path, Value: bsonkit.Copy(e.Value)})
		}
	}
	for _, e := range o {
		if _, ok := bsonkit.Get(n, e.Key); !ok {
			*removed = append(*removed, prefix+e.Key)
		}
	}
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

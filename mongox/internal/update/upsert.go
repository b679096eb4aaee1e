package update

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// UpsertSeed builds the base document of an upsert from the equality parts
// of a filter: plain {path: value} fields, {path: {$eq: value}}, and the
// same inside a top-level $and. Dotted paths become subdocuments; _id comes
// first. Other operators contribute nothing. A path constrained twice, or a
// path and its prefix, fails with code 54 NotSingleValueField.
func UpsertSeed(filter bson.D) (bson.D, error) {
	seed := bson.D{}
	var seen [][]string
	for _, e := range query.Equalities(filter) {
		parts := strings.Split(e.Key, ".")
		for _, p := range parts {
			if p == "" || strings.HasPrefix(p, "$") {
				return nil, newErr(CodeNotSingleValueField, "cannot infer query fields to set, path '%s' is not a valid field path", e.Key)
			}
		}
		for _, s := range seen {
			if isPrefix(s, parts) || isPrefix(parts, s) {
				return nil, newErr(CodeNotSingleValueField, "cannot infer query fields to set, path '%s' is matched twice", strings.Join(shorter(s, parts), "."))
			}
		}
		seen = append(seen, parts)
		seed = setSeed(seed, parts, bsonkit.Copy(e.Value))
	}
	if id, ok := bsonkit.Get(seed, "_id"); ok {
		if _, isArr := id.(bson.A); isArr {
			return nil, newErr(CodeInvalidIDField, "The '_id' value cannot be of type array")
		}
	}
	return idFirst(seed), nil
}

func shorter(a, b []string) []string {
	if len(a) <= len(b) {
		return a
	}
	return b
}

// setSeed sets a dotted path in a seed document, creating subdocuments.
// Paths were checked not to overlap, so an existing intermediate is always
// a document built here.
func setSeed(d bson.D, parts []string, v any) bson.D {
	if len(parts) == 1 {
		return append(d, bson.E{Key: parts[0], Value: v})
	}
	for i := range d {
		if d[i].Key == parts[0] {
			if sub, ok := d[i].Value.(bson.D); ok {
				d[i].Value = setSeed(sub, parts[1:], v)
				return d
			}
		}
	}
	return append(d, bson.E{Key: parts[0], Value: setSeed(bson.D{}, parts[1:], v)})
}

package query

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Equalities returns the top-level equality constraints of a filter, in
// filter order: plain {path: value} fields (not regexes, not operator
// documents), {path: {$eq: value}}, and the same inside a top-level $and
// (recursively). Dotted paths stay dotted. A path may appear more than once;
// callers decide whether that is an error. Values are not copied.
//
// The update package seeds upsert documents from it; the engine may use it
// for index lookups.
func Equalities(filter bson.D) bson.D {
	var out bson.D
	for _, e := range filter {
		if e.Key == "$and" {
			arr, _ := asArr(e.Value)
			for _, el := range arr {
				if d, ok := asDoc(el); ok {
					out = append(out, Equalities(d)...)
				}
			}
			continue
		}
		if strings.HasPrefix(e.Key, "$") {
			continue
		}
		if ops, ok := isOperatorDoc(e.Value); ok {
			for _, o := range ops {
				if o.Key == "$eq" {
					out = append(out, bson.E{Key: e.Key, Value: o.Value})
				}
			}
			continue
		}
		if _, ok := e.Value.(bson.Regex); ok {
			continue
		}
		out = append(out, e)
	}
	return out
}

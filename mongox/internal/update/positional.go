package update

import (
	"slices"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// resolvePositional returns the update's modifications with the positional
// operator $ replaced by the index of the first element of the array that
// the query's predicates on that array matched, as MongoDB does
// ({"items.sku": "a"} + {$set: {"items.$.qty": 5}}).
func (u *Update) resolvePositional(doc, q bson.D) ([]*mod, error) {
	out := make([]*mod, len(u.mods))
	var idx string
	var arrayPath []string
	for i, m := range u.mods {
		pos := slices.Index(m.parts, "$")
		if pos < 0 {
			out[i] = m
			continue
		}
		prefix := m.parts[:pos]
		if arrayPath == nil {
			n, ok := matchedIndex(doc, prefix, q)
			if !ok {
				return nil, newErr(CodeBadValue, "The positional operator did not find the match needed from the query.")
			}
			idx, arrayPath = strconv.Itoa(n), prefix
		} else if !slices.Equal(arrayPath, prefix) {
			return nil, newErr(CodeBadValue, "The positional operator did not find the match needed from the query.")
		}
		cp := *m
		cp.parts = slices.Clone(m.parts)
		cp.parts[pos] = idx
		cp.path = strings.Join(cp.parts, ".")
		out[i] = &cp
	}
	return out, nil
}

// matchedIndex finds the first element of the array at path that satisfies
// every predicate of q on that array (on the path itself, or on a path
// below it, or its $elemMatch).
func matchedIndex(doc bson.D, path []string, q bson.D) (int, bool) {
	v, ok := bsonkit.Lookup(doc, strings.Join(path, "."))
	if !ok {
		return 0, false
	}
	arr, ok := v.(bson.A)
	if !ok {
		return 0, false
	}
	full := strings.Join(path, ".")
	var conds []func(elem any) bool
	var collect func(f bson.D)
	collect = func(f bson.D) {
		for _, e := range f {
			switch {
			case e.Key == "$and":
				if a, ok := e.Value.(bson.A); ok {
					for _, x := range a {
						if d, ok := x.(bson.D); ok {
							collect(d)
						}
					}
				}
			case e.Key == full:
				m, err := query.Compile(bson.D{{Key: "v", Value: e.Value}})
				if err != nil {
					continue
				}
				// {path: value} matches the element itself; {path:
				// {$elemMatch: ...}} is applied by the matcher to
				// {v: [elem]}.
				conds = append(conds, func(elem any) bool {
					return m.Match(bson.D{{Key: "v", Value: elem}}) || m.Match(bson.D{{Key: "v", Value: bson.A{elem}}})
				})
			case strings.HasPrefix(e.Key, full+"."):
				rest := strings.TrimPrefix(e.Key, full+".")
				m, err := query.Compile(bson.D{{Key: rest, Value: e.Value}})
				if err != nil {
					continue
				}
				conds = append(conds, func(elem any) bool {
					d, ok := elem.(bson.D)
					return ok && m.Match(d)
				})
			}
		}
	}
	collect(q)
	if len(conds) == 0 {
		return 0, false
	}
	for i, el := range arr {
		all := true
		for _, c := range conds {
			if !c(el) {
				all = false
				break
			}
		}
		if all {
			return i, true
		}
	}
	return 0, false
}

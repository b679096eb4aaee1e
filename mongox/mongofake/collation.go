package mongofake

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// Collations: an operation's collation applies to string comparison in its
// filter, sort and distinct. The server compares collation keys (see
// bsonkit.Collation): documents are mapped to keys for matching and
// sorting, and the operands of the filter's comparison operators too.
// Collection default collations, index collations and collated aggregation
// expressions fail with a NotImplemented error naming them.

// collationArg parses a command's collation argument (nil: simple).
func collationArg(v any) (*bsonkit.Collation, error) {
	if v == nil {
		return nil, nil
	}
	d, ok := v.(bson.D)
	if !ok {
		return nil, wrongType("collation", v, "object")
	}
	c, err := bsonkit.ParseCollation(d)
	if err != nil {
		var ce *bsonkit.CollationError
		if errors.As(err, &ce) {
			return nil, errorf(ce.Code, mongoerr.CodeName(ce.Code), ce.Msg)
		}
		return nil, err
	}
	return c, nil
}

// checkCollation accepts only the simple collation, where a non-simple one
// is not implemented (collection defaults, indexes).
func checkCollation(v any, where string) error {
	c, err := collationArg(v)
	if err != nil {
		return err
	}
	if c != nil {
		return errorf(238, "NotImplemented", "mongofake: a non-simple collation on "+where+" is not supported (operations take one)")
	}
	return nil
}

// compileFilter compiles a query filter into an engine query; vars are the
// command's let parameters (visible to $expr), coll its collation (nil:
// simple).
func compileFilter(filter bson.D, vars bson.D, coll *bsonkit.Collation) (engine.Query, error) {
	if coll == nil {
		m, err := query.CompileWithVars(filter, vars)
		if err != nil {
			return engine.Query{}, err
		}
		return engine.Query{Filter: filter, Match: m.Match}, nil
	}
	cf, err := collatedFilter(filter, coll)
	if err != nil {
		return engine.Query{}, err
	}
	m, err := query.CompileWithVars(cf, vars)
	if err != nil {
		return engine.Query{}, err
	}
	// No index shortcut: collation-equal strings differ byte-wise.
	return engine.Query{Match: func(d bson.D) bool { return m.Match(coll.Doc(d)) }}, nil
}

// collatedFilter maps the comparison operands of a filter to collation
// keys. Operators whose meaning collation would change in ways this server
// does not implement ($regex, $expr, $where, $text) are refused.
func collatedFilter(f bson.D, coll *bsonkit.Collation) (bson.D, error) {
	out := make(bson.D, 0, len(f))
	for _, e := range f {
		switch e.Key {
		case "$and", "$or", "$nor":
			a, ok := e.Value.(bson.A)
			if !ok {
				out = append(out, e)
				continue
			}
			na := make(bson.A, len(a))
			for i, x := range a {
				d, ok := x.(bson.D)
				if !ok {
					na[i] = x
					continue
				}
				cd, err := collatedFilter(d, coll)
				if err != nil {
					return nil, err
				}
				na[i] = cd
			}
			out = append(out, bson.E{Key: e.Key, Value: na})
		case "$comment":
			out = append(out, e)
		case "$expr", "$where", "$text", "$jsonSchema":
			return nil, errorf(238, "NotImplemented", fmt.Sprintf("mongofake: %s with a non-simple collation is not supported", e.Key))
		default:
			v, err := collatedPredicate(e.Value, coll)
			if err != nil {
				return nil, err
			}
			out = append(out, bson.E{Key: e.Key, Value: v})
		}
	}
	return out, nil
}

// collatedPredicate maps the operand of one field predicate.
func collatedPredicate(v any, coll *bsonkit.Collation) (any, error) {
	switch x := v.(type) {
	case bson.Regex:
		return nil, errorf(238, "NotImplemented", "mongofake: a regular expression with a non-simple collation is not supported")
	case bson.D:
		if len(x) == 0 || len(x[0].Key) == 0 || x[0].Key[0] != '$' {
			return coll.Doc(x), nil // an equality with a document
		}
		out := make(bson.D, 0, len(x))
		for _, op := range x {
			switch op.Key {
			case "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$all":
				if a, ok := op.Value.(bson.A); ok {
					for _, el := range a {
						if _, isRe := el.(bson.Regex); isRe {
							return nil, errorf(238, "NotImplemented", "mongofake: a regular expression with a non-simple collation is not supported")
						}
					}
				}
				out = append(out, bson.E{Key: op.Key, Value: coll.Value(op.Value)})
			case "$not":
				nv, err := collatedPredicate(op.Value, coll)
				if err != nil {
					return nil, err
				}
				out = append(out, bson.E{Key: op.Key, Value: nv})
			case "$elemMatch":
				d, ok := op.Value.(bson.D)
				if !ok {
					out = append(out, op)
					continue
				}
				var nv any
				var err error
				if len(d) > 0 && len(d[0].Key) > 0 && d[0].Key[0] == '$' && d[0].Key != "$and" && d[0].Key != "$or" && d[0].Key != "$nor" {
					nv, err = collatedPredicate(d, coll)
				} else {
					nv, err = collatedFilter(d, coll)
				}
				if err != nil {
					return nil, err
				}
				out = append(out, bson.E{Key: op.Key, Value: nv})
			case "$regex", "$options":
				return nil, errorf(238, "NotImplemented", "mongofake: $regex with a non-simple collation is not supported")
			default:
				out = append(out, op)
			}
		}
		return out, nil
	}
	return coll.Value(v), nil
}

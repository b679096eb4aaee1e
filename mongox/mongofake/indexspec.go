package mongofake

import (
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// Index specification rules of MongoDB 7.0 that createIndexes enforces
// (https://www.mongodb.com/docs/v7.0/reference/command/createIndexes/,
// https://www.mongodb.com/docs/v7.0/core/index-partial/,
// https://www.mongodb.com/docs/v7.0/core/index-ttl/).

// partialFilterMaxDepth is mongod's internalPartialFilterExpressionMaxDepth:
// the deepest a partial filter's expression tree may be.
const partialFilterMaxDepth = 4

// pfNode is a partial filter expression as mongod's parser shapes it: $and
// and $or nodes over leaves, one operator each.
type pfNode struct {
	logical string // "$and" or "$or" for an inner node, "" for a leaf
	kids    []pfNode
	// bad names a leaf a partial index does not accept ("" when accepted).
	bad string
}

// checkPartialFilter validates a partialFilterExpression. Partial indexes
// accept only equalities ($eq or a plain value), $exists: true, $gt, $gte,
// $lt, $lte, $type, $in, $and and $or, at most four levels deep; anything
// else ($exists: false, $ne, $nin, $not, $nor, $regex, $elemMatch, $size,
// $mod, ...) fails with 67 CannotCreateIndex. $expr and $jsonSchema fail
// with 224 QueryFeatureNotAllowed and $where with 2 BadValue, as mongod
// parses partial filters without its special features.
func checkPartialFilter(filter bson.D) error {
	tree, err := pfDoc(filter)
	if err != nil {
		return err
	}
	if _, err := query.Compile(filter); err != nil {
		return convertErr(err)
	}
	return pfCheck(tree, 0)
}

func pfCheck(n pfNode, level int) error {
	if level+1 > partialFilterMaxDepth {
		return errorf(67, "CannotCreateIndex", fmt.Sprintf("partialFilterExpression depth may not exceed %d", partialFilterMaxDepth))
	}
	if n.logical == "" {
		if n.bad != "" {
			return errorf(67, "CannotCreateIndex", "Expression not supported in partial index: "+n.bad)
		}
		return nil
	}
	for _, k := range n.kids {
		if err := pfCheck(k, level+1); err != nil {
			return err
		}
	}
	return nil
}

// pfDoc parses a filter document: one node, or an $and of its fields'
// nodes. Malformed parts are left for the query compiler to report; only
// the features a partial filter bans fail here.
func pfDoc(d bson.D) (pfNode, error) {
	var kids []pfNode
	for _, e := range d {
		ns, err := pfElem(e)
		if err != nil {
			return pfNode{}, err
		}
		kids = append(kids, ns...)
	}
	if len(kids) == 1 {
		return kids[0], nil
	}
	return pfNode{logical: "$and", kids: kids}, nil
}

func pfElem(e bson.E) ([]pfNode, error) {
	switch e.Key {
	case "$and", "$or":
		arr, _ := e.Value.(bson.A)
		n := pfNode{logical: e.Key}
		for _, x := range arr {
			d, ok := x.(bson.D)
			if !ok {
				continue
			}
			k, err := pfDoc(d)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, k)
		}
		return []pfNode{n}, nil
	case "$nor", "$alwaysTrue", "$alwaysFalse":
		return []pfNode{{bad: e.Key}}, nil
	case "$comment":
		return nil, nil
	case "$expr", "$jsonSchema":
		return nil, errorf(224, "QueryFeatureNotAllowed", e.Key+" is not allowed in this context")
	case "$where", "$text":
		return nil, errorf(2, "BadValue", e.Key+" is not allowed in this context")
	}
	if strings.HasPrefix(e.Key, "$") {
		return nil, nil // unknown top-level operator: the compiler says so
	}
	if _, isRe := e.Value.(bson.Regex); isRe {
		return []pfNode{{bad: e.Key + " regex"}}, nil
	}
	ops, isOps := e.Value.(bson.D)
	if !isOps || len(ops) == 0 || !strings.HasPrefix(ops[0].Key, "$") || ops[0].Key == "$ref" || ops[0].Key == "$id" || ops[0].Key == "$db" {
		return []pfNode{{}}, nil // equality with a value
	}
	var out []pfNode
	for _, op := range ops {
		switch op.Key {
		case "$eq", "$gt", "$gte", "$lt", "$lte", "$type", "$in":
			out = append(out, pfNode{})
		case "$exists":
			if b, err := truthy(op.Value, "$exists"); err == nil && b {
				out = append(out, pfNode{})
			} else {
				out = append(out, pfNode{bad: "$not " + e.Key + " exists"})
			}
		case "$options":
		case "$all":
			arr, _ := op.Value.(bson.A)
			all := pfNode{logical: "$and"}
			for _, x := range arr {
				if d, ok := x.(bson.D); ok && len(d) > 0 && d[0].Key == "$elemMatch" {
					all.kids = append(all.kids, pfNode{bad: e.Key + " $elemMatch"})
					continue
				}
				all.kids = append(all.kids, pfNode{})
			}
			switch len(all.kids) {
			case 0:
				out = append(out, pfNode{bad: "$alwaysFalse"})
			case 1:
				out = append(out, all.kids[0])
			default:
				out = append(out, all)
			}
		case "$ne", "$nin", "$not":
			out = append(out, pfNode{bad: "$not " + e.Key + " " + op.Key})
		case "$expr", "$jsonSchema":
			return nil, errorf(224, "QueryFeatureNotAllowed", op.Key+" is not allowed in this context")
		case "$where", "$text":
			return nil, errorf(2, "BadValue", op.Key+" is not allowed in this context")
		default: // $regex, $elemMatch, $size, $mod, $bits*, geo...
			out = append(out, pfNode{bad: e.Key + " " + op.Key})
		}
	}
	return out, nil
}

// checkIndexKey applies mongod's key pattern rules: no field twice
// (BadValue), numbers that are neither 0 nor NaN or plugin names, no empty
// path part, no '$'-prefixed part outside a DBRef (CannotCreateIndex).
func checkIndexKey(k bson.D) error {
	if len(k) == 0 {
		return errorf(67, "CannotCreateIndex", "Index keys cannot be empty.")
	}
	seen := make(map[string]bool, len(k))
	for _, f := range k {
		if seen[f.Key] {
			return errorf(2, "BadValue", fmt.Sprintf("The field '%s' appears multiple times in the index key pattern %s", f.Key, engine.FormatValue(k)))
		}
		seen[f.Key] = true
	}
	for _, f := range k {
		switch v := f.Value.(type) {
		case string:
			if v == "" {
				return errorf(67, "CannotCreateIndex", "Values in the index key pattern cannot be empty strings")
			}
		default:
			n, isNum := bsonkit.ToFloat64(f.Value)
			switch {
			case !isNum:
				return errorf(67, "CannotCreateIndex", fmt.Sprintf("Values in v:2 index key pattern cannot be of type %s. Only numbers > 0, numbers < 0, and strings are allowed.", mongoerr.TypeName(f.Value)))
			case math.IsNaN(n):
				return errorf(67, "CannotCreateIndex", "Values in the index key pattern cannot be NaN.")
			case n == 0:
				return errorf(67, "CannotCreateIndex", "Values in the index key pattern cannot be 0.")
			}
		}
		if f.Key == "" {
			return errorf(67, "CannotCreateIndex", "Index keys cannot be an empty field.")
		}
		parts := strings.Split(f.Key, ".")
		for i, p := range parts {
			if p == "" {
				return errorf(67, "CannotCreateIndex", "Index keys cannot contain an empty field.")
			}
			if p[0] == '$' && (i == 0 || (p != "$db" && p != "$id" && p != "$ref")) {
				return errorf(67, "CannotCreateIndex", "Index key contains an illegal field name: field name starts with '$'.")
			}
		}
	}
	return nil
}

// checkTTLOption validates expireAfterSeconds: a number, not NaN, a
// non-negative 32-bit integer (67 CannotCreateIndex otherwise).
func checkTTLOption(v any) (int64, error) {
	f, isNum := bsonkit.ToFloat64(v)
	switch {
	case !isNum:
		return 0, errorf(67, "CannotCreateIndex", fmt.Sprintf("TTL index 'expireAfterSeconds' option must be numeric, but received a type of '%s'", mongoerr.TypeName(v)))
	case math.IsNaN(f):
		return 0, errorf(67, "CannotCreateIndex", "TTL index 'expireAfterSeconds' option must not be NaN")
	case f < math.MinInt32 || f >= math.MaxInt32+1:
		return 0, errorf(67, "CannotCreateIndex", "TTL index 'expireAfterSeconds' must be within the range of a 32-bit integer")
	case f < 0:
		return 0, errorf(67, "CannotCreateIndex", "TTL index 'expireAfterSeconds' option cannot be less than 0")
	}
	return int64(f), nil
}

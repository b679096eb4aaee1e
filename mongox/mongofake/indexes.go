package mongofake

import (
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
)

func init() {
	register(
		commandSpec{names: []string{"createIndexes"}, handler: dataCommand(cmdCreateIndexes)},
		commandSpec{names: []string{"listIndexes"}, handler: dataCommand(cmdListIndexes)},
		commandSpec{names: []string{"dropIndexes", "deleteIndexes"}, handler: dataCommand(cmdDropIndexes)},
		commandSpec{names: []string{"collMod"}, handler: dataCommand(cmdCollMod)},
	)
}

// idIndexFields are the fields an _id index specification may have.
var idIndexFields = map[string]bool{"key": true, "name": true, "v": true, "collation": true, "ns": true, "_id": true}

// parseIndexSpec reads one createIndexes index document and applies
// mongod's validation of it (see indexspec.go).
func parseIndexSpec(raw any) (engine.IndexSpec, error) {
	var s engine.IndexSpec
	d, ok := raw.(bson.D)
	if !ok {
		return s, errorf(14, "TypeMismatch", "createIndexes.indexes entries must be objects")
	}
	hasName := false
	for _, e := range d {
		switch e.Key {
		case "key":
			k, ok := e.Value.(bson.D)
			if !ok {
				return s, wrongTypeField("key", e.Value, "an object")
			}
			if err := checkIndexKey(k); err != nil {
				return s, err
			}
			for _, f := range k {
				if str, isStr := f.Value.(string); isStr {
					if str == "text" {
						return s, errorf(238, "NotImplemented", textSearchRefusal)
					}
					return s, errorf(238, "NotImplemented", fmt.Sprintf("mongofake: index type '%s' is not supported", str))
				}
			}
			s.Key = k
		case "name":
			n, ok := e.Value.(string)
			if !ok {
				return s, wrongTypeField("name", e.Value, "a string")
			}
			s.Name, hasName = n, true
		case "v":
			n, isNum := bsonkit.ToFloat64(e.Value)
			if !isNum {
				return s, wrongTypeField("v", e.Value, "a number")
			}
			if n != 1 && n != 2 {
				return s, errorf(67, "CannotCreateIndex", fmt.Sprintf("Invalid index specification %s; cannot create an index with v=%v", engine.FormatValue(d), n))
			}
		case "unique", "sparse", "background":
			b, err := truthy(e.Value, e.Key)
			if err != nil {
				return s, errorf(14, "TypeMismatch", fmt.Sprintf("The field '%s has value %v, which is not convertible to bool", e.Key, engine.FormatValue(e.Value)))
			}
			switch e.Key {
			case "unique":
				s.Unique = b
			case "sparse":
				s.Sparse = b
			}
		case "partialFilterExpression":
			p, ok := e.Value.(bson.D)
			if !ok {
				return s, wrongTypeField("partialFilterExpression", e.Value, "an object")
			}
			if err := checkPartialFilter(p); err != nil {
				return s, err
			}
			s.PartialFilter = p
		case "expireAfterSeconds":
			n, err := checkTTLOption(e.Value)
			if err != nil {
				return s, err
			}
			s.ExpireAfterSeconds = &n
		case "ns":
		case "collation":
			if err := checkCollation(e.Value, "an index"); err != nil {
				return s, err
			}
		case "hidden", "weights", "default_language", "language_override", "textIndexVersion",
			"2dsphereIndexVersion", "bits", "min", "max", "bucketSize", "wildcardProjection", "storageEngine", "prepareUnique":
			return s, errorf(238, "NotImplemented", "mongofake: index option '"+e.Key+"' is not supported")
		default:
			return s, errorf(197, "InvalidIndexSpecificationOption", fmt.Sprintf("The field '%s' is not valid for an index specification. Specification: %s", e.Key, engine.FormatValue(d)))
		}
	}
	if s.Key == nil {
		return s, errorf(9, "FailedToParse", "The 'key' field is a required property of an index specification")
	}
	if !hasName {
		return s, errorf(9, "FailedToParse", "The 'name' field is a required property of an index specification")
	}
	if isIDKey(s.Key) {
		for _, e := range d {
			if !idIndexFields[e.Key] {
				return s, errorf(197, "InvalidIndexSpecificationOption", fmt.Sprintf("The field '%s' is not valid for an _id index specification. Specification: %s", e.Key, engine.FormatValue(d)))
			}
		}
	} else if s.Name == "_id_" {
		return s, errorf(2, "BadValue", "The index name '_id_' is reserved for the _id index, which must have key pattern {_id: 1}, found "+engine.FormatValue(s.Key))
	}
	switch {
	case s.Name == "*":
		return s, errorf(2, "BadValue", "The index name '*' is not valid.")
	case s.Name == "":
		return s, errorf(67, "CannotCreateIndex", "index name cannot be empty")
	case strings.ContainsRune(s.Name, 0):
		return s, errorf(67, "CannotCreateIndex", "index name cannot contain NUL bytes")
	case s.PartialFilter != nil && s.Sparse:
		return s, errorf(67, "CannotCreateIndex", `cannot mix "partialFilterExpression" and "sparse" options`)
	case s.ExpireAfterSeconds != nil && len(s.Key) != 1:
		return s, errorf(67, "CannotCreateIndex", "TTL indexes are single-field indexes, compound indexes do not support TTL. Index spec: "+engine.FormatValue(d))
	}
	return s, nil
}

// textSearchRefusal is the answer to a text index: the embedded server has
// no full-text engine (MongoDB's text search tokenizes per language,
// stems, drops stop words and scores by term frequency and field weights;
// an approximation would match and rank differently, silently).
const textSearchRefusal = "mongofake: text indexes are not supported (no full-text engine: language tokenizing, stemming, stop words, textScore); $text needs a text index, so it fails too. Use a real MongoDB to test text search"

// isIDKey reports the _id index's key pattern, {_id: 1}.
func isIDKey(k bson.D) bool {
	if len(k) != 1 || k[0].Key != "_id" {
		return false
	}
	n, ok := bsonkit.ToFloat64(k[0].Value)
	return ok && n == 1
}

// wrongTypeField is mongod's TypeMismatch for an index specification field.
func wrongTypeField(field string, v any, want string) *cmdError {
	return errorf(14, "TypeMismatch", fmt.Sprintf("The field '%s' must be %s, but got %s", field, want, mongoerr.TypeName(v)))
}

func cmdCreateIndexes(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "indexes", "commitQuorum", "ignoreUnknownIndexOptions", "isTimeseriesNamespace"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	v, _ := r.get("indexes")
	arr, ok := v.(bson.A)
	if !ok || len(arr) == 0 {
		return nil, errorf(2, "BadValue", "Must specify at least one index to create")
	}
	specs := make([]engine.IndexSpec, 0, len(arr))
	for _, raw := range arr {
		s, err := parseIndexSpec(raw)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	var created bool
	var before, after int
	if tc.txn != nil {
		if err := explicitCreateInTxn(r, tc); err != nil {
			return nil, err
		}
		// Allowed on a collection the transaction creates (MongoDB 4.4+).
		err = r.srv.engine.Write(ctx, tc.txn, func(v *engine.View) error {
			var err error
			created, before, after, err = v.CreateIndexes(ns, specs)
			return err
		})
	} else {
		created, before, after, err = r.srv.engine.CreateIndexes(ctx, ns, specs)
	}
	if err != nil {
		return nil, err
	}
	out := bson.D{}
	if created {
		out = append(out, bson.E{Key: "createdCollectionAutomatically", Value: true})
	} else {
		out = append(out, bson.E{Key: "createdCollectionAutomatically", Value: false})
	}
	out = append(out, bson.E{Key: "numIndexesBefore", Value: int32(before)}, bson.E{Key: "numIndexesAfter", Value: int32(after)})
	if before == after {
		out = append(out, bson.E{Key: "note", Value: "all indexes already exist"})
	}
	return out, nil
}

func cmdListIndexes(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "cursor", "includeBuildUUIDs", "includeIndexBuildInfo"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	specs, ok := r.srv.engine.ListIndexes(ns)
	if !ok {
		return nil, errorf(26, "NamespaceNotFound", "ns does not exist: "+ns.String())
	}
	cur, _ := r.docArg("cursor")
	batchSize, hasBatch, err := batchSizeArg(cur, "cursor.batchSize")
	if err != nil {
		return nil, err
	}
	docs := make([]bson.D, len(specs))
	clustered := r.srv.engine.ClusteredIndex(ns)
	for i, s := range specs {
		docs[i] = engine.SpecDocument(s)
		if i == 0 && clustered != nil {
			// A clustered collection lists its clustered index in place of _id_.
			docs[i] = bson.D{{Key: "v", Value: int32(2)}, {Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}},
				{Key: "name", Value: lookupD(clustered, "name")}, {Key: "unique", Value: true}, {Key: "clustered", Value: true}}
		}
	}
	cns := engine.NS{DB: ns.DB, Coll: "$cmd.listIndexes." + ns.Coll}
	return r.srv.data.firstBatch(r, tc, cns, docs, nil, batchSize, hasBatch, 0, false), nil
}

func cmdDropIndexes(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "index"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	v, ok := r.get("index")
	if !ok {
		return nil, errorf(40414, "Location40414", "BSON field 'dropIndexes.index' is missing but a required field")
	}
	var names []string
	var key bson.D
	switch x := v.(type) {
	case string:
		names = []string{x}
	case bson.A:
		for _, n := range x {
			s, ok := n.(string)
			if !ok {
				return nil, wrongType("dropIndexes.index", n, "string")
			}
			names = append(names, s)
		}
	case bson.D:
		key = x
	default:
		return nil, wrongType("dropIndexes.index", v, "string")
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	before, err := r.srv.engine.DropIndexes(ctx, ns, names, key)
	if err != nil {
		return nil, err
	}
	out := bson.D{{Key: "nIndexesWas", Value: int32(before)}}
	if len(names) == 1 && names[0] == "*" {
		out = append(out, bson.E{Key: "msg", Value: "non-_id indexes dropped for collection"})
	}
	return out, nil
}

func cmdCollMod(r *request, tc *txnCtx) (bson.D, error) {
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	out := bson.D{}
	for i, e := range r.cmd {
		if i == 0 || genericFields[e.Key] {
			continue
		}
		switch e.Key {
		case "index":
			spec, ok := e.Value.(bson.D)
			if !ok {
				return nil, wrongType("collMod.index", e.Value, "object")
			}
			mod, err := parseCollModIndex(spec)
			if err != nil {
				return nil, err
			}
			ctx, cancel, err := r.opCtx()
			if err != nil {
				return nil, err
			}
			old, err := r.srv.engine.SetIndexTTL(ctx, ns, mod.name, mod.key, mod.ttl)
			cancel()
			if err != nil {
				return nil, err
			}
			if old != nil {
				out = append(out, bson.E{Key: "expireAfterSeconds_old", Value: *old})
			}
			out = append(out, bson.E{Key: "expireAfterSeconds_new", Value: mod.ttl})
		case "validator":
			if d, ok := e.Value.(bson.D); !ok || len(d) > 0 {
				return nil, errorf(238, "NotImplemented", "mongofake: document validation (collMod validator) is not supported")
			}
		case "validationLevel", "validationAction":
			// meaningless without a validator
		case "changeStreamPreAndPostImages":
			en, err := prePostArg("collMod", e.Value)
			if err != nil {
				return nil, err
			}
			ctx, cancel, err := r.opCtx()
			if err != nil {
				return nil, err
			}
			err = r.srv.engine.SetPrePostImages(ctx, ns, en)
			cancel()
			if err != nil {
				return nil, err
			}
		default:
			return nil, errorf(238, "NotImplemented", "mongofake: collMod option '"+e.Key+"' is not supported")
		}
	}
	desc := bson.D{}
	for i, e := range r.cmd {
		if i > 0 && !genericFields[e.Key] {
			desc = append(desc, e)
		}
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	if err := r.srv.engine.RecordModify(ctx, ns, desc); err != nil {
		return nil, err
	}
	return out, nil
}

// collModIndex is a collMod index modification: the index, by name or key
// pattern, and its new expireAfterSeconds.
type collModIndex struct {
	name string
	key  bson.D
	ttl  int64
}

// parseCollModIndex reads collMod's index document as mongod does
// (https://www.mongodb.com/docs/v7.0/reference/command/collMod/): exactly
// one of name and keyPattern (72 InvalidOptions otherwise), and a
// modification, of which this server supports expireAfterSeconds.
func parseCollModIndex(spec bson.D) (collModIndex, error) {
	var m collModIndex
	var hasName, hasKey, hasTTL bool
	for _, f := range spec {
		switch f.Key {
		case "name":
			s, ok := f.Value.(string)
			if !ok {
				return m, wrongType("collMod.index.name", f.Value, "string")
			}
			m.name, hasName = s, true
		case "keyPattern":
			k, ok := f.Value.(bson.D)
			if !ok {
				return m, wrongType("collMod.index.keyPattern", f.Value, "object")
			}
			m.key, hasKey = k, true
		case "expireAfterSeconds":
			n, ok := wholeNumber(f.Value)
			if !ok {
				return m, wrongType("collMod.index.expireAfterSeconds", f.Value, "long")
			}
			switch {
			case n < 0:
				return m, errorf(72, "InvalidOptions", "TTL index 'expireAfterSeconds' option cannot be less than 0")
			case n > math.MaxInt32:
				return m, errorf(72, "InvalidOptions", "TTL index 'expireAfterSeconds' option must be within an acceptable range, try a lower number")
			}
			m.ttl, hasTTL = n, true
		case "hidden", "prepareUnique", "unique", "forceNonUnique", "disallowNewDuplicateKeys":
			return m, errorf(238, "NotImplemented", "mongofake: collMod index option '"+f.Key+"' is not supported")
		default:
			return m, errorf(40415, "Location40415", "BSON field 'collMod.index."+f.Key+"' is an unknown field.")
		}
	}
	switch {
	case hasName && hasKey:
		return m, errorf(72, "InvalidOptions", "Cannot specify both key pattern and name.")
	case !hasName && !hasKey:
		return m, errorf(72, "InvalidOptions", "Must specify either index name or key pattern.")
	case !hasTTL:
		return m, errorf(72, "InvalidOptions", "no expireAfterSeconds, hidden, unique, or disallowNewDuplicateKeys field")
	}
	return m, nil
}

package mongofake

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
)

func init() {
	register(
		commandSpec{names: []string{"createIndexes"}, handler: dataCommand(cmdCreateIndexes)},
		commandSpec{names: []string{"listIndexes"}, handler: dataCommand(cmdListIndexes)},
		commandSpec{names: []string{"dropIndexes", "deleteIndexes"}, handler: dataCommand(cmdDropIndexes)},
		commandSpec{names: []string{"collMod"}, handler: dataCommand(cmdCollMod)},
	)
}

// parseIndexSpec reads one createIndexes index document.
func parseIndexSpec(raw any) (engine.IndexSpec, error) {
	var s engine.IndexSpec
	d, ok := raw.(bson.D)
	if !ok {
		return s, errorf(14, "TypeMismatch", "createIndexes.indexes entries must be objects")
	}
	for _, e := range d {
		switch e.Key {
		case "key":
			k, ok := e.Value.(bson.D)
			if !ok || len(k) == 0 {
				return s, errorf(67, "CannotCreateIndex", "Index keys cannot be an empty field")
			}
			for _, f := range k {
				if f.Key == "" {
					return s, errorf(67, "CannotCreateIndex", "Index keys cannot be an empty field")
				}
				if str, isStr := f.Value.(string); isStr {
					return s, errorf(238, "NotImplemented", fmt.Sprintf("mongofake: index type '%s' is not supported", str))
				}
				n, isNum := bsonkit.ToFloat64(f.Value)
				if !isNum || n == 0 {
					return s, errorf(67, "CannotCreateIndex", fmt.Sprintf("Values in the index key pattern can't be 0 or non-numeric: %s", engine.FormatValue(k)))
				}
			}
			s.Key = k
		case "name":
			n, ok := e.Value.(string)
			if !ok || n == "" {
				return s, errorf(67, "CannotCreateIndex", "index name must be a non-empty string")
			}
			s.Name = n
		case "unique":
			b, err := truthy(e.Value, "unique")
			if err != nil {
				return s, err
			}
			s.Unique = b
		case "sparse":
			b, err := truthy(e.Value, "sparse")
			if err != nil {
				return s, err
			}
			s.Sparse = b
		case "partialFilterExpression":
			p, ok := e.Value.(bson.D)
			if !ok {
				return s, wrongType("partialFilterExpression", e.Value, "object")
			}
			s.PartialFilter = p
		case "expireAfterSeconds":
			n, ok := bsonkit.ToInt64(e.Value)
			if !ok {
				if f, isF := e.Value.(float64); isF {
					n, ok = int64(f), true
				}
			}
			if !ok || n < 0 {
				return s, errorf(2, "BadValue", fmt.Sprintf("TTL index 'expireAfterSeconds' option must be a non-negative number: %v", e.Value))
			}
			s.ExpireAfterSeconds = &n
		case "v", "background", "ns":
		case "collation":
			if err := checkCollation(e.Value, "an index"); err != nil {
				return s, err
			}
		case "hidden", "weights", "default_language", "language_override", "textIndexVersion",
			"2dsphereIndexVersion", "bits", "min", "max", "bucketSize", "wildcardProjection", "storageEngine", "prepareUnique":
			return s, errorf(238, "NotImplemented", "mongofake: index option '"+e.Key+"' is not supported")
		default:
			return s, errorf(197, "InvalidIndexSpecificationOption", fmt.Sprintf("The field '%s' is not valid for an index specification.", e.Key))
		}
	}
	if s.Key == nil {
		return s, errorf(9, "FailedToParse", "The 'key' field is a required property of an index specification")
	}
	if s.Name == "" {
		return s, errorf(9, "FailedToParse", "The 'name' field is a required property of an index specification")
	}
	if s.ExpireAfterSeconds != nil && len(s.Key) != 1 {
		s.ExpireAfterSeconds = nil // mongod ignores TTL on compound indexes
	}
	return s, nil
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
	if err := noDDLInTxn(r, tc); err != nil {
		return nil, err
	}
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
	if err := noDDLInTxn(r, tc); err != nil {
		return nil, err
	}
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
			var name string
			var key bson.D
			var ttl *int64
			for _, f := range spec {
				switch f.Key {
				case "name":
					name, _ = f.Value.(string)
				case "keyPattern":
					key, _ = f.Value.(bson.D)
				case "expireAfterSeconds":
					n, ok := bsonkit.ToInt64(f.Value)
					if !ok || n < 0 {
						return nil, errorf(2, "BadValue", "expireAfterSeconds must be a non-negative number")
					}
					ttl = &n
				case "hidden", "prepareUnique", "unique", "forceNonUnique":
					return nil, errorf(238, "NotImplemented", "mongofake: collMod index option '"+f.Key+"' is not supported")
				default:
					return nil, errorf(40415, "Location40415", "BSON field 'collMod.index."+f.Key+"' is an unknown field.")
				}
			}
			if name == "" && key == nil {
				return nil, errorf(2, "BadValue", "collMod index requires either 'name' or 'keyPattern'")
			}
			if ttl == nil {
				continue
			}
			ctx, cancel, err := r.opCtx()
			if err != nil {
				return nil, err
			}
			old, err := r.srv.engine.SetIndexTTL(ctx, ns, name, key, *ttl)
			cancel()
			if err != nil {
				return nil, err
			}
			out = append(out, bson.E{Key: "expireAfterSeconds_old", Value: old}, bson.E{Key: "expireAfterSeconds_new", Value: *ttl})
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

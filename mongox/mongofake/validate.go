package mongofake

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// The validate command (https://www.mongodb.com/docs/v7.0/reference/command/validate/):
// it checks a collection's documents and indexes. The embedded server's
// structures are in memory and consistent by construction, so the answer
// is always valid; it reports what mongod reports about the collection:
// its records, its indexes and the keys each holds.

func init() {
	register(commandSpec{names: []string{"validate"}, handler: dataCommand(cmdValidate)})
}

func cmdValidate(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "full", "repair", "metadata", "checkBSONConformance", "background", "scandata", "enforceFastCount"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	info := collectionInfo(r, ns)
	if info == nil {
		return nil, errorf(26, "NamespaceNotFound", "Collection '"+ns.String()+"' does not exist to validate.")
	}
	docs, err := allDocs(r, tc, ns)
	if err != nil {
		return nil, err
	}
	specs, _ := r.srv.engine.ListIndexes(ns)
	keys, details := bson.D{}, bson.D{}
	for _, s := range specs {
		n, err := indexKeyCount(docs, s)
		if err != nil {
			return nil, err
		}
		keys = append(keys, bson.E{Key: s.Name, Value: n})
		details = append(details, bson.E{Key: s.Name, Value: bson.D{{Key: "valid", Value: true}}})
	}
	return bson.D{
		{Key: "ns", Value: ns.String()},
		{Key: "uuid", Value: info.UUID},
		{Key: "nInvalidDocuments", Value: int64(0)},
		{Key: "nNonCompliantDocuments", Value: int64(0)},
		{Key: "nrecords", Value: int64(len(docs))},
		{Key: "nIndexes", Value: int32(len(specs))},
		{Key: "keysPerIndex", Value: keys},
		{Key: "indexDetails", Value: details},
		{Key: "valid", Value: true},
		{Key: "repaired", Value: false},
		{Key: "warnings", Value: bson.A{}},
		{Key: "errors", Value: bson.A{}},
		{Key: "extraIndexEntries", Value: bson.A{}},
		{Key: "missingIndexEntries", Value: bson.A{}},
		{Key: "corruptRecords", Value: bson.A{}},
	}, nil
}

// indexKeyCount counts the keys an index holds for docs: one per document
// (an array field holds one per distinct element), none for documents a
// sparse index skips (no key field) or a partial index's filter excludes.
func indexKeyCount(docs []bson.D, s engine.IndexSpec) (int64, error) {
	var partial func(bson.D) bool
	if s.PartialFilter != nil {
		m, err := query.Compile(s.PartialFilter)
		if err != nil {
			return 0, err
		}
		partial = m.Match
	}
	var n int64
	for _, d := range docs {
		if partial != nil && !partial(d) {
			continue
		}
		keys := int64(1)
		present := false
		for _, k := range s.Key {
			v, ok := bsonkit.Lookup(d, k.Key)
			present = present || ok
			if a, isArr := v.(bson.A); isArr && len(a) > 1 {
				distinct := map[string]bool{}
				for _, x := range a {
					distinct[bsonkit.Key(x)] = true
				}
				keys *= int64(len(distinct))
			}
		}
		if s.Sparse && !present {
			continue
		}
		n += keys
	}
	return n, nil
}

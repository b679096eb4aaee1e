package query

import (
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

var fuzzSeedFilters = []string{
	`{"a": 1}`,
	`{"a.b": {"$gt": 1, "$lt": [1]}}`,
	`{"$or": [{"a": null}, {"b": {"$in": [1, "x", {"$regularExpression": {"pattern": "x", "options": "i"}}]}}]}`,
	`{"a": {"$elemMatch": {"b": {"$exists": true}, "c": {"$type": "number"}}}}`,
	`{"a": {"$elemMatch": {"$gte": 1, "$not": {"$size": 2}}}}`,
	`{"a": {"$all": [{"$elemMatch": {"x": 1}}]}, "b": {"$mod": [3, 1]}}`,
	`{"a.0.b": {"$regex": "^x", "$options": "x"}, "$nor": [{"c": {"$bitsAnySet": [1, 70]}}]}`,
}

var fuzzDocs = []string{
	`{"a": 1}`,
	`{"a": [1, {"b": [2, {"c": 3}]}, [4]], "b": null}`,
	`{"a": {"b": {"0": "x"}}, "c": 2.5}`,
	`{"a": [{"b": "xyz"}, {"b": [1, 2]}], "c": {"$numberLong": "7"}}`,
	`{}`,
}

func FuzzCompile(f *testing.F) {
	for _, s := range fuzzSeedFilters {
		b, err := bson.Marshal(d(f, s))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	docs := make([]bson.D, 0, len(fuzzDocs))
	for _, s := range fuzzDocs {
		docs = append(docs, d(f, s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var filter bson.D
		if err := bson.Unmarshal(data, &filter); err != nil {
			return
		}
		_ = Equalities(filter)
		m, err := Compile(filter)
		if err != nil {
			if _, ok := err.(*mongoerr.Error); !ok {
				t.Fatalf("error %T is not *mongoerr.Error: %v", err, err)
			}
			return
		}
		for _, doc := range docs {
			m.Match(doc)
		}
		m.Match(filter)
		if p, err := CompileProjection(filter); err == nil {
			for _, doc := range docs {
				p.Apply(doc)
			}
		}
		if s, err := CompileSort(filter); err == nil {
			for _, a := range docs {
				for _, b := range docs {
					s.Compare(a, b)
				}
			}
		}
	})
}

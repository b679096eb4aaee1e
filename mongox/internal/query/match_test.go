package query

import (
	"errors"
	"math"
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

type matchCase struct {
	filter string
	doc    string
	want   bool
}

func runMatchCases(t *testing.T, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.filter+" ~ "+c.doc, func(t *testing.T) {
			t.Parallel()
			m, err := Compile(d(t, c.filter))
			require.NoError(t, err)
			require.Equal(t, c.want, m.Match(d(t, c.doc)))
		})
	}
}

func TestMatchEquality(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{}`, `{"a": 1}`, true},
		{`{"a": 1}`, `{"a": 1}`, true},
		{`{"a": 1}`, `{"a": 2}`, false},
		{`{"a": 1}`, `{"b": 1}`, false},
		{`{"a": 1}`, `{"a": 1.0}`, true},
		{`{"a": 1}`, `{"a": {"$numberLong": "1"}}`, true},
		{`{"a": 1}`, `{"a": {"$numberDecimal": "1.00"}}`, true},
		{`{"a": {"$numberDecimal": "2.5"}}`, `{"a": 2.5}`, true},
		{`{"a": "1"}`, `{"a": 1}`, false},
		{`{"a": "x", "b": 2}`, `{"a": "x", "b": 2}`, true},
		{`{"a": "x", "b": 2}`, `{"a": "x", "b": 3}`, false},
		{`{"tags": "x"}`, `{"tags": ["x", "y"]}`, true},
		{`{"tags": "z"}`, `{"tags": ["x", "y"]}`, false},
		{`{"tags": ["x", "y"]}`, `{"tags": ["x", "y"]}`, true},
		{`{"tags": ["y", "x"]}`, `{"tags": ["x", "y"]}`, false},
		{`{"tags": ["x"]}`, `{"tags": [["x"], "y"]}`, true},
		{`{"tags": "x"}`, `{"tags": [["x"]]}`, false},
		{`{"a": {"b": 1}}`, `{"a": {"b": 1}}`, true},
		{`{"a": {"b": 1}}`, `{"a": {"b": 1, "c": 2}}`, false},
		{`{"a": {"b": 1, "c": 2}}`, `{"a": {"c": 2, "b": 1}}`, false},
		{`{"a": {"b": 1}}`, `{"a": [{"b": 1}, 2]}`, true},
		{`{"a": null}`, `{"a": null}`, true},
		{`{"a": null}`, `{}`, true},
		{`{"a": null}`, `{"a": 0}`, false},
		{`{"a": null}`, `{"a": [1, null]}`, true},
		{`{"a": null}`, `{"a": [1, 2]}`, false},
		{`{"a": {"$eq": null}}`, `{"b": 1}`, true},
		{`{"a": {"$ne": null}}`, `{"b": 1}`, false},
		{`{"a": {"$ne": null}}`, `{"a": 1}`, true},
		{`{"a": {"$eq": 5}}`, `{"a": [4, 5]}`, true},
		{`{"a": {"$eq": [4, 5]}}`, `{"a": [4, 5]}`, true},
		{`{"a": {"$ne": 5}}`, `{"a": [4, 5]}`, false},
		{`{"a": {"$ne": 5}}`, `{"a": [4, 6]}`, true},
		{`{"a": {"$ne": 5}}`, `{}`, true},
		{`{"_id": {"$oid": "5f1d7f0e1c9d440000a1b2c3"}}`, `{"_id": {"$oid": "5f1d7f0e1c9d440000a1b2c3"}}`, true},
		{`{"_id": {"$oid": "5f1d7f0e1c9d440000a1b2c3"}}`, `{"_id": {"$oid": "5f1d7f0e1c9d440000a1b2c4"}}`, false},
		{`{"a": true}`, `{"a": true}`, true},
		{`{"a": true}`, `{"a": 1}`, false},
		{`{"a": {"$date": "2024-01-01T00:00:00Z"}}`, `{"a": {"$date": "2024-01-01T00:00:00Z"}}`, true},
		{`{"a": {"$ref": "c", "$id": 1}}`, `{"a": {"$ref": "c", "$id": 1}}`, true},
		{`{"a": {"$eq": {"$regularExpression": {"pattern": "x", "options": ""}}}}`, `{"a": "x"}`, false},
		{`{"a": {"$eq": {"$regularExpression": {"pattern": "x", "options": ""}}}}`, `{"a": {"$regularExpression": {"pattern": "x", "options": ""}}}`, true},
		{`{"a": {"$minKey": 1}}`, `{"a": {"$minKey": 1}}`, true},
	})
}

func TestMatchDottedPaths(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"a.b": 1}`, `{"a": {"b": 1}}`, true},
		{`{"a.b": 1}`, `{"a": {"b": 2}}`, false},
		{`{"a.b.c": 1}`, `{"a": {"b": {"c": 1}}}`, true},
		{`{"a.b": 1}`, `{"a": [{"b": 2}, {"b": 1}]}`, true},
		{`{"a.b": 1}`, `{"a": [{"b": 2}, {"b": [0, 1]}]}`, true},
		{`{"a.b": 1}`, `{"a": [[{"b": 1}]]}`, false},
		{`{"a.b.c": 1}`, `{"a": [{"b": [{"c": 1}]}]}`, true},
		{`{"a.0": 5}`, `{"a": [5, 6]}`, true},
		{`{"a.1": 5}`, `{"a": [5, 6]}`, false},
		{`{"a.1": 6}`, `{"a": [5, 6]}`, true},
		{`{"a.2": null}`, `{"a": [5, 6]}`, false},
		{`{"a.0.b": 1}`, `{"a": [{"b": 1}, {"b": 2}]}`, true},
		{`{"a.1.b": 1}`, `{"a": [{"b": 1}, {"b": 2}]}`, false},
		{`{"a.0": 1}`, `{"a": {"0": 1}}`, true},
		{`{"a.0": 1}`, `{"a": [{"0": 1}]}`, true},
		{`{"a.0": 1}`, `{"a": [[1, 2]]}`, true},
		{`{"a.00": 1}`, `{"a": [1]}`, false},
		{`{"a.b": 1}`, `{"a": 1}`, false},
		// null semantics through arrays (MongoDB jstests/core/null2.js).
		{`{"a.b": null}`, `{"a": [{"b": 5}]}`, false},
		{`{"a.b": null}`, `{"a": [{}]}`, true},
		{`{"a.b": null}`, `{"a": []}`, false},
		{`{"a.b": null}`, `{"a": [{}, {"b": 5}]}`, true},
		{`{"a.b": null}`, `{"a": [5, {"b": 5}]}`, false},
		{`{"a.b": {"$in": [null]}}`, `{"a": [{}, {"b": 5}]}`, true},
		{`{"a.b": null}`, `{"a": 4}`, true},
		{`{"a.b": null}`, `{"a": {"b": null}}`, true},
		{`{"a.b": {"$exists": true}}`, `{"a": [{"c": 1}, {"b": 1}]}`, true},
		{`{"a.b": {"$exists": true}}`, `{"a": [{"c": 1}, 5]}`, false},
		{`{"a.b": {"$exists": false}}`, `{"a": [{"c": 1}, 5]}`, true},
		{`{"a.b": {"$gt": 3}}`, `{"a": [{"b": 1}, {"b": [2, 5]}]}`, true},
	})
}

func TestMatchComparison(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"a": {"$gt": 5}}`, `{"a": 6}`, true},
		{`{"a": {"$gt": 5}}`, `{"a": 5}`, false},
		{`{"a": {"$gte": 5}}`, `{"a": 5.0}`, true},
		{`{"a": {"$gt": 5}}`, `{"a": {"$numberLong": "6"}}`, true},
		{`{"a": {"$gt": 5}}`, `{"a": {"$numberDecimal": "5.01"}}`, true},
		{`{"a": {"$lt": 5}}`, `{"a": 4.99}`, true},
		{`{"a": {"$lte": 5}}`, `{"a": 6}`, false},
		{`{"a": {"$gt": 5}}`, `{"a": "6"}`, false},
		{`{"a": {"$gt": 5}}`, `{"a": null}`, false},
		{`{"a": {"$lt": 5}}`, `{"a": null}`, false},
		{`{"a": {"$lt": 5}}`, `{}`, false},
		{`{"a": {"$gt": 5}}`, `{"a": [1, 7]}`, true},
		{`{"a": {"$gt": 5}}`, `{"a": [1, 2]}`, false},
		{`{"a": {"$gt": 5, "$lt": 7}}`, `{"a": [4, 8]}`, true},
		{`{"a": {"$gt": 5, "$lt": 7}}`, `{"a": 8}`, false},
		{`{"a": {"$elemMatch": {"$gt": 5, "$lt": 7}}}`, `{"a": [4, 8]}`, false},
		{`{"a": {"$elemMatch": {"$gt": 5, "$lt": 7}}}`, `{"a": [4, 6, 8]}`, true},
		{`{"a": {"$gt": "abc"}}`, `{"a": "abd"}`, true},
		{`{"a": {"$gt": "abc"}}`, `{"a": 5}`, false},
		{`{"a": {"$gte": null}}`, `{}`, true},
		{`{"a": {"$lte": null}}`, `{"a": null}`, true},
		{`{"a": {"$gt": null}}`, `{"a": 1}`, false},
		{`{"a": {"$gt": {"$minKey": 1}}}`, `{"a": 1}`, true},
		{`{"a": {"$gt": {"$minKey": 1}}}`, `{}`, true},
		{`{"a": {"$lt": {"$maxKey": 1}}}`, `{"a": "x"}`, true},
		{`{"a": {"$gt": {"$date": "2024-01-01T00:00:00Z"}}}`, `{"a": {"$date": "2024-06-01T00:00:00Z"}}`, true},
		{`{"a": {"$gt": {"$date": "2024-01-01T00:00:00Z"}}}`, `{"a": 99999999999999}`, false},
		{`{"a": {"$gt": {"$timestamp": {"t": 5, "i": 1}}}}`, `{"a": {"$timestamp": {"t": 5, "i": 2}}}`, true},
		{`{"a": {"$gt": [1]}}`, `{"a": [2]}`, true},
		{`{"a": {"$gt": {"b": 1}}}`, `{"a": {"b": 2}}`, true},
		{`{"a": {"$gt": 1}}`, `{"a": {"$numberDouble": "NaN"}}`, false},
		{`{"a": {"$lt": 1}}`, `{"a": {"$numberDouble": "NaN"}}`, false},
		{`{"a": {"$gte": {"$numberDouble": "NaN"}}}`, `{"a": {"$numberDouble": "NaN"}}`, true},
		{`{"a": {"$gt": {"$numberDouble": "NaN"}}}`, `{"a": 5}`, false},
		{`{"a": {"$eq": {"$numberDouble": "NaN"}}}`, `{"a": {"$numberDouble": "NaN"}}`, true},
		{`{"a": {"$in": [1, 2]}}`, `{"a": 2}`, true},
		{`{"a": {"$in": [1, 2]}}`, `{"a": 3}`, false},
		{`{"a": {"$in": [1, 2]}}`, `{"a": [3, 2]}`, true},
		{`{"a": {"$in": []}}`, `{"a": 1}`, false},
		{`{"a": {"$in": [null]}}`, `{}`, true},
		{`{"a": {"$in": [{"$regularExpression": {"pattern": "^x", "options": ""}}, 5]}}`, `{"a": "xyz"}`, true},
		{`{"a": {"$in": [{"$regularExpression": {"pattern": "^x", "options": ""}}, 5]}}`, `{"a": "yz"}`, false},
		{`{"a": {"$in": [[1, 2]]}}`, `{"a": [1, 2]}`, true},
		{`{"a": {"$nin": [1, 2]}}`, `{"a": 3}`, true},
		{`{"a": {"$nin": [1, 2]}}`, `{"a": [3, 1]}`, false},
		{`{"a": {"$nin": [1, 2]}}`, `{}`, true},
		{`{"a": {"$nin": [null]}}`, `{}`, false},
		{`{"a": {"$in": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}}`, `{"a": 17.0}`, true},
		{`{"a": {"$in": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}}`, `{"a": 21}`, false},
		{`{"a": {"$in": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,null]}}`, `{"b": 21}`, true},
		{`{"a": {"$in": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}}`, `{"a": [0, {"$numberLong": "20"}]}`, true},
	})
}

func TestMatchElementOperators(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"a": {"$exists": true}}`, `{"a": null}`, true},
		{`{"a": {"$exists": true}}`, `{}`, false},
		{`{"a": {"$exists": false}}`, `{}`, true},
		{`{"a": {"$exists": 0}}`, `{"a": 1}`, false},
		{`{"a": {"$exists": 1}}`, `{"a": 1}`, true},
		{`{"a": {"$type": "string"}}`, `{"a": "x"}`, true},
		{`{"a": {"$type": 2}}`, `{"a": "x"}`, true},
		{`{"a": {"$type": 2.0}}`, `{"a": "x"}`, true},
		{`{"a": {"$type": "string"}}`, `{"a": 1}`, false},
		{`{"a": {"$type": "number"}}`, `{"a": 1}`, true},
		{`{"a": {"$type": "number"}}`, `{"a": {"$numberDecimal": "1"}}`, true},
		{`{"a": {"$type": "number"}}`, `{"a": "1"}`, false},
		{`{"a": {"$type": "int"}}`, `{"a": 1}`, true},
		{`{"a": {"$type": "long"}}`, `{"a": 1}`, false},
		{`{"a": {"$type": "long"}}`, `{"a": {"$numberLong": "1"}}`, true},
		{`{"a": {"$type": "double"}}`, `{"a": 1.5}`, true},
		{`{"a": {"$type": "decimal"}}`, `{"a": {"$numberDecimal": "1"}}`, true},
		{`{"a": {"$type": "object"}}`, `{"a": {"b": 1}}`, true},
		{`{"a": {"$type": "array"}}`, `{"a": []}`, true},
		{`{"a": {"$type": "array"}}`, `{"a": [1]}`, true},
		{`{"a": {"$type": "array"}}`, `{"a": 1}`, false},
		{`{"a": {"$type": 4}}`, `{"a": [[1]]}`, true},
		{`{"a": {"$type": "int"}}`, `{"a": ["x", 1]}`, true},
		{`{"a": {"$type": "bool"}}`, `{"a": false}`, true},
		{`{"a": {"$type": "date"}}`, `{"a": {"$date": "2024-01-01T00:00:00Z"}}`, true},
		{`{"a": {"$type": "null"}}`, `{"a": null}`, true},
		{`{"a": {"$type": "null"}}`, `{}`, false},
		{`{"a": {"$type": "objectId"}}`, `{"a": {"$oid": "5f1d7f0e1c9d440000a1b2c3"}}`, true},
		{`{"a": {"$type": "timestamp"}}`, `{"a": {"$timestamp": {"t": 1, "i": 1}}}`, true},
		{`{"a": {"$type": "binData"}}`, `{"a": {"$binary": {"base64": "AQI=", "subType": "00"}}}`, true},
		{`{"a": {"$type": "regex"}}`, `{"a": {"$regularExpression": {"pattern": "x", "options": ""}}}`, true},
		{`{"a": {"$type": "minKey"}}`, `{"a": {"$minKey": 1}}`, true},
		{`{"a": {"$type": -1}}`, `{"a": {"$minKey": 1}}`, true},
		{`{"a": {"$type": "maxKey"}}`, `{"a": {"$maxKey": 1}}`, true},
		{`{"a": {"$type": ["string", "int"]}}`, `{"a": 3}`, true},
		{`{"a": {"$type": ["string", "bool"]}}`, `{"a": 3}`, false},
		{`{"a": {"$type": []}}`, `{"a": 3}`, false},
	})
}

func TestMatchLogical(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"$and": [{"a": 1}, {"b": 2}]}`, `{"a": 1, "b": 2}`, true},
		{`{"$and": [{"a": 1}, {"b": 2}]}`, `{"a": 1, "b": 3}`, false},
		{`{"$or": [{"a": 1}, {"b": 2}]}`, `{"a": 0, "b": 2}`, true},
		{`{"$or": [{"a": 1}, {"b": 2}]}`, `{"a": 0, "b": 3}`, false},
		{`{"$or": [{"a": 1}]}`, `{"a": 1}`, true},
		{`{"$nor": [{"a": 1}, {"b": 2}]}`, `{"a": 0, "b": 3}`, true},
		{`{"$nor": [{"a": 1}, {"b": 2}]}`, `{"a": 1}`, false},
		{`{"$and": [{"$or": [{"a": 1}, {"a": 2}]}, {"$or": [{"b": 1}, {"b": 2}]}]}`, `{"a": 2, "b": 1}`, true},
		{`{"a": {"$not": {"$gt": 5}}}`, `{"a": 3}`, true},
		{`{"a": {"$not": {"$gt": 5}}}`, `{"a": 6}`, false},
		{`{"a": {"$not": {"$gt": 5}}}`, `{}`, true},
		{`{"a": {"$not": {"$gt": 5}}}`, `{"a": "x"}`, true},
		{`{"a": {"$not": {"$gt": 5, "$lt": 10}}}`, `{"a": 7}`, false},
		{`{"a": {"$not": {"$gt": 5, "$lt": 10}}}`, `{"a": 11}`, true},
		{`{"a": {"$not": {"$regularExpression": {"pattern": "^x", "options": ""}}}}`, `{"a": "xy"}`, false},
		{`{"a": {"$not": {"$regularExpression": {"pattern": "^x", "options": ""}}}}`, `{"a": "yx"}`, true},
		{`{"a": {"$not": {"$regex": "^X", "$options": "i"}}}`, `{"a": "xy"}`, false},
		{`{"a": 1, "$comment": "hello"}`, `{"a": 1}`, true},
		{`{"$alwaysFalse": 1}`, `{"a": 1}`, false},
		{`{"$alwaysTrue": 1}`, `{"a": 1}`, true},
	})
}

func TestMatchRegex(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": "ABC"}`, false},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": "i"}}}`, `{"a": "ABC"}`, true},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": ["x", "abc"]}`, true},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": 1}`, false},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": {"$symbol": "abc"}}`, true},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, true},
		{`{"a": {"$regularExpression": {"pattern": "^ab", "options": ""}}}`, `{"a": {"$regularExpression": {"pattern": "^ab", "options": "i"}}}`, false},
		{`{"a": {"$regex": "b"}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regex": "B", "$options": "i"}}`, `{"a": "abc"}`, true},
		{`{"a": {"$options": "i", "$regex": "B"}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regex": {"$regularExpression": {"pattern": "B", "options": "i"}}}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regex": {"$regularExpression": {"pattern": "B", "options": ""}}, "$options": "i"}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regex": "^b", "$options": "m"}}`, `{"a": "a\nb"}`, true},
		{`{"a": {"$regex": "^b"}}`, `{"a": "a\nb"}`, false},
		{`{"a": {"$regex": "a.b", "$options": "s"}}`, `{"a": "a\nb"}`, true},
		{`{"a": {"$regex": "a.b"}}`, `{"a": "a\nb"}`, false},
		{`{"a": {"$regex": "a b # comment\n c", "$options": "x"}}`, `{"a": "abc"}`, true},
		{`{"a": {"$regex": "a[ ]b", "$options": "x"}}`, `{"a": "a b"}`, true},
		{`{"a": {"$regex": "a\\ b", "$options": "x"}}`, `{"a": "a b"}`, true},
		{`{"a": {"$regex": "^x", "$gt": "x5"}}`, `{"a": "x7"}`, true},
		{`{"a": {"$regex": "^x", "$gt": "x5"}}`, `{"a": "x3"}`, false},
		{`{"a.b": {"$regex": "^q"}}`, `{"a": [{"b": "w"}, {"b": "qq"}]}`, true},
	})
}

func TestMatchArrayOperators(t *testing.T) {
	t.Parallel()
	runMatchCases(t, []matchCase{
		{`{"a": {"$size": 2}}`, `{"a": [1, 2]}`, true},
		{`{"a": {"$size": 2}}`, `{"a": [1]}`, false},
		{`{"a": {"$size": 0}}`, `{"a": []}`, true},
		{`{"a": {"$size": 0}}`, `{}`, false},
		{`{"a": {"$size": 1}}`, `{"a": [[1, 2]]}`, true},
		{`{"a": {"$size": 2}}`, `{"a": [[1, 2]]}`, false},
		{`{"a.b": {"$size": 2}}`, `{"a": [{"b": [1]}, {"b": [1, 2]}]}`, true},
		{`{"a": {"$size": 2.0}}`, `{"a": [1, 2]}`, true},
		{`{"a": {"$all": [1, 2]}}`, `{"a": [2, 3, 1]}`, true},
		{`{"a": {"$all": [1, 2]}}`, `{"a": [2, 3]}`, false},
		{`{"a": {"$all": [1]}}`, `{"a": 1}`, true},
		{`{"a": {"$all": []}}`, `{"a": [1]}`, false},
		{`{"a": {"$all": [[1, 2]]}}`, `{"a": [[1, 2], 3]}`, true},
		{`{"a": {"$all": [[1, 2]]}}`, `{"a": [1, 2]}`, true},
		{`{"a": {"$all": [{"$regularExpression": {"pattern": "^x", "options": ""}}, "yy"]}}`, `{"a": ["xa", "yy"]}`, true},
		{`{"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": 2}}]}}`, `{"a": [{"b": 1}, {"c": 2}]}`, true},
		{`{"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": 2}}]}}`, `{"a": [{"b": 1}, {"c": 3}]}`, false},
		{`{"a": {"$elemMatch": {"b": 1, "c": 2}}}`, `{"a": [{"b": 1}, {"c": 2}]}`, false},
		{`{"a": {"$elemMatch": {"b": 1, "c": 2}}}`, `{"a": [{"b": 1, "c": 2}]}`, true},
		{`{"a": {"$elemMatch": {"b": {"$gt": 1}}}}`, `{"a": [{"b": 0}, {"b": 2}]}`, true},
		{`{"a": {"$elemMatch": {"b": 1}}}`, `{"a": {"b": 1}}`, false},
		{`{"a": {"$elemMatch": {}}}`, `{"a": [1, {"x": 1}]}`, true},
		{`{"a": {"$elemMatch": {}}}`, `{"a": [1, 2]}`, false},
		{`{"a": {"$elemMatch": {"$or": [{"b": 1}, {"c": 1}]}}}`, `{"a": [{"c": 1}]}`, true},
		{`{"a": {"$elemMatch": {"$gte": 80, "$lt": 85}}}`, `{"a": [82]}`, true},
		{`{"a": {"$elemMatch": {"$gte": 80, "$lt": 85}}}`, `{"a": [79, 86]}`, false},
		{`{"a": {"$elemMatch": {"$eq": 1}}}`, `{"a": [[1]]}`, false},
		{`{"a": {"$elemMatch": {"$ne": 1}}}`, `{"a": [1, 2]}`, true},
		{`{"a": {"$elemMatch": {"$ne": 1}}}`, `{"a": [1, 1]}`, false},
		{`{"a": {"$elemMatch": {"$not": {"$gt": 1}}}}`, `{"a": [5, 0]}`, true},
		{`{"a": {"$elemMatch": {"$in": [3, 4]}}}`, `{"a": [1, 4]}`, true},
		{`{"a": {"$elemMatch": {"$elemMatch": {"$eq": 2}}}}`, `{"a": [[1, 2]]}`, true},
		{`{"a": {"$elemMatch": {"$regex": "^x"}}}`, `{"a": ["y", "xx"]}`, true},
		{`{"a": {"$elemMatch": {"$exists": true}}}`, `{"a": [1]}`, true},
		{`{"a": {"$elemMatch": {"$type": "string"}}}`, `{"a": [1, "s"]}`, true},
		{`{"a": {"$elemMatch": {"$size": 1}}}`, `{"a": [[1]]}`, true},
		{`{"a.b": {"$elemMatch": {"c": 1}}}`, `{"a": [{"b": [{"c": 2}]}, {"b": [{"c": 1}]}]}`, true},
		{`{"a": {"$elemMatch": {"0": 1}}}`, `{"a": [[1, 2]]}`, true},
		{`{"a": {"$mod": [4, 0]}}`, `{"a": 8}`, true},
		{`{"a": {"$mod": [4, 0]}}`, `{"a": 9}`, false},
		{`{"a": {"$mod": [4, 1]}}`, `{"a": 9.7}`, true},
		{`{"a": {"$mod": [4, -1]}}`, `{"a": -9}`, true},
		{`{"a": {"$mod": [4, 1]}}`, `{"a": [2, 5]}`, true},
		{`{"a": {"$mod": [4, 0]}}`, `{"a": "8"}`, false},
		{`{"a": {"$mod": [4, 0]}}`, `{}`, false},
		{`{"a": {"$mod": [-1, 0]}}`, `{"a": {"$numberLong": "-9223372036854775808"}}`, true},
		{`{"a": {"$mod": [4.5, 1]}}`, `{"a": 5}`, true},
		{`{"a": {"$bitsAllSet": 5}}`, `{"a": 7}`, true},
		{`{"a": {"$bitsAllSet": 5}}`, `{"a": 6}`, false},
		{`{"a": {"$bitsAnySet": [0, 3]}}`, `{"a": 8}`, true},
		{`{"a": {"$bitsAllClear": [0, 1]}}`, `{"a": 4}`, true},
		{`{"a": {"$bitsAnyClear": [0, 1]}}`, `{"a": 3}`, false},
		{`{"a": {"$bitsAllSet": [63]}}`, `{"a": -1}`, true},
		{`{"a": {"$bitsAllSet": 1}}`, `{"a": 1.5}`, false},
		{`{"a": {"$bitsAllSet": {"$binary": {"base64": "Aw==", "subType": "00"}}}}`, `{"a": 3}`, true},
		{`{"a": {"$bitsAllSet": 3}}`, `{"a": {"$binary": {"base64": "Aw==", "subType": "00"}}}`, true},
		{`{"a": {"$bitsAllSet": 3}}`, `{"a": "x"}`, false},
	})
}

func TestMatchGoValues(t *testing.T) {
	t.Parallel()
	doc := bson.D{
		{Key: "n", Value: int64(5)},
		{Key: "f", Value: math.Inf(1)},
		{Key: "sub", Value: bson.D{{Key: "x", Value: bson.A{int32(1), int32(2)}}}},
	}
	for _, f := range []bson.D{
		{{Key: "n", Value: 5}},
		{{Key: "n", Value: bson.M{"$gt": 4.5}}},
		{{Key: "sub", Value: bson.M{"x": []any{1, 2}}}},
		{{Key: "sub.x", Value: []any{int32(1), int32(2)}}},
		{{Key: "f", Value: bson.D{{Key: "$gt", Value: math.MaxFloat64}}}},
	} {
		m, err := Compile(f)
		require.NoError(t, err)
		require.True(t, m.Match(doc), "%v", f)
	}
	var nilM *Matcher
	require.True(t, nilM.Match(doc))
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		filter string
		code   int32
		msg    string
	}{
		{`{"a": {"$foo": 1}}`, 2, "unknown operator: $foo"},
		{`{"$foo": 1}`, 2, "unknown top level operator: $foo"},
		{`{"a": {"$gt": 1, "b": 1}}`, 2, "unknown operator: b"},
		{`{"a": {"$in": 1}}`, 2, "$in needs an array"},
		{`{"a": {"$nin": {"x": 1}}}`, 2, "$nin needs an array"},
		{`{"a": {"$in": [{"$gt": 1}]}}`, 2, "cannot nest $ under $in"},
		{`{"a": {"$all": 1}}`, 2, "$all needs an array"},
		{`{"a": {"$all": [{"$elemMatch": {"b": 1}}, 1]}}`, 2, "$all/$elemMatch has to be consistent"},
		{`{"a": {"$all": [{"$gt": 1}]}}`, 2, "no $ expressions in $all"},
		{`{"$and": []}`, 2, "$and/$or/$nor must be a nonempty array"},
		{`{"$or": []}`, 2, "$and/$or/$nor must be a nonempty array"},
		{`{"$nor": 1}`, 2, "$nor must be an array"},
		{`{"$and": [1]}`, 2, "$or/$and/$nor entries need to be full objects"},
		{`{"a": {"$size": "x"}}`, 2, "$size needs a number"},
		{`{"a": {"$size": -1}}`, 2, "$size may not be negative"},
		{`{"a": {"$size": 1.5}}`, 2, "$size must be a whole number"},
		{`{"a": {"$mod": 1}}`, 2, "malformed mod, needs to be an array"},
		{`{"a": {"$mod": [1]}}`, 2, "malformed mod, not enough elements"},
		{`{"a": {"$mod": [1, 2, 3]}}`, 2, "malformed mod, too many elements"},
		{`{"a": {"$mod": [0, 1]}}`, 2, "divisor cannot be 0"},
		{`{"a": {"$mod": ["x", 1]}}`, 2, "malformed mod, divisor not a number"},
		{`{"a": {"$type": "foo"}}`, 2, "Unknown type name alias: foo"},
		{`{"a": {"$type": 99}}`, 2, "Invalid numerical type code: 99"},
		{`{"a": {"$type": true}}`, 14, "type must be represented as a number or a string"},
		{`{"a": {"$elemMatch": 1}}`, 2, "$elemMatch needs an Object"},
		{`{"a": {"$not": 1}}`, 2, "$not needs a regex or a document"},
		{`{"a": {"$not": {}}}`, 2, "$not cannot be empty"},
		{`{"a": {"$options": "i"}}`, 2, "$options needs a $regex"},
		{`{"a": {"$regex": 1}}`, 2, "$regex has to be a string"},
		{`{"a": {"$regex": "x", "$options": 1}}`, 2, "$options has to be a string"},
		{`{"a": {"$regex": {"$regularExpression": {"pattern": "x", "options": "i"}}, "$options": "m"}}`, 2, "options set in both $regex and $options"},
		{`{"a": {"$regex": "x", "$options": "q"}}`, 51108, "invalid flag in regex options: q"},
		{`{"a": {"$regex": "(?<=x)y"}}`, 51091, "Regular expression is invalid"},
		{`{"a": {"$regex": "("}}`, 51091, "Regular expression is invalid"},
		{`{"a": {"$bitsAllSet": -1}}`, 2, "bitmask must be non-negative"},
		{`{"a": {"$bitsAllSet": "x"}}`, 2, "takes an Array, a number, or a BinData"},
		{`{"$where": "this.a == 1"}`, 238, "$where"},
		{`{"$text": {"$search": "x"}}`, 27, "text index required for $text query"},
		{`{"$jsonSchema": {}}`, 238, "$jsonSchema"},
		{`{"a": {"$near": [0, 0]}}`, 238, "$near"},
		{`{"a": {"$geoWithin": {}}}`, 238, "$geoWithin"},
		{`{"a": {"$geoIntersects": {}}}`, 238, "$geoIntersects"},
		{`{"$alwaysTrue": 2}`, 2, "$alwaysTrue must be an integer value of 1"},
	}
	for _, c := range cases {
		t.Run(c.filter, func(t *testing.T) {
			t.Parallel()
			m, err := Compile(d(t, c.filter))
			require.Nil(t, m)
			var qe *mongoerr.Error
			require.True(t, errors.As(err, &qe), "%v", err)
			require.Equal(t, c.code, qe.Code)
			require.Contains(t, qe.Msg, c.msg)
			require.NotEmpty(t, qe.CodeName)
			require.Equal(t, qe.Msg, qe.Error())
		})
	}
}

func TestCompileDepthLimit(t *testing.T) {
	t.Parallel()
	f := bson.D{{Key: "a", Value: 1}}
	for range 150 {
		f = bson.D{{Key: "$and", Value: bson.A{f}}}
	}
	_, err := Compile(f)
	require.Error(t, err)
	require.Contains(t, err.Error(), "depth limit")
}

func TestExprHook(t *testing.T) {
	// Not parallel: it installs the package-wide $expr compiler.
	_, err := Compile(d(t, `{"$expr": {"$eq": ["$a", 1]}}`))
	require.Error(t, err)
	var qe *mongoerr.Error
	require.ErrorAs(t, err, &qe)
	require.Equal(t, int32(CodeNotImplemented), qe.Code)
	require.Contains(t, qe.Msg, "$expr")

	SetExprCompiler(func(expr any, _ bson.D) (func(bson.D) bool, error) {
		return func(doc bson.D) bool {
			v, _ := field(doc, "a")
			return v == int32(1)
		}, nil
	})
	t.Cleanup(func() { SetExprCompiler(nil) })
	m, err := Compile(d(t, `{"$expr": {"$eq": ["$a", 1]}, "b": 2}`))
	require.NoError(t, err)
	require.True(t, m.Match(d(t, `{"a": 1, "b": 2}`)))
	require.False(t, m.Match(d(t, `{"a": 2, "b": 2}`)))
}

func TestEqualities(t *testing.T) {
	t.Parallel()
	cases := []struct{ filter, want string }{
		{`{}`, `{}`},
		{`{"a": 1, "b.c": "x"}`, `{"a": 1, "b.c": "x"}`},
		{`{"a": {"$eq": 5}, "b": {"$gt": 1}}`, `{"a": 5}`},
		{`{"a": {"$gt": 1, "$eq": 3}}`, `{"a": 3}`},
		{`{"a": {"$regularExpression": {"pattern": "x", "options": ""}}, "b": 2}`, `{"b": 2}`},
		{`{"$and": [{"a": 1}, {"$and": [{"b": 2}]}], "c": {"d": 1}}`, `{"a": 1, "b": 2, "c": {"d": 1}}`},
		{`{"$or": [{"a": 1}], "x": null}`, `{"x": null}`},
		{`{"a": {"$in": [1]}}`, `{}`},
	}
	for _, c := range cases {
		got := Equalities(d(t, c.filter))
		want := d(t, c.want)
		if len(want) == 0 {
			require.Empty(t, got, c.filter)
			continue
		}
		require.Equal(t, want, got, c.filter)
	}
}

func TestCompareNumbersFastPath(t *testing.T) {
	t.Parallel()
	vals := []any{int32(-3), int32(0), int32(7), int64(7), int64(1 << 60), int64(-(1 << 60)), 7.0, 6.5, -3.0, math.Inf(1), math.Inf(-1), math.NaN(), int64(1<<53 + 1), float64(1 << 53)}
	for _, a := range vals {
		for _, b := range vals {
			require.Equal(t, bsonkit.CompareNumbers(a, b), compareNumbers(a, b), "%v vs %v", a, b)
		}
	}
}

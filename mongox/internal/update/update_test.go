package update

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

var fixedNow = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

type applyCase struct {
	name   string
	doc    string
	update string
	want   string
	insert bool
	code   int32  // expected error code, 0 for success
	msg    string // expected substring of the error message
	afs    []string
}

func runApplyCases(t *testing.T, cases []applyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := j(t, tc.doc)
			before := canon(t, doc)
			u, err := Parse(j(t, tc.update))
			if err == nil {
				var afs []bson.D
				for _, f := range tc.afs {
					afs = append(afs, j(t, f))
				}
				var got bson.D
				got, err = u.Apply(doc, ApplyOptions{IsInsert: tc.insert, Now: fixedNow, ArrayFilters: afs})
				if tc.code == 0 {
					require.NoError(t, err)
					requireSame(t, j(t, tc.want), got)
				}
			}
			if tc.code != 0 {
				requireCode(t, err, tc.code, tc.msg)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, before, canon(t, doc), "input document was mutated")
		})
	}
}

func TestSetUnset(t *testing.T) {
	t.Parallel()
	runApplyCases(t, []applyCase{
		{name: "set existing keeps position", doc: `{"_id": 1, "a": 1, "b": 2}`, update: `{"$set": {"a": "x"}}`, want: `{"_id": 1, "a": "x", "b": 2}`},
		{name: "set new appends", doc: `{"_id": 1, "b": 2}`, update: `{"$set": {"a": 1}}`, want: `{"_id": 1, "b": 2, "a": 1}`},
		{name: "new fields in lexicographic order", doc: `{"_id": 1}`, update: `{"$set": {"z": 1, "b": 2}, "$inc": {"a": 1}}`, want: `{"_id": 1, "a": 1, "b": 2, "z": 1}`},
		{name: "dotted creates subdocs", doc: `{"_id": 1}`, update: `{"$set": {"a.b.c": 1}}`, want: `{"_id": 1, "a": {"b": {"c": 1}}}`},
		{name: "dotted into existing", doc: `{"_id": 1, "a": {"x": 1}}`, update: `{"$set": {"a.y": 2}}`, want: `{"_id": 1, "a": {"x": 1, "y": 2}}`},
		{name: "numeric on missing creates doc", doc: `{"_id": 1}`, update: `{"$set": {"a.0": 1}}`, want: `{"_id": 1, "a": {"0": 1}}`},
		{name: "array index", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$set": {"a.1": 9}}`, want: `{"_id": 1, "a": [1, 9, 3]}`},
		{name: "array index pads with null", doc: `{"_id": 1, "a": [1]}`, update: `{"$set": {"a.3": 9}}`, want: `{"_id": 1, "a": [1, null, null, 9]}`},
		{name: "array index into doc element", doc: `{"_id": 1, "a": [{"b": 1}, {"b": 2}]}`, update: `{"$set": {"a.1.b": 5, "a.2.c": 6}}`, want: `{"_id": 1, "a": [{"b": 1}, {"b": 5}, {"c": 6}]}`},
		{name: "numeric components sort numerically", doc: `{"_id": 1, "a": []}`, update: `{"$set": {"a.10": 10, "a.2": 2}}`, want: `{"_id": 1, "a": [null, null, 2, null, null, null, null, null, null, null, 10]}`},
		{name: "set whole subdoc", doc: `{"_id": 1, "a": {"b": 1}}`, update: `{"$set": {"a": {"c": [1, 2]}}}`, want: `{"_id": 1, "a": {"c": [1, 2]}}`},
		{name: "set same _id ok", doc: `{"_id": 1, "a": 1}`, update: `{"$set": {"_id": 1, "a": 2}}`, want: `{"_id": 1, "a": 2}`},
		{name: "backfill limit", doc: `{"_id": 1, "a": []}`, update: `{"$set": {"a.1500001": 1}}`, code: CodeBadValue, msg: "can't backfill"},
		{name: "set through scalar", doc: `{"_id": 1, "a": 1}`, update: `{"$set": {"a.b": 1}}`, code: CodePathNotViable, msg: "Cannot create field 'b' in element {a: 1}"},
		{name: "set through null", doc: `{"_id": 1, "a": null}`, update: `{"$set": {"a.b": 1}}`, code: CodePathNotViable, msg: "Cannot create field 'b'"},
		{name: "set named field in array", doc: `{"_id": 1, "a": [1]}`, update: `{"$set": {"a.b": 1}}`, code: CodePathNotViable, msg: "Cannot create field 'b'"},
		{name: "unset", doc: `{"_id": 1, "a": 1, "b": 2}`, update: `{"$unset": {"a": ""}}`, want: `{"_id": 1, "b": 2}`},
		{name: "unset nested and missing", doc: `{"_id": 1, "a": {"b": 1, "c": 2}}`, update: `{"$unset": {"a.b": 1, "x.y": 1, "a.c.d": 1}}`, want: `{"_id": 1, "a": {"c": 2}}`},
		{name: "unset nested", doc: `{"_id": 1, "a": {"b": 1, "c": 2}}`, update: `{"$unset": {"a.b": 1, "x.y": 1, "a.z": 1}}`, want: `{"_id": 1, "a": {"c": 2}}`},
		{name: "unset through scalar is noop", doc: `{"_id": 1, "a": 1}`, update: `{"$unset": {"a.b": 1}}`, want: `{"_id": 1, "a": 1}`},
		{name: "unset array element leaves null", doc: `{"_id": 1, "a": [1, 2]}`, update: `{"$unset": {"a.0": 1}}`, want: `{"_id": 1, "a": [null, 2]}`},
		{name: "unset _id", doc: `{"_id": 1, "a": 1}`, update: `{"$unset": {"_id": 1}}`, code: CodeImmutableField, msg: "Performing an update on the path '_id' would modify the immutable field '_id'"},
		{name: "set different _id", doc: `{"_id": 1}`, update: `{"$set": {"_id": 2}}`, code: CodeImmutableField, msg: "immutable field '_id'"},
		{name: "set _id subfield", doc: `{"_id": {"a": 1}}`, update: `{"$set": {"_id.a": 2}}`, code: CodeImmutableField},
		{name: "set _id array", doc: `{"a": 1}`, update: `{"$set": {"_id": [1]}}`, code: CodeInvalidIDField},
		{name: "setOnInsert skipped on update", doc: `{"_id": 1}`, update: `{"$setOnInsert": {"a": 1}, "$set": {"b": 1}}`, want: `{"_id": 1, "b": 1}`},
		{name: "setOnInsert on insert", doc: `{"_id": 1}`, update: `{"$setOnInsert": {"a": 1}, "$set": {"b": 1}}`, insert: true, want: `{"_id": 1, "a": 1, "b": 1}`},
		{name: "insert moves _id first", doc: `{"x": 1}`, update: `{"$set": {"_id": 5}}`, insert: true, want: `{"_id": 5, "x": 1}`},
		{name: "currentDate true", doc: `{"_id": 1}`, update: `{"$currentDate": {"a": true}}`, want: `{"_id": 1, "a": {"$date": "2024-05-06T07:08:09Z"}}`},
		{name: "currentDate date", doc: `{"_id": 1}`, update: `{"$currentDate": {"a": {"$type": "date"}}}`, want: `{"_id": 1, "a": {"$date": "2024-05-06T07:08:09Z"}}`},
		{name: "currentDate timestamp", doc: `{"_id": 1}`, update: `{"$currentDate": {"a": {"$type": "timestamp"}}}`, want: `{"_id": 1, "a": {"$timestamp": {"t": 1714979289, "i": 1}}}`},
	})
}

func TestArithmetic(t *testing.T) {
	t.Parallel()
	runApplyCases(t, []applyCase{
		{name: "inc int32", doc: `{"_id": 1, "a": 1}`, update: `{"$inc": {"a": 2}}`, want: `{"_id": 1, "a": 3}`},
		{name: "inc missing", doc: `{"_id": 1}`, update: `{"$inc": {"a": -2}}`, want: `{"_id": 1, "a": -2}`},
		{name: "inc int32 overflow to int64", doc: `{"_id": 1, "a": 2147483647}`, update: `{"$inc": {"a": 1}}`, want: `{"_id": 1, "a": {"$numberLong": "2147483648"}}`},
		{name: "inc int64", doc: `{"_id": 1, "a": {"$numberLong": "5"}}`, update: `{"$inc": {"a": 1}}`, want: `{"_id": 1, "a": {"$numberLong": "6"}}`},
		{name: "inc int64 small stays int64", doc: `{"_id": 1, "a": 1}`, update: `{"$inc": {"a": {"$numberLong": "1"}}}`, want: `{"_id": 1, "a": {"$numberLong": "2"}}`},
		{name: "inc int64 overflow", doc: `{"_id": 1, "a": {"$numberLong": "9223372036854775807"}}`, update: `{"$inc": {"a": 1}}`, code: CodeBadValue, msg: "Failed to apply $inc operations to current value"},
		{name: "inc double", doc: `{"_id": 1, "a": 1}`, update: `{"$inc": {"a": 0.5}}`, want: `{"_id": 1, "a": 1.5}`},
		{name: "inc decimal", doc: `{"_id": 1, "a": {"$numberDecimal": "1.1"}}`, update: `{"$inc": {"a": 2}}`, want: `{"_id": 1, "a": {"$numberDecimal": "3.1"}}`},
		{name: "inc decimal by double", doc: `{"_id": 1, "a": {"$numberDecimal": "0.1"}}`, update: `{"$inc": {"a": 0.2}}`, want: `{"_id": 1, "a": {"$numberDecimal": "0.3"}}`},
		{name: "inc non numeric", doc: `{"_id": 1, "a": "x"}`, update: `{"$inc": {"a": 1}}`, code: CodeTypeMismatch, msg: "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 'a' of non-numeric type string"},
		{name: "inc non numeric arg", doc: `{"_id": 1}`, update: `{"$inc": {"a": "1"}}`, code: CodeTypeMismatch, msg: "Cannot increment with non-numeric argument"},
		{name: "mul", doc: `{"_id": 1, "a": 3}`, update: `{"$mul": {"a": 4}}`, want: `{"_id": 1, "a": 12}`},
		{name: "mul missing gives typed zero", doc: `{"_id": 1}`, update: `{"$mul": {"a": 2.5, "b": {"$numberLong": "3"}}}`, want: `{"_id": 1, "a": 0.0, "b": {"$numberLong": "0"}}`},
		{name: "mul int32 overflow", doc: `{"_id": 1, "a": 65536}`, update: `{"$mul": {"a": 65536}}`, want: `{"_id": 1, "a": {"$numberLong": "4294967296"}}`},
		{name: "mul int64 overflow", doc: `{"_id": 1, "a": {"$numberLong": "4611686018427387904"}}`, update: `{"$mul": {"a": 4}}`, code: CodeBadValue, msg: "$mul"},
		{name: "mul decimal", doc: `{"_id": 1, "a": {"$numberDecimal": "1.5"}}`, update: `{"$mul": {"a": {"$numberDecimal": "2.0"}}}`, want: `{"_id": 1, "a": {"$numberDecimal": "3.00"}}`},
		{name: "mul non numeric", doc: `{"_id": 1, "a": [1]}`, update: `{"$mul": {"a": 2}}`, code: CodeTypeMismatch, msg: "Cannot apply $mul to a value of non-numeric type"},
		{name: "mul non numeric arg", doc: `{"_id": 1}`, update: `{"$mul": {"a": null}}`, code: CodeTypeMismatch, msg: "Cannot multiply with non-numeric argument"},
		{name: "min", doc: `{"_id": 1, "a": 5, "b": 5}`, update: `{"$min": {"a": 3, "b": 7, "c": 1}}`, want: `{"_id": 1, "a": 3, "b": 5, "c": 1}`},
		{name: "max", doc: `{"_id": 1, "a": 5, "b": 5}`, update: `{"$max": {"a": 3, "b": 7.5}}`, want: `{"_id": 1, "a": 5, "b": 7.5}`},
		{name: "max across types", doc: `{"_id": 1, "a": 5}`, update: `{"$max": {"a": "x"}}`, want: `{"_id": 1, "a": "x"}`},
		{name: "min dates", doc: `{"_id": 1, "a": {"$date": "2024-01-01T00:00:00Z"}}`, update: `{"$min": {"a": {"$date": "2023-01-01T00:00:00Z"}}}`, want: `{"_id": 1, "a": {"$date": "2023-01-01T00:00:00Z"}}`},
	})
}

func TestRename(t *testing.T) {
	t.Parallel()
	runApplyCases(t, []applyCase{
		{name: "rename moves to end", doc: `{"_id": 1, "a": 1, "b": 2}`, update: `{"$rename": {"a": "c"}}`, want: `{"_id": 1, "b": 2, "c": 1}`},
		{name: "rename overwrites", doc: `{"_id": 1, "a": 1, "b": 2}`, update: `{"$rename": {"a": "b"}}`, want: `{"_id": 1, "b": 1}`},
		{name: "rename missing source", doc: `{"_id": 1, "b": 2}`, update: `{"$rename": {"a": "c"}}`, want: `{"_id": 1, "b": 2}`},
		{name: "rename nested", doc: `{"_id": 1, "a": {"b": 1, "c": 2}}`, update: `{"$rename": {"a.b": "x.y"}}`, want: `{"_id": 1, "a": {"c": 2}, "x": {"y": 1}}`},
		{name: "rename same", doc: `{"_id": 1}`, update: `{"$rename": {"a": "a"}}`, code: CodeBadValue, msg: "must differ"},
		{name: "rename same path", doc: `{"_id": 1}`, update: `{"$rename": {"a": "a.b"}}`, code: CodeBadValue, msg: "same path"},
		{name: "rename non string", doc: `{"_id": 1}`, update: `{"$rename": {"a": 1}}`, code: CodeBadValue, msg: "must be a string"},
		{name: "rename through array", doc: `{"_id": 1, "a": [{"b": 1}]}`, update: `{"$rename": {"a.0.b": "c"}}`, code: CodeBadValue, msg: "source field cannot be an array element"},
		{name: "rename conflicts with set", doc: `{"_id": 1}`, update: `{"$rename": {"a": "b"}, "$set": {"b": 1}}`, code: CodeConflictingUpdateOperators, msg: "Updating the path 'b' would create a conflict at 'b'"},
		{name: "rename _id", doc: `{"_id": 1}`, update: `{"$rename": {"_id": "b"}}`, code: CodeImmutableField},
	})
}

func TestArrayOperators(t *testing.T) {
	t.Parallel()
	runApplyCases(t, []applyCase{
		{name: "push", doc: `{"_id": 1, "a": [1]}`, update: `{"$push": {"a": 2}}`, want: `{"_id": 1, "a": [1, 2]}`},
		{name: "push missing", doc: `{"_id": 1}`, update: `{"$push": {"a": [2]}}`, want: `{"_id": 1, "a": [[2]]}`},
		{name: "push doc without each", doc: `{"_id": 1}`, update: `{"$push": {"a": {"x": 1}}}`, want: `{"_id": 1, "a": [{"x": 1}]}`},
		{name: "push each", doc: `{"_id": 1, "a": [1]}`, update: `{"$push": {"a": {"$each": [2, 3]}}}`, want: `{"_id": 1, "a": [1, 2, 3]}`},
		{name: "push position", doc: `{"_id": 1, "a": [1, 4]}`, update: `{"$push": {"a": {"$each": [2, 3], "$position": 1}}}`, want: `{"_id": 1, "a": [1, 2, 3, 4]}`},
		{name: "push negative position", doc: `{"_id": 1, "a": [1, 2, 9]}`, update: `{"$push": {"a": {"$each": [3], "$position": -1}}}`, want: `{"_id": 1, "a": [1, 2, 3, 9]}`},
		{name: "push big position", doc: `{"_id": 1, "a": [1]}`, update: `{"$push": {"a": {"$each": [3], "$position": 10}}}`, want: `{"_id": 1, "a": [1, 3]}`},
		{name: "push slice last", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$push": {"a": {"$each": [4], "$slice": -2}}}`, want: `{"_id": 1, "a": [3, 4]}`},
		{name: "push slice first", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$push": {"a": {"$each": [4], "$slice": 2}}}`, want: `{"_id": 1, "a": [1, 2]}`},
		{name: "push slice zero", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$push": {"a": {"$each": [], "$slice": 0}}}`, want: `{"_id": 1, "a": []}`},
		{name: "push sort desc", doc: `{"_id": 1, "a": [3, 1]}`, update: `{"$push": {"a": {"$each": [2], "$sort": -1}}}`, want: `{"_id": 1, "a": [3, 2, 1]}`},
		{name: "push sort by field then slice", doc: `{"_id": 1, "a": [{"s": 5}, {"s": 1}]}`, update: `{"$push": {"a": {"$each": [{"s": 3}], "$sort": {"s": 1}, "$slice": 2}}}`, want: `{"_id": 1, "a": [{"s": 1}, {"s": 3}]}`},
		{name: "push to non array", doc: `{"_id": 1, "a": 1}`, update: `{"$push": {"a": 2}}`, code: CodeBadValue, msg: "The field 'a' must be an array but is of type int in document {_id: 1}"},
		{name: "push each not array", doc: `{"_id": 1}`, update: `{"$push": {"a": {"$each": 1}}}`, code: CodeBadValue, msg: "$each"},
		{name: "push bad clause", doc: `{"_id": 1}`, update: `{"$push": {"a": {"$each": [1], "$foo": 1}}}`, code: CodeBadValue, msg: "Unrecognized clause in $push: $foo"},
		{name: "push bad sort", doc: `{"_id": 1}`, update: `{"$push": {"a": {"$each": [1], "$sort": 2}}}`, code: CodeBadValue, msg: "1 or -1"},
		{name: "push bad slice", doc: `{"_id": 1}`, update: `{"$push": {"a": {"$each": [1], "$slice": 1.5}}}`, code: CodeBadValue, msg: "$slice"},
		{name: "addToSet", doc: `{"_id": 1, "a": [1, 2]}`, update: `{"$addToSet": {"a": 2}}`, want: `{"_id": 1, "a": [1, 2]}`},
		{name: "addToSet numeric equality", doc: `{"_id": 1, "a": [1, 2]}`, update: `{"$addToSet": {"a": 2.0}}`, want: `{"_id": 1, "a": [1, 2]}`},
		{name: "addToSet each", doc: `{"_id": 1, "a": [1]}`, update: `{"$addToSet": {"a": {"$each": [1, 3, 3, {"x": 1}]}}}`, want: `{"_id": 1, "a": [1, 3, {"x": 1}]}`},
		{name: "addToSet missing", doc: `{"_id": 1}`, update: `{"$addToSet": {"a": {"$each": []}}}`, want: `{"_id": 1, "a": []}`},
		{name: "addToSet non array", doc: `{"_id": 1, "a": "s"}`, update: `{"$addToSet": {"a": 1}}`, code: CodeBadValue, msg: "Cannot apply $addToSet to non-array field. Field named 'a' has non-array type string"},
		{name: "pop last", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$pop": {"a": 1}}`, want: `{"_id": 1, "a": [1, 2]}`},
		{name: "pop first", doc: `{"_id": 1, "a": [1, 2, 3]}`, update: `{"$pop": {"a": -1}}`, want: `{"_id": 1, "a": [2, 3]}`},
		{name: "pop empty and missing", doc: `{"_id": 1, "a": []}`, update: `{"$pop": {"a": 1, "b": 1}}`, want: `{"_id": 1, "a": []}`},
		{name: "pop bad arg", doc: `{"_id": 1}`, update: `{"$pop": {"a": 2}}`, code: CodeFailedToParse, msg: "$pop expects 1 or -1, found: 2"},
		{name: "pop non array", doc: `{"_id": 1, "a": 1}`, update: `{"$pop": {"a": 1}}`, code: CodeTypeMismatch, msg: "Path 'a' contains an element of non-array type 'int'"},
		{name: "pullAll", doc: `{"_id": 1, "a": [1, 2, 1, 3]}`, update: `{"$pullAll": {"a": [1, 3.0]}}`, want: `{"_id": 1, "a": [2]}`},
		{name: "pullAll bad arg", doc: `{"_id": 1}`, update: `{"$pullAll": {"a": 1}}`, code: CodeBadValue, msg: "$pullAll requires an array argument"},
		{name: "pull value", doc: `{"_id": 1, "a": [1, 2, 1]}`, update: `{"$pull": {"a": 1}}`, want: `{"_id": 1, "a": [2]}`},
		{name: "pull array value", doc: `{"_id": 1, "a": [[1], [2]]}`, update: `{"$pull": {"a": [1]}}`, want: `{"_id": 1, "a": [[2]]}`},
		{name: "pull operator condition", doc: `{"_id": 1, "a": [3, 6, 9, "x"]}`, update: `{"$pull": {"a": {"$gte": 6}}}`, want: `{"_id": 1, "a": [3, "x"]}`},
		{name: "pull in", doc: `{"_id": 1, "a": ["a", "b", "c"]}`, update: `{"$pull": {"a": {"$in": ["a", "c"]}}}`, want: `{"_id": 1, "a": ["b"]}`},
		{name: "pull document condition", doc: `{"_id": 1, "a": [{"x": 1, "y": 1}, {"x": 2}, 5]}`, update: `{"$pull": {"a": {"x": 1}}}`, want: `{"_id": 1, "a": [{"x": 2}, 5]}`},
		{name: "pull document condition with operator", doc: `{"_id": 1, "a": [{"x": 1}, {"x": 7}]}`, update: `{"$pull": {"a": {"x": {"$gt": 5}}}}`, want: `{"_id": 1, "a": [{"x": 1}]}`},
		{name: "pull missing", doc: `{"_id": 1}`, update: `{"$pull": {"a": 1}}`, want: `{"_id": 1}`},
		{name: "pull non array", doc: `{"_id": 1, "a": 1}`, update: `{"$pull": {"a": 1}}`, code: CodeBadValue, msg: "Cannot apply $pull to a non-array value"},
		{name: "pull nested path", doc: `{"_id": 1, "a": {"b": [1, 2]}}`, update: `{"$pull": {"a.b": 2}}`, want: `{"_id": 1, "a": {"b": [1]}}`},
		{name: "all positional", doc: `{"_id": 1, "a": [{"b": 1}, {"b": 2}]}`, update: `{"$inc": {"a.$[].b": 10}}`, want: `{"_id": 1, "a": [{"b": 11}, {"b": 12}]}`},
		{name: "all positional leaf", doc: `{"_id": 1, "a": [1, 2]}`, update: `{"$set": {"a.$[]": 0}}`, want: `{"_id": 1, "a": [0, 0]}`},
		{name: "all positional missing", doc: `{"_id": 1}`, update: `{"$set": {"a.$[].b": 0}}`, code: CodeBadValue, msg: "The path 'a' must exist in the document in order to apply array updates."},
		{name: "all positional non array", doc: `{"_id": 1, "a": {"b": 1}}`, update: `{"$set": {"a.$[].b": 0}}`, code: CodeBadValue, msg: "Cannot apply array updates to non-array element"},
		{name: "filtered positional", doc: `{"_id": 1, "a": [1, 5, 10]}`, update: `{"$set": {"a.$[x]": 0}}`, afs: []string{`{"x": {"$gte": 5}}`}, want: `{"_id": 1, "a": [1, 0, 0]}`},
		{name: "filtered positional field", doc: `{"_id": 1, "a": [{"g": 80, "n": 0}, {"g": 90, "n": 0}]}`, update: `{"$inc": {"a.$[e].n": 1}}`, afs: []string{`{"e.g": {"$gte": 85}}`}, want: `{"_id": 1, "a": [{"g": 80, "n": 0}, {"g": 90, "n": 1}]}`},
		{name: "filtered positional no filter", doc: `{"_id": 1, "a": [1]}`, update: `{"$set": {"a.$[x]": 0}}`, code: CodeBadValue, msg: "No array filter found for identifier 'x'"},
		{name: "unused array filter", doc: `{"_id": 1, "a": [1]}`, update: `{"$set": {"a.0": 0}}`, afs: []string{`{"x": 1}`}, code: CodeFailedToParse, msg: "was not used"},
		{name: "positional dollar without a query match", doc: `{"_id": 1, "a": [1]}`, update: `{"$set": {"a.$": 0}}`, code: CodeBadValue, msg: "The positional operator did not find the match needed from the query."},
		{name: "positional dollar first", doc: `{"_id": 1}`, update: `{"$set": {"$.a": 0}}`, code: CodeBadValue, msg: "first position"},
		{name: "positional dollar twice", doc: `{"_id": 1}`, update: `{"$set": {"a.$.b.$": 0}}`, code: CodeBadValue, msg: "Too many positional"},
	})
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		update any
		code   int32
		msg    string
	}{
		{"unknown operator", bson.D{{Key: "$foo", Value: bson.D{{Key: "a", Value: 1}}}}, CodeFailedToParse, "Unknown modifier: $foo"},
		{"mixed operator and field", bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}, {Key: "b", Value: 1}}, CodeFailedToParse, "Unknown modifier: b"},
		{"replacement with dollar key", bson.D{{Key: "a", Value: 1}, {Key: "$set", Value: bson.D{}}}, CodeDollarPrefixedFieldName, "$set"},
		{"operator value not a document", bson.D{{Key: "$set", Value: 1}}, CodeFailedToParse, "Modifiers operate on fields but we found type int instead"},
		{"conflict same path", bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}}}, {Key: "$inc", Value: bson.D{{Key: "a", Value: 1}}}}, CodeConflictingUpdateOperators, "Updating the path 'a' would create a conflict at 'a'"},
		{"conflict prefix", bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 1}, {Key: "a.b", Value: 1}}}}, CodeConflictingUpdateOperators, "Updating the path 'a.b' would create a conflict at 'a'"},
		{"conflict prefix reversed", bson.D{{Key: "$set", Value: bson.D{{Key: "a.b", Value: 1}}}, {Key: "$unset", Value: bson.D{{Key: "a", Value: 1}}}}, CodeConflictingUpdateOperators, "Updating the path 'a' would create a conflict at 'a'"},
		{"empty field name", bson.D{{Key: "$set", Value: bson.D{{Key: "a..b", Value: 1}}}}, CodeEmptyFieldName, "empty field name"},
		{"dollar field", bson.D{{Key: "$set", Value: bson.D{{Key: "$x", Value: 1}}}}, CodeDollarPrefixedFieldName, "$x"},
		{"pipeline stage not allowed", bson.A{bson.D{{Key: "$match", Value: bson.D{}}}}, CodeInvalidOptions, "$match is not allowed to be used within an update"},
		{"pipeline element not a stage", bson.A{int32(1)}, CodeFailedToParse, "exactly one field"},
		{"wrong type", "x", CodeFailedToParse, "Update argument must be either an object or an array"},
		{"currentDate bad type", bson.D{{Key: "$currentDate", Value: bson.D{{Key: "a", Value: bson.D{{Key: "$type", Value: "x"}}}}}}, CodeBadValue, "'date' or 'timestamp'"},
		{"currentDate bad value", bson.D{{Key: "$currentDate", Value: bson.D{{Key: "a", Value: 1}}}}, CodeBadValue, "$currentDate"},
		{"replacement array _id", bson.D{{Key: "_id", Value: bson.A{1}}}, CodeInvalidIDField, "_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.update)
			requireCode(t, err, tc.code, tc.msg)
		})
	}
}

func TestReplacement(t *testing.T) {
	t.Parallel()
	u := mustParse(t, `{"b": 2, "a": 1}`)
	require.True(t, u.IsReplacement())
	doc := j(t, `{"x": 1, "_id": 7}`)
	got, err := u.Apply(doc, ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 7, "b": 2, "a": 1}`), got)
	requireSame(t, j(t, `{"x": 1, "_id": 7}`), doc)

	u = mustParse(t, `{"b": 2, "_id": 7}`)
	got, err = u.Apply(j(t, `{"_id": 7, "a": 1}`), ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 7, "b": 2}`), got)

	_, err = u.Apply(j(t, `{"_id": 8}`), ApplyOptions{})
	requireCode(t, err, CodeImmutableField, "After applying the update, the (immutable) field '_id' was found to have been altered to _id: 7")

	// No _id in the old document (upsert insert): the replacement's _id leads.
	got, err = u.Apply(bson.D{}, ApplyOptions{IsInsert: true})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 7, "b": 2}`), got)

	// The empty document is a replacement keeping only _id.
	u, err = Parse(bson.D{})
	require.NoError(t, err)
	require.True(t, u.IsReplacement())
	got, err = u.Apply(j(t, `{"_id": 1, "a": 1}`), ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 1}`), got)

	// Operator updates are not replacements; bson.M is accepted.
	u, err = Parse(bson.M{"$set": bson.M{"a": int32(1)}})
	require.NoError(t, err)
	require.False(t, u.IsReplacement())
}

func TestApplyDoesNotAliasUpdateValues(t *testing.T) {
	t.Parallel()
	u := mustParse(t, `{"$set": {"a": {"b": [1]}}, "$push": {"c": {"$each": [{"x": 1}]}}}`)
	first, err := u.Apply(bson.D{}, ApplyOptions{})
	require.NoError(t, err)
	// Mutating one result must not leak into the next.
	first[0].Value.(bson.D)[0].Value.(bson.A)[0] = "changed"
	first[1].Value.(bson.A)[0].(bson.D)[0].Value = "changed"
	second, err := u.Apply(bson.D{}, ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"a": {"b": [1]}, "c": [{"x": 1}]}`), second)
}

func TestApplyNestedNoMutation(t *testing.T) {
	t.Parallel()
	doc := j(t, `{"_id": 1, "a": {"b": [1, {"c": 1}]}, "d": [3, 2]}`)
	snapshot := bsonkit.CopyDoc(doc)
	_, err := Parse(j(t, `{"$set": {"a.b.1.c": 2, "a.x": 1}, "$pop": {"a.b": 1}}`))
	requireCode(t, err, CodeConflictingUpdateOperators, "Updating the path 'a.b' would create a conflict at 'a.b'")
	u := mustParse(t, `{"$set": {"a.b.1.c": 2, "a.x": 1}, "$push": {"d": {"$each": [1], "$sort": 1}}}`)
	got, err := u.Apply(doc, ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 1, "a": {"b": [1, {"c": 2}], "x": 1}, "d": [1, 2, 3]}`), got)
	requireSame(t, snapshot, doc)
}

func TestUpsertSeed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, filter, want string
		code               int32
	}{
		{name: "plain", filter: `{"a": 1, "b": "x"}`, want: `{"a": 1, "b": "x"}`},
		{name: "id first", filter: `{"a": 1, "_id": 5}`, want: `{"_id": 5, "a": 1}`},
		{name: "eq and and", filter: `{"a": {"$eq": 1}, "$and": [{"b": 2}, {"c": {"$gt": 1}}]}`, want: `{"a": 1, "b": 2}`},
		{name: "operators skipped", filter: `{"a": {"$gt": 1}, "b": {"$in": [1, 2]}, "$or": [{"c": 1}]}`, want: `{}`},
		{name: "dotted", filter: `{"a.b": 1, "a.c": 2, "d.e.f": 3}`, want: `{"a": {"b": 1, "c": 2}, "d": {"e": {"f": 3}}}`},
		{name: "subdocument value", filter: `{"a": {"x": 1}}`, want: `{"a": {"x": 1}}`},
		{name: "regex skipped", filter: `{"a": {"$regularExpression": {"pattern": "x", "options": ""}}, "b": 1}`, want: `{"b": 1}`},
		{name: "twice", filter: `{"a": 1, "$and": [{"a": 2}]}`, code: CodeNotSingleValueField},
		{name: "prefix", filter: `{"a": {"b": 1}, "a.c": 2}`, code: CodeNotSingleValueField},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := UpsertSeed(j(t, tc.filter))
			if tc.code != 0 {
				requireCode(t, err, tc.code, "cannot infer query fields to set")
				return
			}
			require.NoError(t, err)
			requireSame(t, j(t, tc.want), got)
		})
	}
}

func TestUpsertFlow(t *testing.T) {
	t.Parallel()
	seed, err := UpsertSeed(j(t, `{"key": "k1", "n": {"$gt": 3}}`))
	require.NoError(t, err)
	u := mustParse(t, `{"$setOnInsert": {"created": 1}, "$inc": {"count": 1}}`)
	got, err := u.Apply(seed, ApplyOptions{IsInsert: true})
	require.NoError(t, err)
	requireSame(t, j(t, `{"key": "k1", "count": 1, "created": 1}`), got)
}

func TestDiff(t *testing.T) {
	t.Parallel()
	old := j(t, `{"_id": 1, "a": 1, "b": {"c": 1, "d": 2}, "e": [1, 2], "f": 1, "g": {"h": 1}, "i": 1}`)
	nw := j(t, `{"_id": 1, "a": 2, "b": {"c": 1, "x": 3}, "e": [1, 2, 3], "g": 5, "i": 1.0, "k": {"l": 1}}`)
	updated, removed := Diff(old, nw)
	requireSame(t, j(t, `{"a": 2, "b.x": 3, "e": [1, 2, 3], "g": 5, "i": 1.0, "k": {"l": 1}}`), updated)
	require.Equal(t, []string{"b.d", "f"}, removed)

	updated, removed = Diff(old, old)
	require.Empty(t, updated)
	require.NotNil(t, updated)
	require.Empty(t, removed)
	require.NotNil(t, removed)
}

func TestPipelineUpdate(t *testing.T) {
	t.Parallel()
	u, err := Parse(bson.A{
		j(t, `{"$set": {"total": {"$add": ["$a", "$b"]}, "at": "$$NOW"}}`),
		j(t, `{"$unset": "b"}`),
	})
	require.NoError(t, err)
	require.False(t, u.IsReplacement())
	doc := j(t, `{"_id": 1, "a": 2, "b": 3}`)
	got, err := u.Apply(doc, ApplyOptions{Now: fixedNow})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 1, "a": 2, "total": 5, "at": {"$date": "2024-05-06T07:08:09Z"}}`), got)
	requireSame(t, j(t, `{"_id": 1, "a": 2, "b": 3}`), doc)

	// $replaceWith without _id keeps the original _id.
	u, err = Parse(bson.A{j(t, `{"$replaceWith": {"x": "$a"}}`)})
	require.NoError(t, err)
	got, err = u.Apply(doc, ApplyOptions{})
	require.NoError(t, err)
	requireSame(t, j(t, `{"_id": 1, "x": 2}`), got)

	u, err = Parse(bson.A{j(t, `{"$set": {"_id": 9}}`)})
	require.NoError(t, err)
	_, err = u.Apply(doc, ApplyOptions{})
	requireCode(t, err, CodeImmutableField, "_id")
}

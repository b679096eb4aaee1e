package pipeline

import (
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

type stageCase struct {
	name     string
	pipeline string
	input    string // defaults to stageInput
	want     string // JSON array of documents (extended JSON)
	code     int32
}

const stageInput = `[
 {"_id": 1, "item": "abc", "price": 10, "qty": 2, "tags": ["a", "b"], "size": {"h": 14, "w": 21, "uom": "cm"}},
 {"_id": 2, "item": "jkl", "price": 20, "qty": 1, "tags": [], "size": {"h": 8, "w": 11, "uom": "in"}},
 {"_id": 3, "item": "xyz", "price": 5, "qty": 10, "tags": null},
 {"_id": 4, "item": "abc", "price": 10, "qty": 5, "tags": "c"}
]`

func runStageCases(t *testing.T, cases []stageCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := tc.input
			if in == "" {
				in = stageInput
			}
			out, err := run(t, tc.pipeline, in)
			if tc.code != 0 {
				requireCode(t, err, tc.code)
				return
			}
			require.NoError(t, err)
			want := docs(t, tc.want)
			require.Equal(t, js(t, want), js(t, out))
		})
	}
}

func TestStagesBasic(t *testing.T) {
	t.Parallel()
	runStageCases(t, []stageCase{
		{name: "match", pipeline: `[{"$match": {"item": "abc"}}, {"$project": {"_id": 1}}]`, want: `[{"_id": 1}, {"_id": 4}]`},
		{name: "match expr", pipeline: `[{"$match": {"$expr": {"$gt": [{"$multiply": ["$price", "$qty"]}, 40]}}}, {"$project": {"_id": 1}}]`, want: `[{"_id": 3}, {"_id": 4}]`},
		{name: "match bad filter", pipeline: `[{"$match": {"a": {"$bogus": 1}}}]`, code: 2},
		{name: "match not object", pipeline: `[{"$match": 1}]`, code: 15959},
		{name: "sort", pipeline: `[{"$sort": {"price": -1, "_id": 1}}, {"$project": {"_id": 1}}]`, want: `[{"_id": 2}, {"_id": 1}, {"_id": 4}, {"_id": 3}]`},
		{name: "sort missing first", pipeline: `[{"$sort": {"size.h": 1}}, {"$project": {"_id": 1}}]`, want: `[{"_id": 3}, {"_id": 4}, {"_id": 2}, {"_id": 1}]`},
		{name: "sort empty", pipeline: `[{"$sort": {}}]`, code: 15976},
		{name: "skip limit", pipeline: `[{"$skip": 1}, {"$limit": 2}, {"$project": {"_id": 1}}]`, want: `[{"_id": 2}, {"_id": 3}]`},
		{name: "skip all", pipeline: `[{"$skip": 10}]`, want: `[]`},
		{name: "limit long", pipeline: `[{"$limit": {"$numberLong": "1"}}, {"$project": {"_id": 1}}]`, want: `[{"_id": 1}]`},
		{name: "skip negative", pipeline: `[{"$skip": -1}]`, code: 15956},
		{name: "limit zero", pipeline: `[{"$limit": 0}]`, code: 15958},
		{name: "limit string", pipeline: `[{"$limit": "1"}]`, code: 15957},
		{name: "count", pipeline: `[{"$match": {"item": "abc"}}, {"$count": "n"}]`, want: `[{"n": 2}]`},
		{name: "count none", pipeline: `[{"$match": {"item": "nope"}}, {"$count": "n"}]`, want: `[]`},
		{name: "count dollar", pipeline: `[{"$count": "$n"}]`, code: 40158},
		{name: "count dot", pipeline: `[{"$count": "a.b"}]`, code: 40160},
		{name: "count empty", pipeline: `[{"$count": ""}]`, code: 40157},
		{name: "replaceRoot", pipeline: `[{"$match": {"_id": 1}}, {"$replaceRoot": {"newRoot": "$size"}}]`, want: `[{"h": 14, "w": 21, "uom": "cm"}]`},
		{name: "replaceWith merge", pipeline: `[{"$match": {"_id": 2}}, {"$replaceWith": {"$mergeObjects": [{"id": "$_id"}, "$size"]}}]`, want: `[{"id": 2, "h": 8, "w": 11, "uom": "in"}]`},
		{name: "replaceRoot non-object", pipeline: `[{"$replaceRoot": {"newRoot": "$size"}}]`, code: 40228},
		{name: "replaceRoot missing newRoot", pipeline: `[{"$replaceRoot": {}}]`, code: 40414},
		{name: "sortByCount", pipeline: `[{"$sortByCount": "$item"}]`, want: `[{"_id": "abc", "count": 2}, {"_id": "jkl", "count": 1}, {"_id": "xyz", "count": 1}]`},
		{name: "sortByCount non-path", pipeline: `[{"$sortByCount": "item"}]`, code: 40148},
		{name: "facet", pipeline: `[{"$facet": {"n": [{"$count": "c"}], "top": [{"$sort": {"price": -1}}, {"$limit": 1}, {"$project": {"item": 1}}]}}]`,
			want: `[{"n": [{"c": 4}], "top": [{"_id": 2, "item": "jkl"}]}]`},
		{name: "facet nested", pipeline: `[{"$facet": {"a": [{"$facet": {}}]}}]`, code: 40600},
		{name: "redact", pipeline: `[{"$match": {"_id": 1}}, {"$redact": {"$cond": [{"$eq": ["$uom", "cm"]}, "$$PRUNE", "$$DESCEND"]}}]`,
			want: `[{"_id": 1, "item": "abc", "price": 10, "qty": 2, "tags": ["a", "b"]}]`},
		{name: "redact bad value", pipeline: `[{"$redact": 1}]`, code: 17053},
	})
}

func TestStageProject(t *testing.T) {
	t.Parallel()
	in := `[{"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "d": 2}, 5, [{"c": 3}]], "f": "x"}]`
	runStageCases(t, []stageCase{
		{name: "inclusion keeps document order", input: in, pipeline: `[{"$project": {"f": 1, "a": 1}}]`, want: `[{"_id": 1, "a": 1, "f": "x"}]`},
		{name: "exclude id", input: in, pipeline: `[{"$project": {"a": 1, "_id": 0}}]`, want: `[{"a": 1}]`},
		{name: "only id excluded", input: in, pipeline: `[{"$project": {"_id": 0}}]`, want: `[{"a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "d": 2}, 5, [{"c": 3}]], "f": "x"}]`},
		{name: "exclusion", input: in, pipeline: `[{"$project": {"b": 0, "e": false}}]`, want: `[{"_id": 1, "a": 1, "f": "x"}]`},
		{name: "dotted inclusion", input: in, pipeline: `[{"$project": {"b.c": 1}}]`, want: `[{"_id": 1, "b": {"c": 2}}]`},
		{name: "dotted inclusion through arrays", input: in, pipeline: `[{"$project": {"e.c": 1, "_id": 0}}]`, want: `[{"e": [{"c": 1}, [{"c": 3}]]}]`},
		{name: "nested spec", input: in, pipeline: `[{"$project": {"b": {"d": 1}}}]`, want: `[{"_id": 1, "b": {"d": 3}}]`},
		{name: "dotted exclusion through arrays", input: in, pipeline: `[{"$project": {"e.c": 0, "b.d": 0}}]`, want: `[{"_id": 1, "a": 1, "b": {"c": 2}, "e": [{"d": 2}, 5, [{}]], "f": "x"}]`},
		{name: "computed", input: in, pipeline: `[{"$project": {"sum": {"$add": ["$a", "$b.c"]}, "lit": "hi", "arr": ["$a"], "f": 1}}]`,
			want: `[{"_id": 1, "f": "x", "sum": 3, "lit": "hi", "arr": [1]}]`},
		{name: "computed replaces in place", input: in, pipeline: `[{"$project": {"f": 1, "a": "$f"}}]`, want: `[{"_id": 1, "f": "x", "a": "x"}]`},
		{name: "computed dotted", input: in, pipeline: `[{"$project": {"b.x": {"$literal": 1}, "b.c": 1}}]`, want: `[{"_id": 1, "b": {"c": 2, "x": 1}}]`},
		{name: "computed dotted over scalar", input: in, pipeline: `[{"$project": {"a.x": "$f", "_id": 0}}]`, want: `[{"a": {"x": "x"}}]`},
		{name: "computed id", input: in, pipeline: `[{"$project": {"_id": "$f", "a": 1}}]`, want: `[{"_id": "x", "a": 1}]`},
		{name: "remove", input: in, pipeline: `[{"$project": {"a": 1, "g": {"$cond": [false, 1, "$$REMOVE"]}}}]`, want: `[{"_id": 1, "a": 1}]`},
		{name: "missing field not output", input: in, pipeline: `[{"$project": {"zz": 1, "yy": "$nope"}}]`, want: `[{"_id": 1}]`},
		{name: "mixed include exclude", input: in, pipeline: `[{"$project": {"a": 1, "b": 0}}]`, code: 31254},
		{name: "mixed exclude include", input: in, pipeline: `[{"$project": {"b": 0, "a": 1}}]`, code: 31253},
		{name: "expression in exclusion", input: in, pipeline: `[{"$project": {"b": 0, "a": "$f"}}]`, code: 31252},
		{name: "empty", input: in, pipeline: `[{"$project": {}}]`, code: 51272},
		{name: "empty sub-projection", input: in, pipeline: `[{"$project": {"b": {}}}]`, code: 51270},
		{name: "path collision", input: in, pipeline: `[{"$project": {"b": 1, "b.c": 1}}]`, code: 31250},
		{name: "bad operator", input: in, pipeline: `[{"$project": {"x": {"$nope": 1}}}]`, code: 168},
		{name: "not an object", input: in, pipeline: `[{"$project": 1}]`, code: 15969},
	})
}

func TestStageAddFieldsUnset(t *testing.T) {
	t.Parallel()
	in := `[{"_id": 1, "a": 1, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}]}]`
	runStageCases(t, []stageCase{
		{name: "addFields", input: in, pipeline: `[{"$addFields": {"x": {"$add": ["$a", 1]}, "a": 5, "t": true}}]`, want: `[{"_id": 1, "a": 5, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}], "x": 2, "t": true}]`},
		{name: "set sees original values", input: in, pipeline: `[{"$set": {"a": 10, "y": "$a"}}]`, want: `[{"_id": 1, "a": 10, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}], "y": 1}]`},
		{name: "nested merges", input: in, pipeline: `[{"$set": {"b": {"d": 3}}}]`, want: `[{"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1}, {"c": 2}]}]`},
		{name: "dotted", input: in, pipeline: `[{"$set": {"b.d": "$a", "n.m": 1}}]`, want: `[{"_id": 1, "a": 1, "b": {"c": 2, "d": 1}, "e": [{"c": 1}, {"c": 2}], "n": {"m": 1}}]`},
		{name: "dotted into array", input: in, pipeline: `[{"$set": {"e.z": 0}}]`, want: `[{"_id": 1, "a": 1, "b": {"c": 2}, "e": [{"c": 1, "z": 0}, {"c": 2, "z": 0}]}]`},
		{name: "remove", input: in, pipeline: `[{"$set": {"a": "$$REMOVE"}}]`, want: `[{"_id": 1, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}]}]`},
		{name: "operator object", input: in, pipeline: `[{"$set": {"a": {"$literal": {"$x": 1}}}}]`, want: `[{"_id": 1, "a": {"$x": 1}, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}]}]`},
		{name: "addFields not object", input: in, pipeline: `[{"$addFields": 1}]`, code: 40272},
		{name: "unset string", input: in, pipeline: `[{"$unset": "a"}]`, want: `[{"_id": 1, "b": {"c": 2}, "e": [{"c": 1}, {"c": 2}]}]`},
		{name: "unset list dotted", input: in, pipeline: `[{"$unset": ["b.c", "e.c", "_id"]}]`, want: `[{"a": 1, "b": {}, "e": [{}, {}]}]`},
		{name: "unset empty", input: in, pipeline: `[{"$unset": []}]`, code: 31119},
		{name: "unset non-string", input: in, pipeline: `[{"$unset": [1]}]`, code: 31120},
	})
}

func TestStageGroup(t *testing.T) {
	t.Parallel()
	nums := `[
	 {"g": "a", "v": 2147483647, "x": 1},
	 {"g": "a", "v": 1, "x": 2.5},
	 {"g": "b", "v": {"$numberLong": "5"}, "x": "s"},
	 {"g": "b", "v": 2},
	 {"g": null, "v": 1.5},
	 {"v": {"$numberDecimal": "0.1"}}
	]`
	runStageCases(t, []stageCase{
		{name: "sum int overflow to long", input: nums, pipeline: `[{"$match": {"g": "a"}}, {"$group": {"_id": "$g", "s": {"$sum": "$v"}}}]`,
			want: `[{"_id": "a", "s": {"$numberLong": "2147483648"}}]`},
		{name: "sum long", input: nums, pipeline: `[{"$match": {"g": "b"}}, {"$group": {"_id": "$g", "s": {"$sum": "$v"}}}]`,
			want: `[{"_id": "b", "s": {"$numberLong": "7"}}]`},
		{name: "sum double and ignore strings", input: nums, pipeline: `[{"$group": {"_id": "$g", "s": {"$sum": "$x"}}}]`,
			want: `[{"_id": "a", "s": 3.5}, {"_id": "b", "s": 0}, {"_id": null, "s": 0}]`},
		{name: "null and missing group together", input: nums, pipeline: `[{"$group": {"_id": "$g", "n": {"$sum": 1}}}]`,
			want: `[{"_id": "a", "n": 2}, {"_id": "b", "n": 2}, {"_id": null, "n": 2}]`},
		{name: "sum decimal", input: nums, pipeline: `[{"$match": {"g": {"$ne": "a"}}}, {"$group": {"_id": null, "s": {"$sum": "$v"}}}]`,
			want: `[{"_id": null, "s": {"$numberDecimal": "8.60000000000000"}}]`},
		{name: "avg is double", input: nums, pipeline: `[{"$match": {"g": "b"}}, {"$group": {"_id": 1, "a": {"$avg": "$v"}}}]`,
			want: `[{"_id": 1, "a": 3.5}]`},
		{name: "avg none", input: nums, pipeline: `[{"$group": {"_id": 1, "a": {"$avg": "$nope"}}}]`, want: `[{"_id": 1, "a": null}]`},
		{name: "min max first last", input: nums, pipeline: `[{"$group": {"_id": null, "mn": {"$min": "$x"}, "mx": {"$max": "$x"}, "f": {"$first": "$x"}, "l": {"$last": "$x"}}}]`,
			want: `[{"_id": null, "mn": 1, "mx": "s", "f": 1, "l": null}]`},
		{name: "push addToSet", input: `[{"k": 1, "v": 1}, {"k": 1, "v": 1.0}, {"k": 1}, {"k": 1, "v": 2}]`,
			pipeline: `[{"$group": {"_id": "$k", "p": {"$push": "$v"}, "s": {"$addToSet": "$v"}}}]`,
			want:     `[{"_id": 1, "p": [1, 1.0, 2], "s": [1, 2]}]`},
		{name: "count accumulator", input: nums, pipeline: `[{"$group": {"_id": null, "c": {"$count": {}}}}]`, want: `[{"_id": null, "c": 6}]`},
		{name: "compound id", input: stageInput, pipeline: `[{"$group": {"_id": {"item": "$item", "price": "$price"}, "q": {"$sum": "$qty"}}}]`,
			want: `[{"_id": {"item": "abc", "price": 10}, "q": 7}, {"_id": {"item": "jkl", "price": 20}, "q": 1}, {"_id": {"item": "xyz", "price": 5}, "q": 10}]`},
		{name: "expression id and accumulator", input: stageInput, pipeline: `[{"$group": {"_id": {"$gt": ["$price", 9]}, "rev": {"$sum": {"$multiply": ["$price", "$qty"]}}}}]`,
			want: `[{"_id": true, "rev": 90}, {"_id": false, "rev": 50}]`},
		{name: "group by number types", input: `[{"k": 1}, {"k": {"$numberLong": "1"}}, {"k": 1.0}]`, pipeline: `[{"$group": {"_id": "$k", "n": {"$sum": 1}}}]`,
			want: `[{"_id": 1, "n": 3}]`},
		{name: "mergeObjects", input: `[{"d": {"a": 1}}, {"d": {"b": 2}}, {"d": null}]`, pipeline: `[{"$group": {"_id": null, "m": {"$mergeObjects": "$d"}}}]`,
			want: `[{"_id": null, "m": {"a": 1, "b": 2}}]`},
		{name: "empty input", input: `[]`, pipeline: `[{"$group": {"_id": null, "n": {"$sum": 1}}}]`, want: `[]`},
		{name: "missing id", pipeline: `[{"$group": {"n": {"$sum": 1}}}]`, code: 15955},
		{name: "unknown accumulator", pipeline: `[{"$group": {"_id": null, "n": {"$median": 1}}}]`, code: 15952},
		{name: "two accumulators", pipeline: `[{"$group": {"_id": null, "n": {"$sum": 1, "$avg": 1}}}]`, code: 40238},
		{name: "not an accumulator object", pipeline: `[{"$group": {"_id": null, "n": 1}}]`, code: 40234},
		{name: "dotted field", pipeline: `[{"$group": {"_id": null, "a.b": {"$sum": 1}}}]`, code: 40235},
		{name: "array argument", pipeline: `[{"$group": {"_id": null, "n": {"$sum": [1, 2]}}}]`, code: 40237},
		{name: "count with args", pipeline: `[{"$group": {"_id": null, "n": {"$count": 1}}}]`, code: 14},
	})
}

func TestStageUnwind(t *testing.T) {
	t.Parallel()
	runStageCases(t, []stageCase{
		{name: "string form", pipeline: `[{"$unwind": "$tags"}, {"$project": {"tags": 1}}]`,
			want: `[{"_id": 1, "tags": "a"}, {"_id": 1, "tags": "b"}, {"_id": 4, "tags": "c"}]`},
		{name: "index", pipeline: `[{"$unwind": {"path": "$tags", "includeArrayIndex": "i"}}, {"$project": {"tags": 1, "i": 1}}]`,
			want: `[{"_id": 1, "tags": "a", "i": {"$numberLong": "0"}}, {"_id": 1, "tags": "b", "i": {"$numberLong": "1"}}, {"_id": 4, "tags": "c", "i": null}]`},
		{name: "preserve", pipeline: `[{"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "i"}}, {"$project": {"tags": 1, "i": 1}}]`,
			want: `[{"_id": 1, "tags": "a", "i": {"$numberLong": "0"}}, {"_id": 1, "tags": "b", "i": {"$numberLong": "1"}}, {"_id": 2, "i": null}, {"_id": 3, "tags": null, "i": null}, {"_id": 4, "tags": "c", "i": null}]`},
		{name: "preserve missing", input: `[{"_id": 1}]`, pipeline: `[{"$unwind": {"path": "$a", "preserveNullAndEmptyArrays": true}}]`, want: `[{"_id": 1}]`},
		{name: "nested path", input: `[{"_id": 1, "a": {"b": [1, 2], "c": 0}}]`, pipeline: `[{"$unwind": "$a.b"}]`,
			want: `[{"_id": 1, "a": {"b": 1, "c": 0}}, {"_id": 1, "a": {"b": 2, "c": 0}}]`},
		{name: "no dollar", pipeline: `[{"$unwind": "tags"}]`, code: 28818},
		{name: "unknown option", pipeline: `[{"$unwind": {"path": "$tags", "foo": 1}}]`, code: 28811},
		{name: "no path", pipeline: `[{"$unwind": {}}]`, code: 28812},
		{name: "bad preserve", pipeline: `[{"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": 1}}]`, code: 28809},
		{name: "dollar index", pipeline: `[{"$unwind": {"path": "$tags", "includeArrayIndex": "$i"}}]`, code: 28822},
		{name: "bad spec", pipeline: `[{"$unwind": 1}]`, code: 15981},
	})
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	runStageCases(t, []stageCase{
		{name: "unknown stage", pipeline: `[{"$foo": {}}]`, code: 40324},
		{name: "two fields", pipeline: `[{"$match": {}, "$limit": 1}]`, code: 40323},
		{name: "not an object", pipeline: `[1]`, code: 14},
		{name: "graphLookup unsupported", pipeline: `[{"$graphLookup": {}}]`, code: 238},
		{name: "lookup without as", pipeline: `[{"$lookup": {"from": "x", "localField": "a", "foreignField": "b"}}]`, code: 9},
		{name: "out unsupported", pipeline: `[{"$out": "x"}]`, code: 238},
		{name: "changeStream not first", pipeline: `[{"$match": {}}, {"$changeStream": {}}]`, code: 40602},
	})
	_, err := Compile(bson.A{bson.D{{Key: "$foo", Value: 1}}}, Env{})
	require.EqualError(t, err, "Unrecognized pipeline stage name: '$foo'")
	_, err = Compile(bson.A{bson.D{{Key: "$lookup", Value: bson.D{}}}}, Env{})
	require.ErrorContains(t, err, "$lookup")
	var pe *mongoerr.Error
	_, err = Eval(bson.D{{Key: "$foo", Value: 1}}, nil, Env{})
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "InvalidPipelineOperator", pe.CodeName)
	require.Equal(t, "Unrecognized expression '$foo'", pe.Msg)
}

func TestStagesAndChangeStreamSafe(t *testing.T) {
	t.Parallel()
	p, err := Compile(val(t, `[{"$match": {"a": 1}}, {"$project": {"a": 1}}, {"$set": {"b": 1}}, {"$unset": "c"}, {"$replaceWith": "$$ROOT"}, {"$redact": "$$KEEP"}]`).(bson.A), Env{})
	require.NoError(t, err)
	require.Equal(t, []string{"$match", "$project", "$set", "$unset", "$replaceWith", "$redact"}, p.Stages())
	require.NoError(t, p.ChangeStreamSafe())

	p, err = Compile(val(t, `[{"$match": {"a": 1}}, {"$group": {"_id": null}}]`).(bson.A), Env{})
	require.NoError(t, err)
	err = p.ChangeStreamSafe()
	require.Error(t, err)
	require.Contains(t, err.Error(), "$group")
}

func TestRunDoesNotModifyInput(t *testing.T) {
	t.Parallel()
	in := docs(t, stageInput)
	before := make([]bson.D, len(in))
	for i, d := range in {
		before[i] = bsonkit.CopyDoc(d)
	}
	for _, pl := range []string{
		`[{"$sort": {"price": 1}}]`,
		`[{"$set": {"size.h": 0, "tags": "x"}}]`,
		`[{"$unwind": "$tags"}, {"$set": {"tags": 1}}]`,
		`[{"$project": {"size.w": 0}}]`,
		`[{"$unset": ["size.uom"]}]`,
		`[{"$limit": 2}]`,
		`[]`,
	} {
		p, err := Compile(val(t, pl).(bson.A), Env{})
		require.NoError(t, err)
		out, err := p.Run(in)
		require.NoError(t, err)
		if len(out) > 0 {
			out[0] = bson.D{{Key: "clobbered", Value: true}}
		}
		require.Equal(t, js(t, before), js(t, in), pl)
	}
}

func TestExprInstalledInQuery(t *testing.T) {
	t.Parallel()
	m, err := query.Compile(doc(t, `{"$expr": {"$lt": ["$a", "$b"]}}`))
	require.NoError(t, err)
	require.True(t, m.Match(doc(t, `{"a": 1, "b": 2}`)))
	require.False(t, m.Match(doc(t, `{"a": 3, "b": 2}`)))
	_, err = query.Compile(doc(t, `{"$expr": {"$nope": 1}}`))
	require.Error(t, err)
}

func TestNowIsStableAcrossDocuments(t *testing.T) {
	t.Parallel()
	p, err := Compile(val(t, `[{"$set": {"now": "$$NOW"}}]`).(bson.A), Env{})
	require.NoError(t, err)
	out, err := p.Run(docs(t, `[{"a": 1}, {"a": 2}]`))
	require.NoError(t, err)
	require.Equal(t, out[0][1].Value, out[1][1].Value)
}

func TestSortLimitMatchesFullSort(t *testing.T) {
	t.Parallel()
	in := benchDocs(2000)
	full, err := Compile(val(t, `[{"$sort": {"v": -1}}]`).(bson.A), Env{})
	require.NoError(t, err)
	want, err := full.Run(in)
	require.NoError(t, err)
	for _, k := range []int{1, 7, 100, 1999, 2000, 5000} {
		p, err := Compile(bson.A{bson.D{{Key: "$sort", Value: bson.D{{Key: "v", Value: -1}}}}, bson.D{{Key: "$limit", Value: k}}}, Env{})
		require.NoError(t, err)
		got, err := p.Run(in)
		require.NoError(t, err)
		require.Equal(t, want[:min(k, len(want))], got, "k=%d", k)
	}
}

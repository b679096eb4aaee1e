package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type exprCase struct {
	name string
	expr string
	doc  string // defaults to exprDoc
	want string // extended JSON value; "" with code set means error
	code int32
}

const exprDoc = `{"_id": 1, "i": 7, "j": -3, "l": {"$numberLong": "10"}, "d": 2.5, "s": "Hello World", "n": null,
 "arr": [1, 2, 3], "docs": [{"x": 1, "y": {"z": "a"}}, {"x": 2}, 5, {"y": {"z": "b"}}],
 "sub": {"a": {"b": 42}, "c": [1, 2]}, "t": {"$date": "2023-02-03T04:05:06.789Z"}, "big": 2147483647,
 "dec": {"$numberDecimal": "1.5"}, "oid": {"$oid": "65f1a2b3c4d5e6f708091a2b"}, "empty": [], "bool": true}`

func runExprCases(t *testing.T, cases []exprCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := tc.doc
			if d == "" {
				d = exprDoc
			}
			got, err := Eval(val(t, tc.expr), doc(t, d), testEnv)
			if tc.code != 0 {
				requireCode(t, err, tc.code)
				return
			}
			require.NoError(t, err)
			require.Equal(t, js(t, val(t, tc.want)), js(t, got))
		})
	}
}

func TestEvalPathsAndVariables(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "field", expr: `"$i"`, want: `7`},
		{name: "nested", expr: `"$sub.a.b"`, want: `42`},
		{name: "missing is null", expr: `"$nope"`, want: `null`},
		{name: "missing nested", expr: `"$sub.x.y"`, want: `null`},
		{name: "array of docs fans out", expr: `"$docs.x"`, want: `[1, 2]`},
		{name: "deep fan out", expr: `"$docs.y.z"`, want: `["a", "b"]`},
		{name: "numeric component is a field", expr: `"$arr.0"`, want: `[]`},
		{name: "ROOT", expr: `"$$ROOT.sub.a"`, want: `{"b": 42}`},
		{name: "CURRENT", expr: `"$$CURRENT.i"`, want: `7`},
		{name: "NOW", expr: `"$$NOW"`, want: `{"$date": "2024-05-06T07:08:09.010Z"}`},
		{name: "CLUSTER_TIME", expr: `"$$CLUSTER_TIME"`, want: `{"$timestamp": {"t": 100, "i": 2}}`},
		{name: "REMOVE", expr: `"$$REMOVE"`, want: `null`},
		{name: "undefined variable", expr: `"$$nope"`, code: 17276},
		{name: "bare dollar", expr: `"$"`, code: 16872},
		{name: "empty component", expr: `"$a..b"`, code: 15998},
		{name: "literal string", expr: `"abc"`, want: `"abc"`},
		{name: "literal number", expr: `{"$numberLong": "5"}`, want: `{"$numberLong": "5"}`},
		{name: "$literal keeps dollars", expr: `{"$literal": "$i"}`, want: `"$i"`},
		{name: "array literal", expr: `["$i", "$nope", 1]`, want: `[7, null, 1]`},
		{name: "object literal drops missing", expr: `{"a": "$i", "b": "$nope", "c": {"d": "$s"}}`, want: `{"a": 7, "c": {"d": "Hello World"}}`},
		{name: "object literal dotted key", expr: `{"a.b": 1}`, code: 16412},
		{name: "two operators", expr: `{"$add": [1], "$abs": 1}`, code: 15983},
		{name: "unknown operator", expr: `{"$frobnicate": 1}`, code: 168},
		{name: "let", expr: `{"$let": {"vars": {"x": "$i", "y": 2}, "in": {"$multiply": ["$$x", "$$y"]}}}`, want: `14`},
		{name: "let bad name", expr: `{"$let": {"vars": {"X": 1}, "in": 1}}`, code: 16867},
		{name: "variable out of scope", expr: `{"$add": [{"$let": {"vars": {"x": 1}, "in": "$$x"}}, "$$x"]}`, code: 17276},
	})
}

func TestEvalArithmetic(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "add ints", expr: `{"$add": [1, 2, "$i"]}`, want: `10`},
		{name: "add int overflow to long", expr: `{"$add": ["$big", 1]}`, want: `{"$numberLong": "2147483648"}`},
		{name: "add long", expr: `{"$add": ["$l", 1]}`, want: `{"$numberLong": "11"}`},
		{name: "add long overflow to double", expr: `{"$add": [{"$numberLong": "9223372036854775807"}, 1]}`, want: `{"$numberDouble": "9.223372036854775807E+18"}`},
		{name: "add double", expr: `{"$add": ["$i", "$d"]}`, want: `9.5`},
		{name: "add decimal", expr: `{"$add": ["$dec", 1]}`, want: `{"$numberDecimal": "2.5"}`},
		{name: "add null", expr: `{"$add": [1, "$nope"]}`, want: `null`},
		{name: "add date", expr: `{"$add": ["$t", 1000]}`, want: `{"$date": "2023-02-03T04:05:07.789Z"}`},
		{name: "add two dates", expr: `{"$add": ["$t", "$t"]}`, code: 16612},
		{name: "add string", expr: `{"$add": [1, "$s"]}`, code: 16554},
		{name: "subtract", expr: `{"$subtract": ["$i", "$j"]}`, want: `10`},
		{name: "subtract dates", expr: `{"$subtract": ["$t", {"$add": ["$t", -5]}]}`, want: `{"$numberLong": "5"}`},
		{name: "subtract ms from date", expr: `{"$subtract": ["$t", 789]}`, want: `{"$date": "2023-02-03T04:05:06Z"}`},
		{name: "subtract date from number", expr: `{"$subtract": [1, "$t"]}`, code: 16556},
		{name: "subtract arity", expr: `{"$subtract": [1]}`, code: 16020},
		{name: "multiply", expr: `{"$multiply": ["$i", "$j", 2]}`, want: `-42`},
		{name: "multiply overflow", expr: `{"$multiply": ["$big", 2]}`, want: `{"$numberLong": "4294967294"}`},
		{name: "multiply double", expr: `{"$multiply": ["$d", 2]}`, want: `5.0`},
		{name: "multiply decimal", expr: `{"$multiply": ["$dec", "$dec"]}`, want: `{"$numberDecimal": "2.25"}`},
		{name: "divide ints gives double", expr: `{"$divide": [7, 2]}`, want: `3.5`},
		{name: "divide exact gives double", expr: `{"$divide": [6, 3]}`, want: `{"$numberDouble": "2.0"}`},
		{name: "divide decimal", expr: `{"$divide": [{"$numberDecimal": "1"}, 4]}`, want: `{"$numberDecimal": "0.25"}`},
		{name: "divide decimal inexact", expr: `{"$divide": [{"$numberDecimal": "1"}, 3]}`, want: `{"$numberDecimal": "0.3333333333333333333333333333333333"}`},
		{name: "divide by zero", expr: `{"$divide": [1, 0]}`, code: 16608},
		{name: "mod", expr: `{"$mod": ["$i", 4]}`, want: `3`},
		{name: "mod negative", expr: `{"$mod": ["$j", 2]}`, want: `-1`},
		{name: "mod long", expr: `{"$mod": ["$l", 4]}`, want: `{"$numberLong": "2"}`},
		{name: "mod double", expr: `{"$mod": [7.5, 2]}`, want: `1.5`},
		{name: "mod by zero", expr: `{"$mod": [1, 0]}`, code: 16610},
		{name: "abs", expr: `{"$abs": "$j"}`, want: `3`},
		{name: "abs int min", expr: `{"$abs": -2147483648}`, want: `{"$numberLong": "2147483648"}`},
		{name: "abs null", expr: `{"$abs": "$nope"}`, want: `null`},
		{name: "abs string", expr: `{"$abs": "$s"}`, code: 28765},
		{name: "ceil", expr: `{"$ceil": 2.1}`, want: `3.0`},
		{name: "floor", expr: `{"$floor": -2.1}`, want: `-3.0`},
		{name: "floor int", expr: `{"$floor": "$i"}`, want: `7`},
		{name: "round half even", expr: `{"$round": [2.5, 0]}`, want: `2.0`},
		{name: "round place", expr: `{"$round": [19.25, 1]}`, want: `19.2`},
		{name: "round negative place", expr: `{"$round": [1234, -2]}`, want: `1200`},
		{name: "round decimal", expr: `{"$round": [{"$numberDecimal": "1.2345"}, 2]}`, want: `{"$numberDecimal": "1.23"}`},
		{name: "round default place", expr: `{"$round": 3.7}`, want: `4.0`},
		{name: "round bad place", expr: `{"$round": [1, 200]}`, code: 51083},
		{name: "trunc", expr: `{"$trunc": [-2.789, 2]}`, want: `-2.78`},
		{name: "sqrt", expr: `{"$sqrt": 16}`, want: `4.0`},
		{name: "sqrt negative", expr: `{"$sqrt": -1}`, code: 28714},
		{name: "pow int", expr: `{"$pow": [2, 10]}`, want: `1024`},
		{name: "pow negative exp", expr: `{"$pow": [2, -1]}`, want: `0.5`},
		{name: "sum array", expr: `{"$sum": "$arr"}`, want: `6`},
		{name: "sum args", expr: `{"$sum": [1, "$d", "x"]}`, want: `3.5`},
		{name: "avg array", expr: `{"$avg": "$arr"}`, want: `2.0`},
		{name: "avg empty", expr: `{"$avg": "$empty"}`, want: `null`},
		{name: "min args", expr: `{"$min": [5, "$nope", 2]}`, want: `2`},
		{name: "max array", expr: `{"$max": "$arr"}`, want: `3`},
	})
}

func TestEvalComparisonAndLogic(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "eq numbers across types", expr: `{"$eq": ["$l", 10.0]}`, want: `true`},
		{name: "eq missing vs null", expr: `{"$eq": ["$nope", null]}`, want: `false`},
		{name: "eq null vs null", expr: `{"$eq": ["$n", null]}`, want: `true`},
		{name: "ne", expr: `{"$ne": ["$i", 7]}`, want: `false`},
		{name: "gt type order", expr: `{"$gt": ["$s", 100]}`, want: `true`},
		{name: "gte", expr: `{"$gte": ["$i", 7]}`, want: `true`},
		{name: "lt", expr: `{"$lt": ["$nope", null]}`, want: `true`},
		{name: "lte", expr: `{"$lte": [1, 0]}`, want: `false`},
		{name: "cmp", expr: `{"$cmp": ["a", "b"]}`, want: `-1`},
		{name: "cmp arrays", expr: `{"$cmp": ["$arr", [1, 2, 3]]}`, want: `0`},
		{name: "eq arity", expr: `{"$eq": [1]}`, code: 16020},
		{name: "and", expr: `{"$and": [1, "$s", true]}`, want: `true`},
		{name: "and zero", expr: `{"$and": [1, 0]}`, want: `false`},
		{name: "and empty", expr: `{"$and": []}`, want: `true`},
		{name: "or", expr: `{"$or": ["$nope", null, "$empty"]}`, want: `true`},
		{name: "or false", expr: `{"$or": [false, 0, "$n"]}`, want: `false`},
		{name: "not", expr: `{"$not": ["$nope"]}`, want: `true`},
		{name: "not value", expr: `{"$not": "$i"}`, want: `false`},
		{name: "cond array", expr: `{"$cond": [{"$gt": ["$i", 5]}, "big", "small"]}`, want: `"big"`},
		{name: "cond object", expr: `{"$cond": {"if": "$n", "then": 1, "else": 2}}`, want: `2`},
		{name: "cond missing else", expr: `{"$cond": {"if": 1, "then": 1}}`, code: 17082},
		{name: "cond bad arity", expr: `{"$cond": [1, 2]}`, code: 16020},
		{name: "ifNull", expr: `{"$ifNull": ["$nope", "$n", "dflt"]}`, want: `"dflt"`},
		{name: "ifNull first", expr: `{"$ifNull": ["$i", "dflt"]}`, want: `7`},
		{name: "switch", expr: `{"$switch": {"branches": [{"case": {"$lt": ["$i", 5]}, "then": "low"}, {"case": {"$lt": ["$i", 10]}, "then": "mid"}], "default": "high"}}`, want: `"mid"`},
		{name: "switch default", expr: `{"$switch": {"branches": [{"case": false, "then": 1}], "default": 2}}`, want: `2`},
		{name: "switch no match", expr: `{"$switch": {"branches": [{"case": false, "then": 1}]}}`, code: 40066},
		{name: "switch no branches", expr: `{"$switch": {"branches": []}}`, code: 40068},
	})
}

func TestEvalStrings(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "concat", expr: `{"$concat": ["$s", "!", ""]}`, want: `"Hello World!"`},
		{name: "concat null", expr: `{"$concat": ["a", "$nope"]}`, want: `null`},
		{name: "concat number", expr: `{"$concat": ["a", 1]}`, code: 16702},
		{name: "toLower", expr: `{"$toLower": "$s"}`, want: `"hello world"`},
		{name: "toUpper number", expr: `{"$toUpper": 5}`, want: `"5"`},
		{name: "toUpper null", expr: `{"$toUpper": "$nope"}`, want: `""`},
		{name: "substr", expr: `{"$substr": ["$s", 6, 5]}`, want: `"World"`},
		{name: "substrBytes rest", expr: `{"$substrBytes": ["$s", 6, -1]}`, want: `"World"`},
		{name: "substr past end", expr: `{"$substr": ["$s", 50, 2]}`, want: `""`},
		{name: "substr utf8 middle", expr: `{"$substrBytes": ["é", 1, 1]}`, code: 28656},
		{name: "substrCP", expr: `{"$substrCP": ["héllo", 1, 3]}`, want: `"éll"`},
		{name: "strLenBytes", expr: `{"$strLenBytes": "é"}`, want: `2`},
		{name: "strLenCP", expr: `{"$strLenCP": "é"}`, want: `1`},
		{name: "strLenBytes null", expr: `{"$strLenBytes": "$nope"}`, code: 34471},
		{name: "split", expr: `{"$split": ["a,b,,c", ","]}`, want: `["a", "b", "", "c"]`},
		{name: "split null", expr: `{"$split": ["$nope", ","]}`, want: `null`},
		{name: "split non-string", expr: `{"$split": [1, ","]}`, code: 40085},
		{name: "trim", expr: `{"$trim": {"input": "  hi \n"}}`, want: `"hi"`},
		{name: "trim chars", expr: `{"$trim": {"input": "xxhixx", "chars": "x"}}`, want: `"hi"`},
		{name: "ltrim", expr: `{"$ltrim": {"input": "  hi  "}}`, want: `"hi  "`},
		{name: "rtrim", expr: `{"$rtrim": {"input": "  hi  "}}`, want: `"  hi"`},
		{name: "trim non-string", expr: `{"$trim": {"input": 1}}`, code: 50699},
		{name: "trim missing input", expr: `{"$trim": {"chars": "x"}}`, code: 9},
		{name: "strcasecmp", expr: `{"$strcasecmp": ["abc", "ABC"]}`, want: `0`},
		{name: "indexOfBytes", expr: `{"$indexOfBytes": ["$s", "World"]}`, want: `6`},
		{name: "indexOfBytes none", expr: `{"$indexOfBytes": ["$s", "xyz"]}`, want: `-1`},
	})
}

func TestEvalArrays(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "size", expr: `{"$size": "$arr"}`, want: `3`},
		{name: "size non-array", expr: `{"$size": "$s"}`, code: 17124},
		{name: "size missing", expr: `{"$size": "$nope"}`, code: 17124},
		{name: "arrayElemAt", expr: `{"$arrayElemAt": ["$arr", 1]}`, want: `2`},
		{name: "arrayElemAt negative", expr: `{"$arrayElemAt": ["$arr", -1]}`, want: `3`},
		{name: "arrayElemAt out of range", expr: `{"$arrayElemAt": ["$arr", 5]}`, want: `null`},
		{name: "arrayElemAt non-array", expr: `{"$arrayElemAt": ["$s", 0]}`, code: 28689},
		{name: "arrayElemAt fraction", expr: `{"$arrayElemAt": ["$arr", 1.5]}`, code: 28691},
		{name: "first", expr: `{"$first": "$arr"}`, want: `1`},
		{name: "last", expr: `{"$last": "$arr"}`, want: `3`},
		{name: "in", expr: `{"$in": [2.0, "$arr"]}`, want: `true`},
		{name: "in absent", expr: `{"$in": [9, "$arr"]}`, want: `false`},
		{name: "in non-array", expr: `{"$in": [1, "$s"]}`, code: 40081},
		{name: "isArray", expr: `{"$isArray": "$arr"}`, want: `true`},
		{name: "isArray wrapped", expr: `{"$isArray": ["$s"]}`, want: `false`},
		{name: "concatArrays", expr: `{"$concatArrays": ["$arr", [4], "$empty"]}`, want: `[1, 2, 3, 4]`},
		{name: "concatArrays null", expr: `{"$concatArrays": ["$arr", "$nope"]}`, want: `null`},
		{name: "concatArrays non-array", expr: `{"$concatArrays": ["$arr", 1]}`, code: 28664},
		{name: "slice n", expr: `{"$slice": ["$arr", 2]}`, want: `[1, 2]`},
		{name: "slice negative n", expr: `{"$slice": ["$arr", -2]}`, want: `[2, 3]`},
		{name: "slice pos n", expr: `{"$slice": ["$arr", 1, 5]}`, want: `[2, 3]`},
		{name: "slice negative pos", expr: `{"$slice": ["$arr", -2, 1]}`, want: `[2]`},
		{name: "slice zero count", expr: `{"$slice": ["$arr", 0, 0]}`, code: 28729},
		{name: "filter", expr: `{"$filter": {"input": "$arr", "as": "x", "cond": {"$gte": ["$$x", 2]}}}`, want: `[2, 3]`},
		{name: "filter this", expr: `{"$filter": {"input": "$arr", "cond": {"$ne": ["$$this", 2]}}}`, want: `[1, 3]`},
		{name: "filter limit", expr: `{"$filter": {"input": "$arr", "cond": true, "limit": 1}}`, want: `[1]`},
		{name: "filter null", expr: `{"$filter": {"input": "$nope", "cond": true}}`, want: `null`},
		{name: "filter non-array", expr: `{"$filter": {"input": 1, "cond": true}}`, code: 28651},
		{name: "map", expr: `{"$map": {"input": "$arr", "as": "x", "in": {"$multiply": ["$$x", "$i"]}}}`, want: `[7, 14, 21]`},
		{name: "map nested vars", expr: `{"$map": {"input": [1, 2], "as": "a", "in": {"$map": {"input": [10], "as": "b", "in": {"$add": ["$$a", "$$b"]}}}}}`, want: `[[11], [12]]`},
		{name: "map docs", expr: `{"$map": {"input": "$docs", "in": "$$this.x"}}`, want: `[1, 2, null, null]`},
		{name: "map missing in", expr: `{"$map": {"input": []}}`, code: 9},
		{name: "reduce", expr: `{"$reduce": {"input": "$arr", "initialValue": 0, "in": {"$add": ["$$value", "$$this"]}}}`, want: `6`},
		{name: "reverseArray", expr: `{"$reverseArray": "$arr"}`, want: `[3, 2, 1]`},
		{name: "range", expr: `{"$range": [0, 10, 3]}`, want: `[0, 3, 6, 9]`},
		{name: "indexOfArray", expr: `{"$indexOfArray": ["$arr", 3]}`, want: `2`},
	})
}

func TestEvalTypesAndConversion(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "type int", expr: `{"$type": "$i"}`, want: `"int"`},
		{name: "type long", expr: `{"$type": "$l"}`, want: `"long"`},
		{name: "type missing", expr: `{"$type": "$nope"}`, want: `"missing"`},
		{name: "type array", expr: `{"$type": ["$arr"]}`, want: `"array"`},
		{name: "type date", expr: `{"$type": "$t"}`, want: `"date"`},
		{name: "type decimal", expr: `{"$type": "$dec"}`, want: `"decimal"`},
		{name: "isNumber", expr: `{"$isNumber": "$d"}`, want: `true`},
		{name: "toString int", expr: `{"$toString": "$i"}`, want: `"7"`},
		{name: "toString double", expr: `{"$toString": "$d"}`, want: `"2.5"`},
		{name: "toString date", expr: `{"$toString": "$t"}`, want: `"2023-02-03T04:05:06.789Z"`},
		{name: "toString oid", expr: `{"$toString": "$oid"}`, want: `"65f1a2b3c4d5e6f708091a2b"`},
		{name: "toString bool", expr: `{"$toString": "$bool"}`, want: `"true"`},
		{name: "toString null", expr: `{"$toString": "$nope"}`, want: `null`},
		{name: "toString array", expr: `{"$toString": ["$arr"]}`, code: 241},
		{name: "toInt string", expr: `{"$toInt": "42"}`, want: `42`},
		{name: "toInt double truncates", expr: `{"$toInt": 2.9}`, want: `2`},
		{name: "toInt bad string", expr: `{"$toInt": "4.2"}`, code: 241},
		{name: "toInt overflow", expr: `{"$toInt": {"$numberLong": "3000000000"}}`, code: 241},
		{name: "toLong date", expr: `{"$toLong": "$t"}`, want: `{"$numberLong": "1675397106789"}`},
		{name: "toLong bool", expr: `{"$toLong": true}`, want: `{"$numberLong": "1"}`},
		{name: "toDouble string", expr: `{"$toDouble": "1.5"}`, want: `1.5`},
		{name: "toDouble int", expr: `{"$toDouble": "$i"}`, want: `7.0`},
		{name: "toDecimal", expr: `{"$toDecimal": "$d"}`, want: `{"$numberDecimal": "2.50000000000000"}`},
		{name: "toBool zero", expr: `{"$toBool": 0}`, want: `false`},
		{name: "toBool string", expr: `{"$toBool": ""}`, want: `true`},
		{name: "toDate long", expr: `{"$toDate": {"$numberLong": "1000"}}`, want: `{"$date": "1970-01-01T00:00:01Z"}`},
		{name: "toDate string", expr: `{"$toDate": "2021-01-02T03:04:05Z"}`, want: `{"$date": "2021-01-02T03:04:05Z"}`},
		{name: "toDate oid", expr: `{"$toDate": "$oid"}`, want: `{"$date": "2024-03-13T12:57:23Z"}`},
		{name: "toDate bad string", expr: `{"$toDate": "not a date"}`, code: 241},
		{name: "toObjectId", expr: `{"$toObjectId": "65f1a2b3c4d5e6f708091a2b"}`, want: `{"$oid": "65f1a2b3c4d5e6f708091a2b"}`},
		{name: "convert", expr: `{"$convert": {"input": "12", "to": "int"}}`, want: `12`},
		{name: "convert numeric to", expr: `{"$convert": {"input": 12, "to": 2}}`, want: `"12"`},
		{name: "convert onError", expr: `{"$convert": {"input": "x", "to": "int", "onError": -1}}`, want: `-1`},
		{name: "convert onNull", expr: `{"$convert": {"input": "$nope", "to": "int", "onNull": 0}}`, want: `0`},
		{name: "convert error", expr: `{"$convert": {"input": "x", "to": "int"}}`, code: 241},
		{name: "convert bad target", expr: `{"$convert": {"input": 1, "to": "nonsense"}}`, code: 2},
		{name: "convert missing to", expr: `{"$convert": {"input": 1}}`, code: 9},
	})
}

func TestEvalDatesAndObjects(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "year", expr: `{"$year": "$t"}`, want: `2023`},
		{name: "month", expr: `{"$month": "$t"}`, want: `2`},
		{name: "dayOfMonth", expr: `{"$dayOfMonth": "$t"}`, want: `3`},
		{name: "hour", expr: `{"$hour": "$t"}`, want: `4`},
		{name: "minute", expr: `{"$minute": "$t"}`, want: `5`},
		{name: "second", expr: `{"$second": "$t"}`, want: `6`},
		{name: "millisecond", expr: `{"$millisecond": "$t"}`, want: `789`},
		{name: "dayOfWeek", expr: `{"$dayOfWeek": "$t"}`, want: `6`},
		{name: "hour with timezone", expr: `{"$hour": {"date": "$t", "timezone": "+05:30"}}`, want: `9`},
		{name: "hour with olson", expr: `{"$hour": {"date": "$t", "timezone": "UTC"}}`, want: `4`},
		{name: "year null", expr: `{"$year": "$nope"}`, want: `null`},
		{name: "year of string", expr: `{"$year": "$s"}`, code: 16006},
		{name: "year of oid", expr: `{"$year": "$oid"}`, want: `2024`},
		{name: "dateToString default", expr: `{"$dateToString": {"date": "$t"}}`, want: `"2023-02-03T04:05:06.789Z"`},
		{name: "dateToString format", expr: `{"$dateToString": {"date": "$t", "format": "%Y/%m/%d %H:%M:%S %j %%"}}`, want: `"2023/02/03 04:05:06 034 %"`},
		{name: "dateToString onNull", expr: `{"$dateToString": {"date": "$nope", "onNull": "none"}}`, want: `"none"`},
		{name: "dateToString bad format", expr: `{"$dateToString": {"date": "$t", "format": "%Q"}}`, code: 18536},
		{name: "mergeObjects", expr: `{"$mergeObjects": [{"a": 1, "b": 2}, "$nope", {"b": 3, "c": 4}]}`, want: `{"a": 1, "b": 3, "c": 4}`},
		{name: "mergeObjects non-doc", expr: `{"$mergeObjects": [{"a": 1}, 5]}`, code: 40400},
		{name: "getField", expr: `{"$getField": "i"}`, want: `7`},
		{name: "getField input", expr: `{"$getField": {"field": "b", "input": "$sub.a"}}`, want: `42`},
		{name: "getField dollar literal", expr: `{"$getField": {"field": {"$literal": "$x"}, "input": {"$literal": {"$x": 5}}}}`, want: `5`},
		{name: "objectToArray", expr: `{"$objectToArray": "$sub.a"}`, want: `[{"k": "b", "v": 42}]`},
		{name: "arrayToObject", expr: `{"$arrayToObject": [[["a", 1], ["b", 2]]]}`, want: `{"a": 1, "b": 2}`},
	})
}

func TestEvalMoreOperators(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "setUnion", expr: `{"$setUnion": [[1, 2], [2.0, 3]]}`, want: `[1, 2, 3]`},
		{name: "setIntersection", expr: `{"$setIntersection": [[1, 2, 3], [3, 1]]}`, want: `[1, 3]`},
		{name: "setDifference", expr: `{"$setDifference": [[1, 2, 3], [2]]}`, want: `[1, 3]`},
		{name: "setEquals", expr: `{"$setEquals": [[1, 2, 2], [2, 1]]}`, want: `true`},
		{name: "setIsSubset", expr: `{"$setIsSubset": [[1], [2, 1]]}`, want: `true`},
		{name: "setUnion null", expr: `{"$setUnion": [[1], "$nope"]}`, want: `null`},
		{name: "setUnion non-array", expr: `{"$setUnion": [[1], 1]}`, code: 17044},
		{name: "allElementsTrue", expr: `{"$allElementsTrue": [[1, true, "x"]]}`, want: `true`},
		{name: "anyElementTrue", expr: `{"$anyElementTrue": [[0, false, null]]}`, want: `false`},
		{name: "regexMatch", expr: `{"$regexMatch": {"input": "$s", "regex": "^hello", "options": "i"}}`, want: `true`},
		{name: "regexMatch bson regex", expr: `{"$regexMatch": {"input": "$s", "regex": {"$regularExpression": {"pattern": "wor", "options": "i"}}}}`, want: `true`},
		{name: "regexMatch null input", expr: `{"$regexMatch": {"input": "$nope", "regex": "x"}}`, want: `false`},
		{name: "dateFromString", expr: `{"$dateFromString": {"dateString": "2020-01-02T03:04:05.006Z"}}`, want: `{"$date": "2020-01-02T03:04:05.006Z"}`},
		{name: "dateFromString timezone", expr: `{"$dateFromString": {"dateString": "2020-01-02T03:04:05", "timezone": "+01:00"}}`, want: `{"$date": "2020-01-02T02:04:05Z"}`},
		{name: "dateFromString onError", expr: `{"$dateFromString": {"dateString": "junk", "onError": "bad"}}`, want: `"bad"`},
		{name: "dateAdd", expr: `{"$dateAdd": {"startDate": "$t", "unit": "day", "amount": 2}}`, want: `{"$date": "2023-02-05T04:05:06.789Z"}`},
		{name: "dateSubtract", expr: `{"$dateSubtract": {"startDate": "$t", "unit": "hour", "amount": 5}}`, want: `{"$date": "2023-02-02T23:05:06.789Z"}`},
		{name: "known but unsupported", expr: `{"$dateTrunc": {"date": "$t", "unit": "day"}}`, code: 238},
	})
}

// TestEvalNamedArguments pins what namedArgs checks for the operators with
// named arguments: unknown and missing names, refused options, and that
// every named argument is compiled (a bad expression in an optional one
// fails at parse time).
func TestEvalNamedArguments(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "convert refuses format", expr: `{"$convert": {"input": "$i", "to": "string", "format": "base64"}}`, code: 238},
		{name: "dateFromString refuses format", expr: `{"$dateFromString": {"dateString": "2020-01-02", "format": "%Y"}}`, code: 238},
		{name: "convert unknown argument", expr: `{"$convert": {"input": "$i", "to": "string", "bogus": 1}}`, code: 9},
		{name: "convert missing to", expr: `{"$convert": {"input": "$i"}}`, code: 9},
		{name: "convert onNull", expr: `{"$convert": {"input": "$n", "to": "string", "onNull": "none"}}`, want: `"none"`},
		{name: "convert bad onError expression", expr: `{"$convert": {"input": "$i", "to": "string", "onError": {"$nope": 1}}}`, code: 168},
		{name: "dateAdd missing amount", expr: `{"$dateAdd": {"startDate": "$t", "unit": "day"}}`, code: 9},
		{name: "dateAdd bad timezone expression", expr: `{"$dateAdd": {"startDate": "$t", "unit": "day", "amount": 1, "timezone": {"$nope": 1}}}`, code: 168},
		{name: "dateFromString onNull", expr: `{"$dateFromString": {"dateString": "$n", "onNull": "none"}}`, want: `"none"`},
		{name: "trim bad chars expression", expr: `{"$trim": {"input": "x", "chars": {"$nope": 1}}}`, code: 168},
		{name: "filter unknown argument", expr: `{"$filter": {"input": "$arr", "cond": true, "bogus": 1}}`, code: 9},
		{name: "filter bad limit expression", expr: `{"$filter": {"input": "$arr", "cond": true, "limit": {"$nope": 1}}}`, code: 168},
		{name: "filter limit with as", expr: `{"$filter": {"input": "$arr", "as": "x", "cond": {"$gt": ["$$x", 1]}, "limit": 1}}`, want: `[2]`},
	})
}

func TestEvalRangeLimits(t *testing.T) {
	t.Parallel()
	runExprCases(t, []exprCase{
		{name: "range negative step", expr: `{"$range": [5, 0, -2]}`, want: `[5, 3, 1]`},
		{name: "range empty", expr: `{"$range": [5, 0]}`, want: `[]`},
		{name: "range too big", expr: `{"$range": [-2147483648, 2147483647]}`, code: 146},
		{name: "range zero step", expr: `{"$range": [0, 1, 0]}`, code: 34449},
	})
}

// TestEvalNullishArguments pins the rule shared by the operators built with
// nullishArgs: a null or missing argument in any position gives null, even
// when another argument has the wrong type.
func TestEvalNullishArguments(t *testing.T) {
	t.Parallel()
	var cases []exprCase
	for op, args := range map[string][]string{
		"$subtract":    {`1`, `2`},
		"$divide":      {`1`, `2`},
		"$mod":         {`1`, `2`},
		"$pow":         {`2`, `3`},
		"$arrayElemAt": {`[1]`, `0`},
		"$slice":       {`[1, 2]`, `1`, `1`},
		"$split":       {`"a,b"`, `","`},
	} {
		for i := range args {
			for _, null := range []string{`null`, `"$nope"`, `"$n"`} {
				vs := append([]string{}, args...)
				vs[i] = null
				cases = append(cases, exprCase{
					name: fmt.Sprintf("%s arg %d %s", op, i, null),
					expr: fmt.Sprintf(`{%q: [%s]}`, op, strings.Join(vs, ", ")),
					want: `null`,
				})
				if i > 0 {
					vs[0] = `{"x": 1}` // wrong type, but a later argument is null
					cases = append(cases, exprCase{
						name: fmt.Sprintf("%s arg %d %s beats a bad first argument", op, i, null),
						expr: fmt.Sprintf(`{%q: [%s]}`, op, strings.Join(vs, ", ")),
						want: `null`,
					})
				}
			}
		}
	}
	runExprCases(t, cases)
}

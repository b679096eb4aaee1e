package pipeline

import "testing"

const windowInput = `[
 {"_id": 1, "g": "a", "t": 1, "v": 10},
 {"_id": 2, "g": "b", "t": 1, "v": 5},
 {"_id": 3, "g": "a", "t": 2, "v": 20},
 {"_id": 4, "g": "a", "t": 2, "v": 30},
 {"_id": 5, "g": "a", "t": 5, "v": 40},
 {"_id": 6, "g": "b", "t": 3, "v": 7}
]`

func TestStageSetWindowFields(t *testing.T) {
	t.Parallel()
	runStageCases(t, []stageCase{
		{name: "running sum per partition", input: windowInput,
			pipeline: `[{"$setWindowFields": {"partitionBy": "$g", "sortBy": {"_id": 1}, "output": {"s": {"$sum": "$v", "window": {"documents": ["unbounded", "current"]}}}}}, {"$project": {"s": 1}}]`,
			want:     `[{"_id": 1, "s": 10}, {"_id": 3, "s": 30}, {"_id": 4, "s": 60}, {"_id": 5, "s": 100}, {"_id": 2, "s": 5}, {"_id": 6, "s": 12}]`},
		{name: "whole partition without window", input: windowInput,
			pipeline: `[{"$setWindowFields": {"partitionBy": "$g", "output": {"n": {"$count": {}}, "m": {"$max": "$v"}}}}, {"$project": {"n": 1, "m": 1}}]`,
			want:     `[{"_id": 1, "n": 4, "m": 40}, {"_id": 3, "n": 4, "m": 40}, {"_id": 4, "n": 4, "m": 40}, {"_id": 5, "n": 4, "m": 40}, {"_id": 2, "n": 2, "m": 7}, {"_id": 6, "n": 2, "m": 7}]`},
		{name: "moving average of documents", input: windowInput,
			pipeline: `[{"$match": {"g": "a"}}, {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {"avg": {"$avg": "$v", "window": {"documents": [-1, 1]}}}}}, {"$project": {"avg": 1}}]`,
			want:     `[{"_id": 1, "avg": 15.0}, {"_id": 3, "avg": 20.0}, {"_id": 4, "avg": 30.0}, {"_id": 5, "avg": 35.0}]`},
		{name: "range window", input: windowInput,
			pipeline: `[{"$match": {"g": "a"}}, {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"s": {"$sum": "$v", "window": {"range": [-1, 0]}}}}}, {"$project": {"s": 1}}]`,
			want:     `[{"_id": 1, "s": 10}, {"_id": 3, "s": 60}, {"_id": 4, "s": 60}, {"_id": 5, "s": 40}]`},
		{name: "rank denseRank documentNumber", input: windowInput,
			pipeline: `[{"$match": {"g": "a"}}, {"$setWindowFields": {"sortBy": {"t": 1}, "output": {"r": {"$rank": {}}, "d": {"$denseRank": {}}, "n": {"$documentNumber": {}}}}}, {"$project": {"r": 1, "d": 1, "n": 1}}]`,
			want:     `[{"_id": 1, "r": 1, "d": 1, "n": 1}, {"_id": 3, "r": 2, "d": 2, "n": 2}, {"_id": 4, "r": 2, "d": 2, "n": 3}, {"_id": 5, "r": 4, "d": 3, "n": 4}]`},
		{name: "shift", input: windowInput,
			pipeline: `[{"$match": {"g": "b"}}, {"$setWindowFields": {"sortBy": {"_id": 1}, "output": {"next": {"$shift": {"output": "$v", "by": 1, "default": "none"}}, "prev": {"$shift": {"output": "$v", "by": -1}}}}}, {"$project": {"next": 1, "prev": 1}}]`,
			want:     `[{"_id": 2, "next": 7, "prev": null}, {"_id": 6, "next": "none", "prev": 5}]`},
		{name: "rank needs sortBy", pipeline: `[{"$setWindowFields": {"output": {"r": {"$rank": {}}}}}]`, code: 5371602},
		{name: "documents window needs sortBy", pipeline: `[{"$setWindowFields": {"output": {"s": {"$sum": "$price", "window": {"documents": [-1, 0]}}}}}]`, code: 5339901},
		{name: "unsupported function", pipeline: `[{"$setWindowFields": {"sortBy": {"_id": 1}, "output": {"x": {"$derivative": {"input": "$price"}}}}}]`, code: 238},
		{name: "output required", pipeline: `[{"$setWindowFields": {"sortBy": {"_id": 1}}}]`, code: 40414},
	})
}

package pipeline

import "testing"

const bucketInput = `[
 {"_id": 1, "price": 10}, {"_id": 2, "price": 25}, {"_id": 3, "price": 5},
 {"_id": 4, "price": 40}, {"_id": 5, "price": 25}, {"_id": 6, "price": 200},
 {"_id": 7}
]`

func TestStageBucket(t *testing.T) {
	t.Parallel()
	runStageCases(t, []stageCase{
		{name: "bucket with default and output", input: bucketInput,
			pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [0, 20, 50], "default": "other", "output": {"n": {"$sum": 1}, "ids": {"$push": "$_id"}}}}]`,
			want:     `[{"_id": 0, "n": 2, "ids": [1, 3]}, {"_id": 20, "n": 3, "ids": [2, 4, 5]}, {"_id": "other", "n": 2, "ids": [6, 7]}]`},
		{name: "bucket default count", input: `[{"_id": 1, "p": 1}, {"_id": 2, "p": 3}]`,
			pipeline: `[{"$bucket": {"groupBy": "$p", "boundaries": [0, 2, 4]}}]`, want: `[{"_id": 0, "count": 1}, {"_id": 2, "count": 1}]`},
		{name: "bucket no match no default", input: bucketInput,
			pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [0, 20]}}]`, code: 40066},
		{name: "bucket one boundary", pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [0]}}]`, code: 40192},
		{name: "bucket unsorted", pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [5, 1]}}]`, code: 40194},
		{name: "bucket mixed types", pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [1, "a"]}}]`, code: 40193},
		{name: "bucket default inside", pipeline: `[{"$bucket": {"groupBy": "$price", "boundaries": [0, 10], "default": 5}}]`, code: 40199},
		{name: "bucket groupBy not a path", pipeline: `[{"$bucket": {"groupBy": "price", "boundaries": [0, 10]}}]`, code: 40202},
		{name: "bucket missing boundaries", pipeline: `[{"$bucket": {"groupBy": "$price"}}]`, code: 40198},
		{name: "bucketAuto", input: `[{"_id": 1, "p": 1}, {"_id": 2, "p": 2}, {"_id": 3, "p": 3}, {"_id": 4, "p": 4}, {"_id": 5, "p": 5}]`,
			pipeline: `[{"$bucketAuto": {"groupBy": "$p", "buckets": 2}}]`,
			want:     `[{"_id": {"min": 1, "max": 4}, "count": 3}, {"_id": {"min": 4, "max": 5}, "count": 2}]`},
		{name: "bucketAuto keeps equal values together", input: `[{"_id": 1, "p": 1}, {"_id": 2, "p": 1}, {"_id": 3, "p": 1}, {"_id": 4, "p": 2}]`,
			pipeline: `[{"$bucketAuto": {"groupBy": "$p", "buckets": 2, "output": {"ids": {"$push": "$_id"}}}}]`,
			want:     `[{"_id": {"min": 1, "max": 2}, "ids": [1, 2, 3]}, {"_id": {"min": 2, "max": 2}, "ids": [4]}]`},
		{name: "bucketAuto more buckets than documents", input: `[{"_id": 1, "p": 1}, {"_id": 2, "p": 2}]`,
			pipeline: `[{"$bucketAuto": {"groupBy": "$p", "buckets": 5}}]`,
			want:     `[{"_id": {"min": 1, "max": 2}, "count": 1}, {"_id": {"min": 2, "max": 2}, "count": 1}]`},
		{name: "bucketAuto zero buckets", pipeline: `[{"$bucketAuto": {"groupBy": "$price", "buckets": 0}}]`, code: 40243},
		{name: "bucketAuto granularity", pipeline: `[{"$bucketAuto": {"groupBy": "$price", "buckets": 2, "granularity": "R5"}}]`, code: 238},
	})
}

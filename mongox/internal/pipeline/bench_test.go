package pipeline

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func benchDocs(n int) []bson.D {
	out := make([]bson.D, n)
	for i := range out {
		out[i] = bson.D{
			{Key: "_id", Value: int32(i)},
			{Key: "g", Value: fmt.Sprintf("g%d", i%100)},
			{Key: "v", Value: int32(i % 1000)},
			{Key: "tags", Value: bson.A{"a", "b"}},
			{Key: "sub", Value: bson.D{{Key: "x", Value: float64(i)}}},
		}
	}
	return out
}

func BenchmarkRun100k(b *testing.B) {
	in := benchDocs(100_000)
	for _, tc := range []struct{ name, pipeline string }{
		{"match-group-sort", `[{"$match": {"v": {"$gte": 10}}}, {"$group": {"_id": "$g", "s": {"$sum": "$v"}, "a": {"$avg": "$sub.x"}}}, {"$sort": {"s": -1}}]`},
		{"project-set", `[{"$project": {"g": 1, "y": {"$add": ["$v", "$sub.x"]}}}, {"$set": {"z": {"$concat": ["$g", "-"]}}}]`},
		{"unwind-sort-limit", `[{"$unwind": "$tags"}, {"$sort": {"v": -1, "_id": 1}}, {"$limit": 10}]`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p, err := Compile(val(b, tc.pipeline).(bson.A), Env{})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := p.Run(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package query

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func benchDocs(n int) []bson.D {
	docs := make([]bson.D, n)
	for i := range docs {
		docs[i] = bson.D{
			{Key: "_id", Value: bson.NewObjectID()},
			{Key: "status", Value: []string{"pending", "sent", "failed"}[i%3]},
			{Key: "attempts", Value: int32(i % 7)},
			{Key: "topic", Value: fmt.Sprintf("topic-%d", i%10)},
			{Key: "meta", Value: bson.D{{Key: "tags", Value: bson.A{"a", "b", fmt.Sprint(i % 5)}}}},
		}
	}
	return docs
}

func BenchmarkMatch(b *testing.B) {
	docs := benchDocs(1024)
	m, err := Compile(bson.D{
		{Key: "status", Value: "pending"},
		{Key: "attempts", Value: bson.D{{Key: "$lt", Value: 5}}},
		{Key: "meta.tags", Value: bson.D{{Key: "$in", Value: bson.A{"3", "4"}}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	n := 0
	for i := 0; b.Loop(); i++ {
		if m.Match(docs[i%len(docs)]) {
			n++
		}
	}
	_ = n
}

func BenchmarkSortCompare(b *testing.B) {
	docs := benchDocs(1024)
	s, err := CompileSort(bson.D{{Key: "attempts", Value: 1}, {Key: "topic", Value: -1}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Compare(docs[i%len(docs)], docs[(i+7)%len(docs)])
	}
}

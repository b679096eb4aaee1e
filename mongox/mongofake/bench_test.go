package mongofake

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// BenchmarkDriverChangeStream measures change-stream throughput: documents
// are inserted in batches of 100 while one change stream reads them; it
// reports the events the stream delivered per second.
func BenchmarkDriverChangeStream(b *testing.B) {
	_, client := setup(b)
	c := client.Database("bench").Collection("cs")
	ctx := context.Background()
	cs, err := c.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close(ctx)
	batch := make([]any, 100)
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i += len(batch) {
			n := min(len(batch), b.N-i)
			for j := range n {
				batch[j] = bson.D{{Key: "v", Value: i + j}}
			}
			if _, err := c.InsertMany(ctx, batch[:n]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for seen := 0; seen < b.N; seen++ {
		if !cs.Next(ctx) {
			b.Fatal(cs.Err())
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

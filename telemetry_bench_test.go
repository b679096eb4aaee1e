package outbox

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// BenchmarkHandleTelemetry measures what the telemetry adds to one handling
// attempt: span start with a remote parent, counter, histogram, span end.
func BenchmarkHandleTelemetry(b *testing.B) {
	meta := Metadata{Envelope: Envelope{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k",
		PartitionKey: "p", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, Offset: 1, Attempt: 1}
	run := func(b *testing.B, cfg Config) {
		t := newTelemetry(&cfg)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			sctx, span := t.startHandle(ctx, &meta)
			t.endHandle(sctx, span, &meta.Envelope, time.Now(), nil)
		}
	}
	b.Run("noop", func(b *testing.B) {
		run(b, Config{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: metricnoop.NewMeterProvider()})
	})
	b.Run("sdk", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer tp.Shutdown(context.Background())
		defer mp.Shutdown(context.Background())
		run(b, Config{TracerProvider: tp, MeterProvider: mp})
	})
}

// BenchmarkStoreStatus measures the storage query behind Status and the
// gauges with 10,000 pending events, 100,000 published and 100 parked.
func BenchmarkStoreStatus(b *testing.B) {
	env := mongotest.Start(b)
	db := env.DB(b)
	ctx := context.Background()
	now := time.Now()
	var docs []any
	for i := range 110_000 {
		docs = append(docs, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "topic", Value: []string{"a", "b"}[i%2]},
			{Key: "partition", Value: int32(i % 6)}, {Key: "created_at", Value: now}, {Key: "published", Value: i >= benchPending},
			{Key: "failed", Value: false}, {Key: "payload", Value: "{\"order_id\":\"12345\"}"}})
	}
	if _, err := db.Collection("outbox").InsertMany(ctx, docs); err != nil {
		b.Fatal(err)
	}
	docs = docs[:0]
	for i := range 100 {
		docs = append(docs, bson.D{{Key: "_id", Value: bson.D{{Key: "topic", Value: "a"}, {Key: "schema", Value: "s"}, {Key: "key", Value: itoa(i)}}},
			{Key: "parked", Value: true}, {Key: "handled", Value: false}, {Key: "parked_at", Value: now}})
	}
	if _, err := db.Collection("inbox").InsertMany(ctx, docs); err != nil {
		b.Fatal(err)
	}
	c := &Client{outbox: db.Collection("outbox"), inbox: db.Collection("inbox"), cfg: Config{Mongo: env.Client}}
	if err := c.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	admin := c.Admin()
	for b.Loop() {
		st, err := admin.StoreStatus(ctx)
		if err != nil || st.Pending != int64(benchPending) || st.Parked != 100 {
			b.Fatal(err, st.Pending, st.Parked)
		}
	}
}

var benchPending = 10_000

package outbox

import (
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// BenchmarkClaimCheckRoundTrip measures what the claim check adds to an
// event of each payload size, up to the largest (claimcheck.MaxPayload):
// Record in a transaction that inserts its chunks and its outbox document,
// then reading the payload back as a consumer does before its handler
// runs. The Kafka record of such an event is under 1 KiB, so Kafka's part
// is that of any small event. MB/s counts the payload once.
func BenchmarkClaimCheckRoundTrip(b *testing.B) {
	env := mongotest.Start(b)
	db := env.DB(b)
	c, err := New(Config{
		Mongo:         env.Client,
		Database:      db.Name(),
		Brokers:       []string{"127.0.0.1:1"}, // never dialled: nothing runs
		Service:       "bench",
		PublishTopics: []string{ordersTopic},
		ClaimCheck:    &ClaimCheck{Threshold: 1},
		Logger:        debugLogger,
	})
	if err != nil {
		b.Fatal(err)
	}
	c.topics.Set(ordersTopic, 3)
	ctx := context.Background()
	if err := c.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	overhead := len(`{"run":"bench","order_id":"k","amount":1,"seq":0,"pad":""}`)
	for _, size := range []int{1 << 20, 8 << 20, 16 << 20, claimcheck.MaxPayload} {
		b.Run(itoa(size>>20)+"MiB", func(b *testing.B) {
			e := paddedOrder{orderPlaced: orderPlaced{Run: "bench", OrderID: "k", Amount: 1}, Pad: strings.Repeat("x", size-overhead)}
			b.SetBytes(int64(size))
			for b.Loop() {
				var id bson.ObjectID
				err := c.Transact(ctx, func(ctx context.Context) error {
					if err := Record(ctx, e); err != nil {
						return err
					}
					id = txFrom(ctx).docs[0].(*outboxDoc).ID
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				got, err := c.claims.Resolve(ctx, claimcheck.Ref(id))
				if err != nil {
					b.Fatal(err)
				}
				if len(got) != size {
					b.Fatalf("resolved %d bytes, recorded %d", len(got), size)
				}
				b.StopTimer()
				// Keep the server's memory to one event's chunks.
				if _, err := c.claims.Coll.DeleteMany(ctx, bson.D{}); err != nil {
					b.Fatal(err)
				}
				if _, err := c.outbox.DeleteMany(ctx, bson.D{}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

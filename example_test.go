package outbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// OrderCreated is an event: a struct with a topic, a content schema and a
// partition key, validated by its struct tags when it is recorded.
type OrderCreated struct {
	OrderID string `json:"order_id" validate:"required"`
	Amount  int64  `json:"amount" validate:"gt=0"`
}

func (OrderCreated) Topic() string          { return "orders" }
func (OrderCreated) ContentSchema() string  { return "OrderCreated.v1" }
func (e OrderCreated) PartitionKey() string { return e.OrderID }

// embedded starts the embedded MongoDB server and Kafka cluster, for the
// examples; a service connects to its real ones instead.
func embedded() (mc *mongo.Client, brokers []string, stop func()) {
	srv, err := mongofake.NewServer()
	if err != nil {
		log.Fatal(err)
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	mc, err = mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		log.Fatal(err)
	}
	return mc, kc.ListenAddrs(), func() {
		_ = mc.Disconnect(context.Background())
		kc.Close()
		_ = srv.Close()
	}
}

// Record an event in the same transaction as the business write: both
// commit or neither does.
func ExampleClient_Transact() {
	mc, brokers, stop := embedded()
	defer stop()
	client, err := outbox.New(outbox.Config{
		Mongo: mc, Database: "shop", Brokers: brokers, Service: "orders",
		PublishTopics: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	orders := mc.Database("shop").Collection("orders")
	err = client.Transact(ctx, func(ctx context.Context) error {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}, {Key: "amount", Value: 42}}); err != nil {
			return err
		}
		return outbox.Record(ctx, OrderCreated{OrderID: "o-1", Amount: 42})
	})
	fmt.Println("committed:", err)

	// An invalid event aborts the transaction: the order is not saved either.
	err = client.Transact(ctx, func(ctx context.Context) error {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-2"}}); err != nil {
			return err
		}
		return outbox.Record(ctx, OrderCreated{OrderID: "o-2", Amount: 0})
	})
	fmt.Println("refused:", err)
	n, _ := orders.CountDocuments(ctx, bson.D{})
	fmt.Println("orders:", n)
	// Output:
	// committed: <nil>
	// refused: outbox: invalid event OrderCreated.v1: field OrderCreated.Amount failed "gt"
	// orders: 1
}

// Register a handler and run the client: the event recorded above is
// published to Kafka, delivered, and handled once in its own transaction.
func ExampleHandle() {
	mc, brokers, stop := embedded()
	defer stop()
	client, err := outbox.New(outbox.Config{
		Mongo: mc, Database: "shop", Brokers: brokers, Service: "billing",
		PublishTopics: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}
	handled := make(chan string, 1)
	invoices := mc.Database("shop").Collection("invoices")
	outbox.MustHandle(client, func(ctx context.Context, e OrderCreated, meta outbox.Metadata) error {
		// ctx carries the handling transaction: this insert commits together
		// with the inbox entry that makes the handling idempotent.
		if _, err := invoices.InsertOne(ctx, bson.D{{Key: "order_id", Value: e.OrderID}, {Key: "amount", Value: e.Amount}}); err != nil {
			return err
		}
		handled <- e.OrderID
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()

	err = client.Transact(ctx, func(ctx context.Context) error {
		return outbox.Record(ctx, OrderCreated{OrderID: "o-7", Amount: 99})
	})
	if err != nil {
		log.Fatal(err)
	}
	select {
	case id := <-handled:
		fmt.Println("handled", id)
	case <-time.After(30 * time.Second):
		fmt.Println("timed out")
	}
	cancel()
	fmt.Println("run:", <-done)
	// Output:
	// handled o-7
	// run: <nil>
}

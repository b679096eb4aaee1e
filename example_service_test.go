package outbox_test

// The code between the README markers is quoted in README.md ("Embedding it
// in your service"), imports included; a test in ./example checks that the
// two agree.

// README: begin embed

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// OrderPlaced is an event: a struct with its topic, its stable type name
// and its partition key (events with the same key keep their order).
type OrderPlaced struct {
	OrderID string `json:"order_id" validate:"required"`
	Total   int64  `json:"total" validate:"gt=0"`
}

func (OrderPlaced) Topic() string          { return "orders" }
func (OrderPlaced) ContentSchema() string  { return "OrderPlaced.v1" }
func (e OrderPlaced) PartitionKey() string { return e.OrderID }

func Example_service() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	mc, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	defer mc.Disconnect(context.Background())
	db := mc.Database("shop")

	client, err := outbox.New(outbox.Config{
		Mongo:         mc,
		Database:      "shop", // where the outbox and inbox collections live
		Brokers:       strings.Split(os.Getenv("KAFKA_BROKERS"), ","),
		Service:       "shop", // Kafka group names derive from it
		PublishTopics: []string{"orders"},
	})
	if err != nil {
		log.Fatal(err)
	}

	// A handler: its writes and the events it records commit in one
	// transaction with the inbox entry, once per event.
	outbox.MustHandle(client, func(ctx context.Context, e OrderPlaced, _ outbox.Metadata) error {
		_, err := db.Collection("invoices").InsertOne(ctx, bson.D{{Key: "_id", Value: e.OrderID}, {Key: "total", Value: e.Total}})
		return err
	})

	// A request handler: the order and its event commit together, or
	// neither does.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		id := bson.NewObjectID().Hex()
		err := client.Transact(r.Context(), func(ctx context.Context) error {
			if _, err := db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "total", Value: 42}}); err != nil {
				return err
			}
			return outbox.Record(ctx, OrderPlaced{OrderID: id, Total: 42})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := &http.Server{Addr: ":8080", Handler: mux}

	// The framework runs for the life of the process, next to the server.
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() { runDone <- client.Run(runCtx) }()

	// On SIGTERM: finish the requests in flight, then let the framework
	// finish its handlers and publishes and leave its Kafka groups.
	shutdownDone := make(chan struct{})
	go func() {
		defer close(shutdownDone)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	<-shutdownDone
	stopRun()
	if err := <-runDone; err != nil {
		log.Fatal(err)
	}
}

// README: end embed

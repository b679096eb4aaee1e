package outbox_test

// The code between the README markers is quoted in README.md ("Embed it in
// your service"), imports included; a test in ./example checks that the two
// agree.

// README: begin embed

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

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
	// MONGODB_URI and KAFKA_BROKERS (and KAFKA_TLS, KAFKA_SASL_USER,
	// KAFKA_SASL_PASSWORD, KAFKA_SASL_MECHANISM, REPLICA_ID when set).
	cfg, err := outbox.ConfigFromEnv(os.Getenv)
	if err != nil {
		log.Fatal(err)
	}
	defer cfg.Mongo.Disconnect(context.Background())
	cfg.Database = "shop" // where the outbox and inbox collections live
	cfg.Service = "shop"  // Kafka group names derive from it
	cfg.PublishTopics = []string{"orders"}
	client, err := outbox.New(cfg)
	if err != nil {
		log.Fatal(err) // names every invalid field at once
	}
	db := cfg.Mongo.Database("shop")

	// A handler: its writes and the events it records commit in one
	// transaction with the inbox entry, once per event.
	outbox.MustHandle(client, func(ctx context.Context, e OrderPlaced, _ outbox.Metadata) error {
		_, err := db.Collection("invoices").InsertOne(ctx, bson.D{{Key: "_id", Value: e.OrderID}, {Key: "total", Value: e.Total}})
		return err
	})

	// A request handler: the order and its event commit together, or
	// neither does. A client that retries (its first try timed out, the
	// replica died) sends the same Idempotency-Key: the order's id is the
	// key, so the retry meets the first order instead of making a second.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" || len(key) > 100 {
			http.Error(w, "Idempotency-Key: want 1 to 100 bytes", http.StatusBadRequest)
			return
		}
		err := client.Transact(r.Context(), func(ctx context.Context) error {
			if _, err := db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "total", Value: 42}}); err != nil {
				return err
			}
			return outbox.Record(ctx, OrderPlaced{OrderID: key, Total: 42}, outbox.WithIdempotencyKey(key))
		})
		switch {
		case mongo.IsDuplicateKeyError(err):
			w.WriteHeader(http.StatusOK) // a retry: the order and its one event exist
		case errors.Is(err, outbox.ErrInvalidEvent):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil: // MongoDB down, or the request's deadline passed
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})

	// Serve HTTP and run the client until SIGINT or SIGTERM: GET /livez
	// and /readyz, a 10 s deadline on every request, and a shutdown
	// (requests finished, handlers drained, Kafka groups left) within 25 s.
	// outbox.Server sets these and the probes' paths.
	if err := outbox.Serve(context.Background(), &http.Server{Addr: ":8080", Handler: mux}, client); err != nil {
		log.Fatal(err)
	}
}

// README: end embed

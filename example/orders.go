package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox"
)

// The orders bounded context: it owns the orders collection, publishes
// OrderCreated on the "orders" topic and reacts to the payments context's
// PaymentCompleted and PaymentFailed.

// Topic names. Both are created with defaultPartitions partitions (or
// KAFKA_PARTITIONS) when missing.
const (
	ordersTopic   = "orders"
	paymentsTopic = "payments"
)

// Order statuses.
const (
	StatusPending = "PENDING"
	StatusPaid    = "PAID"
	StatusFailed  = "FAILED"
)

// OrderCreated is published when an order is created.
type OrderCreated struct {
	OrderID  string `json:"order_id" validate:"required"`
	Customer string `json:"customer" validate:"required"`
	Amount   int64  `json:"amount" validate:"gt=0"`
	// Poison makes the payments handler refuse the event for good
	// (POST /orders?poison=1): it is parked, for the parked pages of
	// outboxctl and the console to show.
	Poison bool `json:"poison,omitempty"`
	// Note pads the event (POST /orders?too_large=1): see demo.go.
	Note string `json:"note,omitempty"`
}

// Topic is the Kafka topic of the orders context.
func (OrderCreated) Topic() string { return ordersTopic }

// ContentSchema is the event's stable type name on the wire.
func (OrderCreated) ContentSchema() string { return "OrderCreated.v1" }

// PartitionKey keeps every event of one order in order.
func (e OrderCreated) PartitionKey() string { return e.OrderID }

// Order is an order document.
type Order struct {
	ID        string    `bson:"_id" json:"id"`
	Customer  string    `bson:"customer" json:"customer"`
	Amount    int64     `bson:"amount" json:"amount"`
	Status    string    `bson:"status" json:"status"`
	Reason    string    `bson:"reason,omitempty" json:"reason,omitempty"`
	PaymentID string    `bson:"payment_id,omitempty" json:"payment_id,omitempty"`
	CreatedAt time.Time `bson:"created_at" json:"created_at"`
	UpdatedAt time.Time `bson:"updated_at" json:"updated_at"`
}

// ordersService is the orders context of one replica.
type ordersService struct {
	client *outbox.Client
	orders *mongo.Collection
}

// errAbortedOnPurpose is what the fail-after-write route returns from its
// transaction, after the order and its event were written in it.
var errAbortedOnPurpose = errors.New("aborted on purpose after writing the order and recording OrderCreated")

// ErrNotFound reports an unknown order.
var ErrNotFound = errors.New("order not found")

// newOrdersService registers the orders handlers on client.
func newOrdersService(client *outbox.Client, db *mongo.Database) *ordersService {
	s := &ordersService{client: client, orders: db.Collection("orders")}
	outbox.MustHandle(client, s.onPaymentCompleted)
	outbox.MustHandle(client, s.onPaymentFailed)
	return s
}

// orderOptions are the variants of Create.
type orderOptions struct {
	// idempotencyKey is the request's Idempotency-Key header: the order's
	// id derives from it, so a retried request finds the order it created
	// instead of creating a second one, and OrderCreated carries it as its
	// idempotency key (outbox.WithIdempotencyKey).
	idempotencyKey string
	// failAfterWrite makes the transaction fail after writing the order and
	// recording OrderCreated: neither survives.
	failAfterWrite bool
	// poison and note: see OrderCreated.
	poison bool
	note   string
}

// errKeyReused reports an Idempotency-Key already used for another order.
var errKeyReused = errors.New("this Idempotency-Key was already used for another order")

// orderKeys is the namespace of the order ids derived from Idempotency-Key
// headers (UUIDv5).
var orderKeys = uuid.MustParse("6f0d3c7e-2b1a-4c55-9e1f-0a7d6c5b4e31")

// Create stores a new order and records OrderCreated in one transaction.
// With an idempotency key, a second call with the same key, customer and
// amount returns the first order (replayed true) and records nothing; with
// another customer or amount it fails with errKeyReused.
func (s *ordersService) Create(ctx context.Context, customer string, amount int64, opts orderOptions) (o Order, replayed bool, err error) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	o = Order{ID: uuid.NewString(), Customer: customer, Amount: amount, Status: StatusPending, CreatedAt: now, UpdatedAt: now}
	var record []outbox.RecordOption
	if opts.idempotencyKey != "" {
		// One order per key: the key decides the order's id, and the
		// insert of a second order with that id fails in the transaction,
		// which then records nothing.
		o.ID = uuid.NewSHA1(orderKeys, []byte(opts.idempotencyKey)).String()
		record = append(record, outbox.WithIdempotencyKey(opts.idempotencyKey))
	}
	err = s.client.Transact(ctx, func(ctx context.Context) error {
		if _, err := s.orders.InsertOne(ctx, o); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		e := OrderCreated{OrderID: o.ID, Customer: customer, Amount: amount, Poison: opts.poison, Note: opts.note}
		if err := outbox.Record(ctx, e, record...); err != nil {
			return err
		}
		if opts.failAfterWrite {
			return errAbortedOnPurpose
		}
		return nil
	})
	if opts.idempotencyKey != "" && mongo.IsDuplicateKeyError(err) {
		first, gerr := s.Get(ctx, o.ID)
		if gerr != nil {
			return o, false, gerr
		}
		if first.Customer != customer || first.Amount != amount {
			return first, false, errKeyReused
		}
		return first, true, nil
	}
	return o, false, err
}

// Get returns an order.
func (s *ordersService) Get(ctx context.Context, id string) (Order, error) {
	var o Order
	err := s.orders.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&o)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return o, ErrNotFound
	}
	return o, err
}

// onPaymentCompleted marks the order paid, in the handling transaction.
func (s *ordersService) onPaymentCompleted(ctx context.Context, e PaymentCompleted, _ outbox.Metadata) error {
	return s.settle(ctx, e.OrderID, bson.D{
		{Key: "status", Value: StatusPaid},
		{Key: "payment_id", Value: e.PaymentID},
	})
}

// onPaymentFailed marks the order failed, in the handling transaction.
func (s *ordersService) onPaymentFailed(ctx context.Context, e PaymentFailed, _ outbox.Metadata) error {
	return s.settle(ctx, e.OrderID, bson.D{
		{Key: "status", Value: StatusFailed},
		{Key: "reason", Value: e.Reason},
	})
}

// settle moves a pending order to its final status. The inbox already makes
// the handler run once per event; the status filter also keeps a settled
// order from being changed by a different, later event.
func (s *ordersService) settle(ctx context.Context, id string, set bson.D) error {
	set = append(set, bson.E{Key: "updated_at", Value: time.Now().UTC().Truncate(time.Millisecond)})
	_, err := s.orders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: id}, {Key: "status", Value: StatusPending}},
		bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("settle order %s: %w", id, err)
	}
	// Nothing matched: unknown or already settled. Nothing to do, and not
	// worth a retry.
	return nil
}

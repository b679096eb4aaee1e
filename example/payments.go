package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox"
)

// The payments bounded context: it owns the payments collection, handles
// OrderCreated and publishes PaymentCompleted or PaymentFailed on the
// "payments" topic.

// creditLimit is the largest amount the payments context accepts; larger
// orders fail, which shows the failure path end to end.
const creditLimit = 1000

// PaymentCompleted is published when an order's payment succeeded.
type PaymentCompleted struct {
	OrderID   string `json:"order_id" validate:"required"`
	PaymentID string `json:"payment_id" validate:"required"`
	Amount    int64  `json:"amount" validate:"gt=0"`
}

// Topic is the Kafka topic of the payments context.
func (PaymentCompleted) Topic() string { return paymentsTopic }

// ContentSchema is the event's stable type name on the wire.
func (PaymentCompleted) ContentSchema() string { return "PaymentCompleted.v1" }

// PartitionKey keeps every payment event of one order in order.
func (e PaymentCompleted) PartitionKey() string { return e.OrderID }

// PaymentFailed is published when an order's payment was declined.
type PaymentFailed struct {
	OrderID   string `json:"order_id" validate:"required"`
	PaymentID string `json:"payment_id" validate:"required"`
	Reason    string `json:"reason" validate:"required"`
}

// Topic is the Kafka topic of the payments context.
func (PaymentFailed) Topic() string { return paymentsTopic }

// ContentSchema is the event's stable type name on the wire.
func (PaymentFailed) ContentSchema() string { return "PaymentFailed.v1" }

// PartitionKey keeps every payment event of one order in order.
func (e PaymentFailed) PartitionKey() string { return e.OrderID }

// Payment is a payment document.
type Payment struct {
	ID        string    `bson:"_id"`
	OrderID   string    `bson:"order_id"`
	Amount    int64     `bson:"amount"`
	Status    string    `bson:"status"` // "COMPLETED" or "DECLINED"
	CreatedAt time.Time `bson:"created_at"`
}

// paymentsService is the payments context of one replica.
type paymentsService struct {
	client   *outbox.Client
	payments *mongo.Collection
}

// newPaymentsService registers the payments handler on client.
func newPaymentsService(client *outbox.Client, db *mongo.Database) *paymentsService {
	s := &paymentsService{client: client, payments: db.Collection("payments")}
	outbox.MustHandle(client, s.onOrderCreated)
	return s
}

// onOrderCreated charges the order. The payment document and the resulting
// event commit in the handling transaction together with the inbox entry,
// so the order is charged once however often OrderCreated is delivered.
func (s *paymentsService) onOrderCreated(ctx context.Context, e OrderCreated, _ outbox.Metadata) error {
	if e.Poison {
		// A permanent failure: parked at once (a failing handler would be
		// retried Config.MaxAttempts times first). Re-driving it fails
		// again; purge it (outboxctl parked purge, or the console).
		return outbox.Park(fmt.Errorf("order %s is poison on purpose (POST /orders?poison=1): the payments context refuses it for good", e.OrderID))
	}
	p := Payment{ID: uuid.NewString(), OrderID: e.OrderID, Amount: e.Amount, Status: "COMPLETED",
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if e.Amount > creditLimit {
		p.Status = "DECLINED"
	}
	if _, err := s.payments.InsertOne(ctx, p); err != nil {
		return fmt.Errorf("insert payment: %w", err)
	}
	if p.Status == "DECLINED" {
		return outbox.Record(ctx, PaymentFailed{OrderID: e.OrderID, PaymentID: p.ID,
			Reason: fmt.Sprintf("amount %d exceeds the credit limit of %d", e.Amount, creditLimit)})
	}
	return outbox.Record(ctx, PaymentCompleted{OrderID: e.OrderID, PaymentID: p.ID, Amount: e.Amount})
}

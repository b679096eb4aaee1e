// Package outbox makes "save my data and tell the other services" reliable
// for Go services built on MongoDB and Kafka.
//
// A service changes its documents and records events in one MongoDB
// transaction (the transactional outbox); a publisher relays committed
// events to Kafka; a consumer on the other side records each event in an
// inbox and runs its handler in a transaction that also flips the inbox
// entry, so an event delivered many times has one effect.
//
// # Guarantees
//
// At-least-once publishing, at-least-once delivery and idempotent handling:
//
//   - An event is published if and only if its transaction committed.
//   - Every committed event is eventually published, however often the
//     process, MongoDB or Kafka fail, as long as they come back.
//   - A handler's effects written through its context commit exactly once
//     per event (topic, content schema, idempotency key), however often the
//     event is delivered. Side effects outside MongoDB are at-least-once.
//   - Events with the same partition key are published and handled in
//     commit order (for transactions that are causally ordered: one started
//     after the other committed).
//   - A handler that keeps failing is retried with backoff, then its event
//     is parked (listed by ParkedEvents, re-driven by Redrive); a malformed
//     record is parked at once. Neither blocks its partition.
//
// # Declaring events
//
// An event is a Go struct implementing Event, validated with
// go-playground/validator tags:
//
//	type OrderCreated struct {
//		OrderID string `json:"order_id" validate:"required"`
//		Amount  int64  `json:"amount" validate:"gt=0"`
//	}
//
//	func (OrderCreated) Topic() string           { return "orders" }
//	func (OrderCreated) ContentSchema() string   { return "OrderCreated.v1" }
//	func (e OrderCreated) PartitionKey() string  { return e.OrderID }
//
// # Recording events
//
// Client.Transact runs a function in a MongoDB transaction; operations that
// use its context join the transaction, and Record adds events to it:
//
//	err := client.Transact(ctx, func(ctx context.Context) error {
//		if _, err := orders.InsertOne(ctx, order); err != nil {
//			return err
//		}
//		return outbox.Record(ctx, OrderCreated{OrderID: order.ID, Amount: order.Amount})
//	})
//
// # Handling events
//
// Handlers are plain functions registered per event type. Their context
// carries the handling transaction:
//
//	outbox.MustHandle(client, func(ctx context.Context, e OrderCreated, _ outbox.Metadata) error {
//		_, err := payments.InsertOne(ctx, Payment{OrderID: e.OrderID})
//		return err
//	})
//
// # Running
//
// Client.Run publishes and consumes until its context ends; run it next to
// the HTTP server, in as many replicas as you like. Replicas split the Kafka
// partitions through two consumer groups: Config.ConsumerGroup for handling
// and Config.PublisherGroup for publishing (its members never fetch).
//
// # Storage
//
// Events wait in the outbox collection until published; received events are
// kept in the inbox collection. Partial TTL indexes (EnsureIndexes) delete
// published and handled documents after Config.OutboxRetention and
// Config.InboxRetention; nothing unpublished, unhandled or parked expires.
// The inbox retention must outlast the time a record can be redelivered.
//
// # Wire format
//
// See the constants HeaderVersion and following: value = the event's JSON,
// key = the partition key, headers for the content schema, idempotency key,
// occurred-at time and W3C trace context.
package outbox

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
//     is parked (listed by Admin.ParkedEvents, re-driven by Redrive); a malformed
//     record is parked at once. Neither blocks its partition: under
//     Config.PoisonPolicy HoldKey (the default) the later events of its
//     partition key are held behind it, in order, until it is re-driven or
//     purged, and other keys move on; SkipEvent lets them go on without it.
//     Handlers return Park(err) to park at once and Snooze(d) to retry
//     later without using an attempt.
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
// An inbox collection belongs to one consumer group (ErrInboxOwned): services
// sharing a database need their own collections. The outbox_meta collection
// holds the inbox stamps, the publish topics' partition counts, which let
// Transact record without Kafka (ErrPartitionsUnknown), and a liveness
// record per running replica (Admin.Replicas), expired by a TTL index.
//
// # Telemetry
//
// The framework reports through the OpenTelemetry API only:
// Config.MeterProvider and Config.TracerProvider, the global providers by
// default. Install an SDK (and, say, a Prometheus exporter) in the service
// to collect them; without one they cost next to nothing.
//
// Traces: the trace context of the context passed to Record is stored with
// the event and sent in the W3C traceparent and tracestate headers; each
// handling attempt runs in a span "<topic> process" whose parent is that
// context, so a request's trace continues into the handlers it caused and
// into the events they record. Each published batch is a span
// "<topic> publish" linked to its events' traces.
//
// Metrics: outbox.events.recorded, .published, .publish_failed, .handled,
// .skipped, .retried and .parked (counters); outbox.publish.duration and
// outbox.handle.duration (histograms, seconds); outbox.rebalances and
// outbox.change_stream.reopens; and,
// while Run runs, the gauges outbox.pending and outbox.pending.oldest_age
// per topic, outbox.failed, outbox.parked, outbox.partitions.owned per role
// and outbox.consumer.lag per partition. The storage gauges cost one
// aggregation over the unpublished outbox documents and one count of the
// parked inbox documents per 5 seconds at most, whatever the scrape rate.
//
// # Operations
//
// Client.Status (and Client.StatusHandler, its JSON over HTTP) reports the
// partitions this process publishes and handles, the pending, failed and
// parked counts, the age of the oldest pending event and the last error,
// never credentials. Admin works on the collections alone, without Kafka:
// StoreStatus, FailedEvents and RetryFailed for events Kafka refused,
// ParkedEvents, RequestRedrive and PurgeParked for parked events, Replicas
// for the running replicas' liveness records (their group member ids and
// when each was last seen, so that a dead member can be told from a live
// one while its group still lists it). A
// re-drive request is served by a running consumer of the service that has
// the event's handler, within seconds; cmd/outboxctl offers all of this on
// the command line.
//
// Admin.Doctor (Client.Doctor with the Client's configuration, outboxctl
// doctor, the console's Health page) checks the MongoDB and Kafka settings
// the guarantees rest on: unclean leader election, min.insync.replicas,
// compaction, retention, max.message.bytes, partition counts, records that
// expired unread, codecs, the replica set, the oplog window,
// transactionLifetimeLimitSeconds, the default write concern, the indexes,
// the clock and the inbox's owner. Run runs it once at start and logs what
// breaks a guarantee, with the fix (Status.Doctor).
//
// # Wire formats
//
// The native format (see the constants HeaderVersion and following): value
// = the event's JSON, key = the partition key, headers for the content
// schema, idempotency key, occurred-at time and W3C trace context. A topic
// may instead use the Python event-outbox library's flat JSON body or
// CloudEvents 1.0 (Kafka binding, binary mode): Config.WireFormats, and the
// Format type for the exact layouts. Consumers detect the format of every
// record, and park as malformed a record that carries no idempotency key.
package outbox

// Package topicmeta holds what recording needs to know of the publish
// topics from Kafka: each topic's partition count and max.message.bytes,
// kept in memory, persisted in outbox_meta (through internal/store) and
// refreshed from Kafka's metadata.
//
// Record stores the partition of each event (murmur2 of its key modulo the
// topic's partition count), so it needs the count of every publish topic,
// and it must never ask Kafka for it: it runs inside the caller's MongoDB
// transaction, and a Kafka outage must only delay publishing. The counts
// therefore live in memory (Topics), persisted in MongoDB (one outbox_meta
// document per topic, from the last successful Kafka metadata read), and
// are obtained before any transaction starts:
//
//   - Topics.Run, Run's refresh goroutine, loads them from MongoDB at
//     start, then reads Kafka's metadata every metadataInterval (with
//     backoff after failures) and persists changed counts;
//   - Topics.Prepare, called by Transact and the handlers' transactions
//     outside the transaction, returns at once when every count is known
//     and fresh, else loads them from MongoDB, and only for a topic still
//     unknown (a first-ever start: nothing persisted) reads Kafka, bounded
//     by Config.LookupTimeout and at most once per kafkaRetry while Kafka
//     fails. So Transact works before Run (and without it) when Kafka is
//     up.
//
// A restart during a Kafka outage records normally with the persisted
// counts. A first-ever start with Kafka down records nothing: Topics.Get
// fails at once with ErrPartitionsUnknown, and Transact returns that error
// within about the lookup timeout instead of hanging in an open
// transaction.
//
// Each read also learns the topics' max.message.bytes (DescribeConfigs:
// the topic's own value, or the broker's message.max.bytes it inherits),
// kept and persisted with the counts: Record refuses an event that cannot
// fit and the publisher sizes its producer's batches by it. A failed
// config read (an ACL, say) leaves the limit unknown and never fails the
// count. With Config.CreatePartitions a read creates the publish topics
// Kafka does not know.
//
// Topics are bare (without the topic prefix) everywhere here but in
// requests to Kafka (Config.KafkaTopic).
//
// It does not import the root package: the root gives it its configuration
// as plain values and keeps the public errors, which are this package's
// (outbox.ErrPartitionsUnknown is ErrPartitionsUnknown).
//
// # Goroutines
//
// Topics.Run is the only goroutine: the root starts it in Run's group when
// there are publish topics, and it returns nil when Run's context ends,
// its Kafka client closed then, also mid-request. Kafka failing never ends
// it; only a Kafka client that cannot be made at all returns an error.
// Prepare and Refresh run on their caller's goroutine, bounded by a
// timeout of their own; Prepare's slow path runs one caller at a time.
package topicmeta

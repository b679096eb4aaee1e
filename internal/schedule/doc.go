// Package schedule holds the mechanics of delayed publication: the
// promotion of scheduled events (recorded with a publication time into the
// collection of scheduled events, store.ScheduledSuffix) into the outbox
// at their due time, by the owner of their partition.
//
// A scheduled event never sits in the outbox's pending index: the
// publisher's backlog scans and change stream never meet an event that is
// not due, however many wait. At its due time the owner of its partition
// promotes it in one transaction (Mongo.Promote): it marks the scheduled
// document promoted (the tombstone a cancellation reads as "too late") and
// inserts the outbox document with a new _id and a fresh seq, so the event
// counts as recorded when it is promoted: per partition key, scheduled
// events are published by due time then commit order, and an event
// recorded before a scheduled one's promotion is never held behind it.
// Two promoters of one partition (a rebalance, a zombie) cannot both
// promote an event: the second one's mark meets the first one's write
// (a write conflict, or a count short of the events it read), and its
// transaction is aborted. Promotion needs no lease: what it writes is
// published by the publisher's fenced workers. A process killed in a
// promotion leaves its transaction open, its writes on the events it read:
// each promotion's session is first given to Mongo.Session (the root
// records it for the takeover, internal/liveness), and a promotion that
// meets such a write calls Mongo.Locked (the root asks for a reap), so the
// next owner ends the dead transaction instead of waiting for MongoDB's
// transaction lifetime.
//
// Per owned partition a loop keeps a horizon: the next due times, at
// most Config.Horizon of them, read from the index outbox_scheduled_due,
// and sleeps until the first (or Config.Refill, whichever is sooner). A
// newly scheduled event reaches the loop of its partition through
// Set.Notify (the change stream of Watch): it joins the horizon when it is
// due before the horizon's end. The periodic refill covers any
// notification lost (a stream reopened, an insert while the partition
// changed owners).
//
// # Goroutines and how each stops
//
//   - Loop: one goroutine per owned partition, started by Set.Assign and
//     stopped by Set.Revoke (and Set.Close): its context is cancelled (a
//     promotion in flight is aborted, nothing half-done stays) and the call
//     returns after the goroutine exited.
//   - Watch runs in the caller's goroutine until its context ends; a
//     failing stream is reopened with backoff.
//
// Nothing here starts a goroutine that outlives the Set or Watch.
package schedule

import "fmt"

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

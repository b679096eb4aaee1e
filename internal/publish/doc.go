// Package publish holds the mechanics of the outbox publisher: a run of
// the publisher (Publisher: the Kafka client of the publisher group, its
// rebalance callbacks, the lease that fences a member whose group session
// can no longer be confirmed and what renews it, the background loops and
// the drain), one worker goroutine per owned Kafka partition, the set of
// workers that follows the group assignment, the change-stream watcher
// that hands new events to workers, the marker that marks the events
// produced from the stream, and the producers with the topic size limits
// they follow (Producers). Retries are spaced by internal/retry, as in the
// consumer.
//
// # Goroutines and how each stops
//
//   - Publisher.Run runs in the caller's goroutine until its context ends.
//     It starts the marker, the watcher, the session probe, under KIP-848
//     the session-timeout follower, and followTopics (the topics' counts
//     and limits), all on a context of their own that it cancels after the
//     workers stopped and the group was left (bounded by leaveTimeout); it
//     waits for them, closes the group client, then the producers, and
//     returns. The group client's own goroutines (kgo's) run the rebalance
//     callbacks, which start and stop workers; they end when Run closes
//     the client.
//   - Producers: kgo's goroutines of the main and solo producers, and one
//     goroutine per replaced producer (new size limits, a recreated topic)
//     that flushes and closes it; Producers.Close cancels the flushes,
//     waits for them and closes the clients.
//   - Worker: one goroutine per owned partition, started by Set.Assign. It
//     stops gracefully (Set.Revoke, Set.Close: finish the batch in flight,
//     mark it, exit) or at once (Set.Lose: cancel the batch, do not mark).
//     Both calls return after the goroutine has exited.
//   - Per batch, a worker starts a short-lived goroutine that cancels the
//     batch context when the lease is revoked, and one per produce call (a
//     wave, or a record sent alone) that waits for the producer's promises,
//     one at a time. Each ends when its batch or call ends (the promise
//     waiter, after a hard stop, when the producer resolves or fails the
//     records, at the latest when the producer client is closed).
//   - Watcher: Watcher.Run runs in the caller's goroutine and returns when
//     its context ends; a failing stream is reopened with backoff.
//   - Marker: Marker.Run runs in the caller's goroutine. Its owner cancels
//     its context after every worker has stopped; it then writes what is
//     left (bounded by Marker.Timeout) and returns.
//
// A batch is produced in waves that hold at most one event per key, so no
// event of a key is in flight while an earlier one may still fail. Kafka's
// refusals for good are judged per record (a refused wave is sent again
// one record at a time, and a record too large for the producer's batches
// is always sent alone), and under the hold policy a refused event holds
// the later events of its key: see Worker and the holds type. A document
// that cannot be read is marked failed like a refused event; it never
// stops its partition.
//
// Nothing here knows the outbox document format: the root package provides
// a Store that reads and marks events and builds their Kafka records, the
// decoder of the documents the change stream delivers and their field
// names, and the configuration as plain values (Config). Nothing here
// imports the root package.
package publish

import "fmt"

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

// Package publish holds the mechanics of the outbox publisher: one worker
// goroutine per owned Kafka partition, the set of workers that follows the
// group assignment, the lease that fences a member whose group session can
// no longer be confirmed, the change-stream watcher that hands new events
// to workers, and the marker that marks the events produced from the
// stream. Retries are spaced by internal/retry, as in the consumer.
//
// # Goroutines and how each stops
//
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
// a Store that reads and marks events and builds their Kafka records.
package publish

import "fmt"

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

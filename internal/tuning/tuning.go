// Package tuning holds bounds of the framework's mechanics that its own
// harnesses (cmd/outbox-chaos) shrink to provoke rare paths often. Users
// cannot reach it (internal) and never need to: the defaults are the
// framework's documented behaviour.
package tuning

import "sync/atomic"

// ConsumerQueueRecords and ConsumerQueueBytes, when positive, replace the
// consumer's queue bound per partition (5000 records, 8 MiB of values): a
// partition's fetching pauses when its queue reaches either. A tiny bound
// turns every fetch into a pause and a resume, the pause storm the chaos
// harness uses to exercise the pause/resume handshake. Read at each
// enqueue, so set them before Run.
var ConsumerQueueRecords, ConsumerQueueBytes atomic.Int64

// PublisherOwnership is a callback that, when set, every publisher of the
// process calls when its group assigns it partitions (before their workers
// start) and after it revoked or lost them (after their workers stopped:
// nothing is produced for them afterwards), with the *outbox.Client that
// runs it, the change ("assigned", "revoked", "lost") and the partitions
// by Kafka topic. The chaos harness checks with it that no replica
// produced a record for a partition it did not own. Called on the group
// client's goroutine: it must return quickly.
var PublisherOwnership atomic.Pointer[func(owner any, change string, partitions map[string][]int32)]

// NotePublisherOwnership calls PublisherOwnership when it is set.
func NotePublisherOwnership(owner any, change string, partitions map[string][]int32) {
	if f := PublisherOwnership.Load(); f != nil {
		(*f)(owner, change, partitions)
	}
}

// ConsumerNoDuplicateLookup turns off, when set, the consumer's look-up
// of the inbox before a transaction after it met a duplicate (see lookup
// in internal/consume): a redelivered event is then found only by its
// claim, which rolls back the transaction it shares with others, as the
// consumer did before that look-up existed. The look-ups of the first
// units after an assignment, which count attempts, still run.
// cmd/outbox-bench sets it to measure what the look-up saves after a
// takeover. Read at each unit.
var ConsumerNoDuplicateLookup atomic.Bool

// NoFetchWatch turns the consumer's fetch watch off (internal/kafkawatch)
// when set: a partition its Kafka client stops fetching then
// stays behind, unseen. The chaos harness sets it to show that its
// kafka-fetch-forget fault needs the watch. Read when a consumer starts.
var NoFetchWatch atomic.Bool

// FetchWatchTrace is a callback that, when set, the consumer's fetch watch
// calls with its verdict on each owned partition at each round: the
// *outbox.Client that runs it, the partition's Kafka topic and number, and
// the verdict in words ("paused", "recent", "caught up at N", "clean at
// N", "probe failed at N: ...", "restart at N", "re-subscribe at N"...).
// The chaos harness keeps the last one per partition for its stall report.
// Called on the watch's goroutine: it must return quickly.
var FetchWatchTrace atomic.Pointer[func(owner any, topic string, partition int32, verdict string)]

// NoteFetchWatch calls FetchWatchTrace when it is set.
func NoteFetchWatch(owner any, topic string, partition int32, verdict string) {
	if f := FetchWatchTrace.Load(); f != nil {
		(*f)(owner, topic, partition, verdict)
	}
}

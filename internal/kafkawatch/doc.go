// Package kafkawatch holds the framework's workarounds for the behaviour of
// its Kafka client (kgo) and brokers, removable as a unit when the client
// no longer needs them:
//
//   - the fetch watch (fetch.go, FetchWatch): finds owned partitions the
//     client stopped fetching while the broker has records, shows them as
//     a "fetch" wait and restarts their fetching;
//   - the lag poller (lag.go, LagPoller): lists end offsets, so that the
//     lag gauge of a partition nobody fetches keeps growing;
//   - fatal group errors (fatal.go, FatalHook): group errors that retrying
//     cannot fix end Run instead of looping forever;
//   - the watcher of recreated topics (recreated.go, RecreationWatch):
//     kgo never adopts the new id of a topic deleted and created again, so
//     the watcher compares the broker's topic id with the client's,
//     resubscribes the topic and has one replica of the group set the
//     group's offsets of it to the new topic's start.
//
// It knows no MongoDB and does not import the root package: the consumer
// gives each mechanism its Kafka client and callbacks into its state, and
// the recreation watcher the reset claims the group's replicas share
// (Resets, kept in outbox_meta by internal/store).
//
// # Goroutines
//
// FetchWatch.Run, LagPoller.Run and RecreationWatch.Run each run on the
// goroutine the consumer starts for them after creating its Kafka client,
// until their context ends; the consumer cancels that context and waits for
// them before closing the client. The fetch watch's own Kafka client (for
// its probes) is closed when Run returns. RecreationWatch.Note runs on the
// poll loop's goroutine and only records what a poll saw; a resubscription
// (RecreationWatch.Resubscribe) runs on the watcher's goroutine, its reset
// bounded by resetWait plus a request timeout and its claim's last write
// by a request timeout even when the context ends. FatalHook starts
// nothing: kgo calls it on the group client's goroutines.
package kafkawatch

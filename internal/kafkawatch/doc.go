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
//     cannot fix end Run instead of looping forever.
//
// The watcher of recreated topics (the root's recreated.go) is to join this
// package.
//
// It knows no MongoDB and does not import the root package: the consumer
// gives each mechanism its Kafka client and callbacks into its state.
//
// # Goroutines
//
// FetchWatch.Run and LagPoller.Run each run on the goroutine the consumer
// starts for them after creating its Kafka client, until their context
// ends; the consumer cancels that context and waits for them before closing
// the client. The fetch watch's own Kafka client (for its probes) is closed
// when Run returns. FatalHook starts nothing: kgo calls it on the group
// client's goroutines.
package kafkawatch

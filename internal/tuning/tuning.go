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

// Package liveness holds the replica records and the takeover after a
// crash.
//
// Each running Client keeps a liveness record of its own in the
// outbox_meta collection (record.go): who it is, which group members it
// holds, when it was last seen by MongoDB's clock, and the session ids its
// consumer and its promotions of scheduled events run transactions on. A
// replica that meets a lock left by a dead one ends the dead one's
// recorded sessions (takeover.go), so that its transactions abort at once
// instead of when MongoDB's transaction lifetime runs out.
//
// It does not import the root package: the root gives it the collection,
// the group metadata and the logging it needs, and converts the records it
// reads into the public outbox.Replica.
//
// # Goroutines
//
// Record.Run refreshes the record on a goroutine the root starts at Run's
// start and stops (cancel, wait) after both groups were left; then the root
// writes the record a last time, marked stopped. Sessions.Reap starts at
// most one reap goroutine at a time, bounded by reapTimeout; Sessions.Stop
// cancels it and waits for it.
package liveness

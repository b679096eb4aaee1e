// Package consume holds the mechanics of the outbox consumer: one worker
// goroutine per owned Kafka partition, which schedules the partition's
// events by partition key (sched.go), runs them through the stages of the
// record path (stages.go: decode, check the key, park what cannot run,
// look up, claim and handle, settle), releases held keys, pauses the
// partition's fetching past its bound, and commits the lowest offset not
// yet settled (worker.go); and the set of workers that follows the group
// assignment (set.go). What a partition waits on is listed for status,
// logs and metrics (waits.go).
//
// # Goroutines and how each stops
//
//   - Worker loop: one per owned partition, started by Set.Assign. It owns
//     the partition's scheduler. Set.Revoke and Set.Close stop it after its
//     running units (each one transaction, canceled after
//     Config.DrainTimeout) and a last commit; Set.Lose does the same
//     without committing. All return after the loop has returned.
//   - Units: at most Config.Slots goroutines per partition, each running
//     one unit (one transaction, or one step of a release) and handing its
//     outcome back to the loop, which waits for all of them before it
//     returns.
//   - Commits and reads of the partition's held keys: at most one of each
//     at a time per partition, handed back to the loop the same way.
//
// Nothing here sleeps: a retry is a time at which an event's lane may run
// again, so that only the event's key waits, and a stop never waits for a
// retry delay.
//
// Nothing here knows MongoDB or the inbox document format: the root
// package provides a Host (decoding and offset commits of its own; the
// inbox, its key sequences and the handling transactions through
// internal/inboxhost) and an Observer (metrics, logs).
package consume

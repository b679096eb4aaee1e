// Package store is the storage format of the framework in MongoDB and the
// operations on it that need no client: the field names of outbox and
// inbox documents, the publisher's reads and marks of the outbox (Outbox),
// the metadata collection, the index definitions and their
// reconciliation, the inbox owner's stamp, the reset claims of recreated
// topics, the one-attempt transactions' commit and end, and the
// Python event-outbox library's outbox that a service must migrate from.
//
// The root package, the console and the chaos harness read and write the
// format through this package's names, so that a field is spelled once.
// The root keeps the public names (outbox.ErrIndexConflict is
// ErrIndexConflict) and everything that needs a Client's configuration.
//
// No goroutines are started here: every function runs on its caller's
// goroutine and returns when its commands have, bounded by the caller's
// context (End is bounded on its own, see there).
//
// Invariants:
//
//   - Field names, index names and MetaCollection are the storage format:
//     stored documents, other replicas of other versions and the Python
//     library read them. Renaming one is a migration, not a refactoring.
//   - Indexes are matched by definition (key pattern and partial filter),
//     not by name: an equivalent index under another name is reused and
//     its TTL adjusted in place; one that cannot serve is reported as
//     ErrIndexConflict before anything changes. Several replicas may
//     reconcile at once: a creation that races another is checked again.
//   - Unpublished, unhandled and parked documents never expire: every TTL
//     index is partial on the flag of a settled document.
//   - An inbox belongs to one consumer group: its stamp in MetaCollection
//     is set on insert only.
//   - A consumer write is one transaction attempt: a write conflict fails
//     at once (IsWriteConflict) instead of waiting on another
//     transaction's lock or being retried by the driver.
package store

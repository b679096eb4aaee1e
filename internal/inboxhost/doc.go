// Package inboxhost is the consumer's inbox in MongoDB: the part of
// internal/consume's Host that writes and reads the inbox. It owns the
// handling transaction (one bulk claim of the events' inbox documents, the
// handlers in order, the insert of the events they recorded, the commit,
// all one attempt), the classification of how a transaction ended
// (consume.Result), the failure notes and attempt counts of delivered
// events, and the key sequences of Config.PoisonPolicy HoldKey (hold, park,
// release of a releasable head, failures of a head, the heads of a
// partition's held keys).
//
// It is a package of its own, not a part of internal/consume, because
// internal/consume knows neither MongoDB nor the inbox format: it
// schedules events and settles outcomes through its Host interface, and
// this package is the MongoDB side of that interface. It does not import
// the root package: the root gives it an App (decoding stored events,
// running handlers with their spans, reading what a handler's error asks
// for, beginning transactions with the events the handlers record) and
// adds to its Host the rest of consume.Host (decoding records, offset
// commits, ending dead replicas' sessions) and the Observer. The storage
// format itself (field names, filters, updates) is internal/store's.
//
// # Goroutines
//
// None are started here: every method runs on its caller's goroutine (a
// consumer worker's unit, or an operator's re-drive) and returns when its
// transaction has committed or ended, bounded by the caller's context and
// the handlers' timeouts (App.Timeout).
//
// # Invariants
//
//   - Every write is one transaction of one attempt (Tx; see
//     internal/store's txn.go): a write that meets another transaction's
//     lock fails at once, wrapped in consume.ErrLocked, and the consumer
//     backs off that key and asks for dead sessions to be ended.
//   - A claim flips the event's inbox document to handled in the
//     handlers' own transaction: the handlers' writes and the claim commit
//     together or not at all, so an event is handled at most once.
//   - A failure of the framework's own calls (a lock, MongoDB failing, the
//     unit's context ending) is never an attempt of the event; a failure
//     the handlers caused always is, so a handler that always fails or
//     always outlives its transaction ends parked, not retried for ever.
//   - Every operation on a key's sequence writes the key's head in its
//     transaction, so two operations on one key always conflict and one of
//     them runs again on what the other left: no crash or cancellation
//     between two operations leaves a sequence to repair.
package inboxhost

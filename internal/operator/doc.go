// Package operator holds the mechanics of what an operator does to the
// events the framework set aside, and of the loop that serves an
// operator's re-drive requests.
//
// # What it owns
//
//   - Parked inbox events (inbox.go, Inbox): the selection of parked
//     documents (ParkedFilter), their listing with the current head of
//     each held key, re-drive requests, purges, and the refusal to
//     request a re-drive of a record whose envelope could not be read.
//   - Re-drive requests (requests.go, Requests): the loop that finds the
//     requests due, claims one for a lease with a conditional update so
//     that one replica serves it, hands it to the caller to re-drive, and
//     settles what the re-drive left (done, deferred, or given back).
//   - Failed outbox events (outbox.go, Outbox): their listing (also of a
//     document that cannot be decoded), retry, discard, and the counts of
//     the keys they hold and the events waiting behind them.
//
// A re-drive itself (running the handler in a transaction, releasing the
// events held behind it) is the consumer's: the root runs it and tells
// Requests what it left (Outcome). The public names (outbox.ParkedEvent,
// outbox.FailedEvent, Admin's methods, the errors) stay at the root,
// which converts at the boundary; ErrNotParked and ErrNotRedrivable are
// defined here and re-exported by the root under the same names. The
// storage format is internal/store's. It does not import the root
// package: the inbox's _id type is a type parameter (ID), the root's
// outbox.InboxID.
//
// # Goroutines
//
// Requests.Run runs on a goroutine the consumer starts while it consumes
// (the root's startRedriveRequests) and returns when its context ends; the
// consumer cancels that context and waits for it. Every other function
// runs on its caller's goroutine, bounded by the caller's context
// (Inbox.Settle by settleTimeout as well, as it runs after that context
// may have ended).
//
// # Invariants
//
//   - A re-drive request is a flag on the parked document
//     (redrive_requested_at), not a record put back into Kafka or an
//     outbox: the inbox holds the payload already and only the consuming
//     service has the handler; re-publishing would hand the event to
//     every consumer group of the topic again. The cost is a latency of
//     up to the loop's period and one small indexed query (inbox_parked)
//     per replica per period.
//   - A request stays until its re-drive ran: a replica without the
//     event's handler leaves it to one that has it; a re-drive that could
//     not run for a reason that is not the handler's failure keeps it,
//     with why (redrive_deferred) and its next try (redrive_not_before).
//   - One replica serves a request at a time: its claim sets
//     redrive_not_before a lease ahead, conditionally on the request being
//     due and unchanged; a replica that dies after its claim leaves the
//     request to another one when the lease ends.
//   - A request made again while one is served (a new
//     redrive_requested_at) survives the settling of the old one.
//   - A selection without ids (a topic, all) leaves out what a re-drive
//     request cannot serve: unreadable records, and held events, whose
//     heads' re-drive releases them in order.
package operator

// Package claimcheck stores the payloads of events too large for a Kafka
// record out of band, in MongoDB, and reads them back: the claim check.
//
// It owns the payload collection (store.PayloadsCollection) of the
// claim-check database: its chunk documents, their indexes and their
// expiry, the reference format Kafka records carry (the dataref), and the
// record headers that carry it (HeaderNative for the native format,
// HeaderCloudEvents, CloudEvents' dataref extension attribute, for
// CloudEvents).
//
// A payload is cut into chunks of at most ChunkSize bytes, inserted in the
// caller's transaction next to the outbox document that refers to them, so
// both commit or neither does. Plain chunk documents rather than GridFS:
// they are inserted with the outbox's documents, and they carry the
// published flag and time a partial TTL index expires them by, which
// GridFS's fixed chunk documents do not (the README says more). The
// chunks' ref is the _id the event was recorded with, kept in its
// document's payload_ref (store.OutboxPayloadRef): a scheduled event's
// promotion gives its outbox document a new _id and copies payload_ref,
// so the chunks need no write when it is promoted. When the publisher
// marks events published it first marks their chunks published at the
// same time, by payload_ref (MarkPublished); a partial TTL index on
// published_at deletes published chunks after the outbox retention plus
// the configured margin. Unpublished chunks never expire, however long
// their scheduled event waits; the chunks of an event dropped unpublished
// (a cancelled scheduled event, a discarded failed one) are marked in the
// transaction that drops it, and expire by the same rule.
//
// The package starts no goroutines; every call runs on its caller's
// goroutine and honours its context. It does not import the root package.
package claimcheck

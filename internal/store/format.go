package store

// MetaCollection holds the framework's metadata documents in the
// configured database, next to the outbox and inbox collections:
//
//   - {_id: {inbox: <inbox collection>}, consumer_group, service,
//     stamped_at}: the consumer group that owns an inbox collection;
//   - {_id: {outbox: <outbox collection>, topic}, partitions,
//     max_message_bytes, read_at}: the partition count and size limit of a
//     publish topic at the last successful Kafka metadata read (TopicMeta);
//   - {_id: "replica:<instance id>", kind: "replica", ..., last_seen}: the
//     liveness record of a running client;
//   - {_id: {recreated: <consumer group>, topic, id}, claimed_at, done_at,
//     replica}: the reset of the group's offsets of a topic deleted and
//     created again, claimed by one replica and done once.
//
// A collection of its own rather than reserved documents in the inbox and
// outbox: every query on those collections (claims, parked and held lists,
// status counts, the publisher's scans and change stream, outboxctl, the
// Python event-outbox library in mixed fleets and migrations) would
// otherwise have to know to skip them, and a document whose _id is not an
// inbox id would break any code that decodes a whole inbox. Its name is
// fixed, not configurable, so that two services sharing a database always
// meet the same stamps. Its only index besides _id is a TTL index on
// last_seen restricted to the replica records (kind "replica"): stamps and
// counts never expire.
const MetaCollection = "outbox_meta"

// Field names of an outbox document (OutboxDoc). They are the storage
// format: indexes, the publisher's queries, the console, outboxctl and the
// Python event-outbox library in mixed fleets read them.
const (
	OutboxID             = "_id"
	OutboxTopic          = "topic"
	OutboxPartition      = "partition"
	OutboxKey            = "key"
	OutboxSchema         = "schema"
	OutboxIdempotencyKey = "idempotency_key"
	OutboxOccurredAt     = "occurred_at"
	OutboxPayload        = "payload"
	OutboxTraceParent    = "traceparent"
	OutboxTraceState     = "tracestate"
	OutboxFormat         = "format"
	OutboxSource         = "source"
	OutboxSeq            = "seq"
	OutboxCreatedAt      = "created_at"
	OutboxPublished      = "published"
	OutboxPublishedAt    = "published_at"
	OutboxFailed         = "failed"
	OutboxFailedAt       = "failed_at"
	OutboxError          = "error"
	OutboxAttempts       = "attempts"
	// OutboxPayloadRef is set, instead of the payload, on an event whose
	// payload the claim check stored in PayloadsCollection: the ref of its
	// chunks, the _id the event was recorded with (the outbox document's
	// own, or the scheduled document's for a scheduled event, whose
	// promotion gives its outbox document a new _id and copies this
	// field). The chunks are found and marked by it, never by the outbox
	// document's _id. OutboxPayloadSize is then the payload's length in
	// bytes.
	OutboxPayloadRef  = "payload_ref"
	OutboxPayloadSize = "payload_size"
)

// PayloadsCollection holds the payloads the claim check stores out of band
// (internal/claimcheck), in the claim-check database: one document per
// chunk, {_id, ref, n, count, size, data, published, published_at}, where
// ref is the payload_ref (OutboxPayloadRef) of the outbox or scheduled
// document that refers to the payload, n the chunk's index (from 0), count
// the number of chunks and size the payload's length. published is true
// once no unpublished event needs the chunks (their event was published,
// or cancelled or discarded unpublished), from published_at, which starts
// their expiry. Its name is fixed, so that the producer and its consumers,
// configured separately, meet the same collection.
const PayloadsCollection = "outbox_payloads"

// Field names of a payload chunk document (PayloadsCollection).
const (
	PayloadID          = "_id"
	PayloadRef         = "ref"
	PayloadN           = "n"
	PayloadCount       = "count"
	PayloadSize        = "size"
	PayloadData        = "data"
	PayloadPublished   = "published"
	PayloadPublishedAt = "published_at"
)

// Field names of an inbox document (InboxDoc). Its _id is the ordered
// subdocument {topic, content_schema, idempotency_key}, which the Python
// event-outbox library shares; the InboxIDTopic... paths reach into it.
const (
	InboxID                 = "_id"
	InboxIDTopic            = "_id.topic"
	InboxIDContentSchema    = "_id.content_schema"
	InboxIDIdempotencyKey   = "_id.idempotency_key"
	InboxHandled            = "handled"
	InboxHandledAt          = "handled_at"
	InboxParked             = "parked"
	InboxParkedAt           = "parked_at"
	InboxAttempts           = "attempts"
	InboxFailures           = "failures"
	InboxLastError          = "last_error"
	InboxPartition          = "partition"
	InboxOffset             = "offset"
	InboxPartitionKey       = "partition_key"
	InboxOccurredAt         = "occurred_at"
	InboxTraceParent        = "traceparent"
	InboxTraceState         = "tracestate"
	InboxPayload            = "payload"
	InboxReceivedAt         = "received_at"
	InboxHeldBy             = "held_by"
	InboxPayloadTruncated   = "payload_truncated"
	InboxUnreadable         = "unreadable"
	InboxParkReason         = "park_reason"
	InboxFault              = "fault"
	InboxRedriveRequestedAt = "redrive_requested_at"
	InboxRedriveDeferred    = "redrive_deferred"
	InboxRedriveNotBefore   = "redrive_not_before"
	InboxDiscardedAt        = "discarded_at"
	// InboxPayloadRef is the claim-check reference (dataref) of a record
	// whose payload was stored out of band: a re-drive resolves it again
	// when the inbox could not keep the whole payload.
	InboxPayloadRef = "payload_ref"
)

// Fields of the inbox id subdocument, as they sit inside _id and inside
// held_by (which names its key's head by its id).
const (
	IDTopic          = "topic"
	IDContentSchema  = "content_schema"
	IDIdempotencyKey = "idempotency_key"
)

// ScheduledSuffix makes the name of the collection of scheduled events
// (events recorded with a publication time) from the outbox collection's:
// "outbox" holds its scheduled events in "outbox_scheduled", in the same
// database. A collection of its own, not documents of the outbox: the
// backlog scans of outbox_pending and the change stream of outbox inserts
// never meet an event that is not due.
const ScheduledSuffix = "_scheduled"

// Field names of a scheduled event (ScheduledDoc) besides those of the
// outbox document it holds inline.
const (
	// ScheduledDueAt is when the event is to be published.
	ScheduledDueAt = "due_at"
	// ScheduledPromoted marks an event moved into the outbox: the document
	// stays as a tombstone (until ScheduledPromotedAt plus the outbox
	// retention) so that a cancellation can tell "too late" from "never
	// scheduled".
	ScheduledPromoted   = "promoted"
	ScheduledPromotedAt = "promoted_at"
)

package store

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Index names, part of the storage format.
const (
	IndexOutboxPending = "outbox_pending"
	IndexOutboxTTL     = "outbox_published_ttl"
	IndexOutboxFailed  = "outbox_failed"
	// IndexOutboxIdempotency is the unique index of unique idempotency
	// keys (OutboxIdempotencySpec).
	IndexOutboxIdempotency = "outbox_idempotency"
	IndexInboxTTL          = "inbox_handled_ttl"
	IndexInboxParked       = "inbox_parked"
	// IndexInboxParkedPartition serves the key sequences of held keys.
	IndexInboxParkedPartition = "inbox_parked_partition"
)

// OutboxIndexes are the indexes of the outbox collection: the publisher's
// backlog query (each replica reads only the partitions it owns, in
// order), the failed events for operators, the TTL of published events
// (retention, whole seconds) and, when unique is set, the unique
// idempotency keys.
func OutboxIndexes(retention time.Duration, unique bool) []IndexSpec {
	ttl := int32(retention.Seconds())
	specs := []IndexSpec{
		{
			Name:    IndexOutboxPending,
			Keys:    bson.D{{Key: OutboxTopic, Value: 1}, {Key: OutboxPartition, Value: 1}, {Key: OutboxSeq, Value: 1}, {Key: OutboxID, Value: 1}},
			Partial: bson.D{{Key: OutboxPublished, Value: false}},
		},
		{
			Name:    IndexOutboxFailed,
			Keys:    bson.D{{Key: OutboxFailedAt, Value: 1}},
			Partial: bson.D{{Key: OutboxFailed, Value: true}},
		},
		{
			Name:    IndexOutboxTTL,
			Keys:    bson.D{{Key: OutboxPublishedAt, Value: 1}},
			Partial: bson.D{{Key: OutboxPublished, Value: true}},
			TTL:     &ttl,
		},
	}
	if unique {
		specs = append(specs, OutboxIdempotencySpec())
	}
	return specs
}

// InboxIndexes are the indexes of the inbox collection: the parked events
// in parking order, the key sequences of held keys, and the TTL of handled
// events (retention, whole seconds). Unhandled and parked documents never
// expire: both partial indexes that could delete them select on a flag.
func InboxIndexes(retention time.Duration) []IndexSpec {
	ttl := int32(retention.Seconds())
	return []IndexSpec{
		{
			Name:    IndexInboxParked,
			Keys:    bson.D{{Key: InboxParkedAt, Value: 1}},
			Partial: bson.D{{Key: InboxParked, Value: true}},
		},
		{
			// The held keys of a partition, the sequence of a key and the
			// events held behind a head, in offset order. Partial: it
			// holds parked events only.
			Name: IndexInboxParkedPartition,
			Keys: bson.D{{Key: InboxIDTopic, Value: 1}, {Key: InboxPartition, Value: 1},
				{Key: InboxPartitionKey, Value: 1}, {Key: InboxOffset, Value: 1}},
			Partial: bson.D{{Key: InboxParked, Value: true}},
		},
		{
			Name:    IndexInboxTTL,
			Keys:    bson.D{{Key: InboxHandledAt, Value: 1}},
			Partial: bson.D{{Key: InboxHandled, Value: true}},
			TTL:     &ttl,
		},
	}
}

// OutboxIdempotencyKeys is the key of the unique index of unique
// idempotency keys (IndexOutboxIdempotency): the stored topic, content
// schema and idempotency key, as the Python library's "idempotency" index
// on its payload fields. It holds only while the first event's document is
// kept: published events expire after the outbox retention.
func OutboxIdempotencyKeys() bson.D {
	return bson.D{{Key: OutboxTopic, Value: 1}, {Key: OutboxSchema, Value: 1}, {Key: OutboxIdempotencyKey, Value: 1}}
}

// OutboxIdempotencySpec is the unique index of unique idempotency keys. It
// is partial, on the documents that have an idempotency key of their own:
// a service that took over a Python event-outbox database keeps the
// library's published documents until they expire, and those have the key
// inside their payload only; in a full index they would all collide on
// {null, null, null}. The earlier, non-partial definition is replaced on
// start.
func OutboxIdempotencySpec() IndexSpec {
	return IndexSpec{Name: IndexOutboxIdempotency, Keys: OutboxIdempotencyKeys(), Unique: true,
		Partial: bson.D{{Key: OutboxIdempotencyKey, Value: bson.D{{Key: "$type", Value: "string"}}}},
		Replaces: func(ix bson.D) bool {
			key, _ := Lookup(ix, "key")
			_, partial := Lookup(ix, "partialFilterExpression")
			return !partial && IndexBool(ix, "unique") && SameBSON(key, OutboxIdempotencyKeys(), true)
		}}
}

// Index names of the scheduled events' collection (ScheduledSuffix).
const (
	// IndexScheduledDue serves the promoter: the due events of a
	// partition, earliest first.
	IndexScheduledDue = "outbox_scheduled_due"
	// IndexScheduledKey serves a cancellation by idempotency key; unique
	// with unique idempotency keys.
	IndexScheduledKey = "outbox_scheduled_key"
	// IndexScheduledTTL expires the tombstones of promoted events.
	IndexScheduledTTL = "outbox_scheduled_promoted_ttl"
)

// ScheduledIndexes are the indexes of the scheduled events' collection:
// the due events of a partition in promotion order (due time, then commit
// order), partial on events neither promoted nor failed, so that promoted
// tombstones cost the promoter nothing; the cancellation's look-up by
// topic and idempotency key (unique when unique is set, as the outbox's);
// the TTL of the tombstones (the outbox's retention, whole seconds).
// Events not promoted never expire.
func ScheduledIndexes(retention time.Duration, unique bool) []IndexSpec {
	ttl := int32(retention.Seconds())
	return []IndexSpec{
		{
			Name: IndexScheduledDue,
			Keys: bson.D{{Key: OutboxTopic, Value: 1}, {Key: OutboxPartition, Value: 1},
				{Key: ScheduledDueAt, Value: 1}, {Key: OutboxSeq, Value: 1}, {Key: OutboxID, Value: 1}},
			Partial: bson.D{{Key: ScheduledPromoted, Value: false}, {Key: OutboxFailed, Value: false}},
		},
		{
			Name:   IndexScheduledKey,
			Keys:   scheduledKeyKeys(),
			Unique: unique,
			// A change of Config.UniqueIdempotencyKeys changes the index.
			Replaces: func(ix bson.D) bool {
				key, _ := Lookup(ix, "key")
				return SameBSON(key, scheduledKeyKeys(), true) && IndexBool(ix, "unique") != unique
			},
		},
		{
			Name:    IndexScheduledTTL,
			Keys:    bson.D{{Key: ScheduledPromotedAt, Value: 1}},
			Partial: bson.D{{Key: ScheduledPromoted, Value: true}},
			TTL:     &ttl,
		},
	}
}

// scheduledKeyKeys are the keys of outbox_scheduled_key: a cancellation
// reads its prefix {topic, idempotency_key}; with the schema it is unique
// on what the outbox's unique index is (OutboxIdempotencyKeys).
func scheduledKeyKeys() bson.D {
	return bson.D{{Key: OutboxTopic, Value: 1}, {Key: OutboxIdempotencyKey, Value: 1}, {Key: OutboxSchema, Value: 1}}
}

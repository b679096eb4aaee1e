package store

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Key sequences.
//
// The parked inbox documents of one partition key in one partition, in
// offset order, are the key's sequence: the key is held exactly when it has
// one, and its first document is its head. Nothing else says so: no
// pointer names the head, no flag says a key is held, so no crash or
// cancellation between two writes can leave them disagreeing. Every
// operation on a sequence writes its head (TouchHeadUpdate or the head's
// own change), so two operations on one key always conflict. The index
// inbox_parked_partition serves every query here.
//
//   - a parked event: parked: true, park_reason, last_error, attempts, the
//     payload;
//   - a held event (it waits, it never failed): parked: true and held_by,
//     the head of its key when it was held (for operators; nothing reads
//     it to decide). Tools count held events with {held_by: {$exists:
//     true}}. A held event that cannot be handled keeps why in fault.

// SeqFilter selects the sequence of key in a partition of topic.
func SeqFilter(topic string, partition int32, key string) bson.D {
	return bson.D{{Key: InboxParked, Value: true}, {Key: InboxIDTopic, Value: topic},
		{Key: InboxPartition, Value: partition}, {Key: InboxPartitionKey, Value: key}}
}

// PartitionParked selects the parked documents of a partition of topic:
// the sequences of all its keys.
func PartitionParked(topic string, partition int32) bson.D {
	return bson.D{{Key: InboxParked, Value: true}, {Key: InboxIDTopic, Value: topic}, {Key: InboxPartition, Value: partition}}
}

// SeqOrder sorts a sequence, and the sequences of a partition by key.
func SeqOrder() bson.D {
	return bson.D{{Key: InboxPartitionKey, Value: 1}, {Key: InboxOffset, Value: 1}}
}

// HeadDoc is a sequence member as the head queries read it (HeadProjection).
type HeadDoc[ID any] struct {
	ID           ID            `bson:"_id"`
	PartitionKey string        `bson:"partition_key"`
	Offset       int64         `bson:"offset"`
	HeldBy       bson.RawValue `bson:"held_by"`
	ParkReason   string        `bson:"park_reason"`
	ParkedAt     time.Time     `bson:"parked_at"`
}

// Held reports whether the member is held (it waits behind its head)
// rather than parked on its own account.
func (d *HeadDoc[ID]) Held() bool { return IsHeld(d.HeldBy) }

// IsHeld reports whether a held_by value marks a held event.
func IsHeld(v bson.RawValue) bool { return v.Type != 0 && v.Type != bson.TypeNull }

// HeadProjection reads a HeadDoc.
func HeadProjection() bson.D {
	return bson.D{{Key: InboxID, Value: 1}, {Key: InboxPartitionKey, Value: 1}, {Key: InboxOffset, Value: 1},
		{Key: InboxHeldBy, Value: 1}, {Key: InboxParkReason, Value: 1}, {Key: InboxParkedAt, Value: 1}}
}

// TouchHeadUpdate writes a sequence's head so that the transaction
// conflicts with every other one that changes the sequence; offset is the
// offset of the event the operation adds.
func TouchHeadUpdate(offset int64) bson.D {
	return bson.D{{Key: "$max", Value: bson.D{{Key: InboxHeldTail, Value: offset}}}}
}

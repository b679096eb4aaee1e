package store

import (
	"go.mongodb.org/mongo-driver/v2/bson"
)

// The Python event-outbox library's outbox, which a service migrates from
// and must never run beside: the library's unique index refuses this
// framework's second event (all of ours index as {null, null, null}), the
// framework never publishes the library's documents, and the library's
// relay stops at the first of ours it reads.

// LibraryIdempotencyIndex is the name of the library's unique outbox index.
const LibraryIdempotencyIndex = "idempotency"

// LibraryIdempotencyKeys is the key of the Python library's unique
// "idempotency" outbox index.
func LibraryIdempotencyKeys() bson.D {
	return bson.D{{Key: "payload.topic", Value: int32(1)},
		{Key: "payload.content_schema", Value: int32(1)}, {Key: "payload.idempotency_key", Value: int32(1)}}
}

// LibraryPendingFilter matches the library's unpublished outbox documents
// that a migration converts: its form has no top-level topic, and the
// idempotency key inside the payload (one without a key is refused by the
// migration and left alone, so it is not matched here).
func LibraryPendingFilter() bson.D {
	return bson.D{{Key: OutboxPublished, Value: false}, {Key: OutboxTopic, Value: bson.D{{Key: "$exists", Value: false}}},
		{Key: "payload.idempotency_key", Value: bson.D{{Key: "$exists", Value: true}}}}
}

// SameIndexKeys compares an index key document with want (whose directions
// are int32), whatever numeric type the server used for the directions.
func SameIndexKeys(raw bson.Raw, want bson.D) bool {
	elems, err := raw.Elements()
	if err != nil || len(elems) != len(want) {
		return false
	}
	for i, e := range elems {
		if e.Key() != want[i].Key {
			return false
		}
		dir, ok := e.Value().AsInt64OK()
		w, isInt := want[i].Value.(int32)
		if !ok || !isInt || dir != int64(w) {
			return false
		}
	}
	return true
}

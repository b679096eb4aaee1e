package store

import (
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/wire"
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

// ConvertLibraryDoc converts one of the library's outbox documents into an
// OutboxDoc with the same _id, written in the event-outbox wire format:
// the envelope comes out of the payload document, the rest of the payload
// is the event's JSON, and the partition is the library's (the integer
// partition key modulo the topic's count in partitions). On a missing
// partition count it returns the document (for its topic) and an error.
func ConvertLibraryDoc(raw bson.Raw, partitions map[string]int, now time.Time) (*OutboxDoc, error) {
	id, ok := raw.Lookup(OutboxID).ObjectIDOK()
	if !ok {
		return nil, fmt.Errorf("_id is not an ObjectId")
	}
	var lib struct {
		Payload bson.D `bson:"payload"`
	}
	if err := bson.Unmarshal(raw, &lib); err != nil || lib.Payload == nil {
		return nil, fmt.Errorf("no payload document")
	}
	d := &OutboxDoc{ID: id, Format: wire.EventOutbox.String(), CreatedAt: now}
	var fields bson.D
	var occurred string
	var partKey int64
	for _, e := range lib.Payload {
		switch e.Key {
		case "topic":
			d.Topic, _ = e.Value.(string)
		case "content_schema":
			d.Schema, _ = e.Value.(string)
		case "idempotency_key":
			d.IdempotencyKey, _ = e.Value.(string)
		case "occurred_at":
			occurred, _ = e.Value.(string)
		case "partition_key":
			switch v := e.Value.(type) {
			case int32:
				partKey = int64(v)
			case int64:
				partKey = v
			case float64:
				partKey = int64(v)
			default:
				return nil, fmt.Errorf("payload.partition_key is not an integer")
			}
		default:
			fields = append(fields, e)
		}
	}
	switch {
	case d.Topic == "":
		return nil, fmt.Errorf("missing payload.topic")
	case d.Schema == "":
		return nil, fmt.Errorf("missing payload.content_schema")
	case d.IdempotencyKey == "":
		return nil, fmt.Errorf("missing payload.idempotency_key")
	case len(d.Topic) > wire.MaxNameLen || len(d.Schema) > wire.MaxNameLen || len(d.IdempotencyKey) > wire.MaxKeyLen:
		return nil, fmt.Errorf("envelope field too long")
	}
	if occurred != "" {
		t, err := time.Parse(time.RFC3339Nano, occurred)
		if err != nil {
			return nil, fmt.Errorf("payload.occurred_at: %w", err)
		}
		d.OccurredAt = t.UTC()
	}
	n := partitions[d.Topic]
	if n <= 0 {
		return d, fmt.Errorf("no partition count for topic %q", d.Topic)
	}
	d.Key = strconv.FormatInt(partKey, 10)
	d.Partition = int32(((partKey % int64(n)) + int64(n)) % int64(n))
	if fields == nil {
		fields = bson.D{}
	}
	payload, err := bson.MarshalExtJSON(fields, false, false)
	if err != nil {
		return nil, fmt.Errorf("payload fields to JSON: %w", err)
	}
	d.Payload = string(payload)
	return d, nil
}

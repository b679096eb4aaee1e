package store

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// RecordFields are the outbox fields whose bytes go into a Kafka record
// (the payload, the key and the headers' values): the doctor sums them to
// judge events' sizes against the topics' limits.
var RecordFields = []string{OutboxPayload, OutboxKey, OutboxSchema, OutboxIdempotencyKey, OutboxTraceParent, OutboxTraceState, OutboxSource}

// EventSize is one sampled outbox event and the summed bytes of its
// RecordFields.
type EventSize struct {
	ID        any
	Topic     string
	CreatedAt time.Time
	Size      int64
}

// LatestEventSizes returns the newest n events of the outbox collection
// with their sizes, summed on the server so that no payload crosses the
// network (the outbox's _id is an ObjectID: newest last).
func LatestEventSizes(ctx context.Context, outbox *mongo.Collection, n int) ([]EventSize, error) {
	var sizes bson.A
	for _, f := range RecordFields {
		sizes = append(sizes, bson.D{{Key: "$strLenBytes", Value: bson.D{{Key: "$ifNull", Value: bson.A{"$" + f, ""}}}}})
	}
	cur, err := outbox.Aggregate(ctx, bson.A{
		bson.D{{Key: "$sort", Value: bson.D{{Key: OutboxID, Value: -1}}}},
		bson.D{{Key: "$limit", Value: n}},
		bson.D{{Key: "$project", Value: bson.D{
			{Key: OutboxID, Value: 1}, {Key: OutboxTopic, Value: 1}, {Key: OutboxCreatedAt, Value: 1},
			{Key: "size", Value: bson.D{{Key: "$add", Value: sizes}}},
		}}},
	})
	if err != nil {
		return nil, err
	}
	var docs []struct {
		ID        any       `bson:"_id"`
		Topic     string    `bson:"topic"`
		CreatedAt time.Time `bson:"created_at"`
		Size      int64     `bson:"size"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	out := make([]EventSize, len(docs))
	for i, d := range docs {
		out[i] = EventSize{ID: d.ID, Topic: d.Topic, CreatedAt: d.CreatedAt, Size: d.Size}
	}
	return out, nil
}

// EventRecordFields returns one outbox event's RecordFields, concatenated
// in that order; mongo.ErrNoDocuments when the event is gone.
func EventRecordFields(ctx context.Context, outbox *mongo.Collection, id any) (string, error) {
	var doc struct {
		Payload        string `bson:"payload"`
		Key            string `bson:"key"`
		Schema         string `bson:"schema"`
		IdempotencyKey string `bson:"idempotency_key"`
		TraceParent    string `bson:"traceparent"`
		TraceState     string `bson:"tracestate"`
		Source         string `bson:"source"`
	}
	if err := outbox.FindOne(ctx, bson.D{{Key: OutboxID, Value: id}}).Decode(&doc); err != nil {
		return "", err
	}
	return doc.Payload + doc.Key + doc.Schema + doc.IdempotencyKey + doc.TraceParent + doc.TraceState + doc.Source, nil
}

package store

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// OutboxDoc is the stored form of a recorded event, as Record inserts it
// and the publisher reads it.
type OutboxDoc struct {
	ID             bson.ObjectID `bson:"_id"`
	Topic          string        `bson:"topic"`
	Partition      int32         `bson:"partition"`
	Key            string        `bson:"key"`
	Schema         string        `bson:"schema"`
	IdempotencyKey string        `bson:"idempotency_key"`
	OccurredAt     time.Time     `bson:"occurred_at"`
	Payload        string        `bson:"payload"` // the event's JSON
	TraceParent    string        `bson:"traceparent,omitempty"`
	TraceState     string        `bson:"tracestate,omitempty"`
	// Format is the wire format chosen when the event was recorded; empty
	// for native. Source is its CloudEvents source.
	Format string `bson:"format,omitempty"`
	Source string `bson:"source,omitempty"`
	// Seq orders events for publishing. It is stored as an empty timestamp,
	// which MongoDB replaces at insert with a fresh tick of its cluster
	// clock: a transaction that starts after another committed always gets
	// larger values, whichever process records it.
	Seq         bson.Timestamp `bson:"seq"`
	CreatedAt   time.Time      `bson:"created_at"`
	Published   bool           `bson:"published"`
	PublishedAt *time.Time     `bson:"published_at,omitempty"`
	// Failed marks an event Kafka refused permanently (for example larger
	// than the topic's maximum message size). It stays unpublished, is not
	// retried, and is visible to operators with its Error.
	Failed   bool       `bson:"failed"`
	FailedAt *time.Time `bson:"failed_at,omitempty"`
	Error    string     `bson:"error,omitempty"`
	Attempts int32      `bson:"attempts,omitempty"`
	// PayloadRef is set on an event whose payload the claim check stored
	// in PayloadsCollection (Payload is then empty): the ref of its chunks,
	// the ID the event was recorded with, which a promotion copies (see
	// OutboxPayloadRef). PayloadSize is the payload's length.
	PayloadRef  *bson.ObjectID `bson:"payload_ref,omitempty"`
	PayloadSize int64          `bson:"payload_size,omitempty"`
}

// PendingFilter selects the events of a partition of topic that wait to
// be published, but for those of the keys in exclude (held keys). Served
// by the partial index outbox_pending {topic, partition, seq, _id} where
// published is false, walked in PendingOrder; held keys are filtered on the
// server as it walks.
func PendingFilter(topic string, partition int32, exclude []string) bson.D {
	f := bson.D{
		{Key: OutboxPublished, Value: false},
		{Key: OutboxTopic, Value: topic},
		{Key: OutboxPartition, Value: partition},
		{Key: OutboxFailed, Value: false},
	}
	if len(exclude) > 0 {
		f = append(f, bson.E{Key: OutboxKey, Value: bson.D{{Key: "$nin", Value: exclude}}})
	}
	return f
}

// PendingOrder is the publishing order: commit order (seq), then _id for
// events of one transaction.
func PendingOrder() bson.D {
	return bson.D{{Key: OutboxSeq, Value: 1}, {Key: OutboxID, Value: 1}}
}

// MarkPublishedUpdate marks events published at at.
func MarkPublishedUpdate(at time.Time) bson.D {
	return bson.D{{Key: "$set", Value: bson.D{
		{Key: OutboxPublished, Value: true},
		{Key: OutboxPublishedAt, Value: at.UTC()},
	}}}
}

// MaxOutboxErrorLen is the longest error text an outbox document stores.
const MaxOutboxErrorLen = 1000

// MarkFailedUpdate marks an event failed at at, for msg (cut to
// MaxOutboxErrorLen bytes). countAttempt adds an attempt; leave it out for
// a document that cannot be read, whose attempts field may be what cannot
// be read (an $inc on it would fail).
func MarkFailedUpdate(msg string, at time.Time, countAttempt bool) bson.D {
	if len(msg) > MaxOutboxErrorLen {
		msg = msg[:MaxOutboxErrorLen]
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{
			{Key: OutboxFailed, Value: true},
			{Key: OutboxFailedAt, Value: at.UTC()},
			{Key: OutboxError, Value: msg},
		}},
	}
	if countAttempt {
		update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: OutboxAttempts, Value: 1}}})
	}
	return update
}

// FailedInPartition selects the failed events of a partition of topic,
// through the partial index outbox_failed (failed is true); they are few,
// as each waits for an operator.
func FailedInPartition(topic string, partition int32) bson.D {
	return bson.D{
		{Key: OutboxFailed, Value: true},
		{Key: OutboxTopic, Value: topic},
		{Key: OutboxPartition, Value: partition},
	}
}

// Outbox is the publisher's operations on an outbox collection: reading a
// partition's pending events, marking them published or failed, and
// listing the keys of its failed events.
type Outbox struct {
	// Coll is the outbox collection (Config.OutboxCollection).
	Coll *mongo.Collection
}

// Pending calls each with the pending documents of a partition of topic in
// publishing order (PendingFilter, PendingOrder), but for those of the
// keys in exclude: at most events documents and, past the first, at most
// bytes bytes of them. A document is passed as read, so that one that
// cannot be decoded is the caller's to judge instead of failing the read;
// each must not keep raw after it returns. more reports that a limit cut
// the read short: more events may be waiting.
func (o Outbox) Pending(ctx context.Context, topic string, partition int32, exclude []string, events, bytes int, each func(raw bson.Raw)) (more bool, err error) {
	// Held keys are filtered on the server while it walks the index in
	// order; their events are few (they wait for an operator).
	opts := options.Find().
		SetSort(PendingOrder()).
		SetLimit(int64(events)).
		SetBatchSize(int32(events)) // the whole batch in one round trip (the server caps a reply at 16 MiB)
	cur, err := o.Coll.Find(ctx, PendingFilter(topic, partition, exclude), opts)
	if err != nil {
		return false, fmt.Errorf("find pending events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	n, size := 0, 0
	for cur.Next(ctx) {
		if n > 0 && size+len(cur.Current) > bytes {
			return true, nil
		}
		size += len(cur.Current)
		n++
		each(cur.Current)
	}
	if err := cur.Err(); err != nil {
		return false, fmt.Errorf("read pending events: %w", err)
	}
	return n == events, nil
}

// MarkPublished marks the events of ids published at at.
func (o Outbox) MarkPublished(ctx context.Context, ids []any, at time.Time) error {
	_, err := o.Coll.UpdateMany(ctx,
		bson.D{{Key: OutboxID, Value: bson.D{{Key: "$in", Value: ids}}}}, MarkPublishedUpdate(at))
	return err
}

// MarkFailed marks the event id failed at at, for msg (MarkFailedUpdate).
func (o Outbox) MarkFailed(ctx context.Context, id any, msg string, at time.Time, countAttempt bool) error {
	_, err := o.Coll.UpdateOne(ctx, bson.D{{Key: OutboxID, Value: id}}, MarkFailedUpdate(msg, at, countAttempt))
	return err
}

// FailedKeys returns the partition keys of the failed events of a
// partition of topic (FailedInPartition). A key that is not a string (an
// unreadable document) is left out: no event of the partition has it.
func (o Outbox) FailedKeys(ctx context.Context, topic string, partition int32) ([]string, error) {
	cur, err := o.Coll.Find(ctx, FailedInPartition(topic, partition), options.Find().
		SetProjection(bson.D{{Key: OutboxID, Value: 0}, {Key: OutboxKey, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var keys []string
	for cur.Next(ctx) {
		if k, ok := cur.Current.Lookup(OutboxKey).StringValueOK(); ok {
			keys = append(keys, k)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read failed events: %w", err)
	}
	return keys, nil
}

// ScheduledDoc is the stored form of an event recorded with a publication
// time, in the collection of scheduled events (ScheduledSuffix): the
// outbox document it becomes, inline, and its due time. Its Seq is the
// commit order of its recording (a fresh tick at insert, as in the
// outbox); the outbox document made of it at its due time gets a new _id
// and a new Seq (see internal/schedule).
type ScheduledDoc struct {
	OutboxDoc  `bson:",inline"`
	DueAt      time.Time  `bson:"due_at"`
	Promoted   bool       `bson:"promoted"`
	PromotedAt *time.Time `bson:"promoted_at,omitempty"`
}

// DueFilter selects the events of a partition of topic due at or before
// now, through the partial index outbox_scheduled_due, walked in DueOrder.
func DueFilter(topic string, partition int32, now time.Time) bson.D {
	return bson.D{
		{Key: OutboxTopic, Value: topic},
		{Key: OutboxPartition, Value: partition},
		{Key: ScheduledPromoted, Value: false},
		{Key: OutboxFailed, Value: false},
		{Key: ScheduledDueAt, Value: bson.D{{Key: "$lte", Value: now.UTC()}}},
	}
}

// UpcomingFilter selects the events of a partition of topic that wait for
// their due time (promoted or failed ones excluded), walked in DueOrder.
func UpcomingFilter(topic string, partition int32) bson.D {
	return bson.D{
		{Key: OutboxTopic, Value: topic},
		{Key: OutboxPartition, Value: partition},
		{Key: ScheduledPromoted, Value: false},
		{Key: OutboxFailed, Value: false},
	}
}

// DueOrder is the promotion order: due time, then commit order (seq),
// then _id for events of one transaction.
func DueOrder() bson.D {
	return bson.D{{Key: ScheduledDueAt, Value: 1}, {Key: OutboxSeq, Value: 1}, {Key: OutboxID, Value: 1}}
}

// PromoteUpdate marks scheduled events promoted at at.
func PromoteUpdate(at time.Time) bson.D {
	return bson.D{{Key: "$set", Value: bson.D{
		{Key: ScheduledPromoted, Value: true},
		{Key: ScheduledPromotedAt, Value: at.UTC()},
	}}}
}

// ScheduledKeyFilter selects the scheduled events of topic with an
// idempotency key, through the index outbox_scheduled_key; waiting set
// keeps only those not promoted (failed ones included: they were never
// published).
func ScheduledKeyFilter(topic, idempotencyKey string, waiting bool) bson.D {
	f := bson.D{{Key: OutboxTopic, Value: topic}, {Key: OutboxIdempotencyKey, Value: idempotencyKey}}
	if waiting {
		f = append(f, bson.E{Key: ScheduledPromoted, Value: false})
	}
	return f
}

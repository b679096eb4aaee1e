package outbox

// Failed outbox events (Admin.FailedEvents, RetryFailed, DiscardFailed) and
// the keys they hold: the operator's side of the publisher's hold policy
// (Config.PoisonPolicy; the mechanics are in internal/publish, see its
// holds type).

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// partitionKeys identifies the keys of one partition.
type partitionKeys struct {
	topic     string
	partition int32
}

// heldCounts fills the held keys and events of st and byTopic: the distinct
// (topic, partition, key) of the failed events, and the pending events of
// those keys.
func (a *Admin) heldCounts(ctx context.Context, st *StoreStatus, byTopic map[string]*TopicBacklog) error {
	cur, err := a.outbox.Find(ctx, bson.D{{Key: store.OutboxFailed, Value: true}},
		optionsProjection("topic", "partition", "key"))
	if err != nil {
		return fmt.Errorf("outbox: read failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	keys := map[partitionKeys]map[string]bool{}
	for cur.Next(ctx) {
		var d struct {
			Topic     string
			Partition int32
			Key       string
		}
		var ok1, ok2, ok3 bool
		d.Topic, ok1 = cur.Current.Lookup(store.OutboxTopic).StringValueOK()
		d.Partition, ok2 = cur.Current.Lookup(store.OutboxPartition).Int32OK()
		d.Key, ok3 = cur.Current.Lookup(store.OutboxKey).StringValueOK()
		if !ok1 || !ok2 || !ok3 || d.Key == "" {
			// A keyless failed event holds nothing (keyless events promise
			// no order), nor does a document whose key cannot be read.
			continue
		}
		pk := partitionKeys{d.Topic, d.Partition}
		if keys[pk] == nil {
			keys[pk] = map[string]bool{}
		}
		if !keys[pk][d.Key] {
			keys[pk][d.Key] = true
			st.OutboxHeldKeys++
			if b := byTopic[d.Topic]; b != nil {
				b.HeldKeys++
			} else {
				byTopic[d.Topic] = &TopicBacklog{Topic: d.Topic, HeldKeys: 1}
			}
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("outbox: read failed events: %w", err)
	}
	for pk, ks := range keys {
		in := make(bson.A, 0, len(ks))
		for k := range ks {
			in = append(in, k)
		}
		// Served by outbox_pending (published false, topic, partition).
		n, err := a.outbox.CountDocuments(ctx, bson.D{
			{Key: store.OutboxPublished, Value: false},
			{Key: store.OutboxTopic, Value: pk.topic},
			{Key: store.OutboxPartition, Value: pk.partition},
			{Key: store.OutboxFailed, Value: false},
			{Key: store.OutboxKey, Value: bson.D{{Key: "$in", Value: in}}},
		})
		if err != nil {
			return fmt.Errorf("outbox: count held events: %w", err)
		}
		st.OutboxHeldEvents += n
		byTopic[pk.topic].HeldEvents += n
	}
	return nil
}

// FailedEvent is an outbox event Kafka refused for good, sent on its own
// (for example larger than the topic's maximum message size). It stays in
// the outbox, unpublished, until an operator retries (RetryFailed) or
// discards it (DiscardFailed); under Config.PoisonPolicy HoldKey the later
// events of its partition key wait behind it until then.
type FailedEvent struct {
	// ID is the outbox document's _id (hex ObjectID).
	ID             string    `json:"id"`
	Topic          string    `json:"topic"`
	Partition      int32     `json:"partition"`
	PartitionKey   string    `json:"partition_key"`
	ContentSchema  string    `json:"schema"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
	FailedAt       time.Time `json:"failed_at"`
	Attempts       int32     `json:"attempts"`
	Error          string    `json:"error"`
	// PayloadSize is the size of the event's JSON in bytes.
	PayloadSize int `json:"payload_size"`
}

// FailedFilter selects failed outbox events.
type FailedFilter struct {
	// Topic keeps the events of one topic. Defaults to every topic.
	Topic string
	// Limit caps the events returned. Defaults to no limit.
	Limit int
}

func (f FailedFilter) query() bson.D {
	q := bson.D{{Key: store.OutboxFailed, Value: true}}
	if f.Topic != "" {
		q = append(q, bson.E{Key: store.OutboxTopic, Value: f.Topic})
	}
	return q
}

// FailedEvents lists failed outbox events, oldest failure first.
func (a *Admin) FailedEvents(ctx context.Context, f FailedFilter) ([]FailedEvent, error) {
	opts := options.Find().SetSort(bson.D{{Key: store.OutboxFailedAt, Value: 1}, {Key: store.OutboxID, Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := a.outbox.Find(ctx, f.query(), opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	out := []FailedEvent{}
	for cur.Next(ctx) {
		out = append(out, failedEventOf(cur.Current))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	return out, nil
}

// failedEventOf returns the failed event of a document; one that cannot be
// decoded (the publisher marked it failed for that reason) is listed with
// the fields that can be read, so that an operator can see it and retry or
// discard it.
func failedEventOf(raw bson.Raw) FailedEvent {
	var d outboxDoc
	if err := bson.Unmarshal(raw, &d); err == nil {
		e := FailedEvent{ID: d.ID.Hex(), Topic: d.Topic, Partition: d.Partition, PartitionKey: d.Key,
			ContentSchema: d.Schema, IdempotencyKey: d.IdempotencyKey, CreatedAt: d.CreatedAt,
			Attempts: d.Attempts, Error: d.Error, PayloadSize: len(d.Payload)}
		if d.FailedAt != nil {
			e.FailedAt = *d.FailedAt
		}
		return e
	}
	var e FailedEvent
	if oid, ok := raw.Lookup(store.OutboxID).ObjectIDOK(); ok {
		e.ID = oid.Hex()
	} else {
		e.ID = raw.Lookup(store.OutboxID).String()
	}
	e.Topic, _ = raw.Lookup(store.OutboxTopic).StringValueOK()
	e.Partition, _ = raw.Lookup(store.OutboxPartition).Int32OK()
	e.PartitionKey, _ = raw.Lookup(store.OutboxKey).StringValueOK()
	e.ContentSchema, _ = raw.Lookup(store.OutboxSchema).StringValueOK()
	e.IdempotencyKey, _ = raw.Lookup(store.OutboxIdempotencyKey).StringValueOK()
	e.Error, _ = raw.Lookup(store.OutboxError).StringValueOK()
	if t, ok := raw.Lookup(store.OutboxCreatedAt).TimeOK(); ok {
		e.CreatedAt = t.UTC()
	}
	if t, ok := raw.Lookup(store.OutboxFailedAt).TimeOK(); ok {
		e.FailedAt = t.UTC()
	}
	e.PayloadSize = len(raw.Lookup(store.OutboxPayload).Value)
	return e
}

// RetryFailed clears the failed mark of the selected failed events (those
// of f, Limit ignored, narrowed to ids when not empty), so that the
// publisher tries them again at its next scan of their partition (within
// seconds under Config.PoisonPolicy HoldKey, at most 30 s otherwise). Use it
// after the cause is fixed (for example the topic's maximum message size
// raised). Under HoldKey a retried event is published before the events of
// its key that waited behind it, in order; under SkipEvent after the events
// of its key published meanwhile. With dryRun it only counts them. It returns how many events were (or would be) retried.
func (a *Admin) RetryFailed(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return a.onFailed(ctx, f, ids, dryRun, func(q bson.D) (int64, error) {
		res, err := a.outbox.UpdateMany(ctx, q, bson.D{
			{Key: "$set", Value: bson.D{{Key: store.OutboxFailed, Value: false}}},
			{Key: "$unset", Value: bson.D{{Key: store.OutboxFailedAt, Value: ""}}},
		})
		if err != nil {
			return 0, fmt.Errorf("outbox: retry failed events: %w", err)
		}
		return res.ModifiedCount, nil
	})
}

// DiscardFailed deletes the selected failed events (those of f, Limit
// ignored, narrowed to ids when not empty) from the outbox: they are never
// published. Under Config.PoisonPolicy HoldKey this releases their keys:
// the publisher publishes the events that waited behind them, in order,
// within seconds. With dryRun it only counts them. It returns how many
// events were (or would be) discarded.
func (a *Admin) DiscardFailed(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return a.onFailed(ctx, f, ids, dryRun, func(q bson.D) (int64, error) {
		res, err := a.outbox.DeleteMany(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("outbox: discard failed events: %w", err)
		}
		return res.DeletedCount, nil
	})
}

// onFailed selects failed events as RetryFailed and DiscardFailed do (f,
// narrowed to ids when not empty) and counts them with dryRun, else applies
// act to the selection and returns its count.
func (a *Admin) onFailed(ctx context.Context, f FailedFilter, ids []string, dryRun bool, act func(q bson.D) (int64, error)) (int64, error) {
	q, err := f.withIDs(ids)
	if err != nil {
		return 0, err
	}
	if !dryRun {
		return act(q)
	}
	n, err := a.outbox.CountDocuments(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("outbox: count failed events: %w", err)
	}
	return n, nil
}

// withIDs returns the query of f narrowed to ids (hex ObjectIDs) when not
// empty.
func (f FailedFilter) withIDs(ids []string) (bson.D, error) {
	q := f.query()
	if len(ids) == 0 {
		return q, nil
	}
	oids := make(bson.A, 0, len(ids))
	for _, id := range ids {
		oid, err := bson.ObjectIDFromHex(id)
		if err != nil {
			return nil, fmt.Errorf("outbox: failed event id %q is not a hex ObjectID", id)
		}
		oids = append(oids, oid)
	}
	return append(q, bson.E{Key: store.OutboxID, Value: bson.D{{Key: "$in", Value: oids}}}), nil
}

// optionsProjection returns find options projecting fields (no _id).
func optionsProjection(fields ...string) *options.FindOptionsBuilder {
	p := bson.D{{Key: store.OutboxID, Value: 0}}
	for _, f := range fields {
		p = append(p, bson.E{Key: f, Value: 1})
	}
	return options.Find().SetProjection(p)
}

package operator

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
)

// Outbox runs the operator's actions on the failed events of an outbox
// collection: events Kafka refused for good, which stay unpublished (and,
// under the hold policy, hold their keys) until retried or discarded.
type Outbox struct {
	// Coll is the outbox collection.
	Coll *mongo.Collection
	// Claims is the claim check's payload collection of the outbox's
	// producer, a collection of Coll's client: Discard marks the chunks of
	// the events it deletes there, in its transaction. Nil: Discard marks
	// none (an outbox whose events never go out of band).
	Claims *claimcheck.Store
}

// FailedFilter selects failed events (the root's outbox.FailedFilter
// converts to it).
type FailedFilter struct {
	// Topic keeps the events of one topic; empty keeps any.
	Topic string
	// Limit caps the events Failed returns; 0 is no limit.
	Limit int
	// Scheduled: the root selects the collection (Outbox.Coll) by it;
	// the query is the same, as a scheduled event refused at promotion
	// is marked failed as an outbox event is.
	Scheduled bool
}

// query is the filter of f, served by the partial index outbox_failed.
func (f FailedFilter) query() bson.D {
	q := bson.D{{Key: store.OutboxFailed, Value: true}}
	if f.Topic != "" {
		q = append(q, bson.E{Key: store.OutboxTopic, Value: f.Topic})
	}
	return q
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

// Failed is a failed event as listed. Its fields are the root's
// outbox.FailedEvent's, in the same order, so that the root converts it
// with a type conversion; see there for what each one means.
type Failed struct {
	ID             string
	Topic          string
	Partition      int32
	PartitionKey   string
	ContentSchema  string
	IdempotencyKey string
	CreatedAt      time.Time
	FailedAt       time.Time
	Attempts       int32
	Error          string
	PayloadSize    int
}

// Failed lists the failed events f selects, oldest failure first.
func (o Outbox) Failed(ctx context.Context, f FailedFilter) ([]Failed, error) {
	opts := options.Find().SetSort(bson.D{{Key: store.OutboxFailedAt, Value: 1}, {Key: store.OutboxID, Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := o.Coll.Find(ctx, f.query(), opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	out := []Failed{}
	for cur.Next(ctx) {
		out = append(out, failedOf(cur.Current))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	return out, nil
}

// failedOf returns the failed event of a document. One that cannot be
// decoded (the publisher marks such a document failed for that reason) is
// listed with the fields that can be read, so that an operator sees it and
// can retry or discard it.
func failedOf(raw bson.Raw) Failed {
	var d store.OutboxDoc
	if err := bson.Unmarshal(raw, &d); err == nil {
		e := Failed{ID: d.ID.Hex(), Topic: d.Topic, Partition: d.Partition, PartitionKey: d.Key,
			ContentSchema: d.Schema, IdempotencyKey: d.IdempotencyKey, CreatedAt: d.CreatedAt,
			Attempts: d.Attempts, Error: d.Error, PayloadSize: len(d.Payload)}
		if d.PayloadRef != nil {
			// Stored out of band: the document's payload is empty and its
			// payload_size is the payload's length.
			e.PayloadSize = int(d.PayloadSize)
		}
		if d.FailedAt != nil {
			e.FailedAt = *d.FailedAt
		}
		return e
	}
	var e Failed
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
	e.PayloadSize = rawPayloadSize(raw)
	return e
}

// rawPayloadSize returns the payload's length of an outbox document that
// cannot be decoded: its payload_size when it has one (a payload stored out
// of band), else the length of its payload string, else the size of the
// payload's BSON value.
func rawPayloadSize(raw bson.Raw) int {
	if n, ok := raw.Lookup(store.OutboxPayloadSize).AsInt64OK(); ok && n > 0 {
		return int(n)
	}
	v := raw.Lookup(store.OutboxPayload)
	if s, ok := v.StringValueOK(); ok {
		return len(s)
	}
	return len(v.Value)
}

// Retry clears the failed mark of the selected failed events (those of f,
// Limit ignored, narrowed to ids when not empty), so that the publisher
// tries them again at its next scan of their partition. With dryRun it
// only counts them. It returns how many events were (or would be) retried.
func (o Outbox) Retry(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return o.apply(ctx, f, ids, dryRun, func(q bson.D) (int64, error) {
		res, err := o.Coll.UpdateMany(ctx, q, bson.D{
			{Key: "$set", Value: bson.D{{Key: store.OutboxFailed, Value: false}}},
			{Key: "$unset", Value: bson.D{{Key: store.OutboxFailedAt, Value: ""}}},
		})
		if err != nil {
			return 0, fmt.Errorf("outbox: retry failed events: %w", err)
		}
		return res.ModifiedCount, nil
	})
}

// Discard deletes the selected failed events (as Retry selects them): they
// are never published, and the keys they held are free. With dryRun it
// only counts them. It returns how many events were (or would be)
// discarded.
//
// The chunks of the payloads of the events it deletes that were stored
// out of band are marked, in the same transaction, to expire as those of
// a published event (claimcheck.Store.MarkPublished): deleted with their
// event they would be looked for by no one, left unmarked they would never
// expire. It works in transactions of at most discardBatch events, each
// whole: a crash between two leaves the rest failed, discarded by a rerun.
func (o Outbox) Discard(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return o.apply(ctx, f, ids, dryRun, func(q bson.D) (int64, error) {
		sess, err := o.Coll.Database().Client().StartSession()
		if err != nil {
			return 0, fmt.Errorf("outbox: discard failed events: start session: %w", err)
		}
		defer sess.EndSession(context.WithoutCancel(ctx))
		var total int64
		for {
			n, err := store.WithTransaction(ctx, sess, func(sctx context.Context) (any, error) {
				return o.discardSome(sctx, q)
			})
			if err != nil {
				return total, fmt.Errorf("outbox: discard failed events: %w", err)
			}
			total += n.(int64)
			if n.(int64) < discardBatch {
				return total, nil
			}
		}
	})
}

// discardBatch caps the events one transaction of Discard deletes.
const discardBatch = 1000

// discardSome deletes up to discardBatch failed events of q in the
// transaction of ctx, and marks their payloads' chunks; it returns how
// many it deleted.
func (o Outbox) discardSome(ctx context.Context, q bson.D) (int64, error) {
	cur, err := o.Coll.Find(ctx, q, options.Find().SetLimit(discardBatch).
		SetProjection(bson.D{{Key: store.OutboxID, Value: 1}, {Key: store.OutboxPayloadRef, Value: 1}}))
	if err != nil {
		return 0, fmt.Errorf("read them: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var ids, refs bson.A
	for cur.Next(ctx) {
		ids = append(ids, cur.Current.Lookup(store.OutboxID))
		if ref, ok := cur.Current.Lookup(store.OutboxPayloadRef).ObjectIDOK(); ok {
			refs = append(refs, ref)
		}
	}
	if err := cur.Err(); err != nil {
		return 0, fmt.Errorf("read them: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	res, err := o.Coll.DeleteMany(ctx, bson.D{{Key: "$and", Value: bson.A{q, bson.D{{Key: store.OutboxID, Value: bson.D{{Key: "$in", Value: ids}}}}}}})
	if err != nil {
		return 0, err
	}
	if len(refs) > 0 && o.Claims != nil {
		if err := o.Claims.MarkPublished(ctx, refs, time.Now()); err != nil {
			return 0, err
		}
	}
	return res.DeletedCount, nil
}

// apply selects failed events as Retry and Discard do and counts them with
// dryRun, else applies act to the selection and returns its count.
func (o Outbox) apply(ctx context.Context, f FailedFilter, ids []string, dryRun bool, act func(q bson.D) (int64, error)) (int64, error) {
	q, err := f.withIDs(ids)
	if err != nil {
		return 0, err
	}
	if !dryRun {
		return act(q)
	}
	n, err := o.Coll.CountDocuments(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("outbox: count failed events: %w", err)
	}
	return n, nil
}

// Held counts the keys failed events hold and the events waiting behind
// them.
type Held struct {
	// Keys counts the held keys (topic, partition, key); Events the
	// pending events of those keys.
	Keys, Events int64
}

// Held returns the keys the failed events hold (distinct topic, partition
// and key) and the pending events of those keys, in all and by topic. A
// keyless failed event holds nothing (keyless events promise no order),
// nor does a document whose key cannot be read. Cost: one read of the
// failed events (partial index outbox_failed) and one count per partition
// with held keys (outbox_pending).
func (o Outbox) Held(ctx context.Context) (all Held, byTopic map[string]Held, err error) {
	cur, err := o.Coll.Find(ctx, bson.D{{Key: store.OutboxFailed, Value: true}},
		options.Find().SetProjection(bson.D{{Key: store.OutboxID, Value: 0},
			{Key: store.OutboxTopic, Value: 1}, {Key: store.OutboxPartition, Value: 1}, {Key: store.OutboxKey, Value: 1}}))
	if err != nil {
		return all, nil, fmt.Errorf("outbox: read failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	type partition struct {
		topic     string
		partition int32
	}
	keys := map[partition]map[string]bool{}
	byTopic = map[string]Held{}
	for cur.Next(ctx) {
		topic, ok1 := cur.Current.Lookup(store.OutboxTopic).StringValueOK()
		p, ok2 := cur.Current.Lookup(store.OutboxPartition).Int32OK()
		key, ok3 := cur.Current.Lookup(store.OutboxKey).StringValueOK()
		if !ok1 || !ok2 || !ok3 || key == "" {
			continue
		}
		pk := partition{topic, p}
		if keys[pk] == nil {
			keys[pk] = map[string]bool{}
		}
		if !keys[pk][key] {
			keys[pk][key] = true
			all.Keys++
			h := byTopic[topic]
			h.Keys++
			byTopic[topic] = h
		}
	}
	if err := cur.Err(); err != nil {
		return all, nil, fmt.Errorf("outbox: read failed events: %w", err)
	}
	for pk, ks := range keys {
		in := make(bson.A, 0, len(ks))
		for k := range ks {
			in = append(in, k)
		}
		// Served by outbox_pending (published false, topic, partition).
		n, err := o.Coll.CountDocuments(ctx, bson.D{
			{Key: store.OutboxPublished, Value: false},
			{Key: store.OutboxTopic, Value: pk.topic},
			{Key: store.OutboxPartition, Value: pk.partition},
			{Key: store.OutboxFailed, Value: false},
			{Key: store.OutboxKey, Value: bson.D{{Key: "$in", Value: in}}},
		})
		if err != nil {
			return all, nil, fmt.Errorf("outbox: count held events: %w", err)
		}
		all.Events += n
		h := byTopic[pk.topic]
		h.Events += n
		byTopic[pk.topic] = h
	}
	return all, byTopic, nil
}

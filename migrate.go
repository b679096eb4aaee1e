package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// EventOutboxMigration reports what MigrateEventOutbox changed, or would
// change in a dry run.
type EventOutboxMigration struct {
	// DroppedIndexes names the Python library's indexes dropped, as
	// "collection.name".
	DroppedIndexes []string `json:"dropped_indexes"`
	// Converted counts the unpublished library outbox documents rewritten
	// into this framework's form, by topic.
	Converted map[string]int `json:"converted"`
	// Refused lists the library outbox documents that cannot be converted
	// (for example without an idempotency key), with the reason. They are
	// left as they are.
	Refused []string `json:"refused"`
	// InboxNotParked counts the library's inbox documents that got
	// parked: false (the library has no such field).
	InboxNotParked int64 `json:"inbox_not_parked"`
	// DryRun is true when nothing was changed.
	DryRun bool `json:"dry_run"`
}

// MigrateEventOutbox prepares the collections of a Python event-outbox
// service (library v0.4.0) for this framework, in place. Stop every replica
// of the Python service first: a library publisher running meanwhile could
// publish an event that is being converted (a duplicate, which the inbox
// absorbs, but avoidable). It
//
//   - drops the library's indexes: the unique "idempotency" index on
//     payload.topic, payload.content_schema and payload.idempotency_key
//     (converted documents have no such fields, so it would refuse the
//     second of them; Config.UniqueIdempotencyKeys is the equivalent) and
//     the "expiration" TTL indexes of both collections (EnsureIndexes
//     creates the framework's own);
//   - rewrites each unpublished library outbox document
//     ({_id, payload: {topic, content_schema, partition_key,
//     idempotency_key, occurred_at, ...fields}, published: false}) into the
//     framework's form with the same _id, in the event-outbox wire format,
//     on the partition the library would have chosen (partition_key modulo
//     partitions[topic]), in _id order, so the publisher publishes them
//     before later events; published ones are left to expire;
//   - sets parked: false on the library's inbox documents, which have no
//     such field, so that an event the library had not handled yet is
//     handled and one it handled is skipped.
//
// partitions gives the partition count of every topic with unpublished
// library events; a missing one is an error before anything changes. A
// document that cannot be converted (no idempotency key: the library would
// invent one when publishing) is reported in Refused and left alone. With
// dryRun nothing changes. Running it again converts nothing more.
func (a *Admin) MigrateEventOutbox(ctx context.Context, partitions map[string]int, dryRun bool) (EventOutboxMigration, error) {
	rep := EventOutboxMigration{Converted: map[string]int{}, DryRun: dryRun}
	cur, err := a.outbox.Find(ctx,
		bson.D{{Key: "published", Value: false}, {Key: "topic", Value: bson.D{{Key: "$exists", Value: false}}}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return rep, fmt.Errorf("outbox: find event-outbox documents: %w", err)
	}
	var raws []bson.Raw
	if err := cur.All(ctx, &raws); err != nil {
		return rep, fmt.Errorf("outbox: read event-outbox documents: %w", err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	var docs []any
	var ids []any
	var missing []string
	for _, raw := range raws {
		d, err := store.ConvertLibraryDoc(raw, partitions, now)
		if err != nil {
			if d != nil && d.Topic != "" && partitions[d.Topic] <= 0 {
				if !slices.Contains(missing, d.Topic) {
					missing = append(missing, d.Topic)
				}
				continue
			}
			rep.Refused = append(rep.Refused, fmt.Sprintf("%v: %v", raw.Lookup("_id"), err))
			continue
		}
		docs = append(docs, d)
		ids = append(ids, d.ID)
		rep.Converted[d.Topic]++
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return rep, fmt.Errorf("%w: no partition count for topic(s) %v", ErrConfig, missing)
	}
	inboxFilter := bson.D{{Key: "parked", Value: bson.D{{Key: "$exists", Value: false}}}}
	if rep.InboxNotParked, err = a.inbox.CountDocuments(ctx, inboxFilter); err != nil {
		return rep, fmt.Errorf("outbox: count library inbox documents: %w", err)
	}
	if rep.DroppedIndexes, err = a.dropLibraryIndexes(ctx, dryRun); err != nil {
		return rep, err
	}
	if dryRun {
		return rep, nil
	}
	if _, err := a.inbox.UpdateMany(ctx, inboxFilter, bson.D{{Key: "$set", Value: bson.D{{Key: "parked", Value: false}}}}); err != nil {
		return rep, fmt.Errorf("outbox: set parked on library inbox documents: %w", err)
	}
	// In batches, each one transaction: delete the library's documents and
	// insert their conversions with the same _id (the insert gives each a
	// fresh seq, in order).
	const batch = 500
	sess, err := a.outbox.Database().Client().StartSession()
	if err != nil {
		return rep, fmt.Errorf("outbox: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	for start := 0; start < len(docs); start += batch {
		end := min(start+batch, len(docs))
		_, err := store.WithTransaction(ctx, sess, func(sctx context.Context) (any, error) {
			res, err := a.outbox.DeleteMany(sctx, bson.D{
				{Key: "_id", Value: bson.D{{Key: "$in", Value: ids[start:end]}}},
				{Key: "published", Value: false},
				{Key: "topic", Value: bson.D{{Key: "$exists", Value: false}}},
			})
			if err != nil {
				return nil, err
			}
			if res.DeletedCount != int64(end-start) {
				return nil, fmt.Errorf("%d of %d documents changed meanwhile (is a Python publisher still running?)", int64(end-start)-res.DeletedCount, end-start)
			}
			_, err = a.outbox.InsertMany(sctx, docs[start:end])
			return nil, err
		})
		if err != nil {
			return rep, fmt.Errorf("outbox: convert event-outbox documents %d to %d: %w", start, end, err)
		}
	}
	return rep, nil
}

// dropLibraryIndexes drops the Python library's indexes, recognised by name
// and keys: "idempotency" and "expiration" on the outbox, "expiration" on
// the inbox. It returns them as "collection.name".
func (a *Admin) dropLibraryIndexes(ctx context.Context, dryRun bool) ([]string, error) {
	libKeys := []struct {
		coll *mongo.Collection
		name string
		keys bson.D
	}{
		{a.outbox, store.LibraryIdempotencyIndex, libraryIdempotencyKeys},
		{a.outbox, "expiration", bson.D{{Key: "published_at", Value: int32(1)}}},
		{a.inbox, "expiration", bson.D{{Key: "handled_at", Value: int32(1)}}},
	}
	var dropped []string
	for _, l := range libKeys {
		specs, err := l.coll.Indexes().ListSpecifications(ctx)
		if err != nil {
			var cmdErr mongo.CommandError
			if errors.As(err, &cmdErr) && cmdErr.Code == 26 { // NamespaceNotFound
				continue
			}
			return dropped, fmt.Errorf("outbox: list indexes of %s: %w", l.coll.Name(), err)
		}
		for _, s := range specs {
			if s.Name != l.name || !store.SameIndexKeys(s.KeysDocument, l.keys) {
				continue
			}
			if !dryRun {
				if err := l.coll.Indexes().DropOne(ctx, l.name); err != nil {
					return dropped, fmt.Errorf("outbox: drop index %s of %s: %w", l.name, l.coll.Name(), err)
				}
			}
			dropped = append(dropped, l.coll.Name()+"."+l.name)
		}
	}
	return dropped, nil
}

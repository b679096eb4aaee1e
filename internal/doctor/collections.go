package doctor

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
)

// Collections is the Store of a service's collections in the framework's
// storage format (internal/store): the queries it runs and the indexes it
// compares are the ones the format defines.
type Collections struct {
	Outbox, Inbox *mongo.Collection
	// MetaSpecs are the indexes of store.MetaCollection, and MetaExpiring
	// the partial filter of its own TTL index: they belong to the replica
	// records, whose format is internal/liveness's.
	MetaSpecs    []store.IndexSpec
	MetaExpiring bson.D
}

// Database is the outbox's database.
func (c Collections) Database() *mongo.Database { return c.Outbox.Database() }

// OutboxName names the outbox collection.
func (c Collections) OutboxName() string { return c.Outbox.Name() }

// InboxName names the inbox collection.
func (c Collections) InboxName() string { return c.Inbox.Name() }

// MetaName names the metadata collection.
func (c Collections) MetaName() string { return store.MetaCollection }

func (c Collections) meta() *mongo.Collection { return c.Database().Collection(store.MetaCollection) }

// StoredPartitions reads the partition counts the service stored in the
// metadata collection for its outbox collection.
func (c Collections) StoredPartitions(ctx context.Context) (map[string]int, error) {
	docs, err := store.ReadTopicMetas(ctx, c.meta(), c.Outbox.Name())
	if err != nil {
		return nil, err
	}
	stored := make(map[string]int, len(docs))
	for _, doc := range docs {
		stored[doc.Topic] = doc.Partitions
	}
	return stored, nil
}

// InboxOwner reads the inbox's stamp.
func (c Collections) InboxOwner(ctx context.Context) (*Owner, error) {
	st, err := store.ReadInboxStamp(ctx, c.meta(), c.Inbox.Name())
	if st == nil || err != nil {
		return nil, err
	}
	return &Owner{ConsumerGroup: st.ConsumerGroup, Service: st.Service}, nil
}

// LatestEvents returns the newest n outbox events with their record
// fields' sizes.
func (c Collections) LatestEvents(ctx context.Context, n int) ([]EventSize, error) {
	sizes, err := store.LatestEventSizes(ctx, c.Outbox, n)
	if err != nil {
		return nil, err
	}
	out := make([]EventSize, len(sizes))
	for i, s := range sizes {
		out[i] = EventSize(s)
	}
	return out, nil
}

// EventFields reads one outbox event's record fields, concatenated.
func (c Collections) EventFields(ctx context.Context, id any) (string, error) {
	return store.EventRecordFields(ctx, c.Outbox, id)
}

// ListIndexes lists a collection's index documents.
func (c Collections) ListIndexes(ctx context.Context, coll string) ([]bson.D, error) {
	return store.ListIndexes(ctx, c.Database().Collection(coll))
}

// OutboxIndexes are the outbox's indexes with the given retention. The
// unique idempotency key index is optional, so it is not required here.
func (c Collections) OutboxIndexes(retention time.Duration) Indexes {
	return indexesOf(store.OutboxIndexes(retention, false), bson.D{{Key: store.OutboxPublished, Value: true}})
}

// InboxIndexes are the inbox's indexes with the given retention.
func (c Collections) InboxIndexes(retention time.Duration) Indexes {
	return indexesOf(store.InboxIndexes(retention), bson.D{{Key: store.InboxHandled, Value: true}})
}

// listIndexes lists the index documents of coll, none when it does not
// exist.
func listIndexes(ctx context.Context, coll *mongo.Collection) ([]bson.D, error) {
	return store.ListIndexes(ctx, coll)
}

// PayloadIndexes are the indexes of the claim check's payload collection
// (store.PayloadsCollection) when payloads expire ttl after their
// publication.
func PayloadIndexes(ttl time.Duration) Indexes {
	return indexesOf(claimcheck.Indexes(ttl), bson.D{{Key: store.PayloadPublished, Value: true}})
}

// MetaIndexes are the metadata collection's indexes.
func (c Collections) MetaIndexes() Indexes { return indexesOf(c.MetaSpecs, c.MetaExpiring) }

// indexesOf describes specs for the judgements; expiring is the partial
// filter of the collection's own TTL index.
func indexesOf(specs []store.IndexSpec, expiring bson.D) Indexes {
	out := Indexes{
		Expiring: func(partial any) bool { return store.SameBSON(partial, expiring, false) },
		Field:    store.Lookup,
		Format:   store.FormatIndex,
		TTL:      store.IndexTTL,
	}
	for _, s := range specs {
		out.Specs = append(out.Specs, IndexSpec{Name: s.Name, Doc: s.Document(), TTL: s.TTL, Unique: s.Unique,
			Matches: func(ix bson.D) bool { return len(store.FindEquivalents([]bson.D{ix}, s)) > 0 }})
	}
	return out
}

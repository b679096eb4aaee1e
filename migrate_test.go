package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// libraryCollections are the Python library's default collection names.
const (
	libOutbox = "transactional-outbox"
	libInbox  = "transactional-inbox"
)

// seedLibraryDatabase writes what a Python event-outbox service (v0.4.0)
// leaves in its database, as event_outbox/outbox.py writes it: outbox
// documents {_id, payload: event.model_dump(mode="json"), published} (two
// unpublished, one published), inbox documents {_id: {topic,
// content_schema, idempotency_key}, handled[, handled_at]} without a parked
// field, and the library's indexes (create_indexes).
func seedLibraryDatabase(t *testing.T, db *mongo.Database) {
	t.Helper()
	ctx := context.Background()
	outboxColl, inbox := db.Collection(libOutbox), db.Collection(libInbox)
	payload := func(key string, partKey int32, order string) bson.D {
		return bson.D{{Key: "topic", Value: paymentsTopic}, {Key: "content_schema", Value: "PaymentRequested"},
			{Key: "partition_key", Value: partKey}, {Key: "idempotency_key", Value: key},
			{Key: "occurred_at", Value: "2026-01-02T03:04:05.123456Z"},
			{Key: "order_id", Value: order}, {Key: "account", Value: partKey}, {Key: "amount", Value: 12.5}}
	}
	published := time.Now().UTC().Add(-time.Minute)
	_, err := outboxColl.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "payload", Value: payload("lib-published", 1, "o-p")}, {Key: "published", Value: true}, {Key: "published_at", Value: published}},
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "payload", Value: payload("lib-pending-a", 7, "o-a")}, {Key: "published", Value: false}},
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "payload", Value: payload("lib-pending-b", 8, "o-b")}, {Key: "published", Value: false}},
	})
	require.NoError(t, err)
	id := func(key string) bson.D {
		return bson.D{{Key: "topic", Value: paymentsTopic}, {Key: "content_schema", Value: "PaymentRequested"}, {Key: "idempotency_key", Value: key}}
	}
	_, err = inbox.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: id("lib-handled")}, {Key: "handled", Value: true}, {Key: "handled_at", Value: published}},
		bson.D{{Key: "_id", Value: id("lib-unhandled")}, {Key: "handled", Value: false}},
	})
	require.NoError(t, err)
	_, err = outboxColl.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "payload.topic", Value: 1}, {Key: "payload.content_schema", Value: 1}, {Key: "payload.idempotency_key", Value: 1}},
			Options: options.Index().SetName("idempotency").SetUnique(true)},
		{Keys: bson.D{{Key: "published_at", Value: 1}}, Options: options.Index().SetName("expiration").
			SetPartialFilterExpression(bson.D{{Key: "published", Value: true}}).SetExpireAfterSeconds(86400)},
	})
	require.NoError(t, err)
	_, err = inbox.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "handled_at", Value: 1}}, Options: options.Index().SetName("expiration").
		SetPartialFilterExpression(bson.D{{Key: "handled", Value: true}}).SetExpireAfterSeconds(86400)})
	require.NoError(t, err)
}

// TestMigrateEventOutboxServiceInPlace: a Go service takes over the
// database of a Python event-outbox service. The events the library left
// unpublished are published once, in its format and on its partitions;
// an event the library handled is skipped when redelivered, one it had not
// handled is handled, once.
func TestMigrateEventOutboxServiceInPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedLibraryDatabase(t, b.db)
	ctx := context.Background()
	admin := NewAdmin(b.db, libOutbox, libInbox)

	_, err := admin.MigrateEventOutbox(ctx, map[string]int{}, false)
	require.ErrorContains(t, err, "no partition count for topic(s) [payments]")
	dry, err := admin.MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, true)
	require.NoError(t, err)
	require.Equal(t, EventOutboxMigration{DryRun: true, Converted: map[string]int{paymentsTopic: 2}, InboxNotParked: 2,
		DroppedIndexes: []string{libOutbox + ".idempotency", libOutbox + ".expiration", libInbox + ".expiration"}}, dry)
	require.EqualValues(t, 2, count(t, b.db.Collection(libOutbox), bson.D{{Key: "topic", Value: bson.D{{Key: "$exists", Value: false}}}, {Key: "published", Value: false}}), "dry run changed nothing")

	rep, err := admin.MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, false)
	require.NoError(t, err)
	require.Equal(t, map[string]int{paymentsTopic: 2}, rep.Converted)
	require.Empty(t, rep.Refused)
	again, err := admin.MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, false)
	require.NoError(t, err)
	require.Empty(t, again.Converted, "a second run converts nothing")
	require.Empty(t, again.DroppedIndexes)

	cfg := b.config("payments")
	cfg.OutboxCollection, cfg.InboxCollection = libOutbox, libInbox
	cfg.PublishTopics = []string{paymentsTopic}
	cfg.WireFormats = map[string]Format{paymentsTopic: FormatEventOutbox}
	cfg.EventOutboxPartitioning = []string{paymentsTopic}
	c := b.client(t, cfg)
	var mu sync.Mutex
	handled := map[string]int{}
	MustHandle(c, func(ctx context.Context, e paymentRequested, m Metadata) error {
		mu.Lock()
		defer mu.Unlock()
		handled[m.IdempotencyKey]++
		return nil
	})
	// The library's consumer group had read up to here: these two are
	// redelivered to the Go service, as the library's producer wrote them.
	for _, key := range []string{"lib-handled", "lib-unhandled"} {
		b.produceRaw(t, &kgo.Record{Topic: paymentsTopic, Partition: 0, Value: []byte(
			`{"topic":"payments","content_schema":"PaymentRequested","partition_key":0,"idempotency_key":"` + key +
				`","occurred_at":"2026-01-02T03:04:05.123456Z","order_id":"o-x","account":0,"amount":1.0}`)})
	}
	start(t, c)

	recs := b.kafkaEvents(t, paymentsTopic, 4)
	byKey := map[string][]*kgo.Record{}
	for _, r := range recs {
		env, _, err := decodeRecord(r)
		require.NoError(t, err)
		byKey[env.IdempotencyKey] = append(byKey[env.IdempotencyKey], r)
	}
	require.Len(t, byKey["lib-pending-a"], 1)
	require.Len(t, byKey["lib-pending-b"], 1)
	require.Empty(t, byKey["lib-published"], "published by the library already")
	require.Equal(t, int32(7%3), byKey["lib-pending-a"][0].Partition, "the library's partition")
	require.Equal(t, int32(8%3), byKey["lib-pending-b"][0].Partition)
	require.Equal(t, `{"topic":"payments","content_schema":"PaymentRequested","partition_key":7,"idempotency_key":"lib-pending-a",`+
		`"occurred_at":"2026-01-02T03:04:05.123000Z","order_id":"o-a","account":7,"amount":12.5}`, string(byKey["lib-pending-a"][0].Value))

	eventually(t, "converted and unhandled events handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["lib-pending-a"] == 1 && handled["lib-pending-b"] == 1 && handled["lib-unhandled"] == 1
	})
	eventually(t, "the redelivered records committed", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, paymentsTopic, 0) >= 2
	})
	mu.Lock()
	require.Zero(t, handled["lib-handled"], "handled by the library: skipped")
	for k, n := range handled {
		require.Equal(t, 1, n, k)
	}
	mu.Unlock()
	// Marked published after Kafka's acknowledgement, which may follow
	// the handling.
	eventually(t, "the converted events marked published", func() bool {
		return count(t, b.db.Collection(libOutbox), bson.D{{Key: "published", Value: true}, {Key: "format", Value: "event-outbox"}}) == 2
	})
}

func TestMigrateEventOutboxRefusesDocumentsWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Collection(libOutbox).InsertOne(ctx, bson.D{{Key: "_id", Value: bson.NewObjectID()},
		{Key: "payload", Value: bson.D{{Key: "topic", Value: paymentsTopic}, {Key: "content_schema", Value: "S"}}}, {Key: "published", Value: false}})
	require.NoError(t, err)
	rep, err := NewAdmin(b.db, libOutbox, libInbox).MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, false)
	require.NoError(t, err)
	require.Len(t, rep.Refused, 1)
	require.Contains(t, rep.Refused[0], "missing payload.idempotency_key")
	require.Empty(t, rep.Converted)
	require.EqualValues(t, 1, count(t, b.db.Collection(libOutbox), bson.D{{Key: "topic", Value: bson.D{{Key: "$exists", Value: false}}}}), "left alone")
}

// TestRunRefusesTheLibraryOutbox: a client on the collections of a Python
// event-outbox service that was not migrated, or that a Python replica
// still uses, is refused at start, naming the cause, before it changes
// anything; once migrated it starts. And a library index created while the
// client runs (a Python replica started later) fails recording with the
// same error, not with ErrDuplicateEvent.
func TestRunRefusesTheLibraryOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedLibraryDatabase(t, b.db)
	ctx := context.Background()
	cfg := b.config("payments")
	cfg.OutboxCollection, cfg.InboxCollection = libOutbox, libInbox
	cfg.PublishTopics = []string{paymentsTopic}
	cfg.WireFormats = map[string]Format{paymentsTopic: FormatEventOutbox}
	cfg.EventOutboxPartitioning = []string{paymentsTopic}
	c := b.client(t, cfg)
	outboxColl := b.db.Collection(libOutbox)

	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := c.Run(runCtx)
	require.ErrorIs(t, err, ErrEventOutboxNotMigrated)
	require.ErrorContains(t, err, `index "idempotency"`)
	require.NoError(t, runCtx.Err(), "refused at once")
	specs, err := outboxColl.Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 3, "nothing created: _id, idempotency, expiration")

	require.NoError(t, outboxColl.Indexes().DropOne(ctx, "idempotency"))
	err = c.EnsureIndexes(ctx)
	require.ErrorIs(t, err, ErrEventOutboxNotMigrated, "the library's unpublished events")
	require.ErrorContains(t, err, "unpublished events in the library's form")

	_, err = c.Admin().MigrateEventOutbox(ctx, map[string]int{paymentsTopic: 3}, false)
	require.NoError(t, err)
	require.NoError(t, c.EnsureIndexes(ctx))

	// A Python replica starts after us and creates its index again (it can
	// while the outbox holds at most one document in our form: two index
	// as the same {null, null, null}).
	_, err = outboxColl.DeleteMany(ctx, bson.D{})
	require.NoError(t, err)
	_, err = outboxColl.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: libraryIdempotencyKeys,
		Options: options.Index().SetName("idempotency").SetUnique(true)})
	require.NoError(t, err)
	err = c.Transact(ctx, func(ctx context.Context) error {
		for i := range 2 {
			if err := Record(ctx, paymentRequested{OrderID: "o-" + itoa(i), Account: i, Amount: 1}); err != nil {
				return err
			}
		}
		return nil
	})
	require.ErrorIs(t, err, ErrEventOutboxNotMigrated)
	require.NotErrorIs(t, err, ErrDuplicateEvent)
}

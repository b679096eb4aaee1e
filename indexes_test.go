package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func indexSpecs(t *testing.T, coll *mongo.Collection) map[string]bson.M {
	t.Helper()
	cur, err := coll.Indexes().List(context.Background())
	require.NoError(t, err)
	var specs []bson.M
	require.NoError(t, cur.All(context.Background(), &specs))
	out := map[string]bson.M{}
	for _, s := range specs {
		out[s["name"].(string)] = s
	}
	return out
}

func TestEnsureIndexesIdempotentAndRetentionChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config("svc")
	cfg.OutboxRetention = time.Hour
	c := b.client(t, cfg)
	registerConsumer(t, c) // the inbox indexes are a consumer's
	// Several replicas starting at once.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.EnsureIndexes(ctx) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	specs := indexSpecs(t, c.outbox)
	require.Contains(t, specs, store.IndexOutboxPending)
	require.EqualValues(t, 3600, specs[store.IndexOutboxTTL]["expireAfterSeconds"])
	require.Contains(t, indexSpecs(t, c.inbox), store.IndexInboxTTL)

	cfg.OutboxRetention = 2 * time.Hour
	c2 := b.client(t, cfg)
	require.NoError(t, c2.EnsureIndexes(ctx))
	require.EqualValues(t, 7200, indexSpecs(t, c.outbox)[store.IndexOutboxTTL]["expireAfterSeconds"])
}

func TestTTLRemovesOnlyPublishedAndHandled(t *testing.T) {
	t.Parallel()
	b := setup(t, mongotest.ServerOptions(mongofake.TTLInterval(50*time.Millisecond)))
	if b.mongo.Real {
		t.Skip("the TTL monitor of a real MongoDB runs every 60 s; covered on the embedded server")
	}
	ctx := context.Background()
	cfg := b.config("svc")
	cfg.OutboxRetention = time.Second
	cfg.InboxRetention = time.Second
	c := b.client(t, cfg)
	registerConsumer(t, c)
	require.NoError(t, c.EnsureIndexes(ctx))
	old := time.Now().Add(-time.Hour)
	_, err := c.outbox.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "published-old"}, {Key: "published", Value: true}, {Key: "published_at", Value: old}},
		bson.D{{Key: "_id", Value: "published-new"}, {Key: "published", Value: true}, {Key: "published_at", Value: time.Now().Add(time.Hour)}},
		bson.D{{Key: "_id", Value: "pending"}, {Key: "published", Value: false}, {Key: "published_at", Value: old}},
	})
	require.NoError(t, err)
	_, err = c.inbox.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "handled-old"}, {Key: "handled", Value: true}, {Key: "handled_at", Value: old}},
		bson.D{{Key: "_id", Value: "parked"}, {Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "handled_at", Value: old}},
	})
	require.NoError(t, err)
	eventually(t, "expired documents removed", func() bool {
		return count(t, c.outbox, bson.D{}) == 2 && count(t, c.inbox, bson.D{}) == 1
	})
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "_id", Value: "pending"}}))
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "_id", Value: "published-new"}}))
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: "parked"}}))
}

// consume registers a no-op handler, making c a consumer.
func registerConsumer(t *testing.T, c *Client) {
	t.Helper()
	require.NoError(t, Handle(c, func(context.Context, orderPlaced, Metadata) error { return nil }))
}

// createIndex creates an index as another tool would, bypassing the
// framework.
func createIndex(t *testing.T, coll *mongo.Collection, name string, keys, partial bson.D, ttl int32) {
	t.Helper()
	opts := options.Index().SetName(name)
	if partial != nil {
		opts.SetPartialFilterExpression(partial)
	}
	if ttl >= 0 {
		opts.SetExpireAfterSeconds(ttl)
	}
	_, err := coll.Indexes().CreateOne(context.Background(), mongo.IndexModel{Keys: keys, Options: opts})
	require.NoError(t, err)
}

// The Python event-outbox library's indexes (event_outbox/outbox.py,
// create_indexes): TTL indexes named "expiration" with our key and partial
// filter. EnsureIndexes used
// to get IndexOptionsConflict, then IndexNotFound from collMod on its own
// name, and Run retried forever.
func TestEnsureIndexesReusesEquivalentIndexesOfAnotherName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config("py")
	cfg.OutboxRetention = time.Hour
	cfg.InboxRetention = 2 * time.Hour
	c := b.client(t, cfg)
	registerConsumer(t, c)
	day := int32(24 * 3600)
	// The library's "idempotency" index would refuse our second event:
	// EnsureIndexes refuses it (TestRunRefusesTheLibraryOutbox), and
	// MigrateEventOutbox drops it.
	createIndex(t, c.outbox, "expiration", bson.D{{Key: "published_at", Value: int32(1)}}, bson.D{{Key: "published", Value: true}}, day)
	createIndex(t, c.inbox, "expiration", bson.D{{Key: "handled_at", Value: int32(1)}}, bson.D{{Key: "handled", Value: true}}, day)

	require.NoError(t, c.EnsureIndexes(ctx))
	require.NoError(t, c.EnsureIndexes(ctx), "idempotent")

	out := indexSpecs(t, c.outbox)
	require.NotContains(t, out, store.IndexOutboxTTL, "the equivalent index is reused, not doubled")
	require.EqualValues(t, 3600, out["expiration"]["expireAfterSeconds"], "its TTL follows OutboxRetention")
	require.Contains(t, out, store.IndexOutboxPending)
	in := indexSpecs(t, c.inbox)
	require.NotContains(t, in, store.IndexInboxTTL)
	require.EqualValues(t, 7200, in["expiration"]["expireAfterSeconds"], "its TTL follows InboxRetention")
	require.Contains(t, in, store.IndexInboxParked)

	// Run starts on these collections instead of retrying forever.
	stop := start(t, c)
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"})
	}))
	eventually(t, "the event published", func() bool {
		return count(t, c.outbox, bson.D{{Key: "published", Value: true}}) == 1
	})
	stop()
}

// An index that cannot be reconciled ends Run with a clear error instead of
// a retry loop that never ends.
func TestRunEndsOnIndexConflict(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T, c *Client){
		"our name, another key": func(t *testing.T, c *Client) {
			createIndex(t, c.outbox, store.IndexOutboxTTL, bson.D{{Key: "created_at", Value: 1}}, nil, 60)
		},
		"our key and filter, not TTL": func(t *testing.T, c *Client) {
			createIndex(t, c.outbox, "by_hand", bson.D{{Key: "published_at", Value: 1}}, bson.D{{Key: "published", Value: true}}, -1)
		},
	}
	for name, prepare := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.client(t, b.config("conflict"))
			prepare(t, c)
			err := c.EnsureIndexes(context.Background())
			require.ErrorIs(t, err, ErrIndexConflict)
			require.ErrorContains(t, err, c.outbox.Name())

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = c.Run(ctx)
			require.ErrorIs(t, err, ErrIndexConflict)
			require.NoError(t, ctx.Err(), "Run returned the error, it did not retry until the deadline")
		})
	}
}

package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

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
	// Several replicas starting at once.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- c.EnsureIndexes(ctx) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	specs := indexSpecs(t, c.outbox)
	require.Contains(t, specs, indexOutboxPending)
	require.EqualValues(t, 3600, specs[indexOutboxTTL]["expireAfterSeconds"])
	require.Contains(t, indexSpecs(t, c.inbox), indexInboxTTL)

	cfg.OutboxRetention = 2 * time.Hour
	c2 := b.client(t, cfg)
	require.NoError(t, c2.EnsureIndexes(ctx))
	require.EqualValues(t, 7200, indexSpecs(t, c.outbox)[indexOutboxTTL]["expireAfterSeconds"])
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

package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
)

// Two services with the same Database and the default collection names would
// share the inbox and skip each other's events (the inbox _id is {topic,
// content_schema, idempotency_key}, whoever handles it). The second to start
// is refused, at EnsureIndexes and at Run, with an error that names both
// groups and the fix.
func TestInboxOfAnotherGroupIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := b.client(t, b.config("billing"))
	registerConsumer(t, first)
	require.NoError(t, first.EnsureIndexes(ctx))
	start(t, first)

	cfg := b.config("shipping")
	second := b.client(t, cfg)
	registerConsumer(t, second)
	err := second.EnsureIndexes(ctx)
	require.ErrorIs(t, err, ErrInboxOwned)
	require.ErrorContains(t, err, `"`+first.cfg.ConsumerGroup+`"`, "names the owner")
	require.ErrorContains(t, err, `"`+second.cfg.ConsumerGroup+`"`, "names this client's group")
	require.ErrorContains(t, err, "Config.InboxCollection", "says how to fix it")

	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = second.Run(rctx)
	require.ErrorIs(t, err, ErrInboxOwned)
	require.NoError(t, rctx.Err(), "Run returned the error, it did not retry until the deadline")

	// The refused client changed nothing of the owner's inbox: its TTL is
	// still the owner's.
	require.EqualValues(t, int64(first.cfg.InboxRetention.Seconds()),
		indexSpecs(t, first.inbox)[store.IndexInboxTTL]["expireAfterSeconds"])

	// The fix: an inbox collection of its own.
	cfg.InboxCollection = "shipping_inbox"
	fixed := b.client(t, cfg)
	registerConsumer(t, fixed)
	require.NoError(t, fixed.EnsureIndexes(ctx))
}

// Replicas of one service start at once: every one of them stamps (or finds
// its own stamp) and starts.
func TestInboxStampConcurrentReplicasOfOneGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config("replicas")
	const n = 4
	errs := make(chan error, n)
	for range n {
		c := b.client(t, cfg)
		registerConsumer(t, c)
		go func() { errs <- c.EnsureIndexes(ctx) }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	var st inboxStamp
	c := b.client(t, cfg)
	require.NoError(t, c.meta.FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "inbox", Value: "inbox"}}}}).Decode(&st))
	require.Equal(t, cfg.Service, st.ConsumerGroup)
	require.EqualValues(t, 1, count(t, c.meta, bson.D{}), "one stamp")
}

// Only a consumer stamps the inbox: a publish-only service sharing the
// database neither claims the inbox nor is refused.
func TestInboxNotStampedWithoutHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	owner := b.client(t, b.config("owner"))
	registerConsumer(t, owner)
	require.NoError(t, owner.EnsureIndexes(ctx))

	pub := b.client(t, b.config("publisher-only"))
	require.NoError(t, pub.EnsureIndexes(ctx))
	stop := start(t, pub)
	require.NoError(t, pub.Transact(ctx, func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"})
	}))
	stop()
	var st inboxStamp
	require.NoError(t, owner.meta.FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "inbox", Value: "inbox"}}}}).Decode(&st))
	require.Equal(t, owner.cfg.ConsumerGroup, st.ConsumerGroup)
}

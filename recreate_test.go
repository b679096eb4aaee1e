package outbox

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/syncbuf"
)

// Issue 31 item 3: a topic deleted and created again under a running
// consumer (a dev stack restarted, an operator's mistake) used to answer
// UNKNOWN_TOPIC_ID to every fetch for good, logged thousands of times a
// second. The consumer subscribes to the new topic on its own, and the
// repeated error is logged a few times, not per fetch.
func TestConsumerFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cluster(t) // deletes and creates topics on the embedded cluster
	cfg := consumerConfig(b, "recreate")
	var logs syncbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produce(t, b.envelope("before"), b.payload(t, "o-1", 0))
	eventually(t, "handled", func() bool { return calls.Load() == 1 })

	adm := b.kafka.Admin()
	ctx := context.Background()
	_, err := adm.DeleteTopics(ctx, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	_, err = adm.CreateTopics(ctx, 3, 1, nil, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	b.produce(t, b.envelope("after"), b.payload(t, "o-2", 1))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	// The handler counts a call before its transaction commits: wait for
	// the inbox, which shows the commit.
	eventually(t, "the event of the new topic handled", func() bool {
		return count(t, c.inbox, bson.D{{Key: "handled", Value: true}}) == 2
	})
	require.GreaterOrEqual(t, calls.Load(), int64(2), "a retried attempt counts again")
	require.Contains(t, logs.String(), "topic deleted and created again")
	require.LessOrEqual(t, strings.Count(logs.String(), "fetch error"), 3*2, "one line per partition and kind, then one per period")
}

// Issue 31 item 3, the publisher's side: events recorded after their
// topic was deleted and created again are published to the new topic.
func TestPublisherFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cluster(t)
	cfg := b.config("recreate-pub")
	cfg.PublishTopics = []string{ordersTopic}
	c := b.client(t, cfg)
	start(t, c)
	ctx := context.Background()
	record := func(id string) {
		require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: id, Amount: 1})
		}))
	}
	record("before")
	eventually(t, "published", func() bool { return count(t, c.outbox, bson.D{{Key: "published", Value: true}}) == 1 })
	adm := b.kafka.Admin()
	_, err := adm.DeleteTopics(ctx, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	_, err = adm.CreateTopics(ctx, 3, 1, nil, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	record("after")
	eventually(t, "the event recorded after the recreation published", func() bool {
		return count(t, c.outbox, bson.D{{Key: "published", Value: true}}) == 2
	})
	recs := b.kafkaEvents(t, ordersTopic, 1)
	require.Len(t, recs, 1, "the new topic holds the new event")
}

package outbox

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/kafkax"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// keylessOrder is an event without a partition key.
type keylessOrder struct {
	Run string `json:"run"`
	N   int    `json:"n"`
	Pad string `json:"pad,omitempty"`
}

func (keylessOrder) Topic() string         { return ordersTopic }
func (keylessOrder) ContentSchema() string { return "KeylessOrder.v1" }
func (keylessOrder) PartitionKey() string  { return "" }

func recordKeyless(t *testing.T, c *Client, run string, n, padding int) {
	t.Helper()
	e := keylessOrder{Run: run, N: n}
	if padding > 0 {
		e.Pad = pad(padding)
	}
	require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) }))
}

// A refused keyless event holds nothing: keyless events promise no order, so
// the key "" must not hold every keyless event of its topic after it.
func TestPublisherRefusedKeylessEventHoldsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	recordKeyless(t, c, b.run, 0, 0)
	recordKeyless(t, c, b.run, 1, 6000) // refused under the lowered limit
	recordKeyless(t, c, b.run, 2, 0)
	recordKeyless(t, c, b.run, 3, 0)
	b.setMaxMessageBytes(t, 4000)
	runPub(t, c, publisherOptions{holdRecheck: 50 * time.Millisecond})
	eventually(t, "the other keyless events published", func() bool { return b.published(t, cfg) == 3 && failedCount(t, b) == 1 })
	recordKeyless(t, c, b.run, 4, 0)
	eventually(t, "a later keyless event published", func() bool { return b.published(t, cfg) == 4 })
	require.Zero(t, c.publisherStatus().HeldKeys)
	st, err := c.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.OutboxHeldKeys)
	require.Zero(t, st.OutboxHeldEvents)
}

// Events on partitions added to a topic are published without waiting for the
// clients' metadata refresh (kgo's default: five minutes). Here they are
// recorded by another client that knows the new count, while the publisher's
// own refresh of the counts is a minute away: the bounded metadata age of its
// group and producers brings them out.
func TestPublisherPublishesOnAddedPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	pub := b.client(t, cfg)
	start(t, pub)
	eventually(t, "owns the 3 partitions", func() bool { return len(pub.publisherStatus().Owned) == 3 })

	ctx := context.Background()
	res, err := b.kafka.Admin().CreatePartitions(ctx, 3, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	added := time.Now()
	rec := b.client(t, cfg)
	rec.topics.Apply(ctx, map[string]int{ordersTopic: 6}, nil) // it read the new count
	r := newRecorder(b, rec)
	var keys []string
	for i := 0; len(keys) < 6; i++ {
		if k := "new-" + itoa(i); kafkax.Partition([]byte(k), 6) >= 3 {
			keys = append(keys, k)
		}
	}
	r.record(t, keys...)
	eventually(t, "events on the new partitions published", func() bool { return b.published(t, cfg) == 6 })
	t.Logf("published %v after the partitions were added", time.Since(added))
	require.Len(t, pub.publisherStatus().Owned, 6)
	recs := b.kafkaEvents(t, ordersTopic, 6)
	for _, rec := range recs {
		require.GreaterOrEqual(t, rec.Partition, int32(3))
	}
	checkDelivery(t, r, recs)
}

// A change stream whose getMore keeps failing after a successful open is
// reopened with backoff, not thousands of times a second. With backoff (10 ms
// doubling to 100 ms in this configuration) a 2 s failing window sees a few
// dozen reopens at most; the reopens are counted by a metric.
func TestPublisherChangeStreamFailuresBackOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fail points")
	}
	cfg := pubConfig(b)
	var commands atomic.Int64 // aggregate, getMore and find on the outbox
	cfg.Mongo = b.mongo.NewClient(t, options.Client().SetMonitor(&event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			switch e.CommandName {
			case "aggregate", "getMore", "find":
				commands.Add(1)
			}
		},
	}))
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	var opened atomic.Int64
	runPub(t, c, publisherOptions{streamOpened: func() { opened.Add(1) }})
	eventually(t, "stream open", func() bool { return opened.Load() >= 1 && len(c.publisherStatus().Owned) == 3 })

	for _, fp := range []mongofake.FailPoint{
		{Commands: []string{"getMore"}, ErrorCode: 286, ErrorMessage: "ChangeStreamHistoryLost (test)"},
		{Commands: []string{"getMore"}, ErrorCode: 91, ErrorMessage: "ShutdownInProgress (test)"}, // resumable
	} {
		before, cmds := opened.Load(), commands.Load()
		cancel := b.mongo.Server.FailCommand(fp)
		time.Sleep(2 * time.Second) // the failing window
		cancel()
		n, m := opened.Load()-before, commands.Load()-cmds
		t.Logf("%s: %d reopens, %d aggregate/getMore/find commands in a 2 s failing window", fp.ErrorMessage, n, m)
		require.Less(t, n, int64(60), "%s: reopened without backing off", fp.ErrorMessage)
		require.Less(t, m, int64(1000), "%s: commands without backing off", fp.ErrorMessage)
	}
	r := newRecorder(b, c)
	r.record(t, keysN(6)...)
	eventually(t, "published once the stream is back", func() bool { return b.published(t, cfg) == 6 })
	m := o.collect(t)
	require.Positive(t, sumOf(m["outbox.change_stream.reopens"], itel.AttrReason.String("error")))
}

// outbox_events_publish_failed_total has a topic label, so that an operator
// sees which topic refuses events.
func TestPublishFailedMetricNamesTheTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	r.recordPadded(t, 6000, "k")
	b.setMaxMessageBytes(t, 4000)
	runPub(t, c, publisherOptions{})
	eventually(t, "refused", func() bool { return failedCount(t, b) == 1 })
	eventually(t, "counted with its topic", func() bool {
		m := o.collect(t)
		return sumOf(m["outbox.events.publish_failed"], itel.AttrTopic.String(ordersTopic), itel.AttrReason.String("refused")) == 1
	})
}

// A document whose payload has the wrong BSON type must not fail the decoding
// of its whole scan batch, which would stall its partition for ever: it is
// marked failed with the reason, the others are published, and an operator can
// list, retry and discard it.
func TestPublisherUnreadableDocumentDoesNotStopItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	keys := samePartitionKeys(3)
	r := newRecorder(b, c)
	r.record(t, keys[0])
	coll := b.db.Collection("outbox")
	bad := bson.NewObjectID()
	_, err := coll.InsertOne(context.Background(), bson.D{{Key: "_id", Value: bad}, {Key: "topic", Value: ordersTopic},
		{Key: "partition", Value: int32(0)}, {Key: "key", Value: keys[1]}, {Key: "schema", Value: "OrderPlaced.v1"},
		{Key: "payload", Value: int32(5)}, // not a string
		{Key: "seq", Value: bson.Timestamp{}}, {Key: "created_at", Value: time.Now()},
		{Key: "published", Value: false}, {Key: "failed", Value: false}})
	require.NoError(t, err)
	r.record(t, keys[2])

	runPub(t, c, publisherOptions{holdRecheck: 50 * time.Millisecond})
	eventually(t, "the readable events published", func() bool { return b.published(t, cfg) == 2 })
	eventually(t, "the unreadable one failed", func() bool { return failedCount(t, b) == 1 })
	var doc bson.M
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: bad}}).Decode(&doc))
	require.Equal(t, true, doc["failed"])
	require.Contains(t, doc["error"], "cannot read the outbox document")
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 2))

	failed, err := c.Admin().FailedEvents(context.Background(), FailedFilter{})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, bad.Hex(), failed[0].ID)
	require.Equal(t, keys[1], failed[0].PartitionKey)
	require.Contains(t, failed[0].Error, "cannot read the outbox document")

	// Retried, it is marked failed again (it is still unreadable); then
	// discarded.
	n, err := c.Admin().RetryFailed(context.Background(), FailedFilter{}, []string{bad.Hex()}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "failed again", func() bool { return failedCount(t, b) == 1 })
	n, err = c.Admin().DiscardFailed(context.Background(), FailedFilter{}, []string{bad.Hex()}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, countFind(t, coll, bson.D{{Key: "_id", Value: bad}}))
}

// An event stored for a partition beyond its topic's count waits, and Status
// names the cause, so that the wait is not a silent one.
func TestStatusNamesEventsBeyondThePartitionCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	ctx := context.Background()
	c.topics.Apply(ctx, map[string]int{ordersTopic: 3}, nil) // as Run stores it
	for _, part := range []int32{1, 7, 9} {
		_, err := c.outbox.InsertOne(ctx, outboxDoc{ID: bson.NewObjectID(), Topic: ordersTopic, Partition: part, Key: "k",
			Schema: "X.v1", IdempotencyKey: "u-" + itoa(int(part)), CreatedAt: time.Now()})
		require.NoError(t, err)
	}
	st, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Pending)
	require.EqualValues(t, 2, st.Unroutable)
	require.Len(t, st.Topics, 1)
	require.Equal(t, 3, st.Topics[0].Partitions)
	require.EqualValues(t, 2, st.Topics[0].Unroutable)
	require.Contains(t, st.Topics[0].UnroutableCause(), `2 pending events of topic "orders" are stored for partitions beyond its 3`)
	raw, err := st.MarshalJSON()
	require.NoError(t, err)
	require.Contains(t, string(raw), `"unroutable_cause":`)
}

package outbox

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/kafkax"
)

// blackHole returns the address of a TCP listener that accepts connections
// and never answers: a Kafka broker lost in a network partition. Kafka
// clients connect and then wait for replies that never come.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// transactWithin runs one Transact that records an event for key and gives
// up waiting after a generous deadline: Transact must return on its own (the
// old code waited for Kafka inside the open transaction).
func transactWithin(t *testing.T, c *Client, b *bundle, key string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.Transact(ctx, func(ctx context.Context) error {
		if _, err := b.orders().InsertOne(ctx, bson.D{{Key: "order", Value: key}}); err != nil {
			return err
		}
		return Record(ctx, orderPlaced{Run: b.run, OrderID: key})
	})
	require.NoError(t, ctx.Err(), "Transact hung until the deadline")
	return err
}

// A replica that restarts while Kafka is unreachable records normally, with
// the partition counts a previous run persisted in MongoDB.
func TestRecordAfterRestartDuringKafkaOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("restart")
	before := b.client(t, cfg)
	require.NoError(t, transactWithin(t, before, b, "o-1"))

	// The restart: a new Client, and Kafka unreachable (black-holed).
	cfg.Brokers = []string{blackHole(t)}
	after := b.client(t, cfg)
	require.NoError(t, transactWithin(t, after, b, "o-2"))
	require.NoError(t, transactWithin(t, after, b, "o-1"))

	cur, err := after.outbox.Find(context.Background(), bson.D{{Key: "key", Value: "o-1"}})
	require.NoError(t, err)
	var docs []outboxDoc
	require.NoError(t, cur.All(context.Background(), &docs))
	require.Len(t, docs, 2)
	want := kafkax.Partition([]byte("o-1"), 3)
	for _, d := range docs {
		require.Equal(t, want, d.Partition, "same key, same partition, before and after the restart")
	}
	require.EqualValues(t, 3, count(t, b.orders(), bson.D{}))
}

// On a first-ever start with Kafka unreachable and no count persisted,
// recording fails fast with ErrPartitionsUnknown, the transaction aborts,
// and transactions that record nothing still commit.
func TestRecordFirstStartKafkaDownFailsFast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("first-start")
	cfg.Brokers = []string{blackHole(t)}
	c := b.client(t, cfg)
	c.topics.SetLookupTimeout(300 * time.Millisecond)

	for _, key := range []string{"o-1", "o-2"} { // the second without a Kafka read
		err := transactWithin(t, c, b, key)
		require.ErrorIs(t, err, ErrPartitionsUnknown)
		require.ErrorContains(t, err, ordersTopic)
	}
	require.Zero(t, count(t, c.outbox, bson.D{}))
	require.Zero(t, count(t, b.orders(), bson.D{}), "the business write aborted with the event")

	require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
		_, err := b.orders().InsertOne(ctx, bson.D{{Key: "_id", Value: "no-event"}})
		return err
	}))
	require.EqualValues(t, 1, count(t, b.orders(), bson.D{}))
}

// The same with a broker that refuses connections (the closed address of a
// cluster that is down).
func TestRecordFirstStartKafkaRefusesFailsFast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := b.config("refused")
	cfg.Brokers = []string{addr}
	c := b.client(t, cfg)
	c.topics.SetLookupTimeout(300 * time.Millisecond)
	err = transactWithin(t, c, b, "o-1")
	require.ErrorIs(t, err, ErrPartitionsUnknown)
	require.True(t, errors.Is(err, ErrTopicMetadata), "the cause is kept: %v", err)
}

// Run persists the partition counts of its publish topics at start, so a
// later restart does not need Kafka to record.
func TestRunPersistsPartitionCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("persist"))
	start(t, c)
	eventually(t, "counts persisted", func() bool {
		return count(t, c.meta, bson.D{{Key: "partitions", Value: 3}}) == 2
	})
	require.Equal(t, map[string]int{ordersTopic: 3, paymentsTopic: 3}, c.topics.Snapshot())
}

func (b *bundle) orders() *mongo.Collection { return b.db.Collection("orders") }

// Partitions added to a topic reach recording through Run's refresh: the new
// count is persisted, and later events use it.
func TestRunRefreshesPartitionCountsAfterIncrease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("grow"))
	c.test.metadataEvery = 20 * time.Millisecond
	start(t, c)
	stored := func(n int) func() bool {
		return func() bool {
			return count(t, c.meta, bson.D{{Key: "_id.topic", Value: ordersTopic}, {Key: "partitions", Value: n}}) == 1
		}
	}
	eventually(t, "3 partitions stored", stored(3))

	_, err := b.kafka.Admin().CreatePartitions(context.Background(), 4, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	eventually(t, "7 partitions stored", stored(7))
	eventually(t, "7 partitions in memory", func() bool { return c.topics.Snapshot()[ordersTopic] == 7 })

	key := "o-grow"
	for i := 0; kafkax.Partition([]byte(key), 7) == kafkax.Partition([]byte(key), 3); i++ {
		key = "o-grow-" + itoa(i) // a key whose partition changes
	}
	require.NoError(t, transactWithin(t, c, b, key))
	var doc outboxDoc
	require.NoError(t, c.outbox.FindOne(context.Background(), bson.D{{Key: "key", Value: key}}).Decode(&doc))
	require.Equal(t, kafkax.Partition([]byte(key), 7), doc.Partition)
}

// The topics' max.message.bytes is read and stored with their counts, so a
// process that only records learns it from MongoDB and refuses an event
// that cannot fit (ErrEventTooLarge).
func TestRunStoresTopicLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setMaxMessageBytes(t, 300000)
	cfg := b.config("limits")
	cfg.Compression = CompressionSnappy // pad's hex is incompressible for snappy
	c := b.client(t, cfg)
	start(t, c)
	eventually(t, "limit stored", func() bool {
		return count(t, c.meta, bson.D{{Key: "_id.topic", Value: ordersTopic}, {Key: "max_message_bytes", Value: 300000}}) == 1
	})

	rec := b.client(t, cfg) // records only: loads the stored counts and limits
	e := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: "k", Amount: 1}, Pad: pad(400000)}
	err := rec.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) })
	var tooLarge *EventTooLargeError
	require.ErrorAs(t, err, &tooLarge)
	require.Equal(t, 300000, tooLarge.Limit)
}

package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/publish"
)

// Events Kafka would accept are never failed by the client's own batch limit
// (ProducerBatchMaxBytes, 1,000,012 bytes before compression), and an event
// that truly cannot fit is refused when it is recorded, not first met by the
// relay.

// largeScenario records, on one partition, a small event, a large event of
// about size bytes (incompressible, or compressible) and a small event, all
// of key "big-key", with the topic's max.message.bytes at recordLimit
// while recording (0: Kafka's default).
func largeScenario(t *testing.T, size int, compressible bool, recordLimit int) (*bundle, *Client, *recorder) {
	t.Helper()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	if recordLimit > 0 {
		b.setMaxMessageBytes(t, recordLimit)
	}
	r := newRecorder(b, c)
	r.recordPadded(t, 0, "big-key")
	if compressible {
		r.recordCompressible(t, size, "big-key")
	} else {
		r.recordPadded(t, size, "big-key")
	}
	r.recordPadded(t, 0, "big-key")
	return b, c, r
}

// recordCompressible records one event of key padded with about size bytes
// that compress well.
func (r *recorder) recordCompressible(t *testing.T, size int, key string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := paddedOrder{orderPlaced: orderPlaced{Run: r.b.run, OrderID: key, Amount: 1, Seq: r.next[key]},
		Pad: strings.Repeat("outbox ", size/7)}
	require.NoError(t, r.c.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) }))
	r.next[key]++
	r.all++
}

// (a) A 1.5 MB event on a topic whose max.message.bytes is 4 MB.
func TestPublisherPublishesLargeEventTheTopicAccepts(t *testing.T) {
	t.Parallel()
	b, c, r := largeScenario(t, 1500000, false, 4<<20)
	runPub(t, c, publisherOptions{})
	eventually(t, "the 1.5 MB event published", func() bool { return b.published(t, Config{}) == 3 })
	require.Zero(t, failedCount(t, b))
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 3))
}

// (b) A compressible 1.5 MB event at Kafka's default limit: its compressed
// batch fits.
func TestPublisherPublishesCompressibleLargeEventAtDefaultLimit(t *testing.T) {
	t.Parallel()
	b, c, r := largeScenario(t, 1500000, true, 0)
	runPub(t, c, publisherOptions{})
	eventually(t, "the compressible 1.5 MB event published", func() bool { return b.published(t, Config{}) == 3 })
	require.Zero(t, failedCount(t, b))
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 3))
}

// (c) The README's advice: a large event failed; the operator raises the
// topic's max.message.bytes and retries it; it is published, before the
// event of its key that waited behind it.
func TestPublisherRetriedLargeEventPublishedAfterTheLimitIsRaised(t *testing.T) {
	t.Parallel()
	b, c, r := largeScenario(t, 1500000, false, 4<<20)
	b.setMaxMessageBytes(t, 1<<20) // lowered after recording: the event does not fit
	runPub(t, c, publisherOptions{holdRecheck: 50 * time.Millisecond})
	eventually(t, "the large event failed", func() bool { return failedCount(t, b) == 1 && b.published(t, Config{}) == 1 })
	var doc outboxDoc
	require.NoError(t, b.db.Collection("outbox").FindOne(context.Background(), bson.D{{Key: "failed", Value: true}}).Decode(&doc))
	require.Contains(t, doc.Error, "MESSAGE_TOO_LARGE")

	b.setMaxMessageBytes(t, 4<<20)
	n, err := c.Admin().RetryFailed(context.Background(), FailedFilter{}, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "the retried event published", func() bool { return b.published(t, Config{}) == 3 })
	require.Zero(t, failedCount(t, b))
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 3))
}

// (d) An event that cannot fit even compressed is refused by Record when
// the topic's limit is known, with the sizes; a compressible one that fits
// compressed is accepted.
func TestRecordRefusesEventTooLargeForItsTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, pubConfig(b))
	r := newRecorder(b, c)
	r.record(t, "k") // the first Transact reads the topic's count and limit
	limit, ok := c.topics.MaxMessageBytes(ordersTopic)
	require.True(t, ok, "the limit is read with the partition count")

	e := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: "k", Amount: 1, Seq: 1}, Pad: pad(1500000)}
	err := c.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) })
	require.ErrorIs(t, err, ErrEventTooLarge)
	require.ErrorIs(t, err, ErrInvalidEvent)
	var tooLarge *EventTooLargeError
	require.ErrorAs(t, err, &tooLarge)
	require.Equal(t, limit, tooLarge.Limit)
	require.Greater(t, tooLarge.Size, 1500000)
	require.Greater(t, tooLarge.CompressedSize, limit)
	require.Equal(t, ordersTopic, tooLarge.Topic)
	require.Contains(t, err.Error(), "max.message.bytes")
	require.EqualValues(t, 1, countFind(t, b.db.Collection("outbox"), bson.D{}), "the transaction was aborted")

	r.recordCompressible(t, 1500000, "k")
	require.EqualValues(t, 2, countFind(t, b.db.Collection("outbox"), bson.D{}))
}

// slowPromises delays every promise of the producers, as a slow or
// loaded client would: the worker learns of a refusal late.
type slowPromises struct{ d time.Duration }

func (h slowPromises) OnProduceRecordUnbuffered(*kgo.Record, error) { time.Sleep(h.d) }

// kgo refuses a too-large record on the client but still sends the records
// after it; with promises delivered late, later events of its key could be
// published while it stands failed and holds the key. Whatever the timing,
// none may be.
func TestPublisherNoEventOvertakesARefusedOneOfItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.KafkaOptions = []kgo.Opt{kgo.WithHooks(slowPromises{50 * time.Millisecond})}
	c := b.client(t, cfg)
	keys := samePartitionKeys(2)
	held, other := keys[0], keys[1]
	b.setMaxMessageBytes(t, 4<<20)
	r := newRecorder(b, c)
	r.recordPadded(t, 1200000, held) // above kgo's default and Kafka's default limit
	for range 19 {
		r.recordPadded(t, 0, held, other)
	}
	b.setMaxMessageBytes(t, 1<<20)

	runPub(t, c, publisherOptions{})
	coll := b.db.Collection("outbox")
	eventually(t, "the other key's events published", func() bool {
		return countFind(t, coll, bson.D{{Key: "key", Value: other}, {Key: "published", Value: true}}) == 19
	})
	require.Zero(t, countFind(t, coll, bson.D{{Key: "key", Value: held}, {Key: "published", Value: true}}),
		"events of the held key published while its first event was refused")
	require.EqualValues(t, 1, failedCount(t, b))
	st, err := c.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 19, st.OutboxHeldEvents, "the held key's 19 later events wait behind it")
	for _, rec := range b.kafkaEvents(t, ordersTopic, 19) {
		require.NotEqual(t, held, string(rec.Key), "an event of the held key reached Kafka")
	}
}

// A scan must not read, decode and produce a partition's whole backlog at
// once: rounds are capped by the bytes of their documents (16 MiB by
// default; 2 MiB here, so that eight events of 600 KB, not thirty, go over
// it: the test's work, and its time under load, stay small), and the
// backlog still drains without waiting for the periodic rescan.
func TestPublisherScanRoundsAreCappedByBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	const events, capBytes = 8, 2 << 20
	for _, k := range samePartitionKeys(events) {
		r.recordPadded(t, 600000, k)
	}
	var mu sync.Mutex
	var rounds []int
	runPub(t, c, publisherOptions{rescan: time.Hour, batchBytes: capBytes, hooks: publish.Hooks{
		Produced: func(_ publish.TopicPartition, items []publish.Item, _, _ time.Time, _ int) {
			n := 0
			for _, it := range items {
				n += len(it.Record.Value)
			}
			mu.Lock()
			rounds = append(rounds, n)
			mu.Unlock()
		},
	}})
	eventually(t, "the backlog published", func() bool { return b.published(t, Config{}) == events })
	mu.Lock()
	defer mu.Unlock()
	for _, n := range rounds {
		require.LessOrEqual(t, n, capBytes, "a round held %d bytes of events", n)
	}
	require.Greater(t, len(rounds), 1)
}

// The publisher reads the topics' limits with kadm when it starts, and
// sizes its producer's batches by them.
func TestPublisherReadsTheTopicLimitAtStart(t *testing.T) {
	t.Parallel()
	b, c, _ := largeScenario(t, 1500000, false, 4<<20)
	n, _ := c.topics.MaxMessageBytes(ordersTopic)
	require.Equal(t, 4<<20, n, "read by the first Transact")
	b.setMaxMessageBytes(t, 1<<20)
	runPub(t, c, publisherOptions{})
	eventually(t, "the producer sized by the new limit", func() bool {
		p := c.pub.Load()
		return p != nil && p.MaxBatchBytes(b.kafkaTopic(ordersTopic)) == 1<<20
	})
	eventually(t, "the large event failed", func() bool { return failedCount(t, b) == 1 })
}

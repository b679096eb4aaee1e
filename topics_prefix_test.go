package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Config.TopicPrefix must give Kafka legal topic names.
func TestTopicPrefixValidated(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", "staging.", "a_b-C.9"} {
		cfg := validConfig(t)
		cfg.TopicPrefix = prefix
		_, err := New(cfg)
		require.NoError(t, err, "prefix %q", prefix)
	}
	for _, prefix := range []string{"staging/", "qa ", "é.", strings.Repeat("p", maxNameLen)} {
		cfg := validConfig(t)
		cfg.TopicPrefix = prefix
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, "prefix %q", prefix)
		require.ErrorContains(t, err, "TopicPrefix")
	}
	// The prefixed names must fit Kafka's limit: publish topics at New,
	// handled topics at Handle.
	cfg := validConfig(t)
	cfg.TopicPrefix = strings.Repeat("p", maxNameLen-len("orders")+1)
	_, err := New(cfg)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "PublishTopics")
	cfg.PublishTopics = nil
	c, err := New(cfg)
	require.NoError(t, err)
	require.ErrorIs(t, Handle(c, func(context.Context, testEvent, Metadata) error { return nil }), ErrInvalidEvent)
}

// With Config.TopicPrefix, only Kafka sees the prefix: events are produced
// to, consumed from and committed on the prefixed topics, while the outbox
// and inbox documents, inbox ids, parked and held events, Metadata and the
// status keep the bare topic.
func TestTopicPrefixOnlyAtTheKafkaBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NotEmpty(t, b.prefix)
	ctx := context.Background()
	c := b.client(t, b.config("prefix"))
	var mu sync.Mutex
	var topics []string // Metadata.Topic of every handling attempt
	MustHandle(c, func(_ context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		mu.Lock()
		topics = append(topics, m.Topic)
		mu.Unlock()
		if m.IdempotencyKey == "a1" {
			return Park(errors.New("a1 is poison"))
		}
		return nil
	})
	start(t, c)
	// a1 and a2 share their partition key (the order id): a2 is held
	// behind a1, which its handler parks.
	for i, e := range []struct{ key, order string }{{"a1", "A"}, {"a2", "A"}, {"b1", "B"}} {
		require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: e.order, Amount: 1, Seq: i}, WithIdempotencyKey(e.key))
		}))
	}
	eventually(t, "a1 parked, a2 held behind it, b1 handled", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 2 &&
			count(t, c.inbox, bson.D{{Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}) == 1 &&
			count(t, c.inbox, bson.D{{Key: "parked", Value: bson.D{{Key: "$ne", Value: true}}}}) == 1
	})

	// The publisher marks an event published after Kafka acknowledged it,
	// so the mark may land after the consumer handled the event.
	eventually(t, "all three marked published", func() bool {
		return count(t, c.outbox, bson.D{{Key: "topic", Value: ordersTopic}, {Key: "published", Value: true}}) == 3
	})
	// MongoDB: bare topics only.
	require.EqualValues(t, 3, count(t, c.outbox, bson.D{}))
	require.EqualValues(t, 3, count(t, c.inbox, bson.D{{Key: "_id.topic", Value: ordersTopic}}))
	require.EqualValues(t, 3, count(t, c.inbox, bson.D{}))
	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{Topic: ordersTopic})
	require.NoError(t, err)
	require.Len(t, parked, 2)
	head := InboxID{Topic: ordersTopic, ContentSchema: orderPlaced{}.ContentSchema(), IdempotencyKey: "a1"}
	for _, p := range parked {
		require.Equal(t, ordersTopic, p.ID.Topic)
		if p.ID.IdempotencyKey == "a2" {
			require.Equal(t, ParkedStateHeld, p.State)
			require.Equal(t, &head, p.HeldBy)
		}
	}
	mu.Lock()
	require.NotEmpty(t, topics)
	for _, tp := range topics {
		require.Equal(t, ordersTopic, tp, "Metadata.Topic")
	}
	mu.Unlock()
	st, err := c.Status(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, st.Handling)
	for _, tp := range append(st.Handling, st.Publishing...) {
		require.Contains(t, []string{ordersTopic, paymentsTopic}, tp.Topic, "status names bare topics")
	}

	// Kafka: the records are on the prefixed topic, and the consumer group
	// committed its offsets there.
	raw := b.kafka.Client(t, kgo.ConsumeTopics(b.kafkaTopic(ordersTopic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var recs []*kgo.Record
	for len(recs) < 3 {
		fs := raw.PollFetches(ctx)
		require.NoError(t, fs.Err())
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	for _, r := range recs {
		require.Equal(t, b.kafkaTopic(ordersTopic), r.Topic)
		env, _, err := decodeRecord(&kgo.Record{Topic: ordersTopic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers})
		require.NoError(t, err)
		require.Equal(t, ordersTopic, env.Topic)
	}
	adm := kadm.NewClient(b.kafka.Client(t))
	eventually(t, "offsets committed on the prefixed topic", func() bool {
		offs, err := adm.FetchOffsets(ctx, c.cfg.ConsumerGroup)
		if err != nil {
			return false
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) {
			require.Equal(t, b.kafkaTopic(ordersTopic), o.Topic, "commits go to Kafka topics")
			sum += o.At
		})
		return sum == 3
	})
	if !b.kafka.Real {
		// On a cluster of its own, nothing touched the bare topic.
		details, err := adm.ListTopics(ctx, ordersTopic)
		require.NoError(t, err)
		require.Error(t, details[ordersTopic].Err, "the bare topic does not exist in Kafka")
	}
}

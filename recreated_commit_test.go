package outbox

import (
	"cmp"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/kafkawatch"
)

// The recreation watch (internal/kafkawatch) sets the group's offsets of a
// recreated topic to its start once and counts on no member committing an
// offset of the old topic afterwards: a member still consuming the old topic id commits through
// its client (consumer.commit), which names the topic by the id its
// offsets were fetched under, and either refuses the commit itself (its
// metadata knows the new id) or sends it by that id (OffsetCommit v10),
// which the broker refuses as UNKNOWN_TOPIC_ID. Were such a commit taken
// by name, the group's offset of the new topic would jump past records
// nobody handled.
func TestOldTopicCommitAfterTheResetMovesNoOffset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "recreated-commit")
	cfg.ConsumerGroup = cmp.Or(cfg.ConsumerGroup, cfg.Service)
	topic := b.kafkaTopic(ordersTopic)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer prod.Close()
	for i := range 5 {
		require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte{byte(i)}}).FirstErr())
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Seeds...), kgo.ConsumerGroup(cfg.ConsumerGroup), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	cons := &consumer{c: &Client{cfg: cfg}, cl: cl, log: debugLogger}
	watch := &kafkawatch.RecreationWatch{Client: cl, Group: cfg.ConsumerGroup, Log: debugLogger, Backoff: cfg.backoff()}
	for fetched := 0; fetched < 5; {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "the old topic's records fetched")
		fetched += fs.NumRecords()
	}

	before, err := b.kafka.Admin().ListTopics(ctx, topic)
	require.NoError(t, err)
	recreator(t, b, 3)()
	// The admin client answers from its metadata cache for a while.
	var newID kadm.TopicID
	for {
		details, err := b.kafka.Admin().ListTopics(ctx, topic)
		require.NoError(t, err)
		if newID = details[topic].ID; newID != before[topic].ID {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the recreated topic's id: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NoError(t, watch.CommitStart(ctx, topic, newID), "the reset, as the recreation watch sends it")

	// The member's workers still hold the old topic's records: a commit
	// past them, as a worker sends it.
	err = cons.commit(ctx, consume.TopicPartition{Topic: ordersTopic, Partition: 0}, 5, -1)
	require.ErrorIs(t, err, kerr.UnknownTopicID, "an offset of the old topic is refused")

	offsets, err := b.kafka.Admin().FetchOffsets(ctx, cfg.ConsumerGroup)
	require.NoError(t, err)
	o, ok := offsets.Lookup(topic, 0)
	require.True(t, ok)
	require.NoError(t, o.Err)
	require.Equal(t, int64(0), o.At, "the new topic's offset stays at its start")
}

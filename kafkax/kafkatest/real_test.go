package kafkatest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// StartReal gives real brokers (OUTBOX_TEST_KAFKA_BROKERS or a container)
// that a test can produce to and consume from, or skips; it never fails
// for want of Docker and never returns kfake.
func TestStartReal(t *testing.T) {
	t.Parallel()
	configured := strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)) != ""
	var skipped bool
	var env *kafkatest.Env
	t.Run("real", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		env = kafkatest.StartReal(t, kafkatest.SeedTopics(1, "seeded-real"))
		require.True(t, env.Real, "StartReal never returns the embedded cluster")
		require.Nil(t, env.Cluster)
		require.NotEmpty(t, env.Seeds)

		topic := env.Topic(t, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		prod := env.Client(t, kgo.DefaultProduceTopic(topic))
		require.NoError(t, prod.ProduceSync(ctx, kgo.StringRecord("v")).FirstErr())
		cons := env.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		fetches := cons.PollFetches(ctx)
		require.NoError(t, fetches.Err())
		require.Len(t, fetches.Records(), 1)
	})
	if configured {
		require.False(t, skipped, "OUTBOX_TEST_KAFKA_BROKERS is set: StartReal uses it")
	}
	if skipped {
		t.Log("no real Kafka here (no OUTBOX_TEST_KAFKA_BROKERS, no Docker engine): StartReal skipped")
	}
}

// With OUTBOX_TEST_KAFKA_BROKERS set, StartReal uses those brokers (here a
// kfake cluster standing in for a real one) and creates the seed topics.
func TestStartRealUsesBrokersVariable(t *testing.T) {
	if strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)) != "" {
		t.Skip("OUTBOX_TEST_KAFKA_BROKERS is set")
	}
	fake := kafkatest.Start(t)
	t.Setenv(kafkatest.EnvBrokers, " "+strings.Join(fake.Seeds, " , ")+" ")
	env := kafkatest.StartReal(t, kafkatest.SeedTopics(2, "seeded-real"))
	require.True(t, env.Real)
	require.Nil(t, env.Cluster)
	require.Equal(t, fake.Seeds, env.Seeds)
	md, err := fake.Admin().Metadata(context.Background(), "seeded-real")
	require.NoError(t, err)
	require.Len(t, md.Topics["seeded-real"].Partitions, 2)
}

// Connect takes any broker list as real brokers.
func TestConnect(t *testing.T) {
	t.Parallel()
	fake := kafkatest.Start(t)
	env := kafkatest.Connect(t, fake.Seeds, kafkatest.SeedTopics(3, "seeded-connect"))
	require.True(t, env.Real)
	require.Nil(t, env.Cluster)
	topic := env.Topic(t, 1)
	md, err := env.Admin().Metadata(context.Background(), topic, "seeded-connect")
	require.NoError(t, err)
	require.Len(t, md.Topics[topic].Partitions, 1)
	require.Len(t, md.Topics["seeded-connect"].Partitions, 3)
}

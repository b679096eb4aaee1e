package kafkacontainer_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/kafkax/kafkatest/kafkacontainer"
)

// Start gives real brokers (OUTBOX_TEST_KAFKA_BROKERS or a container) that
// a test can produce to and consume from, or skips; it never fails for want
// of Docker and never returns kfake.
func TestStart(t *testing.T) {
	configured := strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)) != ""
	var skipped bool
	t.Run("real", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		env := kafkacontainer.Start(t, kafkatest.SeedTopics(1, "seeded-real"))
		require.True(t, env.Real, "Start never returns the embedded cluster")
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
		require.False(t, skipped, "OUTBOX_TEST_KAFKA_BROKERS is set: Start uses it")
	}
	if skipped {
		t.Log("no real Kafka here (no OUTBOX_TEST_KAFKA_BROKERS, no Docker engine): Start skipped")
	}
}

// With OUTBOX_TEST_KAFKA_BROKERS set, Start uses those brokers (here a kfake
// cluster standing in for a real one) without looking for Docker.
func TestStartUsesBrokersVariable(t *testing.T) {
	if strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)) != "" {
		t.Skip("OUTBOX_TEST_KAFKA_BROKERS is set")
	}
	fake := kafkatest.Start(t)
	t.Setenv(kafkatest.EnvBrokers, strings.Join(fake.Seeds, ","))
	env := kafkacontainer.Start(t, kafkatest.SeedTopics(2, "seeded-real"))
	require.True(t, env.Real)
	require.Equal(t, fake.Seeds, env.Seeds)
}

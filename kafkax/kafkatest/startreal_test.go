package kafkatest_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// Without OUTBOX_TEST_KAFKA_BROKERS, StartReal skips: it never falls back
// to the embedded cluster.
func TestStartRealSkipsWithoutBrokers(t *testing.T) {
	if len(kafkatest.EnvSeeds()) > 0 {
		t.Skip("OUTBOX_TEST_KAFKA_BROKERS is set")
	}
	var skipped bool
	t.Run("real", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		kafkatest.StartReal(t)
	})
	require.True(t, skipped)
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

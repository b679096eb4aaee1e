package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartProduceConsume(t *testing.T) {
	t.Parallel()
	env := kafkatest.Start(t, kafkatest.SeedTopics(2, "seeded"))
	require.NotEmpty(t, env.Seeds)
	require.Equal(t, env.Real, env.Cluster == nil)

	topic := env.Topic(t, 3)
	md, err := env.Admin().Metadata(context.Background(), topic, "seeded")
	require.NoError(t, err)
	require.Len(t, md.Topics[topic].Partitions, 3)
	require.Len(t, md.Topics["seeded"].Partitions, 2)

	prod := env.Client(t, kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("v")}).FirstErr())

	cons := env.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fetches := cons.PollFetches(ctx)
	require.NoError(t, fetches.Err())
	recs := fetches.Records()
	require.Len(t, recs, 1)
	require.Equal(t, "v", string(recs[0].Value))
}

func TestFaultInjection(t *testing.T) {
	t.Parallel()
	env := kafkatest.Start(t)
	if env.Cluster == nil {
		t.Skip("fault injection needs the embedded kfake cluster")
	}
	topic := env.Topic(t, 1)
	failed := make(chan struct{}, 1)
	env.Cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		failed <- struct{}{}
		return nil, context.DeadlineExceeded, true // drops the connection once
	})
	prod := env.Client(t, kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(), "kgo retries after the injected failure")
	select {
	case <-failed:
	default:
		t.Fatal("control function never ran")
	}
}

func TestUniqueName(t *testing.T) {
	t.Parallel()
	a, b := kafkatest.UniqueName(t), kafkatest.UniqueName(t)
	require.NotEqual(t, a, b)
	require.Regexp(t, `^[a-zA-Z0-9_-]+$`, a)
}

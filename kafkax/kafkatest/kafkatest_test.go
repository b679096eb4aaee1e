package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
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
	// Fail the first produce request with a retriable error; kgo retries.
	env.Cluster.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		failed <- struct{}{}
		req := r.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotLeaderForPartition.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	prod := env.Client(t, kgo.DefaultProduceTopic(topic), kgo.MetadataMinAge(10*time.Millisecond))
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

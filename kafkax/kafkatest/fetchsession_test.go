package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// TestKfakeFetchSessionEpochMovesWhenAnswered pins a difference between
// kfake and Apache Kafka in fetch sessions (docs/real-servers.md, "The
// fetch stall: seen on kfake only"). kfake applies a fetch's forgotten
// partitions to its session when the fetch arrives but moves the session's
// epoch only when it answers, so a second fetch at the same epoch, sent
// while the first waits, is accepted, and finds the partition the first
// one forgot gone from the session, records and all. Apache Kafka moves
// the epoch when the fetch arrives and answers the second one
// INVALID_FETCH_SESSION_EPOCH.
func TestKfakeFetchSessionEpochMovesWhenAnswered(t *testing.T) {
	t.Parallel()
	env := kafkatest.Start(t)
	if env.Cluster == nil {
		t.Skip("pins a kfake behaviour: Apache Kafka moves a fetch session's epoch when a fetch arrives")
	}
	topic := env.Topic(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	details, err := env.Admin().ListTopics(ctx, topic)
	require.NoError(t, err)
	td := details[topic]
	forgetting := make(chan struct{}, 1) // kfake received a fetch that forgets a partition
	env.Cluster.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		env.Cluster.KeepControl()
		if len(r.(*kmsg.FetchRequest).ForgottenTopics) > 0 {
			select {
			case forgetting <- struct{}{}:
			default:
			}
		}
		return nil, nil, false
	})
	// fetch sends one Fetch of the session at epoch through cl's own
	// connection to the leader of partition 0: add names the partitions
	// to add at offset 0, forget those to leave out.
	fetch := func(ctx context.Context, cl *kgo.Client, session, epoch int32, wait time.Duration, add, forget []int32) (*kmsg.FetchResponse, error) {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID, req.MinBytes, req.MaxBytes = -1, 1, 1<<20
		req.MaxWaitMillis = int32(wait.Milliseconds())
		req.SessionID, req.SessionEpoch = session, epoch
		if len(add) > 0 {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = topic, [16]byte(td.ID)
			for _, p := range add {
				rp := kmsg.NewFetchRequestTopicPartition()
				rp.Partition, rp.PartitionMaxBytes = p, 1<<20
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		if len(forget) > 0 {
			ft := kmsg.NewFetchRequestForgottenTopic()
			ft.Topic, ft.TopicID, ft.Partitions = topic, [16]byte(td.ID), forget
			req.ForgottenTopics = append(req.ForgottenTopics, ft)
		}
		return req.RequestWith(ctx, cl.Broker(int(td.Partitions[0].Leader)))
	}
	first, second := env.Client(t), env.Client(t) // a connection each

	open, err := fetch(ctx, first, 0, 0, 0, []int32{0, 1}, nil)
	require.NoError(t, err)
	require.Zero(t, open.ErrorCode)
	require.Positive(t, open.SessionID)
	producer := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("waiting")}).FirstErr())

	// Epoch 1 forgets partition 1 and waits: partition 0 has nothing.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := fetch(waitCtx, first, open.SessionID, 1, 10*time.Second, nil, []int32{1})
		waited <- err
	}()
	defer func() {
		stopWaiting()
		<-waited
	}()
	select {
	case <-forgetting:
	case <-ctx.Done():
		t.Fatal("the forgetting fetch never reached kfake")
	}

	// Epoch 1 again, as a client that never learned of the first one.
	again, err := fetch(ctx, second, open.SessionID, 1, 0, nil, nil)
	require.NoError(t, err)
	require.Zero(t, again.ErrorCode, "kfake accepted epoch 1 twice (Apache Kafka: INVALID_FETCH_SESSION_EPOCH)")
	for _, rt := range again.Topics {
		for _, rp := range rt.Partitions {
			require.NotEqual(t, int32(1), rp.Partition, "partition 1 was still in the session")
		}
	}
}

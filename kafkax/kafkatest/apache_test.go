package kafkatest_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// requireClosed fails t unless nothing accepts connections on addr.
func requireClosed(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections", addr)
	}
}

// produce produces one record to topic with acks=all and returns its
// error.
func produce(t *testing.T, env *kafkatest.Env, topic string, opts ...kgo.Opt) error {
	t.Helper()
	cl := env.Client(t, append([]kgo.Opt{kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr()
}

// One real node: records survive a kill -9 and a restart on the same
// ports and data, and a killed node's port is closed.
func TestStartApacheKillRestart(t *testing.T) {
	env := kafkatest.StartApache(t)
	require.True(t, env.Real)
	require.Nil(t, env.Cluster)
	require.Equal(t, 1, env.Nodes())
	topic := env.Topic(t, 1)
	require.NoError(t, produce(t, env, topic))

	addr := env.NodeAddr(t, 0)
	env.Kill(t, 0)
	requireClosed(t, addr)
	env.Restart(t, 0)
	require.Equal(t, addr, env.NodeAddr(t, 0))
	require.NoError(t, produce(t, env, topic))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := env.Admin().ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	end, _ := ends.Lookup(topic, 0)
	require.Equal(t, int64(2), end.Offset, "the record produced before the kill is kept")
	require.Equal(t, 0, env.Controller(t))
}

// Three real nodes: topics get replication factor 3 and
// min.insync.replicas=2; killing a partition's leader moves leadership
// and acks=all still succeeds on two replicas; a paused node resumes.
func TestStartApacheThreeNodes(t *testing.T) {
	env := kafkatest.StartApache(t, kafkatest.NumBrokers(3))
	require.Equal(t, 3, env.Nodes())
	topic := env.Topic(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	md, err := env.Admin().Metadata(ctx, topic)
	require.NoError(t, err)
	require.Len(t, md.Topics[topic].Partitions[0].Replicas, 3)
	cfgs, err := env.Admin().DescribeTopicConfigs(ctx, topic)
	require.NoError(t, err)
	rc, err := cfgs.On(topic, func(*kadm.ResourceConfig) error { return nil })
	require.NoError(t, err)
	minISR := ""
	for _, c := range rc.Configs {
		if c.Key == "min.insync.replicas" {
			minISR = c.MaybeValue()
		}
	}
	require.Equal(t, "2", minISR)

	leader := env.PartitionLeader(t, topic, 0)
	env.Kill(t, leader)
	require.NoError(t, produce(t, env, topic), "two in-sync replicas of three accept acks=all")
	moved := env.PartitionLeader(t, topic, 0)
	require.NotEqual(t, leader, moved)

	ctrl := env.Controller(t)
	require.True(t, ctrl >= 0 && ctrl < 3)

	env.Restart(t, leader)
	paused := (moved + 1) % 3
	env.Pause(t, paused)
	env.Resume(t, paused)
	require.NoError(t, produce(t, env, topic))
}

package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCommitAsMember: the offset rewind's commit. kadm's CommitOffsets is
// refused for a group with members (Kafka and kfake answer
// UNKNOWN_MEMBER_ID); the harness commits in the name of a member, read
// from that member's own client through the replicas' hooks, and the
// group's committed offset moves back.
func TestCommitAsMember(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	require.NoError(t, err)
	defer c.Close()
	raw, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer raw.Close()
	for i := range 10 {
		require.NoError(t, raw.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte{byte(i)}}).FirstErr())
	}

	// A member of group g that consumed and committed all ten records,
	// created with the replicas' hooks.
	l := newKafkaLog()
	member, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), l.hooks("r1"))
	require.NoError(t, err)
	defer member.Close()
	got := 0
	for got < 10 {
		fs := member.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		got += fs.NumRecords()
	}
	require.NoError(t, member.CommitUncommittedOffsets(ctx))
	adm := kadm.NewClient(raw)
	committed := func() int64 {
		offs, err := adm.FetchOffsets(ctx, "g")
		require.NoError(t, err)
		o, ok := offs.Lookup("t", 0)
		require.True(t, ok)
		return o.At
	}
	require.Equal(t, int64(10), committed())

	// kadm names no member: refused.
	resp, err := adm.CommitOffsets(ctx, "g", kadm.OffsetsFromRecords(kgo.Record{Topic: "t", Partition: 0, Offset: 2}))
	require.NoError(t, err)
	require.Error(t, resp.Error())
	require.Equal(t, int64(10), committed())

	h := &harness{klog: l, slots: map[int]*replica{}, inj: &injector{raw: raw}, env: &replicaEnv{service: "g"}}
	details, err := adm.ListTopics(ctx, "t")
	require.NoError(t, err)
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = "g"
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = "t", details["t"].ID
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, 3, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	m, gen, ok := h.klog.consumerMember("g", []string{"r1"})
	require.True(t, ok)
	require.NoError(t, h.commitAsMember(ctx, req, m, gen))
	require.Equal(t, int64(3), committed())
}

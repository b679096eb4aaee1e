package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// forgetRig is a kfake cluster with topic "t" of three partitions, two
// records in each, and an injector on it.
func forgetRig(t *testing.T) (*kfake.Cluster, *injector) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	raw, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(raw.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p := range int32(3) {
		for i := range 2 {
			require.NoError(t, raw.ProduceSync(ctx, &kgo.Record{Topic: "t", Partition: p, Value: fmt.Appendf(nil, "%d-%d", p, i)}).FirstErr())
		}
	}
	return c, &injector{kafka: c, raw: raw, topic: "t", parts: 3}
}

// readWithSession reads t to its end with a client that opens a fetch
// session (kgo's default), within d.
func readWithSession(ctx context.Context, brokers []string, d time.Duration) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	n := 0
	for n < 6 {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			return n, rctx.Err()
		}
		n += fs.NumRecords()
	}
	return n, nil
}

// TestFetchForgetTakesTheNextSessionOpener: the cause of a run that
// failed with "reading the topics: context deadline exceeded (1
// partitions not read to the end)". kafka-fetch-forget, armed at
// quiescence, stays armed until a fetch opens a session; when no replica
// opens one, the next client to open one loses a partition for good,
// whoever it is: the checker's own topic reader, which has no fetch watch
// to recover it. Disarmed, it takes nothing.
func TestFetchForgetTakesTheNextSessionOpener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, in := forgetRig(t)
	f, err := in.forgetInFetchSession(ctx, action{kind: fKafkaFetchForget, pick: 1})
	require.NoError(t, err)
	n, err := readWithSession(ctx, c.ListenAddrs(), 3*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 4, n, "the reader's session lost one partition's two records")
	<-f.done

	c, in = forgetRig(t)
	f, err = in.forgetInFetchSession(ctx, action{kind: fKafkaFetchForget, pick: 1})
	require.NoError(t, err)
	f.disarm() // what forgetAtQuiescence now does when no session opened in time
	n, err = readWithSession(ctx, c.ListenAddrs(), 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, 6, n)
}

// TestReadToEndOutOfTheForgetsReach: the checker's reader fetches without
// sessions, so an armed kafka-fetch-forget cannot take a partition from
// it, and it stays armed for the replicas.
func TestReadToEndOutOfTheForgetsReach(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, in := forgetRig(t)
	f, err := in.forgetInFetchSession(ctx, action{kind: fKafkaFetchForget, pick: 1})
	require.NoError(t, err)
	n := 0
	require.NoError(t, readToEnd(ctx, c.ListenAddrs(), []string{"t"}, 20*time.Second, func(*kgo.Record) { n++ }))
	require.Equal(t, 6, n)
	require.False(t, f.fired.Load(), "the reader opened no fetch session")
}

// TestReadToEndNamesWhatItWaitedFor: a reader that gives up names each
// partition it did not read to the end, with the offsets it read from and
// reached, the end it waited for and the last fetch error.
func TestReadToEndNamesWhatItWaitedFor(t *testing.T) {
	t.Parallel()
	c, _ := forgetRig(t)
	// Partition 2 cannot be fetched: every fetch of it fails.
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: "t", Partitions: []int32{2}, Err: kerr.UnknownServerError, Count: -1})
	err := readToEnd(context.Background(), c.ListenAddrs(), []string{"t"}, 3*time.Second, func(*kgo.Record) {})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "1 partitions not read to the end: t/2 from 0, nothing read, end 2, last fetch error: UNKNOWN_SERVER_ERROR")
}

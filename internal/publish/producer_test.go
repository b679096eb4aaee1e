package publish

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// A producer that still holds a recreated topic's old id fails with
// UNKNOWN_TOPIC_ID while another producer of the publisher already writes
// to the new topic (here the solo producer, and a main producer rebuilt for
// new size limits after the recreation, as in the chaos run). Purging the
// topic from the producer that writes to the new topic would make it number
// its next batch from zero again under the same producer id and epoch: the
// broker takes a batch of as many records as the first one it appended for
// the producer for a duplicate of it, acknowledges it and drops it. The
// event is then marked published and never delivered. Every record
// acknowledged must be in the topic.
func TestProducersFollowARecreatedTopicWithoutDroppingRecords(t *testing.T) {
	t.Parallel()
	env := kafkatest.Start(t)
	topic := env.Topic(t, 3)
	var logs testkit.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	p, err := NewProducers([]kgo.Opt{
		kgo.SeedBrokers(env.Seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(time.Minute),
	}, map[string]int{topic: 1 << 20}, func(bare string) string { return bare }, log)
	require.NoError(t, err)
	t.Cleanup(p.Close)

	produce := func(pr Producer, value string) (int64, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		done := make(chan struct{})
		var off int64
		var perr error
		pr.Produce(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: []byte("k"), Value: []byte(value)}, func(r *kgo.Record, err error) {
			off, perr = r.Offset, err
			close(done)
		})
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("record %q: no answer: %v", value, ctx.Err())
		}
		return off, perr
	}
	solo := p.Solo()

	// Both producers learn the topic's id.
	_, err = produce(p, "main-before")
	require.NoError(t, err)
	_, err = produce(solo, "solo-before")
	require.NoError(t, err)

	recreateTopic(t, env, topic, 3)
	// A main producer built after the recreation writes to the new topic.
	p.Update(map[string]int{topic: 1<<20 + 1})
	first, err := produce(p, "main-1")
	require.NoError(t, err)
	// The solo producer still holds the old id.
	_, err = produce(solo, "solo-1")
	require.ErrorIs(t, err, kerr.UnknownTopicID)
	p.old.Wait() // what the refusal started (asynchronous) is done

	second, err := produce(p, "main-2")
	require.NoError(t, err)
	require.Greater(t, second, first, "acknowledged at an offset of its own, not as a duplicate of the first record")
	// The solo producer writes to the new topic after its retry.
	soloAt, err := produce(solo, "solo-2")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends, err := env.Admin().ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	end, ok := ends.Lookup(topic, 0)
	require.True(t, ok)
	require.NoError(t, end.Err)
	require.Equal(t, int64(3), end.Offset, "the new topic holds main-1, main-2 and solo-2")
	require.ElementsMatch(t, []int64{0, 1, 2}, []int64{first, second, soloAt})
}

// recreateTopic deletes topic and creates it again with n partitions,
// each with a leader when it returns.
func recreateTopic(t *testing.T, env *kafkatest.Env, topic string, n int32) {
	t.Helper()
	testkit.RecreateTopic(t, env.Admin(), topic, n)
	env.CreateTopic(t, n, topic) // waits for the partitions' leaders
}

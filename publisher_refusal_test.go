package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/kafkax"
)

// paddedOrder is an orderPlaced with incompressible padding, to reach a
// given record size.
type paddedOrder struct {
	orderPlaced
	Pad string `json:"pad"`
}

func pad(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// setMaxMessageBytes sets the orders topic's max.message.bytes.
func (b *bundle) setMaxMessageBytes(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v := strconv.Itoa(n)
	res, err := b.kafka.Admin().AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, b.kafkaTopic(ordersTopic))
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	// A real broker applies the change from its metadata log a moment
	// after the controller accepted it: until then DescribeConfigs (what
	// the framework reads) answers the old value.
	eventually(t, "max.message.bytes "+v+" described", func() bool {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		rcs, err := b.kafka.Admin().DescribeTopicConfigs(dctx, b.kafkaTopic(ordersTopic))
		if err != nil {
			return false
		}
		rc, err := rcs.On(b.kafkaTopic(ordersTopic), nil)
		if err != nil || rc.Err != nil {
			return false
		}
		for _, c := range rc.Configs {
			if c.Key == "max.message.bytes" {
				return c.MaybeValue() == v
			}
		}
		return false
	})
}

// recordPadded records one transaction with one event per key, each padded
// to about size bytes of JSON (0: no padding).
func (r *recorder) recordPadded(t *testing.T, size int, keys ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.c.Transact(context.Background(), func(ctx context.Context) error {
		next := map[string]int{} // the callback may run more than once
		for _, k := range keys {
			e := paddedOrder{orderPlaced: orderPlaced{Run: r.b.run, OrderID: k, Amount: 1, Seq: r.next[k] + next[k]}}
			next[k]++
			if size > 0 {
				e.Pad = pad(size)
			}
			if err := Record(ctx, e); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, k := range keys {
		r.next[k]++
	}
	r.all += len(keys)
}

// samePartitionKeys returns n keys that land on the same partition of a
// 3-partition topic.
func samePartitionKeys(n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := "key-" + strconv.Itoa(i)
		if kafkax.Partition([]byte(k), 3) == 0 {
			out = append(out, k)
		}
	}
	return out
}

func failedCount(t *testing.T, b *bundle) int64 {
	return countFind(t, b.db.Collection("outbox"), bson.D{{Key: "failed", Value: true}})
}

// max.message.bytes=1500 and eight events of about 700 bytes. Each fits alone;
// a batch of them does not. None is marked failed: an event is failed only
// when refused on its own, never because its batch was.
func TestPublisherBatchRefusalPublishesInnocentEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.Compression = CompressionNone // the limits below are for records as recorded
	c := b.client(t, cfg)
	b.setMaxMessageBytes(t, 1500)
	r := newRecorder(b, c)
	r.recordPadded(t, 600, "k", "k", "k", "k", "k", "k", "k", "k") // one partition, one batch

	runPub(t, c, publisherOptions{})
	eventually(t, "all 8 published", func() bool { return b.published(t, cfg) == 8 })
	require.Zero(t, failedCount(t, b), "innocent events marked failed")
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 8))
}

// One 6 KB event among seven tiny ones under a 4000-byte limit: the big one
// fails, the seven are published in order.
func TestPublisherBatchRefusalFailsOnlyTheGuiltyEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.Compression = CompressionNone // the limits below are for records as recorded
	c := b.client(t, cfg)
	keys := samePartitionKeys(8) // one batch; distinct keys, so nothing is held
	r := newRecorder(b, c)
	r.recordPadded(t, 0, keys[:3]...)
	r.recordPadded(t, 6000, keys[3])
	r.recordPadded(t, 0, keys[4:]...)
	b.setMaxMessageBytes(t, 4000) // lowered after the events were recorded

	runPub(t, c, publisherOptions{})
	eventually(t, "7 published, 1 failed", func() bool { return b.published(t, cfg) == 7 && failedCount(t, b) == 1 })
	var doc outboxDoc
	require.NoError(t, b.db.Collection("outbox").FindOne(context.Background(), bson.D{{Key: "failed", Value: true}}).Decode(&doc))
	require.Equal(t, keys[3], doc.Key)
	require.Contains(t, doc.Error, "MESSAGE_TOO_LARGE")
	delete(r.next, keys[3]) // refused: never in Kafka
	recs := b.kafkaEvents(t, ordersTopic, 7)
	checkDelivery(t, r, recs)
	var got []string
	for _, rec := range recs {
		got = append(got, string(rec.Key))
	}
	require.Equal(t, append(append([]string{}, keys[:3]...), keys[4:]...), got, "published out of order")
}

// firstSeqs returns, per key, the seqs of this run's events in the order
// of their first delivery.
func firstSeqs(t *testing.T, b *bundle, recs []*kgo.Record) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	seen := map[string]map[int]bool{}
	for _, rec := range recs {
		var e orderPlaced
		require.NoError(t, json.Unmarshal(rec.Value, &e))
		if e.Run != b.run {
			continue
		}
		if seen[e.OrderID] == nil {
			seen[e.OrderID] = map[int]bool{}
		}
		if !seen[e.OrderID][e.Seq] {
			seen[e.OrderID][e.Seq] = true
			out[e.OrderID] = append(out[e.OrderID], e.Seq)
		}
	}
	return out
}

// holdScenario records, under a 4000-byte limit, with keys a and b on one
// partition: a0, a1 (6 KB: refused), a2, b0, a3, b1 before the publisher
// starts, then a4 and b2 while it runs. Under HoldKey a2, a3 and a4 wait
// behind a1; b's events go on.
func holdScenario(t *testing.T) (*bundle, *Client, *recorder, string, string) {
	t.Helper()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.Compression = CompressionNone // the limits below are for records as recorded
	c := b.client(t, cfg)
	keys := samePartitionKeys(2)
	ka, kb := keys[0], keys[1]
	r := newRecorder(b, c)
	r.recordPadded(t, 0, ka)
	r.recordPadded(t, 6000, ka)
	r.recordPadded(t, 0, ka)
	r.recordPadded(t, 0, kb)
	r.recordPadded(t, 0, ka)
	r.recordPadded(t, 0, kb)
	b.setMaxMessageBytes(t, 4000) // lowered after the events were recorded
	runPub(t, c, publisherOptions{holdRecheck: 50 * time.Millisecond})
	eventually(t, "a0, b0, b1 published, a1 failed", func() bool { return b.published(t, cfg) == 3 && failedCount(t, b) == 1 })
	// Live events (change stream): a4 is committed before b2, so once b2 is
	// published a4 has been seen and held.
	r.recordPadded(t, 0, ka)
	r.recordPadded(t, 0, kb)
	eventually(t, "b2 published", func() bool { return b.published(t, cfg) == 4 })

	require.EqualValues(t, 1, c.publisherStatus().HeldKeys)
	st, err := c.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, st.OutboxHeldKeys)
	require.EqualValues(t, 3, st.OutboxHeldEvents, "a2, a3, a4 wait behind a1")
	require.EqualValues(t, 3, st.Pending, "a1 is failed, not pending; a2..a4 are")
	unpublished := countFind(t, b.db.Collection("outbox"), bson.D{{Key: "key", Value: ka}, {Key: "published", Value: false}, {Key: "failed", Value: false}})
	require.EqualValues(t, 3, unpublished)
	return b, c, r, ka, kb
}

func TestPublisherRefusedEventHoldsKeyUntilRetried(t *testing.T) {
	t.Parallel()
	b, c, _, ka, kb := holdScenario(t)
	b.setMaxMessageBytes(t, 1<<20) // the operator fixes the cause
	n, err := c.Admin().RetryFailed(context.Background(), FailedFilter{}, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "the key released", func() bool { return b.published(t, Config{}) == 8 })
	seqs := firstSeqs(t, b, b.kafkaEvents(t, ordersTopic, 8))
	require.Equal(t, []int{0, 1, 2, 3, 4}, seqs[ka], "a's events out of order after the retry")
	require.Equal(t, []int{0, 1, 2}, seqs[kb])
	eventually(t, "no key held", func() bool { return c.publisherStatus().HeldKeys == 0 })
}

func TestPublisherRefusedEventHoldsKeyUntilDiscarded(t *testing.T) {
	t.Parallel()
	b, c, _, ka, kb := holdScenario(t)
	n, err := c.Admin().DiscardFailed(context.Background(), FailedFilter{Topic: ordersTopic}, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "the key released", func() bool { return b.published(t, Config{}) == 7 })
	seqs := firstSeqs(t, b, b.kafkaEvents(t, ordersTopic, 7))
	require.Equal(t, []int{0, 2, 3, 4}, seqs[ka], "a's events out of order after the discard")
	require.Equal(t, []int{0, 1, 2}, seqs[kb])
	eventually(t, "no key held", func() bool { return c.publisherStatus().HeldKeys == 0 })
}

// The held gauges count the keys failed events hold and the events waiting
// behind them; under SkipEvent nothing is held.
func TestHeldGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	coll := b.db.Collection("outbox")
	for i, failed := range []bool{true, false, false} {
		_, err := coll.InsertOne(ctx, outboxDoc{ID: bson.NewObjectID(), Topic: ordersTopic, Partition: 1, Key: "k",
			Schema: "X.v1", IdempotencyKey: "h-" + strconv.Itoa(i), Failed: failed, CreatedAt: time.Now()})
		require.NoError(t, err)
	}
	for _, policy := range []PoisonPolicy{HoldKey, SkipEvent} {
		// A client that publishes payments only reports the orders backlog.
		cfg := b.config("held-" + policy.String())
		cfg.PublishTopics = []string{paymentsTopic}
		cfg.PoisonPolicy = policy
		o := newOtel(t, &cfg)
		c := b.client(t, cfg)
		stop := start(t, c)
		want := map[PoisonPolicy][2]float64{HoldKey: {1, 2}, SkipEvent: {0, 0}}[policy]
		eventually(t, "held gauges under "+policy.String(), func() bool {
			m := o.collect(t)
			return sumOf(m["outbox.pending"], itel.AttrTopic.String(ordersTopic)) == 2 &&
				sumOf(m["outbox.held_keys"], itel.AttrTopic.String(ordersTopic)) == want[0] &&
				sumOf(m["outbox.held_events"], itel.AttrTopic.String(ordersTopic)) == want[1]
		})
		st, err := c.Status(ctx)
		require.NoError(t, err)
		require.EqualValues(t, want[0], st.Store.OutboxHeldKeys)
		require.EqualValues(t, want[1], st.Store.OutboxHeldEvents)
		stop()
	}
}

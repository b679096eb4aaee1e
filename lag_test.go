package outbox

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// produceOrders writes n framework records of orderPlaced to partition 0 of
// the orders topic in one call, with sequence numbers from seq.
func (b *bundle) produceOrders(t *testing.T, seq, n int) {
	t.Helper()
	cl := b.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, n)
	for i := range recs {
		env := b.envelope(fmt.Sprintf("lag-%d", seq+i))
		env.OccurredAt = time.Now()
		recs[i] = encodeRecord(&env, b.payload(t, "o", seq+i))
		recs[i].Topic = b.kafkaTopic(recs[i].Topic)
		recs[i].Partition = 0
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
}

// A partition whose worker is blocked fills its queue and is paused, so it is
// not fetched any more: its lag gauge must still grow as records are
// produced, not freeze at the last fetch's high watermark.
func TestConsumerLagGrowsWhileStalled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "lag")
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	c.tel.lagEvery = 50 * time.Millisecond
	// blocked has room for the signal: the handler may run before the test
	// waits on it, and a dropped signal would fail the test.
	blocked, release := make(chan struct{}, 1), make(chan struct{})
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run == b.run && e.Seq == 1 {
			select {
			case blocked <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	start(t, c)
	t.Cleanup(func() { close(release) }) // before Run stops (cleanups run last first)

	b.produceOrders(t, 0, 1)
	eventually(t, "the first record committed", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 1
	})
	b.produceOrders(t, 1, 1)
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not block")
	}
	// More than the queue holds: the partition is paused.
	b.produceOrders(t, 2, maxQueue+1000)
	eventually(t, "the stalled partition paused", func() bool {
		cons := c.tel.cons.Load()
		return cons != nil && slices.Contains(cons.cl.PauseFetchPartitions(nil)[b.kafkaTopic(ordersTopic)], 0)
	})
	lag := func() float64 {
		return sumOf(o.collect(t)["outbox.consumer.lag"], itel.AttrTopic.String(ordersTopic), itel.AttrPartition.String("0"))
	}
	produced := 2 + maxQueue + 1000
	eventually(t, "lag of every record after the committed one", func() bool { return lag() == float64(produced-1) })
	b.produceOrders(t, produced, 1000)
	produced += 1000
	eventually(t, "lag grown by the records produced while paused", func() bool { return lag() == float64(produced-1) })
}

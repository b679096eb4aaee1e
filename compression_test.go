package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPublisherCompression: the publisher sends gzip batches by default
// (every mainstream client reads them; franz-go's own default, snappy,
// kafkajs and kafka-python without python-snappy cannot), and
// KafkaOptions chooses another codec.
func TestPublisherCompression(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []kgo.Opt
		codec uint8 // Kafka's attribute: 0 none, 1 gzip, 2 snappy
	}{
		{"default", nil, 1},
		{"none through KafkaOptions", []kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			cfg := b.config("codec")
			cfg.KafkaOptions = tc.opts
			c := b.client(t, cfg)
			start(t, c)
			ctx := context.Background()
			require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
				// Large enough to compress (kgo sends a batch that does
				// not shrink uncompressed).
				return Record(ctx, orderPlaced{Run: b.run, OrderID: strings.Repeat("order-1 ", 60), Amount: 1})
			}))
			cl := b.kafka.Client(t, kgo.ConsumeTopics(b.kafkaTopic(ordersTopic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			var rec *kgo.Record
			for rec == nil && pctx.Err() == nil {
				fs := cl.PollFetches(pctx)
				fs.EachRecord(func(r *kgo.Record) { rec = r })
			}
			require.NotNil(t, rec, "the event was published")
			require.Equal(t, tc.codec, rec.Attrs.CompressionType())
		})
	}
}

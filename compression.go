package outbox

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Compression is the codec of the publisher's record batches (see
// Config.Compression).
//
// The default is gzip. franz-go's own default, snappy, is unreadable for
// kafkajs and for the Python kafka-python without python-snappy (and the
// Python event-outbox library installs aiokafka without its snappy extra);
// every mainstream client decodes gzip and uncompressed batches without
// extra libraries. gzip over none: measured with cmd/outbox-bench -phases
// compression (BENCHMARKS.md), the relay publishes as fast with either (it
// waits on MongoDB, not on the codec), and gzip writes about a quarter of
// the bytes to Kafka for order-like JSON events.
type Compression string

// The codecs, named as Kafka's compression.type names them.
const (
	CompressionGzip   Compression = "gzip"
	CompressionNone   Compression = "none"
	CompressionSnappy Compression = "snappy"
	CompressionLZ4    Compression = "lz4"
	CompressionZstd   Compression = "zstd"
)

// codec returns the franz-go codec, or an error naming the valid values.
func (c Compression) codec() (kgo.CompressionCodec, error) {
	switch c {
	case CompressionGzip:
		return kgo.GzipCompression(), nil
	case CompressionNone:
		return kgo.NoCompression(), nil
	case CompressionSnappy:
		return kgo.SnappyCompression(), nil
	case CompressionLZ4:
		return kgo.Lz4Compression(), nil
	case CompressionZstd:
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown codec %q (gzip, none, snappy, lz4 or zstd)", string(c))
}

// producerCompression is the publisher's ProducerBatchCompression option,
// a new one per client: franz-go dedupes an option's codec list in place
// when a client is created, so one option shared by clients created at
// once (a kgo.ProducerBatchCompression in Config.KafkaOptions) is a data
// race in franz-go.
func (c *Config) producerCompression() kgo.Opt {
	codec, err := c.Compression.codec()
	if err != nil { // validate refused it: not reached
		codec = kgo.GzipCompression()
	}
	return kgo.ProducerBatchCompression(codec)
}

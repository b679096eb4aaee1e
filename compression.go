package outbox

import (
	"bytes"
	"compress/gzip"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The publisher's compression.
//
// The publisher compresses its batches with gzip unless Config.KafkaOptions
// says otherwise (kgo.ProducerBatchCompression, which replaces the
// default: kgo.ProducerBatchCompression(kgo.NoCompression()) sends them
// uncompressed). franz-go's own default is snappy, which kafkajs, the
// Python kafka-python (without python-snappy) and aiokafka (without its
// extras, as the Python event-outbox library installs it) cannot read at
// all; every mainstream client decodes gzip and uncompressed batches
// without extra libraries. gzip over none: measured with cmd/outbox-bench
// -phases compression (BENCHMARKS.md), the relay publishes as fast with
// either (it waits on MongoDB, not on the codec), and gzip writes about a
// quarter of the bytes to Kafka for order-like JSON events.

// defaultCompression is the publisher's codec unless KafkaOptions set one.
func defaultCompression() kgo.Opt { return kgo.ProducerBatchCompression(kgo.GzipCompression()) }

// codecName names the first (preferred) codec of a ProducerBatchCompression
// value, as Kafka's compression.type does, or "" when unknown.
func codecName(v any) string {
	codecs, ok := v.([]kgo.CompressionCodec)
	if !ok || len(codecs) == 0 {
		return ""
	}
	c := codecs[0].WithLevel(0)
	for name, known := range map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	} {
		if c == known.WithLevel(0) {
			return name
		}
	}
	return ""
}

// gzipSize is the size of b compressed with gzip at the default level.
func gzipSize(b []byte) int64 {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return int64(buf.Len())
}

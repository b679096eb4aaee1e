package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	outbox "github.com/event-outbox/outbox"
)

// The compression phase: the relay once per producer codec, in one run,
// so that the publisher's default codec is chosen on figures measured
// together. Each codec gets a topic and a database of its own; the events
// are order-like JSON (field names repeat, values are random hex), which
// compresses about as real events do, unlike the other phases' padding.

// compressionCodecs are the codecs the phase can measure.
var compressionCodecs = []outbox.Compression{outbox.CompressionNone, outbox.CompressionGzip,
	outbox.CompressionSnappy, outbox.CompressionLZ4, outbox.CompressionZstd}

// compressionResult is the relay with one codec.
type compressionResult struct {
	Codec string `json:"codec"`
	relayResult
	// BytesPerEvent is what the framework's Kafka clients wrote per event
	// (every request: produce, metadata, group), compressed.
	BytesPerEvent float64 `json:"bytes_written_per_event"`
}

// compressionEvent is an event of the phase's topic of one codec.
type compressionEvent struct {
	topic    string
	OrderID  string      `json:"order_id"`
	Customer string      `json:"customer_id"`
	Items    []orderItem `json:"items"`
}

type orderItem struct {
	SKU   string `json:"sku"`
	Qty   int    `json:"qty"`
	Price int    `json:"price_cents"`
	Note  string `json:"note"`
}

func (e compressionEvent) Topic() string        { return e.topic }
func (compressionEvent) ContentSchema() string  { return "bench.OrderPlaced" }
func (e compressionEvent) PartitionKey() string { return e.OrderID }

// orderLike returns an order of about size bytes of JSON.
func orderLike(r *rand.Rand, topic string, size int) compressionEvent {
	hex := func(n int) string {
		const digits = "0123456789abcdef"
		var b strings.Builder
		for range n {
			b.WriteByte(digits[r.IntN(16)])
		}
		return b.String()
	}
	e := compressionEvent{topic: topic, OrderID: hex(32), Customer: hex(16)}
	for n := 90; n < size; n += 75 {
		e.Items = append(e.Items, orderItem{SKU: hex(12), Qty: 1 + r.IntN(5), Price: r.IntN(100000), Note: hex(8)})
	}
	return e
}

// runCompression runs the relay once per codec.
func runCompression(ctx context.Context, e *env, n int, codecs []string) ([]compressionResult, error) {
	var out []compressionResult
	defer func() { e.codec = "" }()
	for _, name := range codecs {
		topic := "bench.compression-" + name + "." + e.run
		if _, err := e.admin.CreateTopics(ctx, int32(e.opts.partitions), 1, nil, topic); err != nil {
			return out, fmt.Errorf("create topic %s: %w", topic, err)
		}
		e.codec = outbox.Compression(name)
		// Event i is the same for every codec (fill calls this from
		// several goroutines: one generator per event).
		res, err := runRelay(ctx, e, n, topic, "compression_"+name, func(i int) outbox.Event {
			return orderLike(rand.New(rand.NewPCG(uint64(i), 7)), topic, e.opts.eventSize)
		}, nil)
		bytes := e.kafka.bytes.Load()
		_, _ = e.admin.DeleteTopics(ctx, topic)
		e.release("compression_" + name)
		if err != nil {
			return out, fmt.Errorf("codec %s: %w", name, err)
		}
		out = append(out, compressionResult{Codec: name, relayResult: res, BytesPerEvent: float64(bytes) / float64(n)})
	}
	return out, nil
}

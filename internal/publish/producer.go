package publish

// The publisher's Kafka producers and the size limits they follow.
//
// Kafka takes a record batch up to the topic's max.message.bytes (the
// broker's message.max.bytes unless the topic sets its own), counted after
// compression. kgo refuses on the client a record whose batch would exceed
// its ProducerBatchMaxBytes (1,000,012 bytes unless set), counted before
// compression, reads that limit once per partition and never again, and
// still sends the records after the one it refused. So the publisher has
// two producers:
//
//   - The main producer batches. Its limit per topic is the topic's
//     max.message.bytes as read from Kafka (internal/topicmeta; the
//     client's default while unknown), so its batches are never too large
//     for Kafka, compressed or not. The limits are read when the publisher
//     starts, every limitRefreshInterval, whenever a record is refused for
//     its size (at most every limitRereadDelay) and with the partition
//     counts by Run's refresh (see Publisher.followTopics). When a limit
//     changes the main producer is replaced by one built with the new
//     limits (kgo would keep the old one); the old one finishes the
//     records it holds and is closed.
//   - The solo producer sends one record at a time, the records the worker
//     judges on their own: a record whose batch alone would exceed the main
//     producer's limit (WorkerConfig.MaxBatchBytes), and each record of a
//     batch Kafka refused. Its limit is the largest request the client may
//     write, so that Kafka, not the client, judges the record: a
//     compressible event above the limit is published when its compressed
//     batch fits, an event that does not fit even compressed is refused by
//     Kafka and marked failed, and an event that failed before the topic's
//     limit was raised is published when retried.
//
// Both producers share the publisher's producer options; their goroutines
// are kgo's, ended by Close (which runs when the publisher returns, after
// every worker stopped).
//
// A producer that fails a record with UNKNOWN_TOPIC_ID holds the id of a
// topic deleted and created again; it is replaced by a new client (renew),
// never made to forget the topic (see renew for why).

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// defaultBatchMaxBytes is kgo's ProducerBatchMaxBytes default, used for a
// topic whose max.message.bytes is unknown.
const defaultBatchMaxBytes = 1000012

// limitRereadDelay is the least time between a read of the topics' limits
// and the next one caused by a size refusal; limitRefreshInterval is the
// period of the publisher's own reads.
const (
	limitRereadDelay     = 5 * time.Second
	limitRefreshInterval = 15 * time.Second
)

// Producers are the publisher's main and solo producers (see the file
// comment). Safe for concurrent use.
type Producers struct {
	opts  []kgo.Opt // the producers' options, without the batch limit
	kafka func(topic string) string
	log   *slog.Logger

	// mu guards the clients, replaced when the limits change (Update) or
	// when one fails a record with UNKNOWN_TOPIC_ID (renew).
	mu      sync.RWMutex
	main    *kgo.Client
	solo    *kgo.Client
	limits  map[string]int   // by bare topic: what main was built with
	byKafka map[string]int32 // the same by Kafka topic, clamped as kgo takes it

	old     sync.WaitGroup // replaced producers finishing their records
	closing context.Context
	closed  context.CancelFunc

	renewMu sync.Mutex
	renewed map[*kgo.Client]bool // clients being replaced (renew)
}

// NewProducers creates the producers with opts; limits are the topics'
// max.message.bytes known so far (bare topics), kafka maps a bare topic
// to its Kafka topic.
func NewProducers(opts []kgo.Opt, limits map[string]int, kafka func(string) string, log *slog.Logger) (*Producers, error) {
	p := &Producers{opts: opts, kafka: kafka, log: log}
	p.closing, p.closed = context.WithCancel(context.Background())
	main, byKafka, err := p.newMain(limits)
	if err != nil {
		return nil, err
	}
	solo, err := p.newSolo(main)
	if err != nil {
		main.Close()
		return nil, err
	}
	p.main, p.limits, p.byKafka, p.solo = main, maps.Clone(limits), byKafka, solo
	return p, nil
}

// newMain returns a main producer whose batch limit per topic is limits
// (bare topics), the client's default for the others, and its limits by
// Kafka topic.
func (p *Producers) newMain(limits map[string]int) (*kgo.Client, map[string]int32, error) {
	byKafka := make(map[string]int32, len(limits))
	for t, n := range limits {
		byKafka[p.kafka(t)] = int32(min(max(n, 1024), 1<<30)) // kgo's bounds
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, p.opts...), kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
		if n, ok := byKafka[topic]; ok {
			return n
		}
		return defaultBatchMaxBytes
	}))...)
	return cl, byKafka, err
}

// newSolo returns a solo producer: the largest request kgo may write
// (BrokerMaxWriteBytes, 100 MiB by default; read from main, built with the
// same options) bounds its batch.
func (p *Producers) newSolo(main *kgo.Client) (*kgo.Client, error) {
	soloMax, _ := main.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	if soloMax <= 0 {
		soloMax = defaultBatchMaxBytes
	}
	return kgo.NewClient(append(append([]kgo.Opt{}, p.opts...), kgo.ProducerBatchMaxBytes(min(soloMax, 1<<30)))...)
}

// Produce hands r to the main producer.
func (p *Producers) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.main.Produce(ctx, r, p.watch(p.main, promise))
}

// watch wraps a promise of cl to notice a topic deleted and created again:
// kgo keeps the topic id it first learnt and fails every record of the
// topic with UNKNOWN_TOPIC_ID for good (by design, franz-go issue 908). The
// worker retries the records; the producer that failed them is replaced
// (renew), so that the retries learn the new topic.
func (p *Producers) watch(cl *kgo.Client, promise func(*kgo.Record, error)) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		if errors.Is(err, kerr.UnknownTopicID) {
			p.renew(cl, r.Topic)
		}
		promise(r, err)
	}
}

// renew replaces cl, which failed a record of kafkaTopic with
// UNKNOWN_TOPIC_ID, by a new client built alike, unless cl was replaced
// already (its late failures say nothing of the producer in use).
//
// A new client, not a purge of the topic from cl: an idempotent producer
// numbers each partition's batches from zero under its producer id and
// epoch, and a purge restarts the numbering without a new id or epoch. The
// broker keeps the sequence numbers of the id's last batches per partition
// and answers a batch that repeats one of them (same first and last
// sequence) as a duplicate: acknowledged, at the earlier batch's offset, and
// not written. So a producer that had already written to the new topic (one
// built after the recreation, while another producer of the publisher
// still held the old id) would have its next batch dropped, and the event
// marked published would never be delivered. A new client has a new
// producer id, which the broker has no sequence of.
func (p *Producers) renew(cl *kgo.Client, kafkaTopic string) {
	// Once per client: every record of the topic it holds fails alike. No
	// p.mu here: kgo may run a promise inside Produce, under its read lock.
	p.renewMu.Lock()
	if p.renewed[cl] {
		p.renewMu.Unlock()
		return
	}
	if p.renewed == nil {
		p.renewed = map[*kgo.Client]bool{}
	}
	p.renewed[cl] = true
	p.renewMu.Unlock()
	// From another goroutine (a promise runs in the client's own, and the
	// old client is flushed and closed), which Close waits for.
	p.old.Go(func() {
		p.mu.Lock()
		if p.closing.Err() != nil { // Close closes the clients
			p.mu.Unlock()
			return
		}
		var err error
		switch cl {
		case p.main:
			var fresh *kgo.Client
			var byKafka map[string]int32
			if fresh, byKafka, err = p.newMain(p.limits); err == nil {
				p.main, p.byKafka = fresh, byKafka
			}
		case p.solo:
			var fresh *kgo.Client
			if fresh, err = p.newSolo(p.main); err == nil {
				p.solo = fresh
			}
		default: // replaced meanwhile: Update flushes and closes it
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if err != nil { // the options were accepted before: not expected
			p.log.Warn("outbox publisher: cannot build a new producer for a recreated topic; records of the topic fail until the publisher restarts",
				"kafka_topic", kafkaTopic, "error", err)
			p.forgetRenewed(cl) // the next failure tries again
			return
		}
		p.log.Warn("outbox publisher: topic deleted and created again (UNKNOWN_TOPIC_ID); producing to the new topic", "kafka_topic", kafkaTopic)
		// Nothing is produced on cl any more (Produce holds the read
		// lock): its records of other topics are delivered, those of
		// kafkaTopic fail and are retried on the new client.
		_ = cl.Flush(p.closing)
		cl.Close()
		p.forgetRenewed(cl)
	})
}

// forgetRenewed drops a closed client from renewed: it runs no promise
// any more.
func (p *Producers) forgetRenewed(cl *kgo.Client) {
	p.renewMu.Lock()
	delete(p.renewed, cl)
	p.renewMu.Unlock()
}

// metadataClient returns the client to read the topics' metadata with:
// the solo producer of now (renew may replace it, under mu).
func (p *Producers) metadataClient() *kgo.Client {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.solo
}

// Solo returns the solo producer (WorkerConfig.Solo).
func (p *Producers) Solo() Producer { return soloProducer{p} }

// soloProducer sends through the solo producer.
type soloProducer struct{ p *Producers }

func (s soloProducer) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	s.p.mu.RLock()
	defer s.p.mu.RUnlock()
	s.p.solo.Produce(ctx, r, s.p.watch(s.p.solo, promise))
}

// MaxBatchBytes returns the main producer's batch limit for a Kafka topic
// (WorkerConfig.MaxBatchBytes).
func (p *Producers) MaxBatchBytes(kafkaTopic string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if n, ok := p.byKafka[kafkaTopic]; ok {
		return int(n)
	}
	return defaultBatchMaxBytes
}

// Update replaces the main producer when limits differ from those it was
// built with. The old one finishes the records it holds (bounded by the
// delivery timeout) in a goroutine that Close waits for.
func (p *Producers) Update(limits map[string]int) {
	p.mu.RLock()
	same := maps.Equal(p.limits, limits)
	p.mu.RUnlock()
	if same {
		return
	}
	main, byKafka, err := p.newMain(limits)
	if err != nil { // the options were accepted before: not expected
		p.log.Warn("outbox publisher: cannot rebuild the producer for new topic limits; keeping the old limits", "error", err)
		return
	}
	p.mu.Lock()
	old, was := p.main, p.limits
	p.main, p.limits, p.byKafka = main, maps.Clone(limits), byKafka
	p.mu.Unlock()
	p.log.Info("outbox publisher: topic size limits changed; producer rebuilt", "max_message_bytes", limits, "before", was)
	p.old.Go(func() {
		// Nothing is produced on old any more (Produce holds the read
		// lock): flushing ends once its records are acknowledged or failed
		// (the delivery timeout bounds it), or when the publisher stops.
		_ = old.Flush(p.closing)
		old.Close()
		p.forgetRenewed(old)
	})
}

// ForceMetadataRefresh makes both producers read the topics' metadata now
// (new partitions).
func (p *Producers) ForceMetadataRefresh() {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.main.ForceMetadataRefresh()
	p.solo.ForceMetadataRefresh()
}

// Close closes the producers; the workers have stopped.
func (p *Producers) Close() {
	p.closed()
	p.old.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.main.Close()
	p.solo.Close()
}

// Wire sets the producers in a worker configuration: Producer, Solo,
// MaxBatchBytes and SizeRefused.
func (p *Producers) Wire(w *WorkerConfig, sizeRefused func(topic string)) {
	w.Producer = p
	w.Solo = p.Solo()
	w.MaxBatchBytes = p.MaxBatchBytes
	w.SizeRefused = sizeRefused
}

// Compressor returns the compressor of a producer built with opts (the
// producers' options), nil for none. It builds a client to read it, which
// does no I/O, and closes it.
func Compressor(opts []kgo.Opt) kgo.Compressor {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		comp, _ := kgo.DefaultCompressor(kgo.SnappyCompression()) // kgo's default
		return comp
	}
	defer cl.Close()
	if comp, ok := cl.OptValue(kgo.WithCompressor).(kgo.Compressor); ok && comp != nil {
		return comp
	}
	codecs, _ := cl.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec)
	comp, _ := kgo.DefaultCompressor(codecs...)
	return comp
}

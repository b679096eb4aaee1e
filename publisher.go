package outbox

// The publisher moves recorded events from the outbox collection to Kafka.
// Its mechanics (the group client and the lease that fences it, the
// workers, the change-stream watcher, the marker, the producers and the
// size limits they follow) live in internal/publish, which knows no outbox
// format. This file is the glue: runPublisherWith builds the publisher from
// a Client's Config, and outboxStore gives it the outbox's documents as
// Kafka records (the storage format of internal/store, the encodings of
// internal/wire).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel/metric"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/internal/tuning"
)

// publisherSnapshot is a snapshot of the publisher of a Client, for Status
// and tests. Not exported (no public API returned it): Status carries what
// an operator needs of it (Publishing, PublisherLeaseValid, LastError), the
// metrics outbox.events.published and outbox.events.publish_failed count
// what Published and Failed count, and StoreStatus.OutboxHeldKeys counts
// the held keys of the whole service.
type publisherSnapshot struct {
	// Running reports whether the publisher is running.
	Running bool
	// Owned lists the partitions this process publishes, sorted.
	Owned []TopicPartition
	// Published counts the events marked published since the publisher
	// started.
	Published int64
	// Failed counts the events Kafka refused for good (marked failed).
	Failed int64
	// HeldKeys counts the partition keys this process holds in the
	// partitions it owns: keys with a failed event, whose later events wait
	// in the outbox (Config.PoisonPolicy HoldKey; always 0 under SkipEvent).
	HeldKeys int64
	// LastError is the last error met (Kafka, MongoDB), or "".
	LastError string
	// LastErrorAt is when LastError happened; zero when there is none.
	LastErrorAt time.Time
	// LeaseValid reports whether the group session is confirmed recently
	// enough to publish (see Config.FenceMargin).
	LeaseValid bool
}

// publisherOptions are test hooks.
type publisherOptions struct {
	groupOpts    []kgo.Opt // added to the group client (e.g. a dialer)
	producerOpts []kgo.Opt // added to the producer client
	hooks        publish.Hooks
	rescan       time.Duration
	holdRecheck  time.Duration
	batchBytes   int // caps a scan round's bytes (16 MiB when zero)
	streamOpened func()
}

// publisherStatus returns a snapshot of the publisher's state.
func (c *Client) publisherStatus() publisherSnapshot {
	p := c.pub.Load()
	if p == nil {
		return publisherSnapshot{}
	}
	stats := p.Stats()
	st := publisherSnapshot{
		Running:     true,
		Published:   stats.Published(),
		Failed:      stats.Failed(),
		HeldKeys:    p.HeldKeys(),
		LastError:   stats.LastError(),
		LastErrorAt: stats.LastErrorAt(),
		LeaseValid:  p.LeaseValid(),
	}
	for _, tp := range p.Owned() {
		st.Owned = append(st.Owned, TopicPartition{Topic: tp.Topic, Partition: tp.Partition})
	}
	return st
}

// runPublisher publishes recorded events until ctx ends, then finishes the
// batches in flight, leaves the publisher group and returns nil. It returns
// an error only when it cannot start (Kafka clients cannot be created from
// the configuration); outages are retried forever.
func (c *Client) runPublisher(ctx context.Context) error {
	return c.runPublisherWith(ctx, publisherOptions{})
}

// runPublisherWith is runPublisher with test hooks: it builds the
// publisher of internal/publish from the Client's Config.
func (c *Client) runPublisherWith(ctx context.Context, o publisherOptions) error {
	cfg := &c.cfg
	log := cfg.Logger.With("outbox.component", "publisher", "outbox.group", cfg.PublisherGroup)
	stats := &publish.Stats{} // the workers' and the promotion loops'
	sched := c.newScheduleFollower(log, stats)
	p, err := publish.New(publish.Config{
		Brokers:      cfg.Brokers,
		KafkaOptions: cfg.KafkaOptions,
		// Config.Compression (compression.go); KafkaOptions may override it.
		ProducerDefaults:  []kgo.Opt{cfg.producerCompression()},
		ProducerOverrides: o.producerOpts,
		Group:             cfg.PublisherGroup,
		Topics:            cfg.PublishTopics,
		KafkaTopic:        cfg.kafkaTopic,
		BarePartitions:    cfg.barePartitions,
		SessionTimeout:    cfg.SessionTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		FenceMargin:       cfg.FenceMargin,
		ConsumerProtocol:  cfg.GroupProtocol == GroupConsumer,
		GroupOptions:      append([]kgo.Opt{c.groupHook(cfg.PublisherGroup)}, cfg.groupOpts()...),
		GroupOverrides:    o.groupOpts,
		BatchSize:         cfg.PublishBatchSize,
		Linger:            cfg.PublishLinger,
		Hold:              cfg.PoisonPolicy == HoldKey,
		Backoff:           cfg.backoff(),
		Logger:            cfg.Logger,
		Store:             outboxStore{coll: c.outbox, prefix: cfg.TopicPrefix, claims: c.claims},
		Outbox:            c.outbox,
		TopicField:        store.OutboxTopic,
		PartitionField:    store.OutboxPartition,
		Decode:            decodeOutboxEvent(cfg.TopicPrefix),
		Meta:              c.topics,
		Hooks:             c.tel.ins.PublishHooks(c.tel.tracer, o.hooks),
		Rebalanced: func(change string, m map[string][]int32) {
			c.tel.ins.Rebalanced("publisher", change, m)
		},
		// The chaos harness's hook (internal/tuning).
		Ownership: func(change string, m map[string][]int32) {
			tuning.NotePublisherOwnership(c, change, m)
		},
		StreamReopened: func(reason string) {
			c.tel.ins.StreamReopens.Add(context.Background(), 1, metric.WithAttributes(itel.AttrReason.String(reason)))
		},
		StreamOpened: o.streamOpened,
		Rescan:       o.rescan,
		BatchBytes:   o.batchBytes,
		HoldRecheck:  o.holdRecheck,
		Follower:     sched,
		Stats:        stats,
	})
	if err != nil {
		return err
	}
	c.pub.Store(p)
	defer c.pub.Store(nil)
	p.Run(ctx)
	return nil
}

// outboxStore implements publish.Store on the outbox collection: the
// operations are internal/store's, the records the documents become are
// built here (outboxItem).
type outboxStore struct {
	coll *mongo.Collection
	// prefix is Config.TopicPrefix: the items' records go to its topics.
	prefix string
	// claims is Config.ClaimCheck's payload collection, nil without one.
	claims *claimcheck.Store
}

func (s outboxStore) Pending(ctx context.Context, tp publish.TopicPartition, limit publish.Limit, exclude []string) ([]publish.Item, bool, error) {
	var items []publish.Item
	more, err := store.Outbox{Coll: s.coll}.Pending(ctx, tp.Topic, tp.Partition, exclude, limit.Events, limit.Bytes, func(raw bson.Raw) {
		items = append(items, s.decode(raw))
	})
	if err != nil {
		return nil, false, err
	}
	return items, more, nil
}

// decode returns the item of an outbox document; one that cannot be decoded
// comes with Err set, its raw _id and, when it can be read, its key (see
// publish.Item).
func (s outboxStore) decode(raw bson.Raw) publish.Item {
	var d outboxDoc
	err := bson.Unmarshal(raw, &d)
	if err == nil {
		return outboxItem(&d, s.prefix)
	}
	var id any = raw.Lookup(store.OutboxID)
	if oid, ok := raw.Lookup(store.OutboxID).ObjectIDOK(); ok {
		id = oid
	}
	it := publish.Item{ID: id, Record: &kgo.Record{}, Err: unreadableDocError{err}}
	if key, ok := raw.Lookup(store.OutboxKey).StringValueOK(); ok {
		it.Record.Key = []byte(key)
	}
	return it
}

// unreadableDocError is why an outbox document cannot be read.
type unreadableDocError struct{ err error }

func (e unreadableDocError) Error() string {
	return "cannot read the outbox document: " + e.err.Error()
}
func (e unreadableDocError) Unwrap() error { return e.err }

// item is d's record, produced to the Kafka topic prefix + d.Topic
// (Config.TopicPrefix). The record's body and headers name the bare topic.
func outboxItem(d *outboxDoc, prefix string) publish.Item {
	env := outboxEnvelope(d)
	rec := encodeRecord(&env, []byte(d.Payload))
	addPayloadRef(d, &env, rec)
	rec.Topic = prefix + rec.Topic
	return publish.Item{ID: itemID(d), Record: rec}
}

// decodeOutboxEvent returns the decoder of the outbox documents delivered
// by the change stream into items for the Kafka topics of prefix.
func decodeOutboxEvent(prefix string) func(raw bson.Raw) (publish.TopicPartition, publish.Item, error) {
	return func(raw bson.Raw) (publish.TopicPartition, publish.Item, error) {
		var d outboxDoc
		if err := bson.Unmarshal(raw, &d); err != nil {
			return publish.TopicPartition{}, publish.Item{}, fmt.Errorf("decode outbox document: %w", err)
		}
		return publish.TopicPartition{Topic: d.Topic, Partition: d.Partition}, outboxItem(&d, prefix), nil
	}
}

// MarkPublished marks the events of ids (their items' IDs, see claimedID)
// published, and first the chunks of those whose payload is stored out of
// band, by their payload_ref: a crash between the two writes leaves the
// events unpublished, published again, and their payloads marked again.
// A batch without such events writes the outbox only.
func (s outboxStore) MarkPublished(ctx context.Context, ids []any, at time.Time) error {
	docs, refs := splitIDs(ids)
	if s.claims != nil && len(refs) > 0 {
		if err := s.claims.MarkPublished(ctx, refs, at); err != nil {
			return err
		}
	}
	return store.Outbox{Coll: s.coll}.MarkPublished(ctx, docs, at)
}

func (s outboxStore) MarkFailed(ctx context.Context, id any, cause error, at time.Time) error {
	// An unreadable document's attempts field may be what cannot be read.
	return store.Outbox{Coll: s.coll}.MarkFailed(ctx, docID(id), cause.Error(), at, !errors.As(cause, new(unreadableDocError)))
}

func (s outboxStore) FailedKeys(ctx context.Context, tp publish.TopicPartition) ([]string, error) {
	return store.Outbox{Coll: s.coll}.FailedKeys(ctx, tp.Topic, tp.Partition)
}

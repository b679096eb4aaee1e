package outbox

// The publisher moves recorded events from the outbox collection to Kafka.
//
// Ownership: a Kafka client joins Config.PublisherGroup subscribed to
// Config.PublishTopics with fetching paused, so it never receives a record;
// the partitions the group assigns to this process are the partitions it
// publishes. One worker goroutine per owned partition (internal/publish)
// first scans the partition's unpublished events with an indexed query in
// publishing order (seq, _id), produces them in batches (idempotent
// producer, acks=all, explicit partition) and marks the acknowledged ones
// published with one updateMany per batch. A change stream, filtered on
// the server to inserts of owned partitions, delivers every new event to
// its worker; once a worker has caught up it produces what the stream
// delivers without reading the outbox again, and a shared marker writes
// the acknowledged ids of every partition in one updateMany per
// markDelay. Any doubt (stream reopened, buffer overflow, produce failure,
// periodic rescan) sends the worker back to scanning, so a lost stream
// never loses events.
//
// Fencing: a lease lasts SessionTimeout minus FenceMargin from the send
// time of the last heartbeat the group coordinator answered with error code
// 0 (kafkax.SessionProbe: heartbeats of its own with the group client's
// member id and generation, because kgo's hooks never see a response's
// error code, and a heartbeat answered UNKNOWN_MEMBER_ID must not renew).
// Workers produce only while it is valid and each batch is cancelled when it
// lapses, so a member cut off from the group coordinator, or told that its
// session ended, stops publishing before the group hands its partitions to
// another member. The group's end (kafkax.SessionHook, OnPartitionsLost)
// revokes the lease at once. Under Config.GroupConsumer (KIP-848) the
// coordinator knows nothing of classic heartbeats, and a heartbeat of our
// own would move the member's epoch behind kgo's back: the lease is
// renewed instead by the group client's own ConsumerGroupHeartbeat answers
// with error code 0 (kafkax.HeartbeatTap on its connections), for the
// brokers' session timeout minus FenceMargin (consumerSession).
//
// Revocation stops a partition's worker after its batch in flight is
// acknowledged and marked (bounded by the producer's delivery timeout);
// loss stops it at once. Whatever remains produces duplicates only, which
// the consumers' inbox absorbs.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/metric"

	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/schedule"
	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/tuning"
	"github.com/event-outbox/outbox/kafkax"
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

// Publisher tuning that the Config does not expose.
const (
	rescanInterval = 30 * time.Second // safety scan of every owned partition
	// A partition holding keys (Config.PoisonPolicy HoldKey) re-reads its
	// failed keys this often, to release the keys an operator retried or
	// discarded: one indexed query per holding partition per interval.
	holdRecheckInterval = 5 * time.Second
	streamDebounce      = 100 * time.Millisecond
	streamMaxAwait      = 500 * time.Millisecond
	// metadataMaxAge bounds the age of the group's and the producers'
	// metadata: partitions added to a topic are assigned and published
	// within about this (kgo's default is five minutes).
	metadataMaxAge = 10 * time.Second
	markDelay      = 100 * time.Millisecond // events produced from the stream are marked in one write per markDelay
	leaveTimeout   = 5 * time.Second
	// The relay hands the producer whole batches, so records batch without
	// lingering; kgo's default (10 ms) or even 1 ms only adds latency (at
	// 1,000 events/s, 1 ms of linger was 1.8 ms of p50 commit→handler).
	producerLinger = 0
)

// publisherOptions are test hooks.
type publisherOptions struct {
	groupOpts    []kgo.Opt // added to the group client (e.g. a dialer)
	producerOpts []kgo.Opt // added to the producer client
	hooks        publish.Hooks
	rescan       time.Duration
	holdRecheck  time.Duration
	streamOpened func()
}

// publisher is one run of the publisher.
type publisher struct {
	c     *Client
	group *kgo.Client // the publisher group's client, for the replica record
	lease *publish.Lease
	set   *publish.Set
	sched *schedule.Set // promotion of scheduled events (schedule.go)
	stats *publish.Stats
	prods *producers
}

// publisherStatus returns a snapshot of the publisher's state.
func (c *Client) publisherStatus() publisherSnapshot {
	p := c.pub.Load()
	if p == nil {
		return publisherSnapshot{}
	}
	st := publisherSnapshot{
		Running:     true,
		Published:   p.stats.Published(),
		Failed:      p.stats.Failed(),
		HeldKeys:    p.set.HeldKeys(),
		LastError:   p.stats.LastError(),
		LastErrorAt: p.stats.LastErrorAt(),
		LeaseValid:  p.lease.Valid(),
	}
	for _, tp := range p.set.Owned() {
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

func (c *Client) runPublisherWith(ctx context.Context, o publisherOptions) error {
	cfg := &c.cfg
	log := cfg.Logger.With("outbox.component", "publisher", "outbox.group", cfg.PublisherGroup)
	// A batch is bounded by the producer's delivery timeout; a graceful
	// revoke waits for it and for the mark, so the rebalance timeout must
	// cover both with room to spare.
	deliveryTimeout := cfg.SessionTimeout
	markTimeout := cfg.SessionTimeout
	rebalanceTimeout := max(60*time.Second, 4*(deliveryTimeout+markTimeout))

	p := &publisher{
		c:     c,
		lease: publish.NewLease(cfg.SessionTimeout-cfg.FenceMargin, nil),
		stats: &publish.Stats{},
	}

	// A bounded metadata age, so that partitions added to a topic are
	// assigned (group) and produced to (producers) within seconds, not
	// kgo's default five minutes; Config.Compression (compression.go).
	// KafkaOptions may override both.
	popts := []kgo.Opt{kgo.MetadataMaxAge(metadataMaxAge), cfg.producerCompression()}
	popts = append(popts, cfg.KafkaOptions...)
	popts = append(popts,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(producerLinger),
		kgo.RecordDeliveryTimeout(deliveryTimeout),
	)
	popts = append(popts, o.producerOpts...)
	prods, err := newProducers(popts, c.topics.limitsSnapshot(), cfg.kafkaTopic, log)
	if err != nil {
		return fmt.Errorf("outbox: publisher: create Kafka producer: %w", err)
	}
	defer prods.close()
	p.prods = prods
	sizeRefused := make(chan struct{}, 1) // a record was refused for its size: read the limits again

	store := outboxStore{coll: c.outbox, prefix: cfg.TopicPrefix}
	marker := publish.NewMarker(store, markDelay, 4*cfg.PublishBatchSize)
	marker.Timeout = markTimeout
	marker.Backoff = cfg.backoff()
	marker.Logger = log
	marker.Stats = p.stats
	wcfg := &publish.WorkerConfig{
		Store:       store,
		Marker:      marker,
		Lease:       p.lease,
		BatchSize:   cfg.PublishBatchSize,
		Backoff:     cfg.backoff(),
		Rescan:      cmpOrDuration(o.rescan, rescanInterval),
		Hold:        cfg.PoisonPolicy == HoldKey,
		HoldRecheck: cmpOrDuration(o.holdRecheck, holdRecheckInterval),
		MarkTimeout: markTimeout,
		// A graceful stop must end even when Kafka is unreachable and
		// the producer never resolves the batch: a Run that lost its
		// network mid-batch would otherwise never return.
		StopTimeout: deliveryTimeout + markTimeout + time.Second,
		Logger:      log,
		Stats:       p.stats,
		Hooks:       c.tel.publishHooks(o.hooks),
	}
	prods.workerHooks(wcfg, func(string) {
		select {
		case sizeRefused <- struct{}{}:
		default:
		}
	})
	p.set = publish.NewSet(func(tp publish.TopicPartition) *publish.Worker {
		return publish.NewWorker(tp, wcfg)
	})
	// Stop every worker however we return; after a clean leave this is a
	// no-op.
	defer p.set.Close()
	p.sched = c.newScheduleSet(log, p.stats)
	defer p.sched.Close()

	// toTPs gives the partitions of a rebalance callback with bare topics
	// (Config.TopicPrefix), as the workers and the outbox name them.
	toTPs := func(m map[string][]int32) []publish.TopicPartition {
		var out []publish.TopicPartition
		for t, ps := range cfg.barePartitions(m) {
			for _, part := range ps {
				out = append(out, publish.TopicPartition{Topic: t, Partition: part})
			}
		}
		return out
	}
	var group *kgo.Client
	probe := &kafkax.SessionProbe{
		Group:    cfg.PublisherGroup,
		Member:   func() (string, int32) { return group.GroupMetadata() },
		Request:  func(ctx context.Context, req kmsg.Request) (kmsg.Response, error) { return group.Request(ctx, req) },
		Renewed:  p.lease.Renew,
		Interval: cfg.HeartbeatInterval,
		// An answer older than the lease is worthless.
		Timeout: max(cfg.HeartbeatInterval, p.lease.TTL()/2),
	}
	// Under Config.GroupConsumer (KIP-848) the coordinator knows nothing
	// of classic heartbeats: the group client's own ConsumerGroupHeartbeat
	// answers renew the lease (kafkax.HeartbeatTap), for the session
	// timeout the brokers apply (sess). The probe still runs until the
	// first such answer, in case kgo fell back to the classic protocol.
	var sess *consumerSession
	if cfg.GroupProtocol == GroupConsumer {
		sess = &consumerSession{margin: cfg.FenceMargin, lease: p.lease}
		probe.Skip = sess.active.Load
	}
	probe.Init()
	hook := &kafkax.SessionHook{
		Ended: func(err error) {
			log.Warn("publisher group session ended; publishing paused", "error", err)
			p.stats.SetError(fmt.Errorf("publisher group: %w", err))
			p.lease.Revoke()
		},
	}
	gopts := []kgo.Opt{kgo.MetadataMaxAge(metadataMaxAge)}
	gopts = append(gopts, cfg.KafkaOptions...)
	gopts = append(gopts,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.PublisherGroup),
		kgo.ConsumeTopics(cfg.kafkaTopics(cfg.PublishTopics)...),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(cfg.HeartbeatInterval),
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.DisableAutoCommit(),
		// Cooperative-sticky, whatever KafkaOptions say: incremental
		// revocation under the classic protocol, and the broker's
		// "uniform" assignor under Config.GroupConsumer.
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.WithHooks(hook),
		c.groupHook(cfg.PublisherGroup),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			tuning.NotePublisherOwnership(c, "assigned", m) // harness hook: before the workers start
			c.tel.rebalance("publisher", "assigned", m)
			probe.Kick() // confirm the new generation without waiting an interval
			if tps := toTPs(m); len(tps) > 0 {
				log.Info("publisher partitions assigned", "partitions", m)
				// An assigned partition exists: the producers learn of
				// it now if it is new (added to its topic).
				prods.forceMetadataRefresh()
				p.set.Assign(tps)
				p.sched.Assign(scheduleTPs(tps))
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			c.tel.rebalance("publisher", "revoked", m)
			if tps := toTPs(m); len(tps) > 0 {
				log.Info("publisher partitions revoked", "partitions", m)
				p.sched.Revoke(scheduleTPs(tps))
				p.set.Revoke(tps)
			}
			tuning.NotePublisherOwnership(c, "revoked", m) // harness hook: the workers have stopped
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			p.lease.Revoke()
			c.tel.rebalance("publisher", "lost", m)
			if tps := toTPs(m); len(tps) > 0 {
				log.Warn("publisher partitions lost", "partitions", m)
				p.sched.Revoke(scheduleTPs(tps))
				p.set.Lose(tps)
			}
			tuning.NotePublisherOwnership(c, "lost", m) // harness hook: the workers have stopped
		}),
	)
	gopts = append(gopts, cfg.groupOpts()...)
	gopts = append(gopts, o.groupOpts...)
	if sess != nil {
		// The tap wraps the connections of the dialer the options chose
		// (the application's, kgo's TLS dialer or its default; read from
		// the options that may set one, never the group's own, which
		// would join the group); as kgo.Dialer excludes
		// kgo.DialTLSConfig, the TLS setting, now inside the wrapped
		// dialer, is cleared.
		dopts := append(append([]kgo.Opt{}, cfg.KafkaOptions...), o.groupOpts...)
		dial, err := kafkax.EffectiveDialer(dopts...)
		if err != nil {
			return fmt.Errorf("outbox: publisher: create Kafka group client: %w", err)
		}
		tap := &kafkax.HeartbeatTap{Group: cfg.PublisherGroup, Dial: dial, Renewed: sess.renewed}
		gopts = append(gopts, kgo.DialTLSConfig(nil), kgo.Dialer(tap.DialContext))
	}
	group, err = kgo.NewClient(gopts...)
	if err != nil {
		return fmt.Errorf("outbox: publisher: create Kafka group client: %w", err)
	}
	// The group only assigns partitions; its members never fetch.
	group.PauseFetchTopics(cfg.kafkaTopics(cfg.PublishTopics)...)

	p.group = group
	c.pub.Store(p)
	defer c.pub.Store(nil)

	// Background loops, owned here and stopped by cancelling bg.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	// The marker stops after the workers (set.Close below), so it writes
	// the ids they handed it last.
	wg.Go(func() { marker.Run(bg) })
	wg.Go(func() {
		w := &publish.Watcher{
			Coll:           c.outbox,
			Set:            p.set,
			TopicField:     "topic",
			PartitionField: "partition",
			Decode:         decodeOutboxEvent(cfg.TopicPrefix),
			Linger:         cfg.PublishLinger,
			Debounce:       streamDebounce,
			MaxAwait:       streamMaxAwait,
			Backoff:        wcfg.Backoff,
			Logger:         log,
			Stats:          p.stats,
			Opened:         o.streamOpened,
			Reopened: func(reason string) {
				c.tel.streamReopens.Add(context.Background(), 1, metric.WithAttributes(attrReason.String(reason)))
			},
		}
		w.Run(bg)
	})
	wg.Go(func() { probe.Run(bg) })
	wg.Go(func() { c.watchScheduled(bg, p.sched, log) })
	if sess != nil {
		wg.Go(func() { sess.follow(bg, group, cfg.PublisherGroup, cfg.backoff(), p.stats, log) })
	}
	wg.Go(func() { c.followTopics(bg, prods, group, sizeRefused) })

	<-ctx.Done()

	// Drain: finish and mark the batches in flight, then leave the group
	// (bounded: Close alone can block for a minute when the coordinator is
	// unreachable), then stop the background loops.
	p.sched.Close()
	p.set.Close()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	if err := group.LeaveGroupContext(lctx); err != nil {
		log.Warn("publisher: leaving the group failed", "error", err)
	}
	cancel()
	// Force the leave so that Close, which leaves again with no deadline,
	// returns at once when the coordinator is unreachable.
	forced, force := context.WithCancel(context.Background())
	force()
	_ = group.LeaveGroupContext(forced)
	stopBG()
	wg.Wait()
	group.Close()
	return nil
}

// followTopics keeps the publisher's clients in line with its topics until
// ctx ends (a goroutine of runPublisher): it reads the topics' partition
// counts and max.message.bytes at start, every limitRefreshInterval and
// after a size refusal (at most every limitRereadDelay), so that a raised
// limit reaches Record and the producer within seconds; it rebuilds the
// main producer when a limit changed
// (see producers), and when a topic gained partitions (read here, by Run's
// refresh loop or by a Transact) makes the group and producer clients read
// the metadata at once, so that the new partitions are assigned and
// published without waiting for metadataMaxAge.
func (c *Client) followTopics(ctx context.Context, prods *producers, group *kgo.Client, sizeRefused <-chan struct{}) {
	read := func() {
		rctx, cancel := context.WithTimeout(ctx, metadataTimeout)
		counts, limits, err := c.topics.fetch(rctx, prods.solo, c.cfg.PublishTopics)
		cancel()
		c.topics.apply(ctx, counts, limits)
		if err != nil && ctx.Err() == nil {
			c.cfg.Logger.Debug("outbox publisher: reading topic metadata failed", "error", err)
		}
	}
	known := c.topics.snapshot()
	read()
	readAt := time.Now()
	every := time.NewTicker(limitRefreshInterval)
	defer every.Stop()
	for {
		changed := c.topics.watch()
		prods.update(c.topics.limitsSnapshot())
		now := c.topics.snapshot()
		for t, n := range now {
			if n > known[t] && known[t] > 0 {
				c.cfg.Logger.Info("outbox publisher: topic gained partitions; refreshing metadata", "topic", t, "partitions", n, "before", known[t])
				group.ForceMetadataRefresh()
				prods.forceMetadataRefresh()
				break
			}
		}
		known = now
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-every.C:
			readAt = time.Now()
			read()
		case <-sizeRefused:
			if !retry.Sleep(ctx, nil, time.Until(readAt.Add(limitRereadDelay))) {
				return
			}
			readAt = time.Now()
			read()
		}
	}
}

func cmpOrDuration(a, b time.Duration) time.Duration {
	if a > 0 {
		return a
	}
	return b
}

// outboxStore implements publish.Store on the outbox collection.
type outboxStore struct {
	coll *mongo.Collection
	// prefix is Config.TopicPrefix: the items' records go to its topics.
	prefix string
}

func (s outboxStore) Pending(ctx context.Context, tp publish.TopicPartition, limit publish.Limit, exclude []string) ([]publish.Item, bool, error) {
	// Held keys are filtered on the server while it walks the index in
	// order (see store.PendingFilter); their events are few (they wait for
	// an operator).
	filter := store.PendingFilter(tp.Topic, tp.Partition, exclude)
	opts := options.Find().
		SetSort(store.PendingOrder()).
		SetLimit(int64(limit.Events)).
		SetBatchSize(int32(limit.Events)) // the whole batch in one round trip (the server caps a reply at 16 MiB)
	cur, err := s.coll.Find(ctx, filter, opts)
	if err != nil {
		return nil, false, fmt.Errorf("find pending events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	// One document at a time: a document that cannot be decoded is handed
	// over as such (the worker marks it failed) instead of failing the
	// read, and the read stops at the byte cap.
	var items []publish.Item
	size := 0
	for cur.Next(ctx) {
		if len(items) > 0 && size+len(cur.Current) > limit.Bytes {
			return items, true, nil
		}
		size += len(cur.Current)
		items = append(items, s.decode(cur.Current))
	}
	if err := cur.Err(); err != nil {
		return nil, false, fmt.Errorf("read pending events: %w", err)
	}
	return items, len(items) == limit.Events, nil
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
	rec.Topic = prefix + rec.Topic
	return publish.Item{ID: d.ID, Record: rec}
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

func (s outboxStore) MarkPublished(ctx context.Context, ids []any, at time.Time) error {
	_, err := s.coll.UpdateMany(ctx,
		bson.D{{Key: store.OutboxID, Value: bson.D{{Key: "$in", Value: ids}}}}, store.MarkPublishedUpdate(at))
	return err
}

func (s outboxStore) MarkFailed(ctx context.Context, id any, cause error, at time.Time) error {
	// An unreadable document's attempts field may be what cannot be read.
	update := store.MarkFailedUpdate(cause.Error(), at, !errors.As(cause, new(unreadableDocError)))
	_, err := s.coll.UpdateOne(ctx, bson.D{{Key: store.OutboxID, Value: id}}, update)
	return err
}

// FailedKeys returns the partition keys of tp's failed events. It reads
// the failed events of the collection through the partial index
// outbox_failed (failed is true); they are few, as each waits for an
// operator.
func (s outboxStore) FailedKeys(ctx context.Context, tp publish.TopicPartition) ([]string, error) {
	cur, err := s.coll.Find(ctx, store.FailedInPartition(tp.Topic, tp.Partition), options.Find().
		SetProjection(bson.D{{Key: store.OutboxID, Value: 0}, {Key: store.OutboxKey, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find failed events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var keys []string
	for cur.Next(ctx) {
		// A key that is not a string (an unreadable document) holds
		// nothing: no event of the partition has that key.
		if k, ok := cur.Current.Lookup(store.OutboxKey).StringValueOK(); ok {
			keys = append(keys, k)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read failed events: %w", err)
	}
	return keys, nil
}

// consumerSessionRefresh is how often the publisher reads again the
// session timeout the brokers apply to its KIP-848 group; a lowered
// setting shortens the lease within about this.
const consumerSessionRefresh = 30 * time.Second

// consumerSession renews the publisher's lease from the heartbeats of a
// KIP-848 group (Config.GroupConsumer), whose session timeout is the
// brokers' group.consumer.session.timeout.ms (or the group's
// consumer.session.timeout.ms), not Config.SessionTimeout.
//
// The rule: a heartbeat sent at sentAt and answered 0 keeps the lease until
// sentAt + S - FenceMargin, where S is the shortest session timeout the
// brokers report (kafkax.ConsumerGroupSessionTimeout). Until S is known no
// heartbeat renews (publishing waits); when S is read lower than before,
// the lease is revoked and the next heartbeat renews it for the new S.
type consumerSession struct {
	margin time.Duration
	lease  *publish.Lease

	ttl    atomic.Int64 // S - margin in nanoseconds; 0 until S is known
	active atomic.Bool  // a heartbeat of the group was answered 0: the group runs KIP-848
}

// renewed is the kafkax.HeartbeatTap callback.
func (s *consumerSession) renewed(sentAt time.Time, _ time.Duration) {
	s.active.Store(true)
	s.lease.RenewFor(sentAt, time.Duration(s.ttl.Load()))
}

// set records a session timeout read from the brokers. It returns an
// error when FenceMargin leaves no lease.
func (s *consumerSession) set(session time.Duration) error {
	ttl := session - s.margin
	if ttl <= 0 {
		s.ttl.Store(0)
		s.lease.Revoke()
		return fmt.Errorf("FenceMargin %v is not shorter than the brokers' %s %v: no lease can be granted, publishing is paused", s.margin, kafkax.BrokerConsumerSessionTimeout, session)
	}
	if old := time.Duration(s.ttl.Swap(int64(ttl))); old > ttl {
		s.lease.Revoke()
	}
	return nil
}

// follow reads the brokers' session timeout at once and every
// consumerSessionRefresh, retrying failures with backoff, until ctx ends.
func (s *consumerSession) follow(ctx context.Context, cl *kgo.Client, group string, b retry.Backoff, stats *publish.Stats, log *slog.Logger) {
	failures := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, metadataTimeout)
		session, err := kafkax.ConsumerGroupSessionTimeout(rctx, cl, group)
		cancel()
		if err == nil {
			err = s.set(session)
		}
		wait := consumerSessionRefresh
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 || failures%20 == 0 {
				log.Warn("publisher: reading the KIP-848 session timeout failed; the lease is not renewed until it is known", "error", err)
			}
			stats.SetError(fmt.Errorf("publisher group session timeout: %w", err))
			if s.ttl.Load() == 0 {
				wait = b.Delay(failures)
			}
		} else {
			failures = 0
		}
		if !retry.Sleep(ctx, nil, wait) {
			return
		}
	}
}

package publish

// The publisher: one run moves recorded events from the outbox to Kafka.
//
// Ownership: a Kafka client joins Config.Group subscribed to Config.Topics
// with fetching paused, so it never receives a record; the partitions the
// group assigns to this process are the partitions it publishes. One
// Worker per owned partition first scans the partition's unpublished
// events in publishing order (Store.Pending), produces them in batches
// (idempotent producer, acks=all, explicit partition) and marks the
// acknowledged ones published with one write per batch. The Watcher, a
// change stream filtered on the server to inserts of owned partitions,
// delivers every new event to its worker; once a worker has caught up it
// produces what the stream delivers without reading the outbox again, and
// the Marker writes the acknowledged ids of every partition in one write
// per markDelay. Any doubt (stream reopened, buffer overflow, produce
// failure, periodic rescan) sends the worker back to scanning, so a lost
// stream never loses events.
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
// revokes the lease at once. Under KIP-848 (Config.ConsumerProtocol) the
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
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/kafkax"
)

// Publisher tuning that the root's Config does not expose.
const (
	rescanInterval = 30 * time.Second // safety scan of every owned partition
	// A partition holding keys (Config.Hold) re-reads its failed keys this
	// often, to release the keys an operator retried or discarded: one
	// indexed query per holding partition per interval.
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

// TopicMeta is what the publisher follows of its topics: their partition
// counts and max.message.bytes (internal/topicmeta's Topics).
type TopicMeta interface {
	// Refresh reads the topics' metadata from Kafka through cl.
	Refresh(ctx context.Context, cl *kgo.Client) error
	// Snapshot returns the partition counts by bare topic.
	Snapshot() map[string]int
	// Watch returns a channel closed at the next change.
	Watch() <-chan struct{}
	// Limits returns the known max.message.bytes by bare topic.
	Limits() map[string]int
}

// Config is what a Publisher needs: a Client's configuration as plain
// values, the outbox it publishes and the hooks through which its owner
// observes it.
type Config struct {
	// Brokers are the seed brokers.
	Brokers []string
	// KafkaOptions are the application's options of every Kafka client.
	// They override the publisher's defaults (a bounded metadata age,
	// ProducerDefaults) and are overridden by what it requires (acks=all,
	// explicit partitions, the group's settings).
	KafkaOptions []kgo.Opt
	// ProducerDefaults are producer options KafkaOptions may override (the
	// compression).
	ProducerDefaults []kgo.Opt
	// ProducerOverrides are added last to the producers' options; for
	// tests.
	ProducerOverrides []kgo.Opt
	// Group is the publisher group.
	Group string
	// Topics are the publish topics, bare. KafkaTopic names a bare topic as
	// Kafka knows it; BarePartitions turns partitions by Kafka topic (as
	// the rebalance callbacks give them) into partitions by bare topic.
	Topics         []string
	KafkaTopic     func(bare string) string
	BarePartitions func(map[string][]int32) map[string][]int32
	// SessionTimeout and HeartbeatInterval are the group's; the lease
	// lasts SessionTimeout (under ConsumerProtocol the brokers' session
	// timeout) minus FenceMargin.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	FenceMargin       time.Duration
	// ConsumerProtocol reports that the group runs KIP-848.
	ConsumerProtocol bool
	// GroupOptions are added to the group client's options after the
	// publisher's own (the fatal-error hook, the protocol's balancer).
	GroupOptions []kgo.Opt
	// GroupOverrides are added last to the group client's options; the
	// heartbeat tap reads the dialer they may set. For tests.
	GroupOverrides []kgo.Opt
	// BatchSize caps the events read, produced and marked per round.
	BatchSize int
	// Linger is the Watcher's least time between two getMores.
	Linger time.Duration
	// Hold holds the later events of a key whose event Kafka refused.
	Hold bool
	// Backoff spaces retries after errors.
	Backoff retry.Backoff
	// Logger takes the logs; the publisher names itself in them.
	Logger *slog.Logger
	// Store reads and marks the events.
	Store Store
	// Outbox is the collection the Watcher follows; TopicField and
	// PartitionField name its documents' fields, Decode builds a worker's
	// item from an inserted document.
	Outbox                     *mongo.Collection
	TopicField, PartitionField string
	Decode                     func(doc bson.Raw) (TopicPartition, Item, error)
	// Meta gives the topics' partition counts and size limits.
	Meta TopicMeta
	// Hooks observe the workers' steps (metrics, spans, tests).
	Hooks Hooks
	// Rebalanced, when set, is called at the start of each rebalance
	// callback with its change ("assigned", "revoked", "lost") and the
	// partitions by Kafka topic.
	Rebalanced func(change string, partitions map[string][]int32)
	// Ownership, when set, is called when the group assigned partitions,
	// before their workers start, and after revoked or lost partitions'
	// workers stopped, with the same arguments as Rebalanced. It runs on
	// the group client's goroutine and must return quickly.
	Ownership func(change string, partitions map[string][]int32)
	// StreamReopened, when set, is called before each reopen of the
	// change stream with its reason (Watcher.Reopened).
	StreamReopened func(reason string)
	// StreamOpened, when set, is called after each open of the change
	// stream; for tests.
	StreamOpened func()
	// BatchBytes caps the bytes of the documents a scan reads per round
	// (WorkerConfig.BatchBytes); 16 MiB when zero. For tests.
	BatchBytes int
	// Rescan and HoldRecheck replace rescanInterval and
	// holdRecheckInterval when positive; for tests.
	Rescan, HoldRecheck time.Duration
	// Follower runs beside the workers on the partitions they own (the
	// promotion of scheduled events). Defaults to one that does nothing.
	Follower Follower
	// Stats, when set, is where the workers count and note errors
	// (shared with the Follower); a new one otherwise.
	Stats *Stats
}

// Follower is a mechanism that works per owned partition beside the
// workers. Assign is called after the workers of tps started; Revoke
// before the workers of tps stop, gracefully or not (a partition revoked
// or lost); Close in the drain, before the workers stop, and when Run
// returns; Run runs on a goroutine of Publisher.Run until its context
// ends. Assign, Revoke and Close run on the group client's goroutine or
// Run's and must return once what they stop has stopped.
type Follower interface {
	Assign(tps []TopicPartition)
	Revoke(tps []TopicPartition)
	Close()
	Run(ctx context.Context)
}

// noFollower is the Follower of a publisher given none: it does nothing.
type noFollower struct{}

func (noFollower) Assign([]TopicPartition) {}
func (noFollower) Revoke([]TopicPartition) {}
func (noFollower) Close()                  {}
func (noFollower) Run(context.Context)     {}

// Publisher is one run of the publisher: New creates its Kafka clients
// (the group starts joining at once), Run publishes until its context
// ends. A Publisher New returned must be Run, which releases its clients.
// Its accessors are safe for concurrent use.
type Publisher struct {
	cfg   Config
	log   *slog.Logger
	group *kgo.Client
	lease *Lease
	set   *Set
	stats *Stats
	prods *Producers

	marker      *Marker
	probe       *kafkax.SessionProbe
	sess        *consumerSession // under ConsumerProtocol only
	sizeRefused chan struct{}    // a record was refused for its size: read the limits again
}

// New creates the publisher's producers and group client from cfg. It
// fails only when Kafka clients cannot be created from the options.
func New(cfg Config) (*Publisher, error) {
	log := cfg.Logger.With("outbox.component", "publisher", "outbox.group", cfg.Group)
	// A batch is bounded by the producer's delivery timeout; a graceful
	// revoke waits for it and for the mark, so the rebalance timeout must
	// cover both with room to spare.
	deliveryTimeout := cfg.SessionTimeout
	markTimeout := cfg.SessionTimeout
	rebalanceTimeout := max(60*time.Second, 4*(deliveryTimeout+markTimeout))
	if cfg.Follower == nil {
		cfg.Follower = noFollower{}
	}

	p := &Publisher{
		cfg:         cfg,
		log:         log,
		lease:       NewLease(cfg.SessionTimeout-cfg.FenceMargin, nil),
		stats:       cmp.Or(cfg.Stats, &Stats{}),
		sizeRefused: make(chan struct{}, 1),
	}

	// A bounded metadata age, so that partitions added to a topic are
	// assigned (group) and produced to (producers) within seconds, not
	// kgo's default five minutes. KafkaOptions may override it.
	popts := append([]kgo.Opt{kgo.MetadataMaxAge(metadataMaxAge)}, cfg.ProducerDefaults...)
	popts = append(popts, cfg.KafkaOptions...)
	popts = append(popts,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(producerLinger),
		kgo.RecordDeliveryTimeout(deliveryTimeout),
	)
	popts = append(popts, cfg.ProducerOverrides...)
	prods, err := NewProducers(popts, cfg.Meta.Limits(), cfg.KafkaTopic, log)
	if err != nil {
		return nil, fmt.Errorf("outbox: publisher: create Kafka producer: %w", err)
	}
	p.prods = prods

	p.marker = NewMarker(cfg.Store, markDelay, 4*cfg.BatchSize)
	p.marker.Timeout = markTimeout
	p.marker.Backoff = cfg.Backoff
	p.marker.Logger = log
	p.marker.Stats = p.stats
	wcfg := &WorkerConfig{
		Store:       cfg.Store,
		Marker:      p.marker,
		Lease:       p.lease,
		BatchSize:   cfg.BatchSize,
		BatchBytes:  cfg.BatchBytes,
		Backoff:     cfg.Backoff,
		Rescan:      cmpOrDuration(cfg.Rescan, rescanInterval),
		Hold:        cfg.Hold,
		HoldRecheck: cmpOrDuration(cfg.HoldRecheck, holdRecheckInterval),
		MarkTimeout: markTimeout,
		// A graceful stop must end even when Kafka is unreachable and
		// the producer never resolves the batch: a Run that lost its
		// network mid-batch would otherwise never return.
		StopTimeout: deliveryTimeout + markTimeout + time.Second,
		Logger:      log,
		Stats:       p.stats,
		Hooks:       cfg.Hooks,
	}
	prods.Wire(wcfg, func(string) {
		select {
		case p.sizeRefused <- struct{}{}:
		default:
		}
	})
	p.set = NewSet(func(tp TopicPartition) *Worker { return NewWorker(tp, wcfg) })

	p.probe = &kafkax.SessionProbe{
		Group:    cfg.Group,
		Member:   func() (string, int32) { return p.group.GroupMetadata() },
		Request:  func(ctx context.Context, req kmsg.Request) (kmsg.Response, error) { return p.group.Request(ctx, req) },
		Renewed:  p.lease.Renew,
		Interval: cfg.HeartbeatInterval,
		// An answer older than the lease is worthless.
		Timeout: max(cfg.HeartbeatInterval, p.lease.TTL()/2),
	}
	// Under KIP-848 the coordinator knows nothing of classic heartbeats:
	// the group client's own ConsumerGroupHeartbeat answers renew the
	// lease (kafkax.HeartbeatTap), for the session timeout the brokers
	// apply (sess). The probe still runs until the first such answer, in
	// case kgo fell back to the classic protocol.
	if cfg.ConsumerProtocol {
		p.sess = &consumerSession{margin: cfg.FenceMargin, lease: p.lease}
		p.probe.Skip = p.sess.active.Load
	}
	p.probe.Init()
	gopts, err := p.groupOptions(rebalanceTimeout)
	var group *kgo.Client
	if err == nil {
		group, err = kgo.NewClient(gopts...)
	}
	if err != nil {
		prods.Close()
		return nil, fmt.Errorf("outbox: publisher: create Kafka group client: %w", err)
	}
	// The group only assigns partitions; its members never fetch.
	group.PauseFetchTopics(p.kafkaTopics()...)
	p.group = group
	return p, nil
}

// groupOptions returns the group client's options.
func (p *Publisher) groupOptions(rebalanceTimeout time.Duration) ([]kgo.Opt, error) {
	cfg := &p.cfg
	hook := &kafkax.SessionHook{
		Ended: func(err error) {
			p.log.Warn("publisher group session ended; publishing paused", "error", err)
			p.stats.SetError(fmt.Errorf("publisher group: %w", err))
			p.lease.Revoke()
		},
	}
	gopts := []kgo.Opt{kgo.MetadataMaxAge(metadataMaxAge)}
	gopts = append(gopts, cfg.KafkaOptions...)
	gopts = append(gopts,
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(p.kafkaTopics()...),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.HeartbeatInterval(cfg.HeartbeatInterval),
		kgo.RebalanceTimeout(rebalanceTimeout),
		kgo.DisableAutoCommit(),
		// Cooperative-sticky, whatever KafkaOptions say: incremental
		// revocation under the classic protocol, and the broker's
		// "uniform" assignor under KIP-848.
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.WithHooks(hook),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			p.note(cfg.Ownership, "assigned", m) // before the workers start
			p.note(cfg.Rebalanced, "assigned", m)
			p.probe.Kick() // confirm the new generation without waiting an interval
			if tps := p.toTPs(m); len(tps) > 0 {
				p.log.Info("publisher partitions assigned", "partitions", m)
				// An assigned partition exists: the producers learn of
				// it now if it is new (added to its topic).
				p.prods.ForceMetadataRefresh()
				p.set.Assign(tps)
				cfg.Follower.Assign(tps)
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			p.note(cfg.Rebalanced, "revoked", m)
			if tps := p.toTPs(m); len(tps) > 0 {
				p.log.Info("publisher partitions revoked", "partitions", m)
				cfg.Follower.Revoke(tps)
				p.set.Revoke(tps)
			}
			p.note(cfg.Ownership, "revoked", m) // the workers have stopped
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			p.lease.Revoke()
			p.note(cfg.Rebalanced, "lost", m)
			if tps := p.toTPs(m); len(tps) > 0 {
				p.log.Warn("publisher partitions lost", "partitions", m)
				cfg.Follower.Revoke(tps)
				p.set.Lose(tps)
			}
			p.note(cfg.Ownership, "lost", m) // the workers have stopped
		}),
	)
	gopts = append(gopts, cfg.GroupOptions...)
	gopts = append(gopts, cfg.GroupOverrides...)
	if p.sess != nil {
		// The tap wraps the connections of the dialer the options chose
		// (the application's, kgo's TLS dialer or its default; read from
		// the options that may set one, never the group's own, which
		// would join the group); as kgo.Dialer excludes
		// kgo.DialTLSConfig, the TLS setting, now inside the wrapped
		// dialer, is cleared.
		dopts := append(append([]kgo.Opt{}, cfg.KafkaOptions...), cfg.GroupOverrides...)
		dial, err := kafkax.EffectiveDialer(dopts...)
		if err != nil {
			return nil, err
		}
		tap := &kafkax.HeartbeatTap{Group: cfg.Group, Dial: dial, Renewed: p.sess.renewed}
		gopts = append(gopts, kgo.DialTLSConfig(nil), kgo.Dialer(tap.DialContext))
	}
	return gopts, nil
}

// note calls f, an optional rebalance hook.
func (p *Publisher) note(f func(string, map[string][]int32), change string, m map[string][]int32) {
	if f != nil {
		f(change, m)
	}
}

// kafkaTopics returns the Kafka names of the publish topics.
func (p *Publisher) kafkaTopics() []string {
	out := make([]string, len(p.cfg.Topics))
	for i, t := range p.cfg.Topics {
		out[i] = p.cfg.KafkaTopic(t)
	}
	return out
}

// toTPs gives the partitions of a rebalance callback with bare topics, as
// the workers and the outbox name them.
func (p *Publisher) toTPs(m map[string][]int32) []TopicPartition {
	var out []TopicPartition
	for t, ps := range p.cfg.BarePartitions(m) {
		for _, part := range ps {
			out = append(out, TopicPartition{Topic: t, Partition: part})
		}
	}
	return out
}

// Run publishes recorded events until ctx ends, then finishes the batches
// in flight, leaves the publisher group, stops its background loops and
// closes its clients. Outages are retried for ever.
func (p *Publisher) Run(ctx context.Context) {
	cfg := &p.cfg
	// Stop every worker however we return; after a clean leave this is a
	// no-op. The producers close after the workers have stopped.
	defer p.prods.Close()
	defer p.set.Close()
	defer cfg.Follower.Close()

	// Background loops, owned here and stopped by cancelling bg.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	// The marker stops after the workers (set.Close below), so it writes
	// the ids they handed it last.
	wg.Go(func() { p.marker.Run(bg) })
	wg.Go(func() {
		w := &Watcher{
			Coll:           cfg.Outbox,
			Set:            p.set,
			TopicField:     cfg.TopicField,
			PartitionField: cfg.PartitionField,
			Decode:         cfg.Decode,
			Linger:         cfg.Linger,
			Debounce:       streamDebounce,
			MaxAwait:       streamMaxAwait,
			Backoff:        cfg.Backoff,
			Logger:         p.log,
			Stats:          p.stats,
			Opened:         cfg.StreamOpened,
			Reopened:       cfg.StreamReopened,
		}
		w.Run(bg)
	})
	wg.Go(func() { p.probe.Run(bg) })
	if p.sess != nil {
		wg.Go(func() { p.sess.follow(bg, p.group, cfg.Group, cfg.Backoff, p.stats, p.log) })
	}
	wg.Go(func() { p.followTopics(bg) })
	wg.Go(func() { cfg.Follower.Run(bg) })

	<-ctx.Done()

	// Drain: finish and mark the batches in flight, then leave the group
	// (bounded: Close alone can block for a minute when the coordinator is
	// unreachable), then stop the background loops.
	cfg.Follower.Close()
	p.set.Close()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	if err := p.group.LeaveGroupContext(lctx); err != nil {
		p.log.Warn("publisher: leaving the group failed", "error", err)
	}
	cancel()
	// Force the leave so that Close, which leaves again with no deadline,
	// returns at once when the coordinator is unreachable.
	forced, force := context.WithCancel(context.Background())
	force()
	_ = p.group.LeaveGroupContext(forced)
	stopBG()
	wg.Wait()
	p.group.Close()
}

// followTopics keeps the publisher's clients in line with its topics until
// ctx ends (a goroutine of Run): it reads the topics' partition counts and
// max.message.bytes at start, every limitRefreshInterval and after a size
// refusal (at most every limitRereadDelay), so that a raised limit reaches
// Record and the producer within seconds; it rebuilds the main producer
// when a limit changed (see Producers), and when a topic gained
// partitions (read here, by the root's refresh loop or by a transaction's
// lookup) makes the group and producer clients read the metadata at once,
// so that the new partitions are assigned and published without waiting
// for metadataMaxAge.
func (p *Publisher) followTopics(ctx context.Context) {
	meta, prods := p.cfg.Meta, p.prods
	read := func() {
		if err := meta.Refresh(ctx, prods.metadataClient()); err != nil && ctx.Err() == nil {
			p.cfg.Logger.Debug("outbox publisher: reading topic metadata failed", "error", err)
		}
	}
	known := meta.Snapshot()
	read()
	readAt := time.Now()
	every := time.NewTicker(limitRefreshInterval)
	defer every.Stop()
	for {
		changed := meta.Watch()
		prods.Update(meta.Limits())
		now := meta.Snapshot()
		for t, n := range now {
			if n > known[t] && known[t] > 0 {
				p.cfg.Logger.Info("outbox publisher: topic gained partitions; refreshing metadata", "topic", t, "partitions", n, "before", known[t])
				p.group.ForceMetadataRefresh()
				prods.ForceMetadataRefresh()
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
		case <-p.sizeRefused:
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

// Owned returns the partitions this process publishes, sorted.
func (p *Publisher) Owned() []TopicPartition { return p.set.Owned() }

// Following returns how many workers follow the change stream.
func (p *Publisher) Following() int { return p.set.Following() }

// HeldKeys counts the partition keys held in the owned partitions.
func (p *Publisher) HeldKeys() int64 { return p.set.HeldKeys() }

// Stats returns what the workers did.
func (p *Publisher) Stats() *Stats { return p.stats }

// LeaseValid reports whether the group session is confirmed recently
// enough to publish.
func (p *Publisher) LeaseValid() bool { return p.lease.Valid() }

// GroupClient returns the group client, for reads of the group (its
// members); it lives until Run returns.
func (p *Publisher) GroupClient() *kgo.Client { return p.group }

// GroupMetadata returns the group client's member id and generation.
func (p *Publisher) GroupMetadata() (string, int32) { return p.group.GroupMetadata() }

// MaxBatchBytes returns the main producer's batch limit for a Kafka topic.
func (p *Publisher) MaxBatchBytes(kafkaTopic string) int { return p.prods.MaxBatchBytes(kafkaTopic) }

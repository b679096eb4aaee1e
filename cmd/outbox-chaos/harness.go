package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/apachekafka"
	"github.com/event-outbox/outbox/internal/tuning"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// config is the harness's configuration (the command's flags).
type config struct {
	// claimCheck runs the replicas with Config.ClaimCheck, and the
	// workload records events large enough to go out of band (claim.go).
	claimCheck bool

	// scheduled runs a generator of scheduled events, some cancelled
	// (scheduled.go).
	scheduled bool

	// skipUnknown runs the replicas with Config.SkipUnknownEvents, and the
	// operator writes events of a type no handler takes on held keys.
	skipUnknown bool
	dupRatio    float64             // with migrated: probability that a transaction records an event again (0: 0.5%)
	duration    time.Duration       // load and faults last this long
	replicas    int                 // base replicas (extra ones join and leave)
	rate        int                 // target step events per second
	seed        uint64              // fault schedule seed
	keys        int                 // partition keys
	partitions  int                 // Kafka partitions of the topic
	killEvery   time.Duration       // mean time between kills; 0 disables kills
	faultEvery  time.Duration       // mean time between faults; 0 disables them
	stall       time.Duration       // after the load, fail when nothing progressed for this long
	stacks      string              // when set, the goroutine stacks are written there once nothing progressed for 10 s
	chainPct    int                 // percent of step events whose handler records a follow-up
	transient   int                 // percent of step events whose first attempt fails
	poison      float64             // probability a transaction records a poison event
	abort       float64             // probability a transaction aborts on purpose
	mongoURI    string              // real MongoDB; "" starts the embedded server
	brokers     string              // real Kafka; "" starts kfake
	logger      *slog.Logger        // framework logs
	progress    io.Writer           // progress lines; nil for none
	skip        map[actionKind]bool // fault kinds left out of the schedule
	// scenarioEvery is the mean time between scenarios (slow handlers,
	// downstream outages, small max.message.bytes windows, Kafka down at
	// start, pause storms); 0 disables them.
	scenarioEvery time.Duration
	// replayEvery is the mean time between replays (offset rewinds, rogue
	// producer); 0 disables them.
	replayEvery time.Duration
	txnLifetime time.Duration // the embedded MongoDB's transaction lifetime
	// slowFor is how long a slow handler's run lasts (-slow-for; at least
	// the lifetime plus a second).
	slowFor time.Duration
	sameKey float64 // probability that a multi-event transaction uses one key
	// keyConcurrency is Config.KeyConcurrency of every replica (0: 1).
	keyConcurrency int
	// topicPrefix is Config.TopicPrefix of every replica: the Kafka topics
	// are prefixed, the framework's names bare.
	topicPrefix string
	// massKeys is how many keys of their own a mass hold holds at once.
	massKeys int
	// migrated starts the run on a dataset a Python event-outbox service
	// left, migrated (Admin.MigrateEventOutbox), with
	// Config.UniqueIdempotencyKeys on every replica (migrated.go).
	migrated bool
	stormMiB int // MiB of events per pause storm; 0: 10
	// queueRecords and queueBytes shrink the consumer's per-partition queue
	// bound (internal/tuning) so fetches pause and resume partitions all
	// the time; 0 keeps the framework's bound.
	queueRecords, queueBytes int
	// kafka is "apache" for a real Apache Kafka cluster the harness starts
	// (kafkaNodes nodes) and breaks (brokerKillEvery, brokerPauseEvery, brokerRefuseEvery:
	// broker.go); else kfake, or -kafka-brokers.
	kafka                                                string
	kafkaNodes                                           int
	brokerKillEvery, brokerPauseEvery, brokerRefuseEvery time.Duration
	// groupProtocol is Config.GroupProtocol of every replica
	// (-group-protocol).
	groupProtocol outbox.GroupProtocol
}

// result is the outcome of a run.
type result struct {
	Events, Handled, Lost, DoubleEffects, OrderViolations, Parked int
	// Held counts the distinct events held behind an earlier event of
	// their key at some point (from the inbox history), Parked those parked
	// on their own; Redriven the re-drives the operator made (requests and
	// calls), OutageRedriven those of the load's keys (downstream outages:
	// mass holds left out).
	Held, Redriven, OutageRedriven int
	// Redelivered counts the deliveries of events to a consumer after they
	// were settled (handled or purged).
	Redelivered int
	// Chained counts the follow-ups handled exactly once.
	Chained int
	// DuplicatePublications counts the publications of events published
	// before (each explained by a kill or revoke, or a failure).
	DuplicatePublications int
	// Rewound and RogueRecords count the records the replays delivered
	// again: consumer offsets moved back, records produced again.
	Rewound, RogueRecords int
	// StalledPartitions counts the partitions whose consumer group offset
	// had not reached the end of the partition when the quiesce ended.
	StalledPartitions int
	// Leaked counts the events of aborted transactions found in the
	// outbox, the topic or the effects.
	Leaked int
	// KafkaRecordFailures counts the transactions that failed or hung
	// because their replica could not reach Kafka; FailedInnocent the
	// events marked failed in the outbox although they fit the topic's
	// limit alone.
	KafkaRecordFailures, FailedInnocent int
	Kills, Rebalances, Faults           int
	// Scenarios counts the scenarios carried out, by kind.
	Scenarios map[actionKind]int
	// Poisons counts the committed poison events (part of Events).
	Poisons int
	// KeyConcurrency is the replicas' Config.KeyConcurrency.
	KeyConcurrency int
	// The faults of issues 20 and 31, each counted: EventOutboxKeyed and
	// EventOutboxKeyless the Python library's records handled (with and
	// without a Kafka key, on the prefixed topic); KeylessHeld the records
	// without an idempotency key held behind a parked event of their key;
	// RedrivesCancelled the Client.Redrive calls cancelled mid-release;
	// MassHolds the mass holds and MaxHeldKeys the most keys held at once;
	// DuplicatesRefused the duplicate recordings refused on the migrated
	// dataset; NoHandlerReleased the events of a type without handler
	// released after its deploy; RetryIsolated the retrying keys whose
	// partition went on meanwhile; Takeovers the replicas killed with
	// transactions open, and Takeover the longest time from such a kill to
	// the settling of one of its events.
	EventOutboxKeyed, EventOutboxKeyless, KeylessHeld, RedrivesCancelled int
	// EventOutboxNoID counts the Python library's records written without
	// idempotency_key (each must end parked or purged, holding its key
	// meanwhile).
	EventOutboxNoID                                              int
	MassHolds, MaxHeldKeys, DuplicatesRefused, NoHandlerReleased int
	RetryIsolated, Takeovers                                     int
	Takeover                                                     time.Duration
	// TopicsRecreated counts the recreations of the recreated topic
	// (fRecreateTopic), RecreatedHandled the events recorded while it was
	// gone or after it came back, handled exactly once.
	TopicsRecreated, RecreatedHandled int
	// WaitsSeen counts the slow handler runs that showed as a "running"
	// wait in their replica's Status (waitsvisible.go).
	WaitsSeen int
	// FetchForgotten counts the partitions kafka-fetch-forget left out of
	// a fetch session (each must be fetched again: the quiescence check).
	FetchForgotten int
	// Doomed counts the handling transactions aborted at their commit
	// (commitDoom): on the ordinary path, in releases of held keys, with
	// the commit's result unknown, with a follow-up recorded.
	Doomed doomCounts
	// FenceViolations counts the records a replica produced for a
	// partition outside its ownership, while another replica owned it, or
	// that no replica produced; UnexplainedDuplicates the duplicate
	// publications no kill, stop, revoke or failed produce explains.
	FenceViolations, UnexplainedDuplicates int
	// DoubleHandled counts the events with more than one effect (the
	// deduplication's failures, event by event; DoubleEffects counts the
	// effects beyond the first); UnknownEffects the effects of no
	// committed event a handler succeeds on.
	DoubleHandled, UnknownEffects int
	// Broker counts the broker faults and the fetch watch's restarts
	// (broker.go).
	Broker brokerCounts
	// IgnoredSkipped counts the events of a type the replicas skip
	// (-skip-unknown) written on held keys, each judged skipped.
	IgnoredSkipped int
	// GroupProtocol is the replicas' Config.GroupProtocol.
	GroupProtocol outbox.GroupProtocol
	// PaddedJudged counts the handlings of padded events whose payload was
	// judged against the recorded one (claim.go).
	PaddedJudged int
	// Scheduled counts the events recorded with a due time in the future,
	// PastDue those with one already past (recorded for immediate
	// publication), Cancelled those cancelled in time, TooLate those whose
	// cancellation met ErrTooLate; MaxLate is the longest time from a
	// scheduled event's due time to its first record in the topic,
	// MaxPromoteLate to its promotion (scheduled.go).
	Scheduled, PastDue, Cancelled, TooLate int
	MaxLate, MaxPromoteLate                time.Duration
	// ScheduledPadded counts the handlings of padded scheduled events
	// judged with PaddedJudged: the claim check crossed with delayed
	// publication (-claim-check -scheduled).
	ScheduledPadded int
	// Failures lists every broken invariant, in words.
	Failures []string
}

// summary is the one line the command prints.
func (r *result) summary() string {
	return fmt.Sprintf("events=%d handled=%d lost=%d double_effects=%d order_violations=%d parked=%d held=%d redriven=%d "+
		"redelivered=%d double_handled=%d unknown_effects=%d chained=%d duplicate_publications=%d unexplained_duplicates=%d fence_violations=%d "+
		"stalled_partitions=%d leaked=%d kafka_record_failures=%d failed_innocent=%d kills=%d rebalances=%d faults=%d "+
		"key_concurrency=%d event_outbox_keyed=%d event_outbox_keyless=%d event_outbox_no_id=%d keyless_behind_held=%d redrives_cancelled=%d "+
		"mass_holds=%d max_held_keys=%d duplicates_refused=%d no_handler_released=%d retry_isolated=%d "+
		"takeovers=%d takeover_max=%.1fs topics_recreated=%d recreated_handled=%d waits_seen=%d fetch_forgotten=%d "+
		"commits_doomed=%d doomed_in_releases=%d doomed_unknown=%d doomed_chained=%d ignored_skipped=%d group_protocol=%s padded_judged=%d "+
		"scheduled=%d past_due=%d cancelled=%d too_late=%d max_late=%.1fs max_promote_late=%.1fs scheduled_padded=%d",
		r.Events, r.Handled, r.Lost, r.DoubleEffects, r.OrderViolations, r.Parked, r.Held, r.Redriven,
		r.Redelivered, r.DoubleHandled, r.UnknownEffects, r.Chained, r.DuplicatePublications, r.UnexplainedDuplicates, r.FenceViolations,
		r.StalledPartitions, r.Leaked, r.KafkaRecordFailures, r.FailedInnocent, r.Kills, r.Rebalances, r.Faults,
		r.KeyConcurrency, r.EventOutboxKeyed, r.EventOutboxKeyless, r.EventOutboxNoID, r.KeylessHeld, r.RedrivesCancelled,
		r.MassHolds, r.MaxHeldKeys, r.DuplicatesRefused, r.NoHandlerReleased, r.RetryIsolated,
		r.Takeovers, r.Takeover.Seconds(), r.TopicsRecreated, r.RecreatedHandled, r.WaitsSeen, r.FetchForgotten,
		r.Doomed.Ordinary+r.Doomed.Release, r.Doomed.Release, r.Doomed.Unknown, r.Doomed.Chained, r.IgnoredSkipped, r.GroupProtocol, r.PaddedJudged,
		r.Scheduled, r.PastDue, r.Cancelled, r.TooLate, r.MaxLate.Seconds(), r.MaxPromoteLate.Seconds(), r.ScheduledPadded)
}

// scenarioLine lists how many scenarios of each kind ran.
func (r *result) scenarioLine() string {
	parts := make([]string, 0, len(scenarios)+len(replays)+len(extras))
	for _, k := range append(slices.Clone(scenarios), extras...) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Scenarios[k]))
	}
	for _, k := range replays {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Scenarios[k]))
	}
	return strings.Join(parts, " ") + fmt.Sprintf(" (records rewound=%d produced again=%d)", r.Rewound, r.RogueRecords)
}

// harness is one run.
type harness struct {
	cfg     config
	env     *replicaEnv
	work    *workload
	inj     *injector
	db      *mongo.Database
	admin   *mongo.Client // the harness's own connection, never faulted by kills
	cluster *kfake.Cluster
	topic   string // the Kafka topic of the step events (prefixed: -topic-prefix)

	startMu  sync.Mutex // serializes startIfDown
	mu       sync.Mutex
	slots    map[int]*replica // live replicas by slot
	zombies  []*replica       // killed or stopped replicas still winding down
	incarn   map[int]int
	kills    int
	faults   int
	genMu    sync.Mutex
	gens     map[string]bool // group/generation pairs seen (rebalances)
	txErrors atomic.Int64
	logMu    sync.Mutex
	expireWg sync.WaitGroup // expireMembers goroutines, stopped by cancelling expireCtx
	// expireCtx ends after the final check.
	expireCtx context.Context
	bg        sync.WaitGroup // scenario goroutines (windows, storms)
	began     time.Time
	op        *operator
	klog      *kafkaLog      // the replicas' Kafka facts
	doom      *commitDoom    // aborts handling transactions at their commit; nil with -skip
	rec       *inboxRecorder // the inbox history

	rewound, rogueRecords int // records replayed; guarded by mu

	kafkaRecordFailures int // guarded by mu
	// slowestKafkaDown and slowestKafkaUp are the slowest completed
	// transactions of replicas whose Kafka was down and up (guarded by mu;
	// reported, never judged: see txnDeadline).
	slowestKafkaDown, slowestKafkaUp time.Duration
	scenarios                        map[actionKind]int // scenarios carried out; guarded by mu
	failures                         []string           // violations seen during the run; guarded by mu
	// xf are the facts of the extra scenarios (extras.go); guarded by mu.
	xf extraFacts
	// polls are the replicas' Status polls (waitsvisible.go).
	polls statusPoller
	// held closes when kills and stops may go on; nil when they may now
	// (topic-recreated holds them: recreate.go). Guarded by mu.
	held chan struct{}
	// eventOutboxKeyed and eventOutboxKeyless count the event-outbox
	// records produced (eventoutbox.go); guarded by mu.
	eventOutboxKeyed, eventOutboxKeyless int
	// eventOutboxNoID counts the event-outbox records written without
	// idempotency_key (malformed, holding their key); guarded by mu.
	eventOutboxNoID int
	// syncs are the times rebalances of the consumer group completed
	// (SyncGroup); guarded by genMu.
	syncs []time.Time
	// broker breaks the harness's Apache Kafka cluster, nil without one;
	// restarts counts the fetch watch's restarts (broker.go).
	broker   *brokerFaults
	restarts *restarts
}

// maxFailLines caps the FAIL lines of each kind of violation.
const maxFailLines = 10

// addFailure records a violation seen during the run.
func (h *harness) addFailure(f string) {
	h.mu.Lock()
	h.failures = append(h.failures, f)
	h.mu.Unlock()
}

func (h *harness) logf(format string, args ...any) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	if h.cfg.progress != nil {
		fmt.Fprintf(h.cfg.progress, "chaos: %7.2fs "+format+"\n", append([]any{time.Since(h.began).Seconds()}, args...)...)
	}
}

// runHarness runs the whole experiment and checks the invariants.
func runHarness(ctx context.Context, cfg config) (*result, error) {
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.txnLifetime <= 0 {
		cfg.txnLifetime = 3 * time.Second
	}
	if os.Getenv("OUTBOX_CHAOS_NO_FETCH_WATCH") != "" {
		// To show that kafka-fetch-forget needs the consumer's fetch
		// watch: the run must then fail with a partition behind.
		tuning.NoFetchWatch.Store(true)
		defer tuning.NoFetchWatch.Store(false)
	}
	// The replicas run in this process: one bound for all of them, restored
	// when the run ends.
	tuning.ConsumerQueueRecords.Store(int64(cfg.queueRecords))
	tuning.ConsumerQueueBytes.Store(int64(cfg.queueBytes))
	defer func() {
		tuning.ConsumerQueueRecords.Store(0)
		tuning.ConsumerQueueBytes.Store(0)
	}()
	if cfg.stall <= 0 {
		cfg.stall = 60 * time.Second
	}
	runID := fmt.Sprintf("c%x%x", cfg.seed, time.Now().UnixNano()&0xffffff)
	bare := "chaos-" + runID
	topicName.Store(&bare)
	prefix := cfg.topicPrefix
	topicPrefix.Store(&prefix)
	topic := kafkaTopic(bare) // the harness speaks to Kafka: prefixed names
	h := &harness{began: time.Now(), cfg: cfg, topic: topic, slots: map[int]*replica{}, incarn: map[int]int{}, gens: map[string]bool{},
		scenarios: map[actionKind]int{}, klog: newKafkaLog()}
	// The publishers' ownership callback is process-wide: set for this
	// run, removed when it ends.
	h.klog.install()
	defer h.klog.uninstall()
	cfg.logger = h.countRestarts(cfg.logger)
	h.cfg.logger = cfg.logger

	// Servers.
	mongoURI, brokers := cfg.mongoURI, splitList(cfg.brokers)
	var srv *mongofake.Server
	if mongoURI == "" {
		var err error
		srv, err = mongofake.NewServer(mongofake.TransactionLifetime(cfg.txnLifetime))
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		mongoURI = srv.URI()
	}
	sessionTimeout := 6 * time.Second
	var rebalanceTimeout time.Duration // kgo's default (60 s) on real Kafka
	if cfg.kafka == kafkaApache && len(brokers) == 0 {
		c, err := startApache(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer func() { _ = c.Stop() }()
		h.broker = &brokerFaults{cluster: c}
		brokers = c.Brokers()
		h.logf("Apache Kafka %s: %d nodes at %s", apachekafka.Version, len(brokers), strings.Join(brokers, ","))
	}
	if len(brokers) == 0 {
		sessionTimeout = 4 * time.Second
		// KIP-848 groups take their session timeout and heartbeat
		// interval from the broker: the classic groups' own.
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second),
			kfake.BrokerConfigs(map[string]string{
				"group.consumer.session.timeout.ms":    strconv.Itoa(int(sessionTimeout.Milliseconds())),
				"group.consumer.heartbeat.interval.ms": strconv.Itoa(int(chaosHeartbeat.Milliseconds())),
			}))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		h.cluster = c
		brokers = c.ListenAddrs()
		// kfake expires a member waiting in JoinGroup once its session
		// timeout passes since its last heartbeat, and never answers its
		// join (Kafka counts a member awaiting join or sync as alive). A
		// rebalance slowed by a replica whose revoke waits for a slow
		// handler then leaves the other members hanging until kgo's join
		// deadline, the rebalance timeout plus 10 s, again and again: with
		// the default 60 s the group stalled past the quiescence wait. A
		// short rebalance timeout bounds each hang.
		rebalanceTimeout = 2 * sessionTimeout
		// Count rebalances: every (group, generation) synced; in a
		// KIP-848 group, every group epoch a member first heartbeats
		// with (a member takes the group's epoch once it has reconciled
		// the assignment of that epoch: the counterpart of a sync).
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.SyncGroup, kmsg.ConsumerGroupHeartbeat}, Observe: true, Count: -1, When: func(r kmsg.Request) bool {
			group, gen, sync := "", int32(0), false
			switch req := r.(type) {
			case *kmsg.SyncGroupRequest:
				group, gen, sync = req.Group, req.Generation, true
			case *kmsg.ConsumerGroupHeartbeatRequest:
				if req.MemberEpoch <= 0 { // joining (0) or leaving (-1, -2)
					return false
				}
				group, gen = req.Group, req.MemberEpoch
			default:
				return false
			}
			h.genMu.Lock()
			defer h.genMu.Unlock()
			k := fmt.Sprintf("%s/%d", group, gen)
			// Every sync of the consumer group is a disturbance; a
			// heartbeat only when it first carries an epoch (the later
			// ones of that epoch are the steady state).
			if group == "chaos-"+runID && (sync || !h.gens[k]) { // the consumer group (h.env.service, set later)
				h.syncs = append(h.syncs, time.Now())
			}
			h.gens[k] = true
			return false
		}})
	}
	admin, err := mongo.Connect(options.Client().ApplyURI(mongoURI).SetAppName("chaos-admin"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = admin.Disconnect(context.Background()) }()
	h.admin = admin
	h.db = admin.Database("chaos_" + runID)

	raw, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	for _, t := range []string{topic, kafkaTopic(chainTopic()), kafkaTopic(recreateTopic())} {
		if _, err := kadm.NewClient(raw).CreateTopic(ctx, int32(cfg.partitions), -1, nil, t); err != nil {
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}

	keys := make([]string, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%05d", i)
	}
	h.work = &workload{db: h.db, keys: keys, transient: cfg.transient, poisonRatio: cfg.poison, abortRatio: cfg.abort,
		sameKey: cfg.sameKey, runID: runID, slowFor: max(cfg.txnLifetime+time.Second, cfg.slowFor), chainPct: cfg.chainPct,
		mass: massKeys(cfg.massKeys), iso: isoKeys(cfg.partitions)}
	h.work.extraKeys = append(append(eventOutboxKeys(), h.work.mass...), h.work.iso...)
	if cfg.migrated {
		h.work.dupRatio = cmp.Or(cfg.dupRatio, 0.005)
	}
	if cfg.claimCheck {
		h.work.claimRatio = claimRatio
	}
	if err := h.work.prepare(ctx); err != nil {
		return nil, err
	}
	service := "chaos-" + runID
	h.env = &replicaEnv{mongoURI: mongoURI, brokers: brokers, database: h.db.Name(), service: service,
		logger: cfg.logger, work: h.work, appName: "chaos-replica", klog: h.klog}
	h.env.sessionTimeout, h.env.rebalanceTimeout = sessionTimeout, rebalanceTimeout
	h.env.keyConcurrency = max(1, cfg.keyConcurrency)
	h.env.groupProtocol = cfg.groupProtocol
	h.env.skipUnknown = cfg.skipUnknown
	h.env.topicPrefix = cfg.topicPrefix
	h.env.unique = cfg.migrated
	h.env.claimCheck = cfg.claimCheck
	if h.broker != nil {
		h.env.produceWatch = &produceWatch{}
	}
	if !cfg.skip[fCommitDoomed] {
		h.doom = newCommitDoom(cfg.seed, admin, srv)
		h.env.doom = h.doom
	}
	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	h.inj = &injector{mongo: srv, kafka: h.cluster, topic: topic, raw: raw, parts: int32(cfg.partitions), protocol: cfg.groupProtocol,
		groups: []string{service, service + ".outbox-publisher"}, keys: keys,
		partitionOf: func(k string) int32 {
			return int32(part.Partition(&kgo.Record{Key: []byte(k)}, cfg.partitions))
		}}

	if cfg.migrated {
		if err := h.seedMigrated(ctx); err != nil {
			return nil, err
		}
	}

	// The inbox history starts before the first replica: it must see every
	// change. Its goroutine ends after the final check.
	h.rec = newInboxRecorder(h.db, h.logf)
	if err := h.rec.start(ctx); err != nil {
		return nil, err
	}
	recCtx, stopRec := context.WithCancel(ctx)
	var recWg sync.WaitGroup
	recWg.Go(func() { h.rec.run(recCtx) })
	defer func() {
		stopRec()
		recWg.Wait()
	}()

	for slot := range cfg.replicas {
		if err := h.start(slot); err != nil {
			return nil, err
		}
	}
	defer h.shutdown()
	// The operator runs until the final check (or an early return).
	opCtx, stopOp := context.WithCancel(ctx)
	h.op = newOperator(h)
	var opWg sync.WaitGroup
	opWg.Go(func() { h.op.run(opCtx) })
	defer func() {
		stopOp()
		opWg.Wait()
	}()

	acts := scheduleStorms(cfg.seed, cfg.duration, cfg.replicas, cfg.killEvery, cfg.faultEvery, cfg.scenarioEvery, cfg.replayEvery,
		srv != nil, h.cluster != nil, cmp.Or(cfg.stormMiB, 10))
	if h.broker != nil {
		acts = append(acts, scheduleBrokerFaults(cfg.seed, cfg.duration, cfg.brokerKillEvery, cfg.brokerPauseEvery, cfg.brokerRefuseEvery, sessionTimeout)...)
		slices.SortStableFunc(acts, func(a, b action) int { return int(a.at - b.at) })
	}
	acts = slices.DeleteFunc(acts, func(a action) bool { return cfg.skip[a.kind] })
	h.logf("run %s started %s: %d replicas, %d keys, %d partitions, rate %d/s, %s, %d scheduled actions (seed %d)",
		runID, h.began.Format(tsFormat), cfg.replicas, cfg.keys, cfg.partitions, cfg.rate, cfg.duration, len(acts), cfg.seed)

	// Load and faults. Killed replicas' group members are expired on
	// their behalf (expireMembers) until the final check, load or not.
	expireCtx, stopExpire := context.WithCancel(ctx)
	h.expireCtx = expireCtx
	defer func() {
		stopExpire()
		h.expireWg.Wait()
	}()
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.duration)
	defer stopLoad()
	// The Status poller (waitsvisible.go), until the final check.
	pollCtx, stopPoll := context.WithCancel(ctx)
	var pollWg sync.WaitGroup
	pollWg.Go(func() { h.pollStatus(pollCtx, &h.polls) })
	stopPolling := sync.OnceFunc(func() {
		stopPoll()
		pollWg.Wait()
	})
	defer stopPolling()
	if h.doom != nil {
		// Through the quiescence too: the operator's last re-drives
		// release held keys then. Disarmed before the final check.
		h.doom.armed.Store(true)
	}
	var wg sync.WaitGroup
	wg.Go(func() { h.runSchedule(loadCtx, acts) })
	if cfg.progress != nil {
		wg.Go(func() { h.logThroughput(loadCtx) })
	}
	h.runLoad(loadCtx, &wg)
	if !cfg.skip[fEventOutbox] {
		wg.Go(func() { h.runEventOutbox(loadCtx) })
	}
	if cfg.scheduled {
		wg.Go(func() { h.runScheduled(loadCtx) })
	}
	wg.Wait()
	h.bg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	// Quiescence: no more faults, every slot up, then wait until every
	// committed event is handled (or parked) and the outbox is empty.
	h.inj.clear()
	h.op.loadOver.Store(true)
	h.work.endOutages()
	h.closeSmallLimit()
	for slot := range cfg.replicas {
		if _, err := h.startIfDown(slot); err != nil {
			return nil, err
		}
	}
	if h.inj.kafka != nil && !cfg.skip[fKafkaFetchForget] {
		if err := h.forgetAtQuiescence(ctx, cfg); err != nil {
			return nil, err
		}
	}
	h.logf("load done: %d transactions committed, %d aborted on purpose, %d failed; waiting for quiescence",
		h.work.recorded.Load(), h.work.aborted.Load(), h.work.failedTx.Load())
	dumped := false
	quiet, last := waitSettled(ctx, realClock{}, 250*time.Millisecond, cfg.stall, h.lookSettled, h.logf, func(idle time.Duration) {
		if cfg.stacks != "" && !dumped && idle >= 10*time.Second {
			dumped = true
			if err := dumpStacks(cfg.stacks); err != nil {
				h.logf("stacks: %v", err)
			} else {
				h.logf("nothing progressed for %s: goroutine stacks written to %s", idle.Round(time.Second), cfg.stacks)
			}
		}
	})
	var stalled string
	if !quiet {
		stalled = fmt.Sprintf("no progress for %s before everything settled: %s; %s", cfg.stall, last.summary, h.unsettled(ctx))
	}
	stopOp()
	opWg.Wait()
	stopPolling()
	if h.doom != nil {
		h.doom.armed.Store(false)
	}

	res, err := h.check(ctx)
	if err != nil {
		return nil, err
	}
	h.logf("checked")
	if !quiet {
		res.Failures = append(res.Failures, stalled)
	}
	h.mu.Lock()
	res.Kills, res.Faults = h.kills, h.faults
	res.Scenarios = maps.Clone(h.scenarios)
	res.Rewound, res.RogueRecords = h.rewound, h.rogueRecords
	h.mu.Unlock()
	res.KeyConcurrency = h.env.keyConcurrency
	res.GroupProtocol = h.env.groupProtocol
	res.Doomed = h.doom.counts()
	res.Broker = h.brokerCounts()
	if b := res.Broker; b.Refusals > 0 && b.ProduceRefused == 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("broker-refuse-writes: %d refusals carried out, yet no replica's producer met NOT_ENOUGH_REPLICAS: the fault refused nothing", b.Refusals))
	}
	h.inj.mu.Lock()
	res.FetchForgotten = len(h.inj.forgot)
	if len(h.inj.forgot) > 0 {
		h.logf("kafka-fetch-forget: left out of a fetch session: %s", strings.Join(h.inj.forgot, ", "))
	}
	h.inj.mu.Unlock()
	h.genMu.Lock()
	res.Rebalances = len(h.gens)
	h.genMu.Unlock()
	if len(res.Failures) == 0 && cfg.mongoURI != "" {
		_ = h.db.Drop(context.Background())
	}
	return res, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// start starts a new incarnation of a slot.
func (h *harness) start(slot int) error { return h.startWith(slot, 0, false) }

// startIfDown starts a new incarnation of a slot unless one is live. It
// reports whether it started one.
func (h *harness) startIfDown(slot int) (bool, error) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.mu.Lock()
	live := h.slots[slot] != nil
	h.mu.Unlock()
	if live {
		return false, nil
	}
	return true, h.start(slot)
}

// startWith starts a new incarnation of a slot whose Kafka is unreachable
// for kafkaDown (refused, or black-holed).
func (h *harness) startWith(slot int, kafkaDown time.Duration, blackHole bool) error {
	h.mu.Lock()
	h.incarn[slot]++
	name := fmt.Sprintf("r%d.%d", slot, h.incarn[slot])
	h.mu.Unlock()
	r, err := startReplica(h.env, name, kafkaDown, blackHole)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.slots[slot] = r
	h.mu.Unlock()
	return nil
}

// runSchedule executes the fault schedule until ctx ends.
func (h *harness) runSchedule(ctx context.Context, acts []action) {
	start := time.Now()
	for _, a := range acts {
		wait := time.Until(start.Add(a.at))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		h.execute(ctx, a)
	}
}

// killSlot kills the replica of a slot, if it is live, and returns it;
// while a topic recreation holds kills, it waits for the hold to end.
func (h *harness) killSlot(slot int) *replica {
	h.waitChurn()
	return h.killSlotNow(slot)
}

// killSlotNow is killSlot without waiting for a topic recreation's hold:
// for a kill that must come at its moment (kill-open-txns, whose handlers
// block until it comes). One replica killed does not hide the others'
// recovery from a recreation.
func (h *harness) killSlotNow(slot int) *replica {
	h.mu.Lock()
	r := h.slots[slot]
	if r != nil {
		delete(h.slots, slot)
		h.zombies = append(h.zombies, r)
		h.kills++
	}
	h.mu.Unlock()
	if r == nil {
		return nil
	}
	h.klog.interrupted(r.name, "kill")
	r.kill()
	h.logf("kill %s", r.name)
	if h.cluster != nil {
		h.expireWg.Go(func() { h.expireMembers(h.expireCtx, r.name) })
	}
	return r
}

// stopSlot stops the replica of a slot gracefully, if it is live, and
// returns it.
func (h *harness) stopSlot(slot int) *replica {
	h.waitChurn()
	h.mu.Lock()
	r := h.slots[slot]
	if r != nil {
		delete(h.slots, slot)
		h.zombies = append(h.zombies, r)
	}
	h.mu.Unlock()
	if r != nil {
		h.klog.interrupted(r.name, "stop")
		h.logf("stop %s", r.name)
		r.stop()
	}
	return r
}

func (h *harness) execute(ctx context.Context, a action) {
	switch a.kind {
	case actKill, actLeave:
		if h.churnHeld() {
			// The schedule must not wait: skipped.
			h.logf("%s: skipped, a topic recreation holds kills and stops", a)
			return
		}
		h.logf("%s", a)
		if a.kind == actKill {
			h.killSlot(a.slot)
		} else {
			h.stopSlot(a.slot)
		}
	case actRestart, actJoin:
		started, err := h.startIfDown(a.slot)
		if started || err != nil {
			h.logf("%s", a)
		}
		if err != nil {
			h.logf("%s: start failed: %v", a, err)
		}
	case fOffsetRewind, fRogueProducer:
		h.logf("%s", a)
		// In the background: a replay waits for Kafka, the schedule must not.
		h.bg.Go(func() {
			ok, err := h.replay(ctx, a)
			h.account(a, ok, err, true)
		})
	case fMassHold, fNoHandler, fRetryIsolation, fKillOpenTxns, fRecreateTopic:
		h.logf("%s", a)
		h.bg.Go(func() { h.extra(ctx, a) })
	case fBrokerKill, fBrokerKillPartLeader, fBrokerKillController, fBrokerPause, fBrokerRefuse:
		h.bg.Go(func() { h.brokerFault(ctx, a) })
	case fKeylessHeld:
		ok, err := h.writeKeylessHeld(ctx, a)
		if ok {
			h.logf("%s", a)
		}
		h.account(a, ok, err, false)
	case fSlowHandler, fOutage, fSmallMaxBytes, fKafkaDownStart, fPauseStorm:
		h.logf("%s", a)
		if a.kind == fKafkaDownStart && h.churnHeld() {
			// Its stop waits for a topic recreation; the schedule must not.
			h.bg.Go(func() {
				ok, err := h.scenario(ctx, a)
				h.account(a, ok, err, true)
			})
			return
		}
		ok, err := h.scenario(ctx, a)
		h.account(a, ok, err, true)
	default:
		h.logf("%s", a)
		ok, err := h.inj.apply(ctx, a)
		h.account(a, ok, err, false)
	}
}

// account logs an action's error and counts it when it took place (as a
// scenario or replay of its kind too when counted).
func (h *harness) account(a action, ok bool, err error, counted bool) {
	if err != nil {
		h.logf("%s: %v", a, err)
	}
	if !ok {
		return
	}
	h.mu.Lock()
	h.faults++
	if counted {
		h.scenarios[a.kind]++
	}
	h.mu.Unlock()
}

// runLoad starts the load generators: transactions spread over the live
// replicas at cfg.rate step events per second (two per transaction on
// average).
func (h *harness) runLoad(ctx context.Context, wg *sync.WaitGroup) {
	gens := max(8, h.cfg.rate/20)
	txPerSec := float64(h.cfg.rate) / 2
	interval := time.Duration(float64(gens) / txPerSec * float64(time.Second))
	for g := range gens {
		rng := rand.New(rand.NewPCG(h.cfg.seed, uint64(g)+1))
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				r := h.pick(rng)
				if r == nil {
					continue
				}
				tctx, cancel := context.WithTimeout(r.ctx, txnDeadline)
				stop := context.AfterFunc(ctx, cancel)
				kafkaDown := r.sw.kafkaIsDown(0)
				start := time.Now()
				err := h.work.transact(tctx, r.client, r.mongo.Database(h.env.database), rng, h.work.newPlan(rng))
				took := time.Since(start)
				stop()
				cancel()
				if ctx.Err() != nil || r.ctx.Err() != nil {
					continue // the load ended, or the replica was stopped or killed
				}
				if kafkaDown {
					h.noteKafkaRecording(r, err, took)
				} else if err == nil {
					h.noteTxDuration(false, took)
				}
				if err != nil {
					h.noteTxError(r, err, took)
				}
			}
		})
	}
}

func (h *harness) pick(rng *rand.Rand) *replica {
	h.mu.Lock()
	defer h.mu.Unlock()
	live := make([]*replica, 0, len(h.slots))
	for _, r := range h.slots {
		live = append(live, r)
	}
	if len(live) == 0 {
		return nil
	}
	// Map order is random; sort-free pick is fine for load spreading.
	return live[rng.IntN(len(live))]
}

// expireMembers works around a kfake gap: when a member's JoinGroup or
// SyncGroup reply cannot be delivered (its connection died: a kill), kfake
// never starts the member's session timer, so the dead member stays in the
// group and every later rebalance waits for it for the whole rebalance
// timeout (60 s for the publisher group), again and again. Kafka expires
// such a member after the session timeout. After the session timeout plus a
// margin, the harness does what Kafka would have done: it removes the
// killed replica's members (found by client id) with a LeaveGroup on their
// behalf. Members kfake already expired are gone and unaffected. A member
// whose join was still parked then (killed while joining) may show up in
// the group later, when the round completes: the harness looks again every
// few seconds, for a few rounds.
func (h *harness) expireMembers(ctx context.Context, name string) {
	wait := h.env.sessionTimeout + time.Second
	for range 5 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		wait = 5 * time.Second
		h.leaveFor(ctx, name)
	}
}

// leaveFor sends a LeaveGroup for every member of a killed replica still in
// the service's groups.
func (h *harness) leaveFor(ctx context.Context, name string) {
	adm := kadm.NewClient(h.inj.raw)
	described, err := adm.DescribeGroups(ctx, h.inj.groups...)
	if err != nil {
		return
	}
	for _, g := range described.Sorted() {
		req := kmsg.NewPtrLeaveGroupRequest()
		req.Group = g.Group
		for _, m := range g.Members {
			if m.ClientID == "chaos-"+name {
				lm := kmsg.NewLeaveGroupRequestMember()
				lm.MemberID = m.MemberID
				req.Members = append(req.Members, lm)
			}
		}
		if len(req.Members) > 0 {
			if _, err := req.RequestWith(ctx, h.inj.raw); err == nil {
				h.logf("expired %d stale member(s) of killed %s in %s", len(req.Members), name, g.Group)
			}
		}
	}
}

// shutdown stops every live replica gracefully and waits for every
// replica, killed ones included, to wind down.
func (h *harness) shutdown() {
	h.mu.Lock()
	all := append([]*replica(nil), h.zombies...)
	for slot, r := range h.slots {
		all = append(all, r)
		delete(h.slots, slot)
	}
	h.zombies = nil
	h.mu.Unlock()
	for _, r := range all {
		r.stop()
	}
	timeout := time.After(3 * time.Minute)
	for _, r := range all {
		select {
		case <-r.done:
			if r.err != nil && !errors.Is(r.err, context.Canceled) {
				h.logf("replica %s: Run returned %v", r.name, r.err)
			}
		case <-timeout:
			h.logf("replica %s did not stop within 3 minutes", r.name)
			return
		}
	}
}

// logThroughput prints, every 15 s of the load, how many transactions were
// recorded and how many step handler runs returned nil since the last line,
// per second: a consumer falling behind shows there, long before the
// quiescence reports the backlog. The counts are the harness's own, so the
// line costs the servers nothing.
func (h *harness) logThroughput(ctx context.Context) {
	const every = 15 * time.Second
	t := time.NewTicker(every)
	defer t.Stop()
	lastRec, lastRuns := h.work.recorded.Load(), h.work.handledRuns.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rec, runs := h.work.recorded.Load(), h.work.handledRuns.Load()
		h.logf("throughput: %.1f transactions/s recorded, %.1f step handler runs/s succeeded (%d, %d in all)",
			float64(rec-lastRec)/every.Seconds(), float64(runs-lastRuns)/every.Seconds(), rec, runs)
		lastRec, lastRuns = rec, runs
	}
}

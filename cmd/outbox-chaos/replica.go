package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// replica is one incarnation of a service replica: its own network switch,
// MongoDB client, Kafka clients (created by the framework, dialled through
// the switch) and outbox.Client, all sharing the service name with the
// other replicas.
type replica struct {
	name   string
	sw     *netSwitch
	mongo  *mongo.Client
	client *outbox.Client
	cancel context.CancelFunc // cancels Run and the replica's load
	ctx    context.Context    // the replica's life: load generators use it
	done   chan struct{}      // closed when Run has returned and the clients are closed
	err    error              // Run's result, set before done closes

	mu      sync.Mutex
	stopped bool
}

// replicaEnv is what every replica needs.
type replicaEnv struct {
	mongoURI string
	brokers  []string
	database string
	service  string
	logger   *slog.Logger
	work     *workload
	appName  string
	// sessionTimeout is the Kafka group session timeout of the replicas.
	sessionTimeout time.Duration
	// rebalanceTimeout, when set, is the replicas' kgo.RebalanceTimeout.
	rebalanceTimeout time.Duration
	// klog receives what each replica's Kafka clients do.
	klog *kafkaLog
	// keyConcurrency is the replicas' Config.KeyConcurrency.
	keyConcurrency int
	// topicPrefix is the replicas' Config.TopicPrefix.
	topicPrefix string
	// unique is the replicas' Config.UniqueIdempotencyKeys (-migrated).
	unique bool
	// doom aborts some handling transactions at their commit (nil: none).
	doom *commitDoom
	// skipUnknown is the replicas' Config.SkipUnknownEvents (-skip-unknown).
	skipUnknown bool
	// claimCheck gives the replicas a Config.ClaimCheck (-claim-check).
	claimCheck bool
	// produceWatch, when set, counts the produce refusals the replicas'
	// Kafka clients receive (on a cluster of the harness's own).
	produceWatch *produceWatch
	// groupProtocol is the replicas' Config.GroupProtocol (-group-protocol).
	groupProtocol outbox.GroupProtocol
}

// chaosMaxAttempts is the replicas' Config.MaxAttempts.
const chaosMaxAttempts = 6

// chaosHeartbeat is the replicas' Config.HeartbeatInterval, and the
// embedded broker's group.consumer.heartbeat.interval.ms.
const chaosHeartbeat = 300 * time.Millisecond

// startReplica starts a replica. With kafkaDown > 0 its Kafka is
// unreachable for that long from the start (refused, or black-holed).
func startReplica(env *replicaEnv, name string, kafkaDown time.Duration, blackHole bool) (*replica, error) {
	sw := newNetSwitch()
	if kafkaDown > 0 {
		sw.kafkaDown(kafkaDown, blackHole)
	}
	// An application name of its own, so that a fail point can single
	// out the replica's connections (commitDoom).
	appName := env.appName + "-" + name
	mopts := options.Client().ApplyURI(env.mongoURI).
		SetDialer(sw).
		SetAppName(appName).
		SetServerSelectionTimeout(3 * time.Second).
		SetConnectTimeout(3 * time.Second)
	if m := env.doom.monitor(appName); m != nil {
		mopts.SetMonitor(m)
	}
	mc, err := mongo.Connect(mopts)
	if err != nil {
		return nil, fmt.Errorf("replica %s: connect MongoDB: %w", name, err)
	}
	dial := sw.dialKafka
	if env.produceWatch != nil {
		dial = env.produceWatch.dial(dial)
	}
	kafkaOpts := []kgo.Opt{kgo.Dialer(dial), kgo.ClientID("chaos-" + name), kgo.WithLogger(kgoLogger{env.logger.With("replica", name)}),
		env.klog.hooks(name)}
	if env.rebalanceTimeout > 0 {
		kafkaOpts = append(kafkaOpts, kgo.RebalanceTimeout(env.rebalanceTimeout))
	}
	if os.Getenv("OUTBOX_CHAOS_NO_FETCH_SESSIONS") != "" {
		// An experiment: does a partition its owner stops fetching (issue
		// 31 item 7) need incremental fetch sessions?
		kafkaOpts = append(kafkaOpts, kgo.DisableFetchSessions())
	}
	client, err := outbox.New(outbox.Config{
		Mongo:                 mc,
		Database:              env.database,
		Brokers:               env.brokers,
		KafkaOptions:          kafkaOpts,
		Service:               env.service,
		PublishTopics:         []string{chaosTopic(), chainTopic(), recreateTopic()},
		MaxAttempts:           chaosMaxAttempts,
		SkipUnknownEvents:     env.skipUnknown,
		KeyConcurrency:        env.keyConcurrency,
		TopicPrefix:           env.topicPrefix,
		UniqueIdempotencyKeys: env.unique,
		ClaimCheck:            claimCheckOf(env.claimCheck),
		RetryMinBackoff:       10 * time.Millisecond,
		RetryMaxBackoff:       250 * time.Millisecond,
		PublishBatchSize:      500,
		SessionTimeout:        env.sessionTimeout,
		HeartbeatInterval:     chaosHeartbeat,
		FenceMargin:           env.sessionTimeout / 3,
		GroupProtocol:         env.groupProtocol,
		Logger:                env.logger.With("replica", name),
	})
	if err != nil {
		_ = mc.Disconnect(context.Background())
		return nil, err
	}
	if err := env.work.register(client, mc.Database(env.database), name); err != nil {
		_ = mc.Disconnect(context.Background())
		return nil, err
	}
	env.klog.register(client, name)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{name: name, sw: sw, mongo: mc, client: client, cancel: cancel, ctx: ctx, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = client.Run(ctx)
		env.klog.ended(name)
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = mc.Disconnect(dctx)
		dcancel()
	}()
	return r, nil
}

// kill stops the replica abruptly: first its network is cut (every
// connection closed, no new one possible), then its context is cancelled.
// Whatever Run does after the cut (drain, commit offsets, leave the group)
// cannot reach MongoDB or Kafka, so the servers see exactly what a crashed
// process leaves behind. Run's goroutines wind down in the background; the
// returned channel closes when they are gone.
func (r *replica) kill() <-chan struct{} {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.sw.Cut()
	r.cancel()
	return r.done
}

// stop stops the replica gracefully: Run drains and leaves its groups.
func (r *replica) stop() <-chan struct{} {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.cancel()
	return r.done
}

// kgoLogger passes franz-go's own logs (group joins, rebalances) to the
// harness's logger, at Info and above, for a failure to explain.
type kgoLogger struct{ l *slog.Logger }

// Level is Info when the harness logs Info, else Warn.
func (k kgoLogger) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelInfo) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

// Log writes one franz-go log line.
func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	case kgo.LogLevelDebug:
		l = slog.LevelDebug
	}
	k.l.Log(context.Background(), l, "kgo: "+msg, keyvals...)
}

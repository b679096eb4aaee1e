package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/kafkawatch"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/internal/tuning"
)

// The consumer.
//
// One kgo client in Config.ConsumerGroup polls the topics of the registered
// handlers with automatic commits off. The mechanics live in
// internal/consume: one worker per owned partition schedules the
// partition's events by key (Config.KeyConcurrency), runs them in
// transactions, settles them and commits the lowest offset not yet
// settled. This file wires the kgo client to them; consume_host.go gives
// them the handlers and the commits, and internal/inboxhost the inbox and
// the held keys' sequences.
//
// Goroutines and how they stop:
//   - The poll loop runs on runConsumer's goroutine (owned by Run) and stops
//     when Run's context ends.
//   - The kgo client's rebalance callbacks (run one at a time by kgo) start
//     and stop the partition workers (consume.Set): a revoked partition's
//     worker finishes its running transactions and commits before the
//     callback returns; a lost one's is canceled and commits nothing.
//   - The lag poller, the fetch watch and the recreation watcher
//     (internal/kafkawatch) and the re-drive request loop (parked.go) are
//     started and stopped by runConsumer.
//
// When Run's context ends, the poll loop, the lag poller, the recreation
// watcher and the re-drive loop stop, every worker finishes its running transactions and commits
// (bounded by Config.DrainTimeout), then the client leaves the group (waiting at
// most leaveTimeout for the coordinator).

const (
	// A partition's fetching pauses when it holds maxQueue records past
	// its committable offset or maxQueueBytes of unsettled values.
	maxQueue      = 5000
	maxQueueBytes = 8 << 20
	// fetchMaxWait bounds how long a fetch waits at the broker for data. A
	// fetch sent while partitions were paused waits this long before a
	// resumed partition's records can flow, so keep it short.
	fetchMaxWait = 500 * time.Millisecond
	// heldRecheck is how often a worker with held keys reads its
	// partition's sequences again, to release what an operator unblocked.
	heldRecheck = 5 * time.Second
	// waitVisible is how long a wait lasts before status and logs show it.
	waitVisible = 3 * time.Second
	// leaveTimeout bounds the leave of the group on shutdown: Close alone
	// can block for a minute when the coordinator is unreachable.
	leaveTimeout = 5 * time.Second
)

// queueBound returns the records and bytes at which a partition's
// fetching pauses: maxQueue and maxQueueBytes, unless a harness shrank
// them (internal/tuning).
func queueBound() (records, bytes int) {
	records, bytes = maxQueue, maxQueueBytes
	if n := tuning.ConsumerQueueRecords.Load(); n > 0 {
		records = int(n)
	}
	if n := tuning.ConsumerQueueBytes.Load(); n > 0 {
		bytes = int(n)
	}
	return records, bytes
}

// consumer is the running consumer of a Client.
type consumer struct {
	c   *Client
	cl  *kgo.Client
	log *slog.Logger
	set *consume.Set
	// errLog rate-limits the poll loop's repeated errors.
	errLog *itel.RateLog
	// recreated watches the topics answering UNKNOWN_TOPIC_ID
	// (internal/kafkawatch).
	recreated *kafkawatch.RecreationWatch
	// readdMu serializes readdTopic.
	readdMu sync.Mutex
}

// kafkaPauser pauses and resumes fetching with the Kafka topic of a bare
// topic (Config.TopicPrefix), through the consumer's client (set before any
// partition is assigned, so before any worker pauses).
type kafkaPauser struct {
	cons *consumer
}

func (p kafkaPauser) Pause(tp consume.TopicPartition) {
	p.cons.cl.PauseFetchPartitions(map[string][]int32{p.cons.c.cfg.kafkaTopic(tp.Topic): {tp.Partition}})
}

func (p kafkaPauser) Resume(tp consume.TopicPartition) {
	p.cons.cl.ResumeFetchPartitions(map[string][]int32{p.cons.c.cfg.kafkaTopic(tp.Topic): {tp.Partition}})
}

// consumeConfig is the configuration of the partition workers.
func (c *Client) consumeConfig(host *consumeHost, pauser consume.Pauser) *consume.Config {
	records, bytes := queueBound()
	return &consume.Config{
		Host:         host,
		Observer:     host,
		Pauser:       pauser,
		Log:          c.cfg.Logger.With("outbox.component", "consumer"),
		Slots:        c.cfg.KeyConcurrency,
		BatchSize:    c.cfg.HandleBatchSize,
		Hold:         c.cfg.PoisonPolicy == HoldKey,
		SkipUnknown:  c.cfg.SkipUnknownEvents,
		QueueRecords: records,
		QueueBytes:   bytes,
		Backoff:      c.cfg.backoff(),
		Recheck:      c.heldRecheckEvery(),
		DrainTimeout: c.cfg.DrainTimeout,
		WaitVisible:  waitVisible,
	}
}

func (c *Client) heldRecheckEvery() time.Duration {
	if c.test.redriveEvery > 0 {
		return c.test.redriveEvery
	}
	return heldRecheck
}

// runConsumer runs the consumer until ctx ends. It returns nil after a clean
// drain, or a fatal error.
func (c *Client) runConsumer(ctx context.Context) error {
	topics := c.subscribedTopics()
	if len(topics) == 0 {
		return nil
	}
	// Handlers run under work: it outlives ctx by the drain, so that the
	// transactions in hand can finish and commit.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	cons := &consumer{c: c, log: c.cfg.Logger.With("outbox.component", "consumer"), errLog: itel.NewRateLog(itel.ErrorRelog)}
	host := c.newConsumeHost(cons)
	// The set exists before the client: kgo may call the rebalance
	// callbacks as soon as the client is created.
	cons.set = consume.NewSet(c.consumeConfig(host, kafkaPauser{cons}), work)
	opts := append([]kgo.Opt{}, c.cfg.KafkaOptions...)
	opts = append(opts,
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.ConsumerGroup),
		kgo.ConsumeTopics(c.cfg.kafkaTopics(topics)...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.HeartbeatInterval(c.cfg.HeartbeatInterval),
		c.groupHook(c.cfg.ConsumerGroup),
		kgo.OnPartitionsAssigned(cons.assigned),
		kgo.OnPartitionsRevoked(cons.revoked),
		kgo.OnPartitionsLost(cons.lost),
	)
	opts = append(opts, c.cfg.groupOpts()...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("outbox: consumer: %w", err)
	}
	cons.cl = cl
	cons.recreated = cons.recreationWatch(topics)
	c.tel.cons.Store(cons)
	defer c.tel.cons.Store(nil)
	// Re-drive requests (Admin.RequestRedrive) are served while consuming,
	// under ctx: a shutdown cuts a re-drive short between two transactions,
	// and the partition's owner goes on with it.
	defer c.startRedriveRequests(ctx)()
	defer func() {
		// Drain first, while still a member: every worker finishes the
		// transactions in hand and commits (bounded by Config.DrainTimeout). Then
		// leave with a bounded wait, and force the leave before Close:
		// Close leaves again with no deadline and blocks for as long as the
		// coordinator is unreachable.
		stopTimer := time.AfterFunc(c.cfg.DrainTimeout, cancelWork)
		cons.set.Close()
		stopTimer.Stop()
		leaveCtx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
		_ = cl.LeaveGroupContext(leaveCtx)
		cancel()
		forced, force := context.WithCancel(context.Background())
		force()
		_ = cl.LeaveGroupContext(forced)
		cl.Close()
	}()
	// Deferred after the drain and Close above, so they stop before them:
	// they use the client.
	defer cons.startLagPoller(ctx, topics)()
	if !tuning.NoFetchWatch.Load() {
		defer cons.startFetchWatch(ctx)()
	}
	defer startStoppable(ctx, cons.recreated.Run)()
	for {
		fetches := cl.PollRecords(ctx, maxQueue)
		// At once: records of partitions assigned after this mark are from
		// an earlier assignment (consume.Set.EnqueuePolled).
		mark := cons.set.Polled()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(cons.fetchError)
		cons.recreated.Note(fetches)
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			// Past this point topics are bare (Config.TopicPrefix): the
			// records' too, before anything reads them.
			topic := c.cfg.bareTopic(p.Topic)
			for _, r := range p.Records {
				r.Topic = topic
			}
			c.tel.marks.Fetched(itel.Partition{Topic: topic, Partition: p.Partition}, p.HighWatermark)
			if len(p.Records) > 0 {
				cons.set.EnqueuePolled(consume.TopicPartition{Topic: topic, Partition: p.Partition}, p.Records, mark)
			}
		})
	}
}

// fetchError logs a fetch error, once per kind and partition and then at
// most every itel.ErrorRelog with the number of repeats.
func (cons *consumer) fetchError(t string, p int32, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	cons.errLog.Warn(cons.log, "fetch error", fmt.Sprintf("%s/%d/%s", t, p, itel.ErrorKind(err)),
		"topic", cons.c.cfg.bareTopic(t), "partition", p, "err", err)
}

func (cons *consumer) tps(m map[string][]int32) []consume.TopicPartition {
	var out []consume.TopicPartition
	for t, ps := range cons.c.cfg.barePartitions(m) {
		for _, p := range ps {
			out = append(out, consume.TopicPartition{Topic: t, Partition: p})
		}
	}
	return out
}

func (cons *consumer) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	cons.rebalanced("assigned", assigned, slog.LevelInfo, cons.set.Assign)
}

func (cons *consumer) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	cons.rebalanced("revoked", revoked, slog.LevelInfo, cons.set.Revoke)
}

func (cons *consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	cons.rebalanced("lost", lost, slog.LevelWarn, cons.set.Lose)
}

// rebalanced counts and logs an assignment change and applies it to the
// workers.
func (cons *consumer) rebalanced(change string, m map[string][]int32, level slog.Level, apply func([]consume.TopicPartition)) {
	cons.c.tel.ins.Rebalanced("consumer", change, m)
	tps := cons.tps(m)
	if len(tps) > 0 {
		cons.log.Log(context.Background(), level, "partitions "+change, "partitions", tpsString(tps))
	}
	apply(tps)
}

func tpsString(tps []consume.TopicPartition) string {
	s := ""
	for i, tp := range tps {
		if i > 0 {
			s += ","
		}
		s += tp.String()
	}
	return s
}

// commit commits a partition's offset with the consumer's group session.
// The broker checks the session's generation; a worker commits only while
// its partition is owned (revoked workers commit before the callback
// returns, lost ones never).
func (cons *consumer) commit(ctx context.Context, tp consume.TopicPartition, offset int64, epoch int32) error {
	var failed error
	offsets := map[string]map[int32]kgo.EpochOffset{
		cons.c.cfg.kafkaTopic(tp.Topic): {tp.Partition: {Epoch: epoch, Offset: offset}},
	}
	cons.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err == nil {
			err = kafkawatch.OffsetCommitErr(resp)
		}
		failed = err
	})
	return failed
}

// startLagPoller starts the lag poller of the subscribed topics
// (internal/kafkawatch); stop cancels it and waits for it to return.
func (cons *consumer) startLagPoller(ctx context.Context, topics []string) (stop func()) {
	c := cons.c
	p := &kafkawatch.LagPoller{
		Client: cons.cl,
		Topics: c.cfg.kafkaTopics(topics),
		Every:  c.tel.lagEvery,
		SetHighWatermark: func(topic string, partition int32, offset int64) {
			c.tel.marks.Listed(itel.Partition{Topic: c.cfg.bareTopic(topic), Partition: partition}, offset)
		},
		SetLogStart: func(topic string, partition int32, offset int64) {
			c.tel.marks.SetLogStart(itel.Partition{Topic: c.cfg.bareTopic(topic), Partition: partition}, offset)
		},
		Listed: func(at time.Time) { c.tel.lagListedAt.Store(at.UnixNano()) },
		Log:    cons.log,
		Warn: func(msg string, args ...any) {
			cons.errLog.Warn(cons.log, msg, "lag-listing", args...)
		},
	}
	return startStoppable(ctx, p.Run)
}

// startFetchWatch starts the fetch watch (internal/kafkawatch); stop
// cancels it and waits for it to return.
func (cons *consumer) startFetchWatch(ctx context.Context) (stop func()) {
	c := cons.c
	w := &kafkawatch.FetchWatch{
		Client:     cons.cl,
		Partitions: cons.set,
		ProbeOpts:  append(append([]kgo.Opt{}, c.cfg.KafkaOptions...), kgo.SeedBrokers(c.cfg.Brokers...)),
		KafkaTopic: c.cfg.kafkaTopic,
		Ends: func(topic string, partition int32) (hwm, logStart int64, ok bool) {
			return c.tel.marks.Ends(itel.Partition{Topic: topic, Partition: partition})
		},
		ListedAt: func() time.Time {
			if ns := c.tel.lagListedAt.Load(); ns != 0 {
				return time.Unix(0, ns)
			}
			return time.Time{}
		},
		LagEvery: c.tel.lagEvery,
		Restarted: func(tp consume.TopicPartition, reason string) {
			c.tel.ins.FetchRestarted(tp.Topic, tp.Partition, reason)
			if h := c.test.fetchRestartHook; h != nil {
				h(tp, reason)
			}
		},
		Readd:        func(topic string) { cons.readdTopic(topic, nil) },
		Log:          cons.log,
		Owner:        c,
		CheckEvery:   c.test.fetchCheckEvery,
		QuietFor:     c.test.fetchQuietFor,
		RestartEvery: c.test.fetchRestartEvery,
	}
	return startStoppable(ctx, w.Run)
}

// recreationWatch makes the watcher of the subscribed topics deleted and
// created again (internal/kafkawatch), over the consumer's client; its
// reset claims are outbox_meta documents (internal/store).
func (cons *consumer) recreationWatch(topics []string) *kafkawatch.RecreationWatch {
	c := cons.c
	return &kafkawatch.RecreationWatch{
		Client:      cons.cl,
		Group:       c.cfg.ConsumerGroup,
		Topics:      c.cfg.kafkaTopics(topics),
		BareTopic:   c.cfg.bareTopic,
		Readd:       cons.readdTopic,
		Resets:      store.TopicResets{Meta: c.meta, Group: c.cfg.ConsumerGroup, Replica: c.cfg.ReplicaID},
		Log:         cons.log,
		Failed:      c.tel.setError,
		Backoff:     c.cfg.backoff(),
		WaitVisible: waitVisible,
		ResetWait:   c.test.resetWait,
		Crash:       c.test.resetHook,
	}
}

// readdTopic drops the client's whole state of the Kafka topic t and
// subscribes it again: the workers of its owned partitions stop as lost
// (without committing: another member may own them after the rebalance,
// and redeliveries are skipped), before runs, then the client purges the
// topic (its cursors, its partitions' fetch session entries and pending
// offset loads) and adds it back, which rebalances the group. The
// recreation watcher uses it to follow a recreated topic, the fetch watch
// as its last resort; one at a time.
func (cons *consumer) readdTopic(t string, before func()) {
	cons.readdMu.Lock()
	defer cons.readdMu.Unlock()
	// Every worker of the topic, also one a rebalance is stopping with a
	// commit in flight: a commit built after the purge would name the
	// topic's new incarnation with an offset of the old one, and a replica
	// starting there would skip the new topic's first records.
	cons.set.LoseTopic(cons.c.cfg.bareTopic(t))
	if before != nil {
		before()
	}
	cons.cl.PurgeTopicsFromClient(t)
	cons.cl.AddConsumeTopics(t)
}

// groupHook returns the fatal-error hook for one of the framework's group
// clients (internal/kafkawatch), or a no-op hook when the client is not
// running under Run.
func (c *Client) groupHook(group string) kgo.Opt {
	stop := c.stopRun
	if stop == nil {
		stop = func(error) {}
	}
	return kgo.WithHooks(&kafkawatch.FatalHook{Group: group, Stop: stop, Kind: ErrKafkaGroup,
		ConsumerProtocol: c.cfg.GroupProtocol == GroupConsumer})
}

// startStoppable runs run on a goroutine of its own until ctx ends or stop
// is called; stop cancels run's context and waits for it to return.
func startStoppable(ctx context.Context, run func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

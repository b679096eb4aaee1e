package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// Broker faults: a real Apache Kafka cluster (-kafka apache), started by the
// harness, three nodes by default, every node a broker and a KRaft
// controller; topics get replication factor 3 and min.insync.replicas=2.
// The faults act on the brokers' processes, one at a time (two nodes down
// would take the controller quorum's majority and min.insync.replicas with
// them), and each waits, before the next may start, until every replica of
// the run's topics is back in sync:
//
//   - broker-kill: kill -9 of the broker leading the most partitions of the
//     run's topics, restarted after a.d;
//   - broker-kill-partition-leader: kill -9 of the leader of one partition
//     of the main topic (a.pick), restarted after a.d;
//   - broker-kill-controller: kill -9 of the active controller (the KRaft
//     quorum's leader), restarted after a.d;
//   - broker-pause: SIGSTOP of the consumer group's coordinator for a.d,
//     longer than the group session timeout (the broker's controller
//     session, 9 s, too: the controller fences it and its leaderships move),
//     then SIGCONT;
//   - broker-refuse-writes: the main topic's min.insync.replicas raised to
//     its replication factor and a broker paused until the controller
//     fences it and every partition's ISR is below that minimum, then for
//     a.d more: the leaders refuse every acks=all write with
//     NOT_ENOUGH_REPLICAS (refuse.go says why no other cheap refusal, a
//     full disk among them, is possible here).
//
// The kills come every -broker-kill-every (uniformly from two thirds to
// four thirds of it), the kinds in turn; pauses every -broker-pause-every,
// refusals every -broker-refuse-every; none in the last fifth of the load,
// so that the cluster is whole when the quiescence wait starts. The three
// schedules come from the seed, on streams of their own.
const (
	fBrokerKill           actionKind = "broker-kill"
	fBrokerKillPartLeader actionKind = "broker-kill-partition-leader"
	fBrokerKillController actionKind = "broker-kill-controller"
	fBrokerPause          actionKind = "broker-pause"
	fBrokerRefuse         actionKind = "broker-refuse-writes"
)

// kafkaApache is the -kafka value of a run on a real Apache Kafka cluster
// that the harness starts.
const kafkaApache = "apache"

var brokerKills = []actionKind{fBrokerKill, fBrokerKillPartLeader, fBrokerKillController}

// brokerInSyncWait bounds the wait, after a broker fault, until every
// replica of the run's topics is in sync again.
const brokerInSyncWait = 2 * time.Minute

// scheduleBrokerFaults draws the broker faults of a run from the seed.
// sessionTimeout is the group session timeout a pause must outlast.
func scheduleBrokerFaults(seed uint64, duration, killEvery, pauseEvery, refuseEvery, sessionTimeout time.Duration) []action {
	var acts []action
	stream := func(salt uint64, every time.Duration, kinds []actionKind, draw func(rng *rand.Rand, a *action)) {
		if every <= 0 {
			return
		}
		rng := rand.New(rand.NewPCG(seed, salt))
		next := rng.IntN(len(kinds))
		spacing := func() time.Duration {
			return every*2/3 + time.Duration(rng.Int64N(int64(every*2/3)+1))
		}
		for t := spacing() / 2; t < duration*8/10; t += spacing() {
			a := action{at: t, kind: kinds[next%len(kinds)], pick: rng.Uint64()}
			next++
			draw(rng, &a)
			acts = append(acts, a)
		}
	}
	stream(0xb40c1, killEvery, brokerKills, func(rng *rand.Rand, a *action) {
		a.d = 2*time.Second + time.Duration(rng.Int64N(int64(8*time.Second))) // down for 2-10 s
	})
	stream(0xb40c2, pauseEvery, []actionKind{fBrokerPause}, func(rng *rand.Rand, a *action) {
		// Past the session timeout and the broker's 9 s controller
		// session: 10-16 s at the default 6 s session.
		a.d = max(sessionTimeout, 9*time.Second) + time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
	})
	stream(0xb40c3, refuseEvery, []actionKind{fBrokerRefuse}, func(rng *rand.Rand, a *action) {
		// Refusing for 3-8 s once every partition refuses.
		a.d = 3*time.Second + time.Duration(rng.Int64N(int64(5*time.Second)))
	})
	return acts
}

// brokerFaults runs the broker faults on the harness's cluster and counts
// them.
type brokerFaults struct {
	cluster *apachekafka.Cluster
	busy    sync.Mutex // held by the fault in progress

	mu sync.Mutex
	// kills counts the broker kills (every kind), controllerKills those
	// of the active controller, pauses and refusals the other faults;
	// skipped those that found another fault in progress.
	kills, controllerKills, pauses, refusals, skipped int
	// last is when the last broker fault ended (or began, while one runs).
	last time.Time
}

// brokerCounts are the broker faults carried out in a run (the summary's
// broker_* fields), and the fetch watch's restarts.
type brokerCounts struct {
	Apache                                   bool // the run had a cluster of its own
	Nodes                                    int
	Kills, ControllerKills, Pauses, Refusals int
	Skipped                                  int
	// ProduceRefused counts the partitions of the replicas' Produce
	// responses refused with NOT_ENOUGH_REPLICAS or
	// NOT_ENOUGH_REPLICAS_AFTER_APPEND (produceWatch).
	ProduceRefused                   int
	FetchRestarts, FetchResubscribes int
}

// summary is the broker part of the summary line, empty without a cluster
// of the harness's own (the fetch watch's restarts are counted in any
// run).
func (b brokerCounts) summary() string {
	s := fmt.Sprintf(" fetch_restarts=%d fetch_resubscribes=%d", b.FetchRestarts, b.FetchResubscribes)
	if !b.Apache {
		return s
	}
	return s + fmt.Sprintf(" kafka_nodes=%d broker_kills=%d controller_kills=%d broker_pauses=%d broker_refusals=%d produce_refused=%d broker_faults_skipped=%d",
		b.Nodes, b.Kills, b.ControllerKills, b.Pauses, b.Refusals, b.ProduceRefused, b.Skipped)
}

// startApache starts the run's Apache Kafka cluster. Its settings add to
// apachekafka.BrokerProps: few internal partitions (fewer replicas to move
// after each fault on a loaded machine) and a leader rebalance every 20 s,
// so that a restarted broker leads again soon and the next kill moves
// leaders again.
func startApache(ctx context.Context, cfg config) (*apachekafka.Cluster, error) {
	nodes := cmp.Or(cfg.kafkaNodes, 3)
	progress := cfg.progress
	if progress == nil {
		progress = discard{}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // a loaded machine starts JVMs slowly
	defer cancel()
	c, err := apachekafka.Start(sctx, apachekafka.Options{Nodes: nodes, Progress: progress, HeapMB: 320, Props: map[string]string{
		"offsets.topic.num.partitions":            "6",
		"transaction.state.log.num.partitions":    "6",
		"leader.imbalance.check.interval.seconds": "20",
	}})
	if err != nil {
		return nil, fmt.Errorf("start Apache Kafka (%d nodes): %w", nodes, err)
	}
	return c, nil
}

// discard is an io.Writer that drops everything.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// brokerFault carries out one broker fault; it runs in the background
// (h.bg), so that the schedule goes on while a broker is down. A fault that
// finds another in progress is skipped. Restarts and resumptions use a
// context of their own: a broker killed when the load ends must come back
// all the same.
func (h *harness) brokerFault(ctx context.Context, a action) {
	bf := h.broker
	if !bf.busy.TryLock() {
		bf.mu.Lock()
		bf.skipped++
		bf.mu.Unlock()
		h.logf("%s: skipped, another broker fault is in progress", a)
		return
	}
	defer bf.busy.Unlock()
	bf.mark()
	defer bf.mark()
	h.logf("%s", a)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	var err error
	switch a.kind {
	case fBrokerKill, fBrokerKillPartLeader, fBrokerKillController:
		err = h.killBroker(fctx, a)
	case fBrokerPause:
		err = h.pauseBroker(fctx, a)
	case fBrokerRefuse:
		err = h.refuseWrites(fctx, a)
	}
	if err != nil {
		h.logf("%s: %v", a, err)
		return
	}
	start := time.Now()
	if err := h.waitInSync(fctx); err != nil {
		h.logf("%s: %v", a, err)
		return
	}
	h.logf("%s: every replica in sync %.1fs after the fault ended", a, time.Since(start).Seconds())
}

// mark notes that a broker fault begins or ends now.
func (bf *brokerFaults) mark() {
	bf.mu.Lock()
	bf.last = time.Now()
	bf.mu.Unlock()
}

// killBroker kills the node a chooses, waits a.d and starts it again.
func (h *harness) killBroker(ctx context.Context, a action) error {
	bf := h.broker
	var n *apachekafka.Node
	var why string
	var err error
	switch a.kind {
	case fBrokerKill:
		n, why, err = h.mostLeader(ctx)
	case fBrokerKillPartLeader:
		p := int32(a.pick % uint64(h.inj.parts))
		n, err = bf.cluster.Leader(ctx, h.topic, p)
		why = fmt.Sprintf("the leader of %s/%d", h.topic, p)
	case fBrokerKillController:
		n, err = bf.cluster.Controller(ctx)
		why = "the active controller"
	}
	if err != nil {
		return fmt.Errorf("choosing the broker: %w", err)
	}
	if err := n.Kill(); err != nil {
		return err
	}
	bf.mu.Lock()
	bf.kills++
	if a.kind == fBrokerKillController {
		bf.controllerKills++
	}
	bf.mu.Unlock()
	h.addFault()
	h.logf("broker %d (%s) killed; down for %s", n.ID, why, a.d.Round(time.Millisecond))
	if err := sleepCtx(ctx, a.d); err != nil {
		return err
	}
	start := time.Now()
	if err := n.Start(ctx); err != nil {
		return fmt.Errorf("restarting broker %d: %w", n.ID, err)
	}
	h.logf("broker %d restarted in %.1fs", n.ID, time.Since(start).Seconds())
	return nil
}

// pauseBroker stops the consumer group's coordinator with SIGSTOP for a.d,
// then continues it.
func (h *harness) pauseBroker(ctx context.Context, a action) error {
	bf := h.broker
	id := int32(-1)
	for _, r := range kadm.NewClient(h.inj.raw).FindGroupCoordinators(ctx, h.env.service) {
		if r.Err == nil {
			id = r.NodeID
		}
	}
	n := bf.cluster.Node(int(id) - 1)
	if n == nil || !n.Running() {
		n = bf.cluster.Node(int(a.pick % uint64(len(bf.cluster.Nodes()))))
	}
	if err := n.Pause(); err != nil {
		return err
	}
	bf.mu.Lock()
	bf.pauses++
	bf.mu.Unlock()
	h.addFault()
	h.logf("broker %d (the consumer group's coordinator: %t) paused for %s", n.ID, n.ID == id, a.d.Round(time.Millisecond))
	err := sleepCtx(ctx, a.d)
	if rerr := n.Resume(); rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	h.logf("broker %d resumed", n.ID)
	return bf.cluster.WaitReady(ctx)
}

// refuseWrites makes the brokers refuse the main topic's acks=all writes
// (beginRefusal) for a.d, then accepts them again.
func (h *harness) refuseWrites(ctx context.Context, a action) error {
	var avoid []int32
	cctx, cancel := context.WithTimeout(ctx, refuseAttempt)
	coords := kadm.NewClient(h.inj.raw).FindGroupCoordinators(cctx, h.env.service+".outbox-publisher", h.env.service)
	cancel()
	for _, g := range []string{h.env.service + ".outbox-publisher", h.env.service} {
		if r, ok := coords[g]; ok && r.Err == nil {
			avoid = append(avoid, r.NodeID)
		}
	}
	r, err := beginRefusal(ctx, h.broker.cluster, h.topic, a.pick, avoid...)
	if err != nil {
		return err
	}
	h.broker.mu.Lock()
	h.broker.refusals++
	h.broker.mu.Unlock()
	h.addFault()
	h.logf("%s refuses writes (min.insync.replicas=%d, broker %d paused, the groups' coordinators %v, every partition below it %.1fs later) for %s",
		h.topic, r.rf, r.node.ID, avoid, r.shrunk.Seconds(), a.d.Round(time.Millisecond))
	err = sleepCtx(ctx, a.d)
	// However the wait ended: a topic left refusing writes would stall
	// the run.
	if eerr := r.end(context.WithoutCancel(ctx)); eerr != nil {
		return errors.Join(err, eerr)
	}
	h.logf("%s accepts writes again (broker %d resumed); producers met %d refusals so far", h.topic, r.node.ID, h.env.produceWatch.count())
	return err
}

// runTopics are the Kafka topics of the run.
func (h *harness) runTopics() []string {
	return []string{h.topic, kafkaTopic(chainTopic()), kafkaTopic(recreateTopic())}
}

// mostLeader returns the running node leading the most partitions of the
// run's topics.
func (h *harness) mostLeader(ctx context.Context) (*apachekafka.Node, string, error) {
	md, err := kadm.NewClient(h.inj.raw).Metadata(ctx, h.runTopics()...)
	if err != nil {
		return nil, "", err
	}
	led := map[int32]int{}
	for _, t := range md.Topics {
		for _, p := range t.Partitions {
			if p.Err == nil && p.Leader >= 0 {
				led[p.Leader]++
			}
		}
	}
	var best *apachekafka.Node
	for _, n := range h.broker.cluster.Nodes() {
		if n.Running() && (best == nil || led[n.ID] > led[best.ID]) {
			best = n
		}
	}
	if best == nil {
		return nil, "", fmt.Errorf("no broker running")
	}
	return best, fmt.Sprintf("leading %d partitions", led[best.ID]), nil
}

// waitInSync waits until every partition of the run's topics has a leader
// and every replica in sync, polling with a backoff, for brokerInSyncWait
// at most.
func (h *harness) waitInSync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, brokerInSyncWait)
	defer cancel()
	adm := kadm.NewClient(h.inj.raw)
	backoff := 100 * time.Millisecond
	var behind []string
	for {
		behind = behind[:0]
		md, err := adm.Metadata(ctx, h.runTopics()...)
		if err == nil {
			for _, t := range md.Topics {
				if t.Err != nil {
					continue // the recreated topic, while it is gone
				}
				for _, p := range t.Partitions {
					if p.Err != nil || p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
						behind = append(behind, fmt.Sprintf("%s/%d", t.Topic, p.Partition))
					}
				}
			}
			if len(behind) == 0 {
				return nil
			}
		}
		if sleepCtx(ctx, backoff) != nil {
			slices.Sort(behind)
			return fmt.Errorf("replicas not in sync after %s: %s (last error: %v)", brokerInSyncWait, strings.Join(behind, ", "), err)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// addFault counts a fault carried out.
func (h *harness) addFault() {
	h.mu.Lock()
	h.faults++
	h.mu.Unlock()
}

// counts returns the broker faults carried out.
func (bf *brokerFaults) counts() brokerCounts {
	if bf == nil {
		return brokerCounts{}
	}
	bf.mu.Lock()
	defer bf.mu.Unlock()
	return brokerCounts{Apache: true, Nodes: len(bf.cluster.Nodes()), Kills: bf.kills, ControllerKills: bf.controllerKills,
		Pauses: bf.pauses, Refusals: bf.refusals, Skipped: bf.skipped}
}

// sinceFault is the time since the last broker fault began or ended, zero
// when there was none.
func (bf *brokerFaults) sinceFault() time.Duration {
	if bf == nil {
		return 0
	}
	bf.mu.Lock()
	defer bf.mu.Unlock()
	if bf.last.IsZero() {
		return 0
	}
	return time.Since(bf.last)
}

// Messages of the consumer's fetch watch (internal/kafkawatch/fetch.go)
// that restartCounter counts.
const (
	msgFetchRestart     = "restarting a partition's fetching"
	msgFetchResubscribe = "re-subscribing a topic: restarting its partition's fetching did not help"
)

// restartCounter is a slog.Handler that counts the fetch watch's restarts
// in the replicas' framework logs, whatever the level the harness logs at,
// and passes every record on to its inner handler when that one takes it.
// On a broker without the kafka-fetch-forget fault every restart is a
// partition the client stopped fetching on its own (or one the watch
// restarted needlessly): the run reports them (fetch_restarts) and logs
// each with the partition and the time since the last broker fault.
type restartCounter struct {
	inner slog.Handler
	attrs []slog.Attr
	rc    *restarts
}

// restarts is what restartCounter counted.
type restarts struct {
	mu               sync.Mutex
	restarts, resubs int
	note             func(msg string) // logs one restart
}

func (c *restartCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || c.inner.Enabled(ctx, l)
}

func (c *restartCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == msgFetchRestart || r.Message == msgFetchResubscribe {
		c.count(r)
	}
	if !c.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return c.inner.Handle(ctx, r)
}

// count counts one restart and logs it with its replica and partition.
func (c *restartCounter) count(r slog.Record) {
	var who []string
	add := func(a slog.Attr) bool {
		switch a.Key {
		case "replica", "partition", "offset":
			who = append(who, a.Key+"="+a.Value.String())
		}
		return true
	}
	for _, a := range c.attrs {
		add(a)
	}
	r.Attrs(add)
	c.rc.mu.Lock()
	kind := "restart"
	if r.Message == msgFetchResubscribe {
		c.rc.resubs++
		kind = "re-subscription"
	} else {
		c.rc.restarts++
	}
	note := c.rc.note
	c.rc.mu.Unlock()
	if note != nil {
		note(fmt.Sprintf("fetch watch %s: %s", kind, strings.Join(who, " ")))
	}
}

func (c *restartCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &restartCounter{inner: c.inner.WithAttrs(as), attrs: append(slices.Clone(c.attrs), as...), rc: c.rc}
}

func (c *restartCounter) WithGroup(name string) slog.Handler {
	return &restartCounter{inner: c.inner.WithGroup(name), attrs: c.attrs, rc: c.rc}
}

// countRestarts wraps the replicas' logger in a restartCounter.
func (h *harness) countRestarts(l *slog.Logger) *slog.Logger {
	h.restarts = &restarts{note: func(msg string) {
		if s := h.broker.sinceFault(); s > 0 {
			msg += fmt.Sprintf(" (%.1fs after the last broker fault began or ended)", s.Seconds())
		}
		h.logf("%s", msg)
	}}
	return slog.New(&restartCounter{inner: l.Handler(), rc: h.restarts})
}

// brokerCounts returns the run's broker faults, the produce refusals the
// replicas met and the fetch watch restarts.
func (h *harness) brokerCounts() brokerCounts {
	b := h.broker.counts()
	b.ProduceRefused = h.env.produceWatch.count()
	if h.restarts != nil {
		h.restarts.mu.Lock()
		b.FetchRestarts, b.FetchResubscribes = h.restarts.restarts, h.restarts.resubs
		h.restarts.mu.Unlock()
	}
	return b
}

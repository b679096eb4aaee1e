package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// refusal is the fault broker-refuse-writes in progress on one topic: the
// topic's min.insync.replicas raised to its replication factor and one
// broker paused (SIGSTOP). Once the controller fences the paused broker
// (its broker.session.timeout.ms, 9 s by default, passes without a
// heartbeat) it leaves every partition's ISR, which is then one short of
// the minimum: the leaders refuse acks=all writes with NOT_ENOUGH_REPLICAS
// (NOT_ENOUGH_REPLICAS_AFTER_APPEND for a write appended before the
// shrink), as they do when brokers are lost. The paused broker's
// leaderships move to the others meanwhile.
//
// Raising min.insync.replicas above the replication factor instead refuses
// nothing on Kafka 3.7 and later: the brokers enforce
// min(min.insync.replicas, replicas) (KAFKA-15583, part of KIP-966). A
// real full disk is not emulated: a log directory whose write fails goes
// offline and a broker whose only log directory is offline shuts down (the
// kills cover that), and an ENOSPC needs a size-limited file system (a
// loop or tmpfs mount), which needs root.
type refusal struct {
	c      *apachekafka.Cluster
	cl     *kgo.Client
	topic  string
	rf     int
	node   *apachekafka.Node // the paused broker
	shrunk time.Duration     // from the pause until every partition refused
}

// refuseShrinkWait bounds the wait, once a broker is paused, until every
// partition's ISR is below its minimum: the controller fences the broker
// after 9 s; a loaded machine needs more.
const refuseShrinkWait = time.Minute

// refuseAttempt bounds one request of the fault: a request sent to the
// paused broker is never answered, and is retried on another.
const refuseAttempt = 5 * time.Second

// beginRefusal makes the brokers refuse topic's acks=all writes and returns
// once every partition of topic has a leader and fewer replicas in sync
// than its minimum. It pauses a running broker: none of avoid when it can,
// the earlier ones avoided first, then not the active controller, then the
// one leading the fewest of topic's partitions, pick breaking ties. A
// paused group coordinator would stop its group's members (a publisher
// whose coordinator does not answer pauses publishing and never meets the
// refusal): the harness passes the publisher group's coordinator, then
// the consumer group's. On error nothing is left changed.
func beginRefusal(ctx context.Context, c *apachekafka.Cluster, topic string, pick uint64, avoid ...int32) (*refusal, error) {
	var seeds []string
	for _, n := range c.Nodes() {
		if n.Running() && !n.Paused() {
			seeds = append(seeds, n.Addr)
		}
	}
	if len(seeds) < 2 {
		return nil, fmt.Errorf("refusing writes needs two running brokers, %d run", len(seeds))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DialTimeout(time.Second))
	if err != nil {
		return nil, err
	}
	r := &refusal{c: c, cl: cl, topic: topic}
	md, err := r.metadata(ctx)
	if err != nil {
		cl.Close()
		return nil, err
	}
	led := map[int32]int{}
	for _, p := range md.Partitions {
		led[p.Leader]++
		if r.rf == 0 || len(p.Replicas) < r.rf {
			r.rf = len(p.Replicas)
		}
	}
	if r.rf < 2 {
		cl.Close()
		return nil, fmt.Errorf("%s has replication factor %d: a broker paused leaves no leader to refuse", topic, r.rf)
	}
	var ctrl int32 = -1
	cctx, cancel := context.WithTimeout(ctx, refuseAttempt)
	if n, err := c.Controller(cctx); err == nil {
		ctrl = n.ID
	}
	cancel()
	var cands []*apachekafka.Node
	for _, n := range c.Nodes() {
		if n.Running() && !n.Paused() {
			cands = append(cands, n)
		}
	}
	// Rotate by pick, then order by what pausing costs: ties go to pick.
	avoid = append(slices.Clone(avoid), ctrl)
	cost := func(n *apachekafka.Node) int {
		if i := slices.Index(avoid, n.ID); i >= 0 {
			return len(avoid) - i
		}
		return 0
	}
	k := int(pick % uint64(len(cands)))
	cands = append(cands[k:], cands[:k]...)
	slices.SortStableFunc(cands, func(a, b *apachekafka.Node) int {
		return cmp.Or(cmp.Compare(cost(a), cost(b)), cmp.Compare(led[a.ID], led[b.ID]))
	})
	r.node = cands[0]

	if err := r.alter(ctx, kadm.SetConfig, strconv.Itoa(r.rf)); err != nil {
		cl.Close()
		return nil, fmt.Errorf("min.insync.replicas=%d on %s: %w", r.rf, topic, err)
	}
	if err := r.node.Pause(); err != nil {
		return nil, errors.Join(err, r.end(context.WithoutCancel(ctx)))
	}
	start := time.Now()
	if err := r.waitRefusing(ctx); err != nil {
		return nil, errors.Join(err, r.end(context.WithoutCancel(ctx)))
	}
	r.shrunk = time.Since(start)
	return r, nil
}

// metadata returns topic's metadata, retrying each attempt that a paused
// broker leaves unanswered.
func (r *refusal) metadata(ctx context.Context) (kadm.TopicDetail, error) {
	adm := kadm.NewClient(r.cl)
	backoff := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, refuseAttempt)
		md, err := adm.Metadata(actx, r.topic)
		cancel()
		if err == nil {
			td, ok := md.Topics[r.topic]
			switch {
			case !ok:
				err = fmt.Errorf("%s is not in the metadata", r.topic)
			case td.Err != nil:
				err = td.Err
			case len(td.Partitions) == 0:
				err = fmt.Errorf("%s has no partition", r.topic)
			default:
				return td, nil
			}
		}
		if serr := sleepCtx(ctx, backoff); serr != nil {
			return kadm.TopicDetail{}, fmt.Errorf("metadata of %s: %w (last error: %v)", r.topic, serr, err)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// alter sets (or, with kadm.DeleteConfig, removes) the topic's
// min.insync.replicas, retrying each attempt that fails or goes
// unanswered, up to 10 attempts.
func (r *refusal) alter(ctx context.Context, op kadm.IncrementalOp, v string) error {
	adm := kadm.NewClient(r.cl)
	ac := kadm.AlterConfig{Op: op, Name: "min.insync.replicas"}
	if op == kadm.SetConfig {
		ac.Value = &v
	}
	var err error
	for try := 0; try < 10; try++ {
		actx, cancel := context.WithTimeout(ctx, refuseAttempt)
		var res kadm.AlterConfigsResponses
		res, err = adm.AlterTopicConfigs(actx, []kadm.AlterConfig{ac}, r.topic)
		cancel()
		if err == nil {
			for _, x := range res {
				err = cmp.Or(err, x.Err)
			}
		}
		if err == nil || sleepCtx(ctx, time.Second) != nil {
			break
		}
	}
	return err
}

// waitRefusing waits until every partition of the topic has a running
// leader and fewer than rf replicas in sync, for refuseShrinkWait at most.
func (r *refusal) waitRefusing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, refuseShrinkWait)
	defer cancel()
	backoff := 100 * time.Millisecond
	var behind []int32
	for {
		md, err := r.metadata(ctx)
		if err != nil {
			return fmt.Errorf("%s: ISR not below %d within %s after pausing broker %d: %w (partitions still in sync: %v)",
				r.topic, r.rf, refuseShrinkWait, r.node.ID, err, behind)
		}
		behind = behind[:0]
		for _, p := range md.Partitions.Sorted() {
			if p.Err != nil || p.Leader < 0 || p.Leader == r.node.ID || len(p.ISR) >= r.rf {
				behind = append(behind, p.Partition)
			}
		}
		if len(behind) == 0 {
			return nil
		}
		if err := sleepCtx(ctx, backoff); err != nil {
			return fmt.Errorf("%s: ISR not below %d within %s after pausing broker %d (partitions still in sync: %v)",
				r.topic, r.rf, refuseShrinkWait, r.node.ID, behind)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// end restores the topic's min.insync.replicas (the brokers' default) and
// resumes the paused broker, whatever else fails, and waits until every
// broker lists every other.
func (r *refusal) end(ctx context.Context) error {
	defer r.cl.Close()
	var errs []error
	if err := r.alter(ctx, kadm.DeleteConfig, ""); err != nil {
		errs = append(errs, fmt.Errorf("restoring min.insync.replicas of %s: %w", r.topic, err))
	}
	if r.node.Paused() {
		if err := r.node.Resume(); err != nil {
			errs = append(errs, err)
		} else if err := r.c.WaitReady(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

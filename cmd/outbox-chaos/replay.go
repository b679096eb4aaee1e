package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Replays: the faults that deliver events already handled, by the thousand,
// so that the inbox's "already handled" test is exercised on purpose, not
// only around the odd kill (see fOffsetRewind, fRogueProducer).

// replay executes one replay action. It reports whether it took place.
func (h *harness) replay(ctx context.Context, a action) (bool, error) {
	switch a.kind {
	case fOffsetRewind:
		return h.rewindOffsets(ctx, a)
	case fRogueProducer:
		return h.rogueProduce(ctx, a)
	}
	return false, fmt.Errorf("unknown replay %q", a.kind)
}

// rewindOffsets kills the replica of a.slot and moves the consumer group's
// committed offsets of the partitions it consumed back by up to a.n
// records each: their next owners deliver every record from there again.
//
// The kill comes first because a live owner would overwrite the rewound
// offsets with its next commit, and would not read them before its next
// assignment anyway; a killed one commits nothing more, and the group hands
// its partitions on once its session expires, seconds later. The commit
// names the killed member and its generation (see commitAsMember): Kafka
// refuses offset commits for a group with members from anyone else
// (kadm's CommitOffsets names none, and is refused), and kfake does the
// same; and once the group has a new generation the partitions may have a
// new owner that read the offsets, so the rewind is dropped then.
func (h *harness) rewindOffsets(ctx context.Context, a action) (bool, error) {
	// The group may be rebalancing (members hold no partitions then), or
	// have committed nothing yet: look again for a while.
	var slot int
	var name string
	var owned map[string][]int32
	for tries := 0; ; tries++ {
		var err error
		slot, name, owned, err = h.rewindVictim(ctx, a.slot)
		if err != nil {
			return false, err
		}
		if slot >= 0 {
			break
		}
		if tries == 40 {
			return false, errors.New("no live replica consumes partitions with committed offsets")
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return false, nil
		}
	}
	adm := kadm.NewClient(h.inj.raw)
	// The victim's identity in the group, read right before it dies: the
	// rewind is committed in its name and generation only, which Kafka
	// accepts while the group has not moved its partitions on. Once they
	// are assigned again, a new owner may have read the offsets already:
	// a rewind landing then would leave the partition behind, behind a
	// worker that has nothing new to commit (no replica of a running
	// service commits for partitions it does not own).
	h.waitChurn()
	member, gen, known := h.klog.consumerMember(h.env.service, []string{name})
	if !known {
		return false, fmt.Errorf("%s has no member identity in the group", name)
	}
	r := h.killSlotNow(slot)
	if r == nil || r.name != name {
		return false, fmt.Errorf("%s went away", name)
	}
	// The slot starts again after a.d, as after a kill.
	h.bg.Go(func() {
		if sleepCtx(ctx, a.d) == nil {
			if _, err := h.startIfDown(slot); err != nil {
				h.logf("%s: restart of slot %d failed: %v", a, slot, err)
			}
		}
	})
	// Commits the replica had in flight when its network was cut may still
	// land; let them.
	if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
		return false, nil
	}
	committed, err := adm.FetchOffsets(ctx, h.env.service)
	if err != nil {
		return false, fmt.Errorf("fetch offsets: %w", err)
	}
	// Newer brokers name the topics of an offset commit by id.
	details, err := adm.ListTopics(ctx, slices.Collect(maps.Keys(owned))...)
	if err != nil {
		return false, fmt.Errorf("list topics: %w", err)
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = h.env.service
	back := int64(0)
	for topic, ps := range owned {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = topic, details[topic].ID
		for _, p := range ps {
			c, ok := committed.Lookup(topic, p)
			if !ok || c.Err != nil || c.At <= 0 {
				continue
			}
			n := min(c.At, int64(a.n))
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, c.At-n, -1
			rt.Partitions = append(rt.Partitions, rp)
			back += n
		}
		if len(rt.Partitions) > 0 {
			req.Topics = append(req.Topics, rt)
		}
	}
	if len(req.Topics) == 0 {
		return false, fmt.Errorf("nothing committed yet on %v", owned)
	}
	// A rebalance under way refuses commits for a moment: retry until the
	// killed member's session is about to expire. A new generation refuses
	// them for good.
	deadline := time.Now().Add(h.env.sessionTimeout - time.Second)
	for {
		err := h.commitAsMember(ctx, req, member, gen)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil || errors.Is(err, kerr.IllegalGeneration) || errors.Is(err, kerr.UnknownMemberID) {
			// The kill happened, the rewind did not: not counted.
			return false, fmt.Errorf("rewind %v of %s: %w", owned, r.name, err)
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return false, nil
		}
	}
	h.mu.Lock()
	h.rewound += int(back)
	h.mu.Unlock()
	h.logf("%s rewound %d records of %v (consumed by killed %s)", a, back, owned, r.name)
	return true, nil
}

// rewindVictim picks the replica a rewind kills: the replica of slot, or
// the next live one that consumes partitions with committed offsets (a
// replica just started, or one in a rebalance, holds none); those that
// publish too first: they have joined both their groups (one killed while
// its join is parked leaves kfake waiting for it, see expireMembers). slot
// is -1 when none fits.
func (h *harness) rewindVictim(ctx context.Context, want int) (slot int, name string, owned map[string][]int32, err error) {
	adm := kadm.NewClient(h.inj.raw)
	groups, err := adm.DescribeGroups(ctx, h.env.service)
	if err != nil {
		return -1, "", nil, fmt.Errorf("describe group: %w", err)
	}
	committed, err := adm.FetchOffsets(ctx, h.env.service)
	if err != nil {
		return -1, "", nil, fmt.Errorf("fetch offsets: %w", err)
	}
	consumed := func(name string) map[string][]int32 {
		owned := map[string][]int32{}
		for _, m := range groups[h.env.service].Members {
			if m.ClientID != "chaos-"+name {
				continue
			}
			if c, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range c.Topics {
					if t.Topic == kafkaTopic(recreateTopic()) {
						continue // deleted and created again meanwhile, maybe: see fRecreateTopic
					}
					for _, p := range t.Partitions {
						if o, ok := committed.Lookup(t.Topic, p); ok && o.Err == nil && o.At > 0 {
							owned[t.Topic] = append(owned[t.Topic], p)
						}
					}
				}
			}
		}
		return owned
	}
	h.mu.Lock()
	names := map[int]string{}
	for s, r := range h.slots {
		names[s] = r.name
	}
	h.mu.Unlock()
	slots := slices.Sorted(maps.Keys(names))
	start := max(0, slices.IndexFunc(slots, func(s int) bool { return s >= want }))
	for _, publishing := range []bool{true, false} {
		for i := range slots {
			s := slots[(start+i)%len(slots)]
			if o := consumed(names[s]); len(o) > 0 && h.klog.publishing(names[s]) == publishing {
				return s, names[s], o, nil
			}
		}
	}
	return -1, "", nil, nil
}

// errRetryCommit: the group refused the commit (a rebalance under way, for
// now; a new generation or an unknown member, for good).
var errRetryCommit = errors.New("commit refused for now")

// commitAsMember sends req in the name of a member of the consumer group
// and its generation.
func (h *harness) commitAsMember(ctx context.Context, req *kmsg.OffsetCommitRequest, member string, gen int32) error {
	req.MemberID, req.Generation = member, gen
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, h.inj.raw)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%w: %s/%d: %w", errRetryCommit, t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

// rogueProduce produces again up to a.n records the replicas' publishers
// produced lately, to the same partitions: deliveries of events that are
// handled (or being handled) already.
func (h *harness) rogueProduce(ctx context.Context, a action) (bool, error) {
	rng := rand.New(rand.NewPCG(a.pick, 0x709e))
	// Records that fit the topic's limit may not fit a small-limit window:
	// wait for it to close, and for records to copy.
	var recs []*kgo.Record
	for {
		if h.work.smallLimit.Load() == 0 {
			if recs = h.klog.sample(a.n, rng.IntN); len(recs) > 0 {
				break
			}
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return false, nil
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res := h.inj.raw.ProduceSync(pctx, recs...)
	ok := make([]recordPosID, 0, len(res))
	var doubt []recordPosID
	var firstErr error
	for _, pr := range res {
		p := recordPosID{recordPos{bareTopic(pr.Record.Topic), pr.Record.Partition, pr.Record.Offset}, idOf(pr.Record)}
		if pr.Err != nil {
			doubt = append(doubt, p)
			if firstErr == nil {
				firstErr = pr.Err
			}
			continue
		}
		ok = append(ok, p)
	}
	h.klog.noteRogue(ok, doubt)
	h.mu.Lock()
	h.rogueRecords += len(ok)
	h.mu.Unlock()
	h.logf("%s produced %d records again (%d failed)", a, len(ok), len(doubt))
	return len(ok) > 0, firstErr
}

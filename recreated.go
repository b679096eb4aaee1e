package outbox

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/retry"
)

// Topics deleted and created again.
//
// kgo keeps the id it first learnt of a topic and never adopts a new one: a
// topic deleted and created again answers UNKNOWN_TOPIC_ID to the client for
// good (by design, franz-go issue 908). The way out is to purge the topic
// from the client and add it again (resubscribe).
//
// The error reaches the poll loop in two shapes. A fetch of an owned
// partition answers it on every fetch, for as long as it lasts. A partition
// assigned after the recreation to a client that still holds the old id
// answers it once: kgo's offset fetch retries it three times, then hands a
// single error to the poll and drops the partition from the assignment, so
// nothing fetches it until the next rebalance (seen in the chaos run: a
// partition of the recreated topic handled by nobody for 90 s). So the
// decision cannot wait for the error to repeat: the recreation watcher asks
// the broker for the topic's id and compares it with the id the client
// uses (the error's own, a fetch's, or the one listed when the consumer
// started). A different id is a recreation; the same id is a topic still
// being created, which clears on its own; a topic the broker does not know
// is deleted and watched until it comes back.
//
// The watcher is one goroutine, started and stopped by runConsumer (before
// the client closes). The poll loop only notes what it saw (note).

const (
	// recreatedAfter is how long a topic must answer UNKNOWN_TOPIC_ID
	// before it is taken for created again when the id the client uses is
	// not known.
	recreatedAfter = 3 * time.Second
	// recreateFirstCheck is how long after a topic's first
	// UNKNOWN_TOPIC_ID the watcher asks the broker; recreateMaxCheck
	// bounds the backoff of the later checks.
	recreateFirstCheck = 500 * time.Millisecond
	recreateMaxCheck   = 30 * time.Second
	// recreateTimeout bounds each request of the watcher.
	recreateTimeout = 10 * time.Second
)

// unknownTopic is what the poll loop saw of one topic answering
// UNKNOWN_TOPIC_ID.
type unknownTopic struct {
	first, last time.Time
	// clientID is the id the client sent, from the error's fetch (zero
	// when the error was kgo's own, from its offset fetch).
	clientID kadm.TopicID
	due      time.Time
	checks   int
}

// recreationWatch decides which topics were created again and resubscribes
// them.
type recreationWatch struct {
	cons *consumer
	wake chan struct{}

	mu      sync.Mutex
	pending map[string]*unknownTopic // by Kafka topic
	// known is the id of each topic as the client uses it: listed when
	// the consumer started, learnt from fetches, set by a resubscription.
	known map[string]kadm.TopicID
	// retired are the ids each topic had before the client resubscribed:
	// a late error of their fetches is no new recreation.
	retired map[string]map[kadm.TopicID]bool
}

func newRecreationWatch(cons *consumer) *recreationWatch {
	return &recreationWatch{cons: cons, wake: make(chan struct{}, 1),
		pending: map[string]*unknownTopic{}, known: map[string]kadm.TopicID{}, retired: map[string]map[kadm.TopicID]bool{}}
}

// note records a poll's UNKNOWN_TOPIC_ID errors and the topic ids of its
// fetches. Called by the poll loop.
func (w *recreationWatch) note(fetches kgo.Fetches) {
	now := time.Now()
	woke := false
	w.mu.Lock()
	for _, f := range fetches {
		for _, ft := range f.Topics {
			for _, p := range ft.Partitions {
				switch {
				case errors.Is(p.Err, kerr.UnknownTopicID):
					u := w.pending[ft.Topic]
					if u == nil {
						u = &unknownTopic{first: now, due: now.Add(recreateFirstCheck)}
						w.pending[ft.Topic] = u
						woke = true
					}
					u.last = now
					if ft.TopicID != ([16]byte{}) {
						u.clientID = kadm.TopicID(ft.TopicID)
					}
				case p.Err == nil && len(p.Records) > 0 && ft.TopicID != ([16]byte{}):
					w.known[ft.Topic] = kadm.TopicID(ft.TopicID)
				}
			}
		}
	}
	w.mu.Unlock()
	if woke {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// start runs the watcher until ctx ends or stop is called; stop waits for
// it to return.
func (w *recreationWatch) start(ctx context.Context, kafkaTopics []string) (stop func()) {
	return startStoppable(ctx, func(ctx context.Context) { w.run(ctx, kafkaTopics) })
}

func (w *recreationWatch) run(ctx context.Context, kafkaTopics []string) {
	w.learn(ctx, kafkaTopics)
	for {
		var timer *time.Timer
		var fire <-chan time.Time
		if next, ok := w.nextDue(); ok {
			timer = time.NewTimer(time.Until(next))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		w.checkDue(ctx)
	}
}

// learn lists the ids of the subscribed topics as the consumer starts: the
// ids the client learns at the same moment. A topic the listing misses is
// learnt from its first fetch.
func (w *recreationWatch) learn(ctx context.Context, kafkaTopics []string) {
	lctx, cancel := context.WithTimeout(ctx, recreateTimeout)
	defer cancel()
	details, err := kadm.NewClient(w.cons.cl).ListTopics(lctx, kafkaTopics...)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for t, d := range details {
		if _, ok := w.known[t]; !ok && d.Err == nil && d.ID != (kadm.TopicID{}) {
			w.known[t] = d.ID
		}
	}
}

func (w *recreationWatch) nextDue() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var next time.Time
	for _, u := range w.pending {
		if next.IsZero() || u.due.Before(next) {
			next = u.due
		}
	}
	return next, !next.IsZero()
}

// checkDue decides the topics whose check is due.
func (w *recreationWatch) checkDue(ctx context.Context) {
	now := time.Now()
	var due []string
	w.mu.Lock()
	for t, u := range w.pending {
		if !u.due.After(now) {
			due = append(due, t)
		}
	}
	w.mu.Unlock()
	for _, t := range due {
		if ctx.Err() != nil {
			return
		}
		w.check(ctx, t)
	}
}

// recreateVerdict is what a check decides of a topic.
type recreateVerdict int

const (
	verdictWait      recreateVerdict = iota // look again later
	verdictRecreated                        // resubscribe
	verdictRecovered                        // forget it
)

// decideRecreated judges a topic from the broker's answer (id, or exists
// false), what the poll loop saw, the id the client is known to use and the
// ids it left, at now. A pure function, for the tests.
func decideRecreated(u unknownTopic, known kadm.TopicID, retired map[kadm.TopicID]bool, brokerID kadm.TopicID, exists bool, now time.Time) recreateVerdict {
	if retired[u.clientID] {
		// An error of the fetches of an id this client already left (noted
		// before its purge): not a new recreation.
		u.clientID = kadm.TopicID{}
	}
	if !exists {
		// Deleted and not created again yet (or the broker cannot say):
		// watched until it comes back, even if the errors stopped (a
		// partition kgo dropped after its offset fetch fails once).
		return verdictWait
	}
	clientID := u.clientID
	if clientID == (kadm.TopicID{}) {
		clientID = known
	}
	stillFailing := now.Sub(u.last) < recreatedAfter
	switch {
	case clientID != (kadm.TopicID{}) && clientID != brokerID:
		return verdictRecreated
	case clientID == (kadm.TopicID{}) && stillFailing && u.last.Sub(u.first) >= recreatedAfter:
		// The client's id is not known: the error has lasted.
		return verdictRecreated
	case stillFailing:
		// The same id (a topic being created), or not known yet.
		return verdictWait
	}
	return verdictRecovered
}

func (w *recreationWatch) check(ctx context.Context, t string) {
	brokerID, exists := w.brokerID(ctx, t)
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	u := w.pending[t]
	if u == nil {
		w.mu.Unlock()
		return
	}
	verdict := decideRecreated(*u, w.known[t], w.retired[t], brokerID, exists, time.Now())
	switch verdict {
	case verdictWait:
		u.checks++
		u.due = time.Now().Add(min(recreateFirstCheck<<min(u.checks, 10), recreateMaxCheck))
	case verdictRecreated:
		delete(w.pending, t)
		if w.retired[t] == nil {
			w.retired[t] = map[kadm.TopicID]bool{}
		}
		for _, old := range []kadm.TopicID{u.clientID, w.known[t]} {
			if old != (kadm.TopicID{}) && old != brokerID {
				w.retired[t][old] = true
			}
		}
		w.known[t] = brokerID
	case verdictRecovered:
		delete(w.pending, t)
	}
	w.mu.Unlock()
	if verdict == verdictRecreated {
		w.cons.log.Warn("topic deleted and created again (UNKNOWN_TOPIC_ID); subscribing to the new topic from its start", "topic", w.cons.c.cfg.bareTopic(t))
		w.cons.resubscribe(ctx, t, brokerID)
		// Errors noted while it resubscribed came from the old id's
		// fetches: judged afresh from the next one.
		w.mu.Lock()
		delete(w.pending, t)
		w.mu.Unlock()
	}
}

// brokerID asks the broker for a topic's id; exists is false when the
// topic is not there or the broker cannot say.
func (w *recreationWatch) brokerID(ctx context.Context, t string) (id kadm.TopicID, exists bool) {
	lctx, cancel := context.WithTimeout(ctx, recreateTimeout)
	defer cancel()
	details, err := kadm.NewClient(w.cons.cl).ListTopics(lctx, t)
	if err != nil {
		return id, false
	}
	d, ok := details[t]
	if !ok || d.Err != nil || d.ID == (kadm.TopicID{}) {
		return id, false
	}
	return d.ID, true
}

// resubscribe subscribes to a topic that was deleted and created again (its
// new id is id), from the start of the new topic: the offsets the group
// committed belong to the old one, and one inside the new topic's range
// would skip its first records. The topic's workers stop without committing
// (their offsets are the old topic's), the topic leaves the client, the
// group's offsets of the topic are set to the new topic's start (Kafka does
// not check that a committing member owns a partition), and the topic is
// added again. A redelivery this causes is skipped by the inbox.
//
// The offsets are set once per recreation, by the first replica that
// resubscribes (resetTopicOnce): every replica that held the old id
// resubscribes, some of them late (one assigned a partition of the topic
// only later), and a late reset would rewind partitions that other
// replicas already consume on the new topic, behind workers that have
// nothing new to commit: their partitions would stay behind, settled, until
// the next rebalance (the chaos short run's stalled partitions).
func (cons *consumer) resubscribe(ctx context.Context, t string, id kadm.TopicID) {
	// Before the purge: this member's session is not in the rebalance the
	// purge starts.
	cons.readdTopic(t, func() { cons.resetTopicOnce(ctx, t, id) })
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

// resetTopicOnce sets the group's offsets of a recreated topic to its start
// unless another replica did or is doing it. The replica that inserts the
// topic's reset document (outbox_meta, one per consumer group, topic and
// topic id) sets the offsets and marks the document done; the others wait
// for done (at most resetWait) before they add the topic again, since
// fetching the old offsets first would skip records. A claim that is not
// done in time (its replica died, or failed and withdrew it) is taken over:
// the offsets are set again, which redelivers what was consumed meanwhile
// rather than skip anything.
func (cons *consumer) resetTopicOnce(parent context.Context, t string, id kadm.TopicID) {
	bare := cons.c.cfg.bareTopic(t)
	ctx, cancel := context.WithTimeout(parent, cmp.Or(cons.c.test.resetWait, resetWait)+recreateTimeout)
	defer cancel()
	if cons.c.resetCrash(ctx, "begin") {
		return
	}
	claimed, err := cons.claimTopicReset(ctx, t, id)
	if err != nil {
		cons.log.Warn("claiming the reset of a recreated topic's offsets failed; setting them", "topic", bare, "err", err)
		claimed = true
	}
	if claimed && cons.c.resetCrash(ctx, "claimed") {
		return
	}
	if !claimed && cons.awaitTopicReset(ctx, t, id) {
		return
	}
	rctx, rcancel := context.WithTimeout(ctx, resetCommitBound)
	defer rcancel()
	err = cons.commitTopicStart(rctx, t, id)
	if err == nil && cons.c.resetCrash(ctx, "committed") {
		return
	}
	// The document's writes outlive the commit's bound and a shutdown.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), recreateTimeout)
	defer mcancel()
	if err != nil {
		if parent.Err() == nil { // not a shutdown
			cons.log.Warn("setting the group's offsets of a recreated topic to its start failed; records before the old offsets may be skipped",
				"topic", bare, "err", err)
			cons.c.tel.setError(fmt.Errorf("recreated topic %s: set offsets to its start: %w", bare, err))
		}
		// Withdrawn, so that the next replica to resubscribe tries.
		_, _ = cons.c.meta.DeleteOne(mctx, bson.D{{Key: "_id", Value: cons.topicResetID(t, id)}, {Key: "done_at", Value: bson.D{{Key: "$exists", Value: false}}}})
		return
	}
	if _, err := cons.c.meta.UpdateOne(mctx, bson.D{{Key: "_id", Value: cons.topicResetID(t, id)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "done_at", Value: time.Now().UTC()}, {Key: "replica", Value: cons.c.cfg.ReplicaID}}}},
		options.UpdateOne().SetUpsert(true)); err != nil {
		cons.log.Warn("recording that the group's offsets of a recreated topic were set to its start failed; a replica that resubscribes later sets them again (a redelivery)",
			"topic", bare, "err", err)
	}
}

const (
	// resetCommitBound bounds the tries of the reset's commit (a group
	// rebalancing refuses it until the rebalance ends); resetWait how long
	// a resubscribing replica waits for another replica's reset, a little
	// longer.
	resetCommitBound = 20 * time.Second
	resetWait        = resetCommitBound + 5*time.Second
)

// resetCrash is the crash tests' hook in resetTopicOnce: at each step
// ("begin", "claimed": the claim written, "committed": the offsets set,
// done not written yet) it reports whether the replica dies there, leaving
// what it wrote as a crash would. Always false outside tests.
func (c *Client) resetCrash(ctx context.Context, step string) bool {
	return c.test.resetHook != nil && c.test.resetHook(ctx, step)
}

// topicResetID is the _id of the outbox_meta document of the reset of a
// recreated topic's offsets for the consumer group.
func (cons *consumer) topicResetID(t string, id kadm.TopicID) bson.D {
	return bson.D{{Key: "recreated", Value: cons.c.cfg.ConsumerGroup}, {Key: "topic", Value: t}, {Key: "id", Value: hex.EncodeToString(id[:])}}
}

// claimTopicReset inserts the reset document of the topic of that id; it
// reports whether this replica inserted it.
func (cons *consumer) claimTopicReset(ctx context.Context, t string, id kadm.TopicID) (bool, error) {
	res, err := cons.c.meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: cons.topicResetID(t, id)}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{
			{Key: "claimed_at", Value: time.Now().UTC()},
			{Key: "replica", Value: cons.c.cfg.ReplicaID},
		}}},
		options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return false, nil // inserted by another replica at the same moment
	}
	if err != nil {
		return false, err
	}
	return res.UpsertedCount == 1, nil
}

// awaitTopicReset waits, at most resetWait, until the reset document of the
// topic of that id is done; it reports whether it is.
func (cons *consumer) awaitTopicReset(ctx context.Context, t string, id kadm.TopicID) bool {
	start := time.Now()
	deadline := start.Add(cmp.Or(cons.c.test.resetWait, resetWait))
	logged := false
	for attempt := 0; ; attempt++ {
		var doc struct {
			DoneAt  *time.Time `bson:"done_at"`
			Replica string     `bson:"replica"`
		}
		err := cons.c.meta.FindOne(ctx, bson.D{{Key: "_id", Value: cons.topicResetID(t, id)}}).Decode(&doc)
		if err == nil && doc.DoneAt != nil {
			return true
		}
		if errors.Is(err, mongo.ErrNoDocuments) || time.Now().After(deadline) {
			return false // withdrawn, or not done in time: set them here
		}
		if !logged && time.Since(start) >= waitVisible {
			logged = true
			cons.log.Warn("waiting for another replica to set the group's offsets of a recreated topic to its start",
				"topic", cons.c.cfg.bareTopic(t), "replica", doc.Replica, "for", time.Since(start).Round(time.Second), "at_most", deadline.Sub(start))
		}
		if !retry.Sleep(ctx, nil, min(cons.c.cfg.backoff().Delay(attempt), time.Second)) {
			return false
		}
	}
}

// commitTopicStart commits the log start offsets of every partition of t
// (the topic of that id) for the consumer's group, until it is accepted or
// ctx ends. It sends the commit itself, in the name of this member and its
// current generation read at each try, naming the new topic's id: the
// client's own commit path waits for a join in progress (the resubscription's
// own rebalance, others' under load: a bounded try used to time out) and
// names the id the client holds, the old one.
func (cons *consumer) commitTopicStart(ctx context.Context, t string, id kadm.TopicID) error {
	starts, err := kadm.NewClient(cons.cl).ListStartOffsets(ctx, t)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	for attempt := 0; ; attempt++ {
		err := cons.commitTopicOffsets(ctx, t, id, starts)
		if err == nil {
			return nil
		}
		if !retry.Sleep(ctx, nil, min(cons.c.cfg.backoff().Delay(attempt), time.Second)) {
			return fmt.Errorf("%w (last refusal: %w)", ctx.Err(), err)
		}
	}
}

// commitTopicOffsets sends one offset commit of the listed offsets of t.
func (cons *consumer) commitTopicOffsets(ctx context.Context, t string, id kadm.TopicID, offsets kadm.ListedOffsets) error {
	member, gen := cons.cl.GroupMetadata()
	if member == "" || gen < 0 {
		return errors.New("not a member of the group yet")
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = cons.c.cfg.ConsumerGroup
	req.MemberID, req.Generation = member, gen
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = t, id
	offsets.Each(func(o kadm.ListedOffset) {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = o.Partition, o.Offset, -1
		rt.Partitions = append(rt.Partitions, rp)
	})
	req.Topics = append(req.Topics, rt)
	cctx, cancel := context.WithTimeout(ctx, recreateTimeout)
	defer cancel()
	resp, err := req.RequestWith(cctx, cons.cl)
	if err != nil {
		return err
	}
	return offsetCommitErr(resp)
}

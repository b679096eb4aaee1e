package kafkawatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/retry"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// Topics deleted and created again.
//
// kgo keeps the id it first learnt of a topic and never adopts a new one
// (by design: franz-go issue 908): a topic deleted and created again
// answers UNKNOWN_TOPIC_ID to the client for good. The way out is to purge
// the topic from the client and add it again (resubscribe).
//
// The error reaches the poll loop in two shapes. A fetch of an owned
// partition answers it on every fetch, for as long as it lasts. A partition
// assigned after the recreation to a client that still holds the old id
// answers it once: kgo's offset fetch retries it three times, then hands a
// single error to the poll and drops the partition from the assignment, so
// nothing fetches it until the next rebalance. So the decision cannot wait
// for the error to repeat: the watcher asks the broker for the topic's id
// and compares it with the id the client uses (the error's own, a fetch's,
// or the one listed when the consumer started). A different id is a
// recreation; the same id is a topic still being created, which clears on
// its own; a topic the broker does not know is deleted and watched until
// it comes back.
//
// The watcher is one goroutine (RecreationWatch.Run), started and stopped
// by the consumer (before its client closes). The poll loop only notes
// what it saw (RecreationWatch.Note).

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
	// resetCommitBound bounds the tries of the reset's commit (a group
	// rebalancing refuses it until the rebalance ends); resetWait how long
	// a resubscribing replica waits for another replica's reset, a little
	// longer.
	resetCommitBound = 20 * time.Second
	resetWait        = resetCommitBound + 5*time.Second
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

// Resets keeps the claims of the resets of a consumer group's offsets of
// recreated topics, one per topic and topic id, in a store every replica
// of the group reads (the root gives it the outbox_meta collection through
// internal/store). Ids are Kafka topic ids.
type Resets interface {
	// Claim inserts the claim of the reset of topic (of that id) unless
	// there is one; it reports whether this call inserted it.
	Claim(ctx context.Context, topic string, id [16]byte) (bool, error)
	// State reads the claim: found is false when there is none (never
	// made, or withdrawn), done is true once its offsets were set; replica
	// is the replica that claimed or set them.
	State(ctx context.Context, topic string, id [16]byte) (found, done bool, replica string, err error)
	// Finish marks the claim done by this replica, making it if it is
	// missing.
	Finish(ctx context.Context, topic string, id [16]byte) error
	// Withdraw deletes the claim unless it is done.
	Withdraw(ctx context.Context, topic string, id [16]byte) error
}

// RecreationWatch decides which topics of one consumer were deleted and
// created again, and resubscribes them (see the comment at the top of the
// file). The consumer fills in the exported fields, calls Note from its
// poll loop and Run on a goroutine of its own after creating its Kafka
// client, and cancels Run's context and waits for it before closing that
// client.
type RecreationWatch struct {
	// Client is the consumer's group client: the watch lists topics and
	// commits the group's offsets through it.
	Client *kgo.Client
	// Group is the consumer group.
	Group string
	// Topics are the subscribed topics, as Kafka names them.
	Topics []string
	// BareTopic names a Kafka topic as the framework's logs and errors do
	// (without Config.TopicPrefix); nil keeps Kafka's name.
	BareTopic func(kafkaTopic string) string
	// Readd drops the client's whole state of a Kafka topic and adds the
	// topic again; it stops the topic's partition workers, then calls
	// before, then purges and adds the topic.
	Readd func(kafkaTopic string, before func())
	// Resets keeps the reset claims the group's replicas share.
	Resets Resets
	// Log is the consumer's logger.
	Log *slog.Logger
	// Failed hears a reset that failed (not one a shutdown cut short):
	// the caller shows it as the last error.
	Failed func(error)
	// Backoff spaces the tries of the reset's commit and the polls of
	// another replica's claim, each at most a second apart.
	Backoff retry.Backoff
	// WaitVisible is how long waiting for another replica's reset lasts
	// before it is logged.
	WaitVisible time.Duration
	// ResetWait replaces resetWait when positive.
	ResetWait time.Duration
	// Crash is the crash tests' hook in a reset: at each step ("begin";
	// "claimed": the claim written; "committed": the offsets set, done
	// not written yet) it reports whether the replica dies there, leaving
	// what it wrote as a crash would. Nil outside tests.
	Crash func(ctx context.Context, step string) bool

	init sync.Once
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

// start makes the watch's state; Note and Run both call it first, in
// either order.
func (w *RecreationWatch) start() {
	w.init.Do(func() {
		w.wake = make(chan struct{}, 1)
		w.pending = map[string]*unknownTopic{}
		w.known = map[string]kadm.TopicID{}
		w.retired = map[string]map[kadm.TopicID]bool{}
	})
}

func (w *RecreationWatch) bare(t string) string {
	if w.BareTopic == nil {
		return t
	}
	return w.BareTopic(t)
}

// Note records a poll's UNKNOWN_TOPIC_ID errors and the topic ids of its
// fetches. The poll loop calls it with every poll's fetches.
func (w *RecreationWatch) Note(fetches kgo.Fetches) {
	w.start()
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

// Run watches until ctx ends. The backoff of its checks of a topic is
// recreateFirstCheck doubled per check up to recreateMaxCheck; each request
// is bounded by recreateTimeout.
func (w *RecreationWatch) Run(ctx context.Context) {
	w.start()
	w.learn(ctx)
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
func (w *RecreationWatch) learn(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, recreateTimeout)
	defer cancel()
	details, err := kadm.NewClient(w.Client).ListTopics(lctx, w.Topics...)
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

func (w *RecreationWatch) nextDue() (time.Time, bool) {
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
func (w *RecreationWatch) checkDue(ctx context.Context) {
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

func (w *RecreationWatch) check(ctx context.Context, t string) {
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
		w.Log.Warn("topic deleted and created again (UNKNOWN_TOPIC_ID); subscribing to the new topic from its start", "topic", w.bare(t))
		w.Resubscribe(ctx, t, brokerID)
		// Errors noted while it resubscribed came from the old id's
		// fetches: judged afresh from the next one.
		w.mu.Lock()
		delete(w.pending, t)
		w.mu.Unlock()
	}
}

// brokerID asks the broker for a topic's id; exists is false when the
// topic is not there or the broker cannot say.
func (w *RecreationWatch) brokerID(ctx context.Context, t string) (id kadm.TopicID, exists bool) {
	lctx, cancel := context.WithTimeout(ctx, recreateTimeout)
	defer cancel()
	details, err := kadm.NewClient(w.Client).ListTopics(lctx, t)
	if err != nil {
		return id, false
	}
	d, ok := details[t]
	if !ok || d.Err != nil || d.ID == (kadm.TopicID{}) {
		return id, false
	}
	return d.ID, true
}

// Resubscribe subscribes to the Kafka topic t that was deleted and created
// again (its new id is id), from the start of the new topic: the offsets
// the group committed belong to the old one, and one inside the new
// topic's range would skip its first records. The topic's workers stop
// without committing (their offsets are the old topic's), the group's
// offsets of the topic are set to the new topic's start (Kafka does not
// check that a committing member owns a partition), and the topic leaves
// the client and is added again (Readd). A redelivery this causes is
// skipped by the inbox.
//
// The offsets are set once per recreation, by the first replica that
// resubscribes (resetOnce): every replica that held the old id
// resubscribes, some of them late (one assigned a partition of the topic
// only later), and a late reset would rewind partitions that other
// replicas already consume on the new topic, behind workers that have
// nothing new to commit: their partitions would stay behind, settled,
// until the next rebalance.
func (w *RecreationWatch) Resubscribe(ctx context.Context, t string, id kadm.TopicID) {
	// Before the purge: this member's session is not in the rebalance the
	// purge starts.
	w.Readd(t, func() { w.resetOnce(ctx, t, id) })
}

// resetOnce sets the group's offsets of a recreated topic to its start
// unless another replica did or is doing it. The replica that inserts the
// topic's claim (Resets.Claim) sets the offsets and marks the claim done;
// the others wait for done (at most resetWait) before they add the topic
// again, since fetching the old offsets first would skip records. A claim
// that is not done in time (its replica died, or failed and withdrew it)
// is taken over: the offsets are set again, which redelivers what was
// consumed meanwhile rather than skip anything.
func (w *RecreationWatch) resetOnce(parent context.Context, t string, id kadm.TopicID) {
	bare := w.bare(t)
	ctx, cancel := context.WithTimeout(parent, cmp.Or(w.ResetWait, resetWait)+recreateTimeout)
	defer cancel()
	if w.crash(ctx, "begin") {
		return
	}
	claimed, err := w.Resets.Claim(ctx, t, id)
	if err != nil {
		w.Log.Warn("claiming the reset of a recreated topic's offsets failed; setting them", "topic", bare, "err", err)
		claimed = true
	}
	if claimed && w.crash(ctx, "claimed") {
		return
	}
	if !claimed && w.awaitReset(ctx, t, id) {
		return
	}
	rctx, rcancel := context.WithTimeout(ctx, resetCommitBound)
	defer rcancel()
	err = w.CommitStart(rctx, t, id)
	if err == nil && w.crash(ctx, "committed") {
		return
	}
	// The claim's writes outlive the commit's bound and a shutdown.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), recreateTimeout)
	defer mcancel()
	if err != nil {
		if parent.Err() == nil { // not a shutdown
			w.Log.Warn("setting the group's offsets of a recreated topic to its start failed; records before the old offsets may be skipped",
				"topic", bare, "err", err)
			if w.Failed != nil {
				w.Failed(fmt.Errorf("recreated topic %s: set offsets to its start: %w", bare, err))
			}
		}
		// Withdrawn, so that the next replica to resubscribe tries.
		_ = w.Resets.Withdraw(mctx, t, id)
		return
	}
	if err := w.Resets.Finish(mctx, t, id); err != nil {
		w.Log.Warn("recording that the group's offsets of a recreated topic were set to its start failed; a replica that resubscribes later sets them again (a redelivery)",
			"topic", bare, "err", err)
	}
}

func (w *RecreationWatch) crash(ctx context.Context, step string) bool {
	return w.Crash != nil && w.Crash(ctx, step)
}

// awaitReset waits, at most resetWait, until the claim of the reset of the
// topic of that id is done; it reports whether it is.
func (w *RecreationWatch) awaitReset(ctx context.Context, t string, id kadm.TopicID) bool {
	start := time.Now()
	deadline := start.Add(cmp.Or(w.ResetWait, resetWait))
	logged := false
	for attempt := 0; ; attempt++ {
		found, done, replica, err := w.Resets.State(ctx, t, id)
		if err == nil && done {
			return true
		}
		if (err == nil && !found) || time.Now().After(deadline) {
			return false // withdrawn, or not done in time: set them here
		}
		if !logged && time.Since(start) >= w.WaitVisible {
			logged = true
			w.Log.Warn("waiting for another replica to set the group's offsets of a recreated topic to its start",
				"topic", w.bare(t), "replica", replica, "for", time.Since(start).Round(time.Second), "at_most", deadline.Sub(start))
		}
		if !retry.Sleep(ctx, nil, min(w.Backoff.Delay(attempt), time.Second)) {
			return false
		}
	}
}

// CommitStart commits the log start offsets of every partition of the
// Kafka topic t (the topic of that id) for the group, until it is accepted
// or ctx ends. It sends the commit itself, in the name of this member and
// its current generation read at each try, naming the new topic's id: the
// client's own commit path waits for a join in progress (the
// resubscription's own rebalance, others' under load) and names the id
// the client holds, the old one.
func (w *RecreationWatch) CommitStart(ctx context.Context, t string, id kadm.TopicID) error {
	starts, err := kadm.NewClient(w.Client).ListStartOffsets(ctx, t)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	for attempt := 0; ; attempt++ {
		err := w.CommitOffsets(ctx, t, id, starts)
		if err == nil {
			return nil
		}
		if !retry.Sleep(ctx, nil, min(w.Backoff.Delay(attempt), time.Second)) {
			return fmt.Errorf("%w (last refusal: %w)", ctx.Err(), err)
		}
	}
}

// CommitOffsets sends one offset commit of the listed offsets of the Kafka
// topic t (of that id) for the group, in the name of the client's member
// and generation.
func (w *RecreationWatch) CommitOffsets(ctx context.Context, t string, id kadm.TopicID, offsets kadm.ListedOffsets) error {
	member, gen := w.Client.GroupMetadata()
	if member == "" || gen < 0 {
		return errors.New("not a member of the group yet")
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = w.Group
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
	resp, err := req.RequestWith(cctx, w.Client)
	if err != nil {
		return err
	}
	return OffsetCommitErr(resp)
}

// OffsetCommitErr is the first partition error of an offset commit's
// response, or nil.
func OffsetCommitErr(resp *kmsg.OffsetCommitResponse) error {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return fmt.Errorf("partition %d: %w", p.Partition, itel.KerrFor(p.ErrorCode))
			}
		}
	}
	return nil
}

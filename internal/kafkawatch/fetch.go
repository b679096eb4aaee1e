package kafkawatch

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/tuning"
)

// The fetch watch: a partition its Kafka client stops fetching.
//
// The watch guards against an owned partition that its replica's Kafka
// client (kgo) stops fetching: not paused, no error, the group stable,
// records waiting at the broker. Nothing in the framework is waiting then,
// so nothing else would show it: status lists the partition handled with
// nothing waiting, and only the lag gauge grows. It was seen only against
// kfake, the embedded broker of the tests and of the chaos harness (once
// in about seventy chaos runs, before the watch; cause not found); no
// run on Apache Kafka has met one (docs/real-servers.md). The
// chaos harness makes one on purpose on kfake (kafka-fetch-forget): kgo
// fetches through incremental fetch sessions and names a partition in a
// fetch only when its offset or leader epoch changes, so a partition left
// out of the broker's session is never asked for again.
//
// The watch looks, every fetchCheckEvery, at each owned partition whose
// fetching the worker has not paused, that was handed no record for
// fetchQuietFor since it last fetched or resumed (the time a partition spends
// paused is nobody's fetching), and whose high watermark (the lag poller's listing, or a
// fetch's) is above the offset its worker expects next, or unknown because
// the lag poller's listings stopped succeeding. It then asks the
// partition's leader itself, through a Kafka client of its own: one Fetch at
// that offset, read_committed, no wait, no fetch session (probeFetch).
//
//   - Committed records there: the client is not fetching what the broker
//     has. The partition shows a "fetch" wait (Status.Waiting, the worker's
//     "partition waiting" log line, outbox.consumer.waiting), and the watch
//     restarts the partition's fetching at that offset with kgo's
//     SetOffsets, which stops the client's fetch session and sets the
//     partition's cursor again, pending loads dropped: at most every
//     fetchRestartEvery per partition, logged and counted
//     (outbox.consumer.fetch_restarts, reason set_offsets). Nothing is
//     skipped: the offset is the one after the last record the worker was
//     handed; records handed again are dropped by the worker as already
//     seen. When fetchRestartsBeforeReadd restarts did not help, the next
//     one re-subscribes the partition's topic (readdTopic: the client's
//     whole state of the topic dropped, the group rebalanced; reason
//     resubscribe): the topic's partitions go on from the group's
//     committed offsets, the inbox skipping what was handled.
//   - No committed record, but the last stable offset is below the
//     watermark at or before that offset: an open Kafka transaction of some
//     producer holds the partition. It shows as a "fetch" wait that says so;
//     nothing restarts.
//   - No committed record otherwise (transaction markers only): nothing is
//     wrong; the watch does not ask again until the offset or the watermark
//     moves.
//   - The probe fails: a "fetch" wait with the error; nothing restarts.
//
// SetOffsets acts only on partitions the client fetches (its cursors in
// use): a partition revoked meanwhile, or one the client never started
// fetching because its offset load never finished, is left alone by it.
// The re-subscription covers the second kind.
//
// The watch is one goroutine, started by runConsumer after the client and
// stopped (canceled, then waited for) before the client closes.

const (
	fetchCheckEvery   = 5 * time.Second
	fetchQuietFor     = 15 * time.Second
	fetchRestartEvery = 30 * time.Second
	// fetchRestartsBeforeReadd is how many restarts with SetOffsets a
	// partition gets before the watch re-subscribes its topic.
	fetchRestartsBeforeReadd = 2
	fetchProbeTimeout        = 10 * time.Second
	// fetchProbeBytes bounds the probe's answer: the probe needs one
	// committed record, the broker sends at least one batch whatever the
	// bound.
	fetchProbeBytes = 64 << 10
)

// RestartsBeforeReadd is how many restarts with SetOffsets a partition gets
// before the watch re-subscribes its topic, for the tests of the consumer
// that runs the watch.
const RestartsBeforeReadd = fetchRestartsBeforeReadd

// fetchProbe is what the partition's leader answered.
type fetchProbe struct {
	err error
	// first is the offset of the first committed record at or after the
	// probed offset; -1 when there is none.
	first int64
	// lso and hwm are the leader's last stable offset and high watermark.
	lso, hwm int64
}

// fetchState is the watch's memory of one owned partition.
type fetchState struct {
	quiet time.Time // the Fetching.Quiet this state is for
	// clean is set when a probe found nothing to fetch at (at, hwm).
	clean         bool
	at, hwm       int64
	probedAt      time.Time
	restarts      int
	lastRestartAt time.Time
}

// fetchVerdict is what the watch makes of a probe.
type fetchVerdict struct {
	wait    *consume.Wait // nil: nothing to show
	restart bool
	clean   bool // nothing to fetch: no need to ask again at this offset and watermark
}

// judgeFetch decides on a quiet partition whose watermark is above at,
// from its leader's answer.
// A partition is restarted at most every restartEvery.
func judgeFetch(tp consume.TopicPartition, at int64, quiet time.Time, pr fetchProbe, st *fetchState, restartEvery time.Duration, now time.Time) fetchVerdict {
	wait := &consume.Wait{Partition: tp, Offset: at, What: "fetch", Since: quiet}
	idle := now.Sub(quiet).Round(time.Second)
	switch {
	case pr.err != nil:
		wait.Detail = fmt.Sprintf("nothing fetched for %s with records past offset %d; asking the partition's leader failed: %v", idle, at, pr.err)
		return fetchVerdict{wait: wait}
	case pr.first >= 0:
		restart := st.lastRestartAt.IsZero() || now.Sub(st.lastRestartAt) >= restartEvery
		n := st.restarts
		if restart {
			n++
		}
		wait.Detail = fmt.Sprintf("the broker has records from offset %d; this replica's Kafka client fetched none for %s; fetching restarted %d times", pr.first, idle, n)
		return fetchVerdict{wait: wait, restart: restart}
	case pr.lso >= 0 && pr.lso < pr.hwm && pr.lso <= at:
		wait.Detail = fmt.Sprintf("an open Kafka transaction: committed records end at offset %d, the high watermark is %d", pr.lso, pr.hwm)
		return fetchVerdict{wait: wait}
	default:
		return fetchVerdict{clean: true}
	}
}

// Partitions is what the fetch watch reads and sets of the consumer's
// partition workers (a *consume.Set).
type Partitions interface {
	// Fetching lists the owned partitions with their fetch positions.
	Fetching() map[consume.TopicPartition]consume.Fetching
	// SetFetchWait shows (or, with nil, clears) a partition's fetch wait.
	SetFetchWait(tp consume.TopicPartition, w *consume.Wait)
}

// FetchWatch is the fetch watch of one consumer (see the comment at the top
// of the file). The consumer fills it in and calls Run on a goroutine of
// its own after creating its Kafka client, and cancels Run's context and
// waits for it before closing that client.
type FetchWatch struct {
	// Client is the consumer's group client: the watch reads its offsets
	// and restarts its fetching.
	Client *kgo.Client
	// Partitions are the consumer's partition workers.
	Partitions Partitions
	// ProbeOpts make the watch's own Kafka client (the brokers and the
	// user's Kafka options, no group).
	ProbeOpts []kgo.Opt
	// KafkaTopic names a topic as Kafka knows it (its prefix added).
	KafkaTopic func(topic string) string
	// Ends returns a partition's high watermark and log start as the lag
	// poller and the fetches last saw them; known is false before either did.
	Ends func(topic string, partition int32) (hwm, logStart int64, known bool)
	// ListedAt returns when the lag poller last listed every partition
	// (zero: never), and LagEvery is its period (0: lagPollInterval): a
	// listing older than three periods is stale.
	ListedAt func() time.Time
	LagEvery time.Duration
	// Restarted hears each restart (reason set_offsets or resubscribe)
	// before it acts: the caller counts it.
	Restarted func(tp consume.TopicPartition, reason string)
	// Readd re-subscribes a Kafka topic, the watch's last resort.
	Readd func(kafkaTopic string)
	// Log is the consumer's logger.
	Log *slog.Logger
	// Owner is what the chaos harness's trace hears as the watch's owner
	// (tuning.NoteFetchWatch).
	Owner any
	// CheckEvery, QuietFor and RestartEvery replace fetchCheckEvery,
	// fetchQuietFor and fetchRestartEvery when positive.
	CheckEvery, QuietFor, RestartEvery time.Duration
}

// Run watches until ctx ends.
func (fw *FetchWatch) Run(ctx context.Context) {
	w := &fetchWatch{FetchWatch: fw, states: map[consume.TopicPartition]*fetchState{}}
	defer w.close()
	every := fetchCheckEvery
	if fw.CheckEvery > 0 {
		every = fw.CheckEvery
	}
	for retry.Sleep(ctx, nil, every) {
		w.check(ctx, time.Now())
	}
}

// fetchWatch is the state of the watch's goroutine.
type fetchWatch struct {
	*FetchWatch
	states map[consume.TopicPartition]*fetchState
	// probe is the watch's own Kafka client (Config.Brokers and
	// KafkaOptions, no group), made at the first probe and closed when the
	// watch stops: a probe must not depend on the state of the client it
	// checks (its connections, its metadata, its requests in flight).
	probe *kgo.Client
}

func (w *fetchWatch) close() {
	if w.probe != nil {
		w.probe.Close()
	}
}

// probeClient returns the watch's own client, made on first use.
func (w *fetchWatch) probeClient() (*kgo.Client, error) {
	if w.probe == nil {
		cl, err := kgo.NewClient(w.ProbeOpts...)
		if err != nil {
			return nil, fmt.Errorf("create the fetch watch's Kafka client: %w", err)
		}
		w.probe = cl
	}
	return w.probe, nil
}

// check is one round of the watch.
func (w *fetchWatch) check(ctx context.Context, now time.Time) {
	quietFor, restartEvery := fetchQuietFor, fetchRestartEvery
	if w.QuietFor > 0 {
		quietFor = w.QuietFor
	}
	if w.RestartEvery > 0 {
		restartEvery = w.RestartEvery
	}
	// The watermarks come from the lag poller's listings through the
	// consumer's own client. When its listings stop succeeding (a client
	// in trouble, which may be the very one that stopped fetching), the
	// watermarks are stale: a quiet partition is then probed whatever its
	// watermark says, the probe answering for it.
	listed := w.ListedAt()
	fresh := !listed.IsZero() && now.Sub(listed) <= 3*cmp.Or(w.LagEvery, lagPollInterval)
	fetching := w.Partitions.Fetching()
	for tp := range w.states {
		if _, ok := fetching[tp]; !ok {
			delete(w.states, tp) // not owned any more: its worker and wait are gone
		}
	}
	var committed map[string]map[int32]kgo.EpochOffset
	// One listing of each topic per round; after a failed probe the
	// round's other quiet partitions take its error instead of asking
	// again (a broker down would cost a probe timeout each).
	topics := map[string]kadm.TopicDetail{}
	var roundErr error
	for tp, f := range fetching {
		st := w.states[tp]
		if st == nil || !st.quiet.Equal(f.Quiet) {
			st = &fetchState{quiet: f.Quiet} // records came: start over
			w.states[tp] = st
		}
		at := f.Next
		if at < 0 {
			if committed == nil {
				committed = w.Client.CommittedOffsets()
			}
			at = -1
			if eo, ok := committed[w.KafkaTopic(tp.Topic)][tp.Partition]; ok {
				at = eo.Offset
			}
		}
		hwm, logStart, known := w.Ends(tp.Topic, tp.Partition)
		if at < 0 {
			at = logStart
		}
		behind := (known && hwm > at) || !fresh
		// Found clean: asked again once the offset or the watermark moves,
		// or, while the watermarks are stale, every restartEvery.
		cleanStill := st.clean && st.at == at && (fresh && st.hwm == hwm || !fresh && now.Sub(st.probedAt) < restartEvery)
		trace := func(verdict string) {
			tuning.NoteFetchWatch(w.Owner, w.KafkaTopic(tp.Topic), tp.Partition, verdict)
		}
		skip := ""
		switch {
		case f.Paused:
			skip = "paused"
		case now.Sub(f.Quiet) < quietFor:
			skip = "recent"
		case !behind:
			skip = fmt.Sprintf("caught up at %d (listed high watermark %d, known %t)", at, hwm, known)
		case cleanStill:
			skip = fmt.Sprintf("clean at %d", at)
		}
		if skip != "" {
			trace(skip)
			w.Partitions.SetFetchWait(tp, nil)
			continue
		}
		pr := fetchProbe{err: roundErr, first: -1, lso: -1, hwm: -1}
		if roundErr == nil {
			pr = w.probeFetch(ctx, tp, at, topics)
			if ctx.Err() != nil {
				return
			}
			roundErr = pr.err
		}
		v := judgeFetch(tp, at, f.Quiet, pr, st, restartEvery, now)
		switch {
		case v.wait != nil:
			trace(fmt.Sprintf("wait at %d: %s (restart %t)", at, v.wait.Detail, v.restart))
		default:
			trace(fmt.Sprintf("probed clean at %d (leader high watermark %d, last stable offset %d)", at, pr.hwm, pr.lso))
		}
		if v.clean && !(st.clean && st.at == at) {
			// Once per offset: a partition behind its listed watermark
			// with nothing to fetch is rare enough to say.
			w.Log.Info("quiet partition: its leader has no committed record to fetch", "partition", tp.String(),
				"offset", at, "listed_high_watermark", hwm, "listing_fresh", fresh,
				"leader_high_watermark", pr.hwm, "leader_last_stable_offset", pr.lso)
		}
		st.clean, st.at, st.hwm, st.probedAt = v.clean, at, hwm, now
		w.Partitions.SetFetchWait(tp, v.wait)
		if v.restart {
			st.restarts++
			st.lastRestartAt = now
			if st.restarts > fetchRestartsBeforeReadd {
				w.readdStalledTopic(tp, v.wait.Detail)
				return // the topic's partitions are lost: the next round sees the new assignment
			}
			// The probe took up to fetchProbeTimeout: the partition may
			// have been revoked and assigned back meanwhile, its new
			// worker starting at the committed offset, below at. Setting
			// at then would skip the records between, and the new worker
			// would commit past records it never handled. Restart only the
			// worker judged: a new one has a later Quiet (its start).
			if cur := w.Partitions.Fetching()[tp]; cur.Quiet.Equal(f.Quiet) && cur.Next == f.Next {
				w.restartFetching(tp, at, v.wait.Detail)
			}
		}
	}
}

// readdStalledTopic re-subscribes the topic of a partition that restarts
// did not get fetched again (see the comment at the top of the file).
func (w *fetchWatch) readdStalledTopic(tp consume.TopicPartition, why string) {
	w.Log.Warn("re-subscribing a topic: restarting its partition's fetching did not help", "partition", tp.String(), "why", why)
	w.Restarted(tp, "resubscribe")
	w.Readd(w.KafkaTopic(tp.Topic))
}

// restartFetching sets the partition's fetch offset in the client again
// (see the comment at the top of the file).
func (w *fetchWatch) restartFetching(tp consume.TopicPartition, at int64, why string) {
	w.Log.Warn("restarting a partition's fetching", "partition", tp.String(), "offset", at, "why", why)
	w.Restarted(tp, "set_offsets")
	topic := w.KafkaTopic(tp.Topic)
	w.Client.SetOffsets(map[string]map[int32]kgo.EpochOffset{
		topic: {tp.Partition: {Epoch: restartEpoch(w.Client, topic, tp.Partition, at), Offset: at}},
	})
}

// restartEpoch is the leader epoch to restart a partition's fetching at
// offset at with. SetOffsets skips a partition whose position in the client
// (the last polled record's offset and epoch, or the last set) equals the
// one given, so the epoch must differ from the position's: -1 (nothing to
// validate), unless the position is already at -1 (an earlier restart),
// then the partition's current leader epoch, which a fetch from the leader
// validates as it is.
func restartEpoch(cl *kgo.Client, topic string, partition int32, at int64) int32 {
	pos, ok := cl.UncommittedOffsets()[topic][partition] // the position, when it moved past the commit
	if !ok {
		pos = cl.CommittedOffsets()[topic][partition]
	}
	if pos.Offset == at && pos.Epoch == -1 {
		if _, epoch, err := cl.PartitionLeader(topic, partition); err == nil && epoch >= 0 {
			return epoch
		}
	}
	return -1
}

// probeFetch asks the partition's leader for its committed records from
// offset at: one Fetch outside the client's fetch sessions. topics caches
// the round's topic listings.
func (w *fetchWatch) probeFetch(ctx context.Context, tp consume.TopicPartition, at int64, topics map[string]kadm.TopicDetail) fetchProbe {
	ctx, cancel := context.WithTimeout(ctx, fetchProbeTimeout)
	defer cancel()
	topic := w.KafkaTopic(tp.Topic)
	fail := func(err error) fetchProbe { return fetchProbe{err: err, first: -1, lso: -1, hwm: -1} }
	cl, err := w.probeClient()
	if err != nil {
		return fail(err)
	}
	// The topic's id, which Fetch v13 and later name topics by; the listing
	// also names the leader.
	td, ok := topics[topic]
	if !ok {
		details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
		if err != nil {
			return fail(err)
		}
		if td, ok = details[topic]; !ok {
			return fail(fmt.Errorf("listing topic %s: not listed", topic))
		}
		topics[topic] = td
	}
	if td.Err != nil {
		return fail(fmt.Errorf("listing topic %s: %w", topic, td.Err))
	}
	pd, ok := td.Partitions[tp.Partition]
	if !ok || pd.Err != nil {
		return fail(fmt.Errorf("listing partition %s: %v", tp, pd.Err))
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 1
	req.MaxBytes = fetchProbeBytes
	req.IsolationLevel = 1 // read_committed, as the consumer reads
	req.SessionID = 0
	req.SessionEpoch = -1 // a full fetch, no session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, [16]byte(td.ID)
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = tp.Partition
	rp.FetchOffset = at
	rp.PartitionMaxBytes = fetchProbeBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(pd.Leader)))
	if err != nil {
		return fail(err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fail(err)
	}
	for i := range resp.Topics {
		t := &resp.Topics[i]
		if t.Topic != topic && t.TopicID != [16]byte(td.ID) {
			continue
		}
		for j := range t.Partitions {
			p := &t.Partitions[j]
			if p.Partition != tp.Partition {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fail(err)
			}
			fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: at, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: tp.Partition,
			}, p, kgo.DefaultDecompressor(), nil)
			pr := fetchProbe{first: -1, lso: p.LastStableOffset, hwm: p.HighWatermark}
			if fp.Err != nil {
				pr.err = fp.Err
			}
			for _, r := range fp.Records {
				if r.Offset >= at {
					pr.first = r.Offset
					break
				}
			}
			return pr
		}
	}
	return fail(fmt.Errorf("the leader's answer has no partition %s", tp))
}

package outbox

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/kafkawatch"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// A partition its client believes it fetches while the broker does not
// serve it (here: the broker's fetch session forgets it, and the client's
// incremental fetches never name it again) shows as a "fetch" wait in
// Status, and the fetch watch restarts its fetching: every record is
// handled and committed. Without the watch the partition stays behind for
// as long as the client lives. The broker also leaves the partition out
// of the next sessions the client opens (the restarts open them): one, and
// the wait stays until a second restart; two, and the restarts do not help
// (kafkawatch.RestartsBeforeReadd): the watch re-subscribes the topic.
func TestFetchWatchRestartsAPartitionItsClientStopped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		sessions    int32 // sessions the broker leaves the partition out of, after the first
		resubscribe bool
		// noListings fails every ListOffsets of the consumer's lag poller:
		// its watermark of the partition stays at the last fetch's, the
		// stalled partition looks caught up, and only the staleness of the
		// listings gets it probed.
		noListings bool
	}{
		{name: "restarts", sessions: 1},
		{name: "re-subscribes", sessions: kafkawatch.RestartsBeforeReadd, resubscribe: true},
		{name: "listings fail", sessions: 1, noListings: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testFetchWatch(t, tc.sessions, tc.resubscribe, tc.noListings)
		})
	}
}

func testFetchWatch(t *testing.T, sessions int32, resubscribe, noListings bool) {
	b := setup(t)
	kc := b.cluster(t, "leave a partition out of the fetch responses")
	cfg := consumerConfig(b, "fetchwatch")
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	c.tel.lagEvery = 50 * time.Millisecond
	c.test.fetchCheckEvery = 50 * time.Millisecond
	// As long as a wait takes to show: the wait shows when it is set.
	c.test.fetchQuietFor = waitVisible
	c.test.fetchRestartEvery = time.Second
	var mu sync.Mutex
	handled := map[int]bool{}
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run == b.run {
			mu.Lock()
			handled[e.Seq] = true
			mu.Unlock()
		}
		return nil
	})
	start(t, c)

	b.produceOrders(t, 0, 1)
	eventually(t, "the first record committed", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 1
	})

	if noListings {
		kc.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
			kc.KeepControl()
			req := r.(*kmsg.ListOffsetsRequest)
			resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
			for _, rt := range req.Topics {
				st := kmsg.NewListOffsetsResponseTopic()
				st.Topic = rt.Topic
				for _, rp := range rt.Partitions {
					sp := kmsg.NewListOffsetsResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.UnknownServerError.Code
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
	}
	topic := b.kafkaTopic(ordersTopic)
	details, err := kadm.NewClient(b.kafka.Client(t)).ListTopics(context.Background(), topic)
	require.NoError(t, err)
	id := [16]byte(details[topic].ID)
	// The consumer's next incremental fetch tells the broker to forget
	// partition 0 of its session: the client still counts it in and never
	// names it again, so the broker never answers for it.
	// The broker then leaves the partition out of every session the
	// client opens (its full fetch that opens each) until the watch has
	// restarted the partition's fetching `sessions` times, or re-subscribed
	// the topic: the client counts it in again, and the stall goes on. The
	// watch's restarts are counted, not the sessions: the client may open
	// a session on its own (after a fetch error, under load), which must
	// not end the stall early.
	var setOffsets, resubscribes atomic.Int32
	c.test.fetchRestartHook = func(tp consume.TopicPartition, reason string) {
		if tp.Topic != ordersTopic || tp.Partition != 0 {
			return
		}
		if reason == "resubscribe" {
			resubscribes.Add(1)
		} else {
			setOffsets.Add(1)
		}
	}
	var forgot atomic.Int32
	strip := func(req *kmsg.FetchRequest) {
		for i := range req.Topics {
			rt := &req.Topics[i]
			if rt.Topic == topic || rt.TopicID == id {
				kept := rt.Partitions[:0]
				for _, p := range rt.Partitions {
					if p.Partition != 0 {
						kept = append(kept, p)
					}
				}
				rt.Partitions = kept
			}
		}
	}
	kc.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		req := r.(*kmsg.FetchRequest)
		switch {
		case forgot.Load() == 0 && req.SessionID != 0 && req.SessionEpoch > 0:
			strip(req)
			ft := kmsg.NewFetchRequestForgottenTopic()
			ft.Topic, ft.TopicID, ft.Partitions = topic, id, []int32{0}
			req.ForgottenTopics = append(req.ForgottenTopics, ft)
			forgot.Store(1)
		case forgot.Load() >= 1 && req.SessionEpoch == 0:
			// A new session's opening fetch (the watch's probe asks for
			// no session: epoch -1).
			if setOffsets.Load() > sessions || resubscribes.Load() > 0 {
				kc.DropControl()
				break
			}
			strip(req)
			forgot.Add(1)
		}
		return nil, nil, false
	})
	eventually(t, "the broker's session forgot the partition", func() bool { return forgot.Load() == 1 })

	b.produceOrders(t, 1, 5)
	var sawWait atomic.Bool
	eventually(t, "every record handled and committed", func() bool {
		st, err := c.Status(context.Background())
		if err == nil {
			for _, w := range st.Waiting {
				if w.What == "fetch" && w.Topic == ordersTopic && w.Partition == 0 {
					require.Equal(t, int64(1), w.Offset, "the wait names where fetching must go on")
					require.Contains(t, w.Detail, "the broker has records from offset 1")
					sawWait.Store(true)
				}
			}
		}
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 6
	})
	require.GreaterOrEqual(t, forgot.Load(), 1+min(sessions, kafkawatch.RestartsBeforeReadd), "the restarts' sessions left the partition out")
	restarts := o.collect(t)["outbox.consumer.fetch_restarts"]
	require.GreaterOrEqual(t, sumOf(restarts, itel.AttrTopic.String(ordersTopic), itel.AttrPartition.String("0"), itel.AttrReason.String("set_offsets")), float64(min(sessions+1, kafkawatch.RestartsBeforeReadd)))
	resubscribed := sumOf(restarts, itel.AttrTopic.String(ordersTopic), itel.AttrPartition.String("0"), itel.AttrReason.String("resubscribe"))
	if resubscribe {
		require.GreaterOrEqual(t, resubscribed, 1.0, "the restarts did not help: the topic was re-subscribed")
	} else {
		require.Zero(t, resubscribed)
	}
	require.True(t, sawWait.Load(), "the stalled partition showed a fetch wait in Status")
	mu.Lock()
	defer mu.Unlock()
	for seq := range 6 {
		require.True(t, handled[seq], "order %d handled", seq)
	}
	eventually(t, "the wait cleared", func() bool {
		st, err := c.Status(context.Background())
		if err != nil {
			return false
		}
		for _, w := range st.Waiting {
			if w.What == "fetch" {
				return false
			}
		}
		return true
	})
}

package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/testkit"
)

// A topic deleted and created again under a running consumer (a dev stack
// restarted, an operator's mistake) answers UNKNOWN_TOPIC_ID to every fetch of
// the client for good. The consumer subscribes to the new topic on its own,
// and the repeated error is logged a few times, not per fetch.
func TestConsumerFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "recreate")
	var logs testkit.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produce(t, b.envelope("before"), b.payload(t, "o-1", 0))
	eventually(t, "handled", func() bool { return calls.Load() == 1 })

	recreator(t, b, 3)()
	b.produce(t, b.envelope("after"), b.payload(t, "o-2", 1))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	// The handler counts a call before its transaction commits: wait for
	// the inbox, which shows the commit.
	eventually(t, "the event of the new topic handled", func() bool {
		return count(t, c.inbox, bson.D{{Key: "handled", Value: true}}) == 2
	})
	require.GreaterOrEqual(t, calls.Load(), int64(2), "a retried attempt counts again")
	require.Equal(t, 1, strings.Count(logs.String(), "topic deleted and created again"), "one resubscription: the old id's late errors start no second one")
	require.LessOrEqual(t, strings.Count(logs.String(), "fetch error"), 3*2, "one line per partition and kind, then one per period")
}

// The publisher's side: events recorded after their topic was deleted and
// created again are published to the new topic.
func TestPublisherFollowsARecreatedTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("recreate-pub")
	cfg.PublishTopics = []string{ordersTopic}
	c := b.client(t, cfg)
	start(t, c)
	ctx := context.Background()
	record := func(id string) {
		require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: id, Amount: 1})
		}))
	}
	record("before")
	eventually(t, "published", func() bool { return count(t, c.outbox, bson.D{{Key: "published", Value: true}}) == 1 })
	recreator(t, b, 3)()
	record("after")
	eventually(t, "the event recorded after the recreation published", func() bool {
		return count(t, c.outbox, bson.D{{Key: "published", Value: true}}) == 2
	})
	recs := b.kafkaEvents(t, ordersTopic, 1)
	require.Len(t, recs, 1, "the new topic holds the new event")
}

// A partition of a recreated topic assigned to a replica that never
// fetched it: the replica still holds the old topic id, its offset fetch
// answers UNKNOWN_TOPIC_ID a few times, and kgo hands one error to the poll
// and drops the partition from the assignment. The error never repeats, so
// a consumer waiting for it to would leave the partition to nobody until
// the next rebalance: the watcher asks the broker for the topic's id and
// resubscribes when it is not the one its client uses.
func TestConsumerTakesOverARecreatedTopicItNeverFetched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// One partition: one replica owns it, the other owns nothing of the
	// topic and so never fetches it.
	recreate := recreator(t, b, 1)
	recreate()
	var calls atomic.Int64
	replicas, stops, _ := startRecreateReplicas(t, b, "recreate-takeover", &calls, nil)
	handled := func(n int64) func() bool {
		return func() bool { return count(t, replicas[0].inbox, bson.D{{Key: "handled", Value: true}}) == n }
	}
	owner := func() int {
		for i, c := range replicas {
			st, _ := c.Status(ctx)
			if len(st.Handling) > 0 {
				return i
			}
		}
		return -1
	}
	b.produce(t, b.envelope("before"), b.payload(t, "o-1", 0))
	eventually(t, "handled before the recreation", handled(1))

	// The owner's resubscription makes the group rebalance, and the
	// partition may move to the replica that never fetched it (which is
	// how the first version got stuck here).
	recreate()
	b.produce(t, b.envelope("after"), b.payload(t, "o-2", 1))
	eventually(t, "the event recorded after the recreation handled", handled(2))

	// The owner goes; the other replica takes the partition over (if it
	// did not already: then it is the one that goes).
	var last int
	eventually(t, "an owner", func() bool { last = owner(); return last >= 0 })
	stops[last]()
	b.produce(t, b.envelope("taken over"), b.payload(t, "o-3", 2))
	eventually(t, "the event handled by the replica that took the partition over", handled(3))
}

// Every replica that held the old topic id resubscribes, some late (one
// assigned a partition of the topic only later). The group's offsets are
// reset once per recreation: a late resubscription that set every
// partition of the topic to its start again would rewind partitions other
// replicas already consumed on the new topic, and their workers, with
// nothing new to commit, would leave them behind, every event handled.
func TestLateResubscriptionRewindsNoOtherPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	adm := b.kafka.Admin()
	ctx := context.Background()
	topic := b.kafkaTopic(ordersTopic)
	recreate := recreator(t, b, 2) // two partitions: one for each replica
	recreate()
	var calls atomic.Int64
	replicas, _, logs := startRecreateReplicas(t, b, "recreate-late", &calls, nil)
	group := replicas[0].cfg.ConsumerGroup
	handled := func(n int64) func() bool { return handledIs(t, replicas[0], n) }
	caughtUp := groupAtEnds(adm, group, topic)
	eventually(t, "each replica owns a partition", eachOwnsOne(replicas))
	produceTo(t, b, "o-1", 0, 0)
	produceTo(t, b, "o-2", 1, 0)
	eventually(t, "handled before the recreation", handled(2))

	recreate()
	produceTo(t, b, "o-3", 0, 1)
	produceTo(t, b, "o-4", 1, 1)
	testkit.Eventually(t, recreationRecovery, "handled after the recreation", handled(4))
	testkit.Eventually(t, recreationRecovery, "the group's offsets at the new topic's ends", caughtUp)

	// A late resubscription, as by a replica that learns of the recreation
	// only now.
	details, err := adm.ListTopics(ctx, topic)
	require.NoError(t, err)
	cons := replicas[0].tel.cons.Load()
	require.NotNil(t, cons)
	cons.recreated.Resubscribe(ctx, topic, details[topic].ID)
	testkit.Eventually(t, recreationRecovery, "the group's offsets at the new topic's ends after a late resubscription", caughtUp)
	require.EqualValues(t, 4, calls.Load()-int64(strings.Count(logs.String(), "handling failed")), "nothing handled twice")
}

// recreationRecovery bounds the waits of a test for the consumers'
// recovery from a topic's recreation. By design the recovery can take
// longer than eventually's bound: the clients see the old topic id
// refused at their next metadata refresh (about 10 s on kfake), then a
// replica that finds another's reset of the group's offsets under way
// waits for it up to internal/kafkawatch's resetWait (25 s), and the
// resetting replica retries its commit while the group rebalances up to
// resetCommitBound (20 s); a loaded machine stretches each step.
const recreationRecovery = 2 * time.Minute

// recreator returns a function that deletes the test's orders topic and
// creates it again with n partitions, each with a leader when it returns.
// A real broker deletes a topic in the background and refuses to create
// it again (TOPIC_ALREADY_EXISTS) until the deletion is done: the creation
// is retried until the broker accepts it.
func recreator(t *testing.T, b *bundle, n int32) func() {
	return func() {
		t.Helper()
		topic := b.kafkaTopic(ordersTopic)
		testkit.RecreateTopic(t, b.kafka.Admin(), topic, n)
		b.kafka.CreateTopic(t, n, topic) // waits for the partitions' leaders
	}
}

// startRecreateReplicas starts two consuming replicas of service whose
// handler counts its calls; prepare, when not nil, adjusts each before it
// starts. Their logs are printed if the test fails.
func startRecreateReplicas(t *testing.T, b *bundle, service string, calls *atomic.Int64, prepare func(i int, c *Client)) (replicas []*Client, stops []func(), logs *testkit.Buffer) {
	logs = &testkit.Buffer{}
	for i := range 2 {
		cfg := consumerConfig(b, service)
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", i)
		c := b.client(t, cfg)
		MustHandle(c, effectHandler(b, calls))
		if prepare != nil {
			prepare(i, c)
		}
		replicas = append(replicas, c)
		stops = append(stops, start(t, c))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	return replicas, stops, logs
}

// produceTo writes a framework record of orderPlaced with key and sequence
// number seq to partition of the orders topic.
func produceTo(t *testing.T, b *bundle, key string, partition int32, seq int) {
	t.Helper()
	env := b.envelope(key)
	env.OccurredAt = time.Now()
	rec := encodeRecord(&env, b.payload(t, key, seq))
	rec.Partition = partition
	b.produceRaw(t, rec)
}

// handledIs reports whether c's inbox holds n handled entries.
func handledIs(t *testing.T, c *Client, n int64) func() bool {
	return func() bool { return count(t, c.inbox, bson.D{{Key: "handled", Value: true}}) == n }
}

// eachOwnsOne reports whether each replica handles exactly one partition.
func eachOwnsOne(replicas []*Client) func() bool {
	return func() bool {
		for _, c := range replicas {
			if st, _ := c.Status(context.Background()); len(st.Handling) != 1 {
				return false
			}
		}
		return true
	}
}

// groupAtEnds reports whether the group's committed offsets of every
// partition of topic are at the partition's end.
func groupAtEnds(adm *kadm.Client, group, topic string) func() bool {
	return func() bool {
		ctx := context.Background()
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return false
		}
		committed, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			c, found := committed.Lookup(topic, o.Partition)
			ok = ok && found && c.At == o.Offset
		})
		return ok
	}
}

// The reset of a recreated topic's offsets is three writes: the claim (an
// outbox_meta document), the group's offsets, the claim marked done. A
// replica that dies after the claim, or after setting the offsets but
// before done, leaves a claim that is never done: the other replicas wait
// for it (resetWait), then take the reset over and set the offsets again.
// Each crash ends with the group's offsets at the new topic's ends, every
// record of the new topic handled (none skipped, which fetching from the
// old topic's offsets would do) and the claim done by the survivor.
func TestRecreatedTopicResetSurvivesACrashAtEachWrite(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"claimed", "committed"} {
		t.Run("crash after "+step, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			adm := b.kafka.Admin()
			ctx := context.Background()
			topic := b.kafkaTopic(ordersTopic)
			recreate := recreator(t, b, 2) // two partitions: one for each replica
			recreate()

			crashed := make(chan struct{})
			var crashOnce sync.Once
			var calls atomic.Int64
			replicas, stops, _ := startRecreateReplicas(t, b, "reset-crash", &calls, func(i int, c *Client) {
				c.test.resetWait = 2 * time.Second
				if i == 0 {
					// Dies at step: blocks there (nothing more is written)
					// until the test stops it.
					c.test.resetHook = func(ctx context.Context, at string) bool {
						if at != step {
							return false
						}
						crashOnce.Do(func() { close(crashed) })
						<-ctx.Done()
						return true
					}
				} else {
					// Begins its reset once the other replica died.
					c.test.resetHook = func(ctx context.Context, at string) bool {
						if at == "begin" {
							select {
							case <-crashed:
							case <-ctx.Done():
							}
						}
						return false
					}
				}
			})
			group := replicas[0].cfg.ConsumerGroup
			produce := func(partition int32, n int) {
				t.Helper()
				for i := range n {
					produceTo(t, b, fmt.Sprintf("p%d-%d-%d", partition, n, i), partition, i)
				}
			}
			handled := func(n int64) func() bool { return handledIs(t, replicas[1], n) }
			eventually(t, "each replica owns a partition", eachOwnsOne(replicas))
			produce(0, 3)
			produce(1, 3)
			eventually(t, "handled before the recreation", handled(6))

			// More records on the new topic than the old offsets (3): from
			// those, the first three of each partition would be skipped.
			recreate()
			produce(0, 5)
			produce(1, 5)
			select {
			case <-crashed:
			case <-time.After(60 * time.Second):
				t.Fatal("the first replica never reached the step it dies at")
			}
			// Kafka dropped the old topic's offsets with it; a worker that
			// commits late, by topic name, puts them back on the new topic.
			// The dying replica does it here, in
			// its own name: only a reset after it keeps the survivor from
			// skipping the first three records of each partition.
			details, err := adm.ListTopics(ctx, topic)
			require.NoError(t, err)
			id := details[topic].ID
			cons := replicas[0].tel.cons.Load()
			require.NotNil(t, cons)
			require.NoError(t, cons.recreated.CommitOffsets(ctx, topic, id, kadm.ListedOffsets{topic: {
				0: {Topic: topic, Partition: 0, Offset: 3}, 1: {Topic: topic, Partition: 1, Offset: 3},
			}}))
			stops[0]()

			eventually(t, "every record of the new topic handled", handled(16))
			eventually(t, "the group's offsets at the new topic's ends", groupAtEnds(adm, group, topic))
			var doc store.TopicReset
			require.NoError(t, replicas[1].meta.FindOne(ctx, bson.D{{Key: "_id", Value: store.TopicResetID(group, topic, id)}}).Decode(&doc))
			require.NotNil(t, doc.DoneAt, "the claim is done")
			require.Equal(t, replicas[1].cfg.ReplicaID, doc.Replica, "by the survivor")
		})
	}
}

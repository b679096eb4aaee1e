package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/publish"
)

// slowPromises delays every promise of the producers, as a slow or
// loaded client would: the worker learns of a refusal late.
type slowPromises struct{ d time.Duration }

func (h slowPromises) OnProduceRecordUnbuffered(*kgo.Record, error) { time.Sleep(h.d) }

// Issue 27, item 6: kgo refuses a too-large record on the client but still
// sends the records after it; with promises delivered late, later events of
// its key were published while it stood failed and held the key. Whatever
// the timing, none may be.
func TestPublisherNoEventOvertakesARefusedOneOfItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.KafkaOptions = []kgo.Opt{kgo.WithHooks(slowPromises{50 * time.Millisecond})}
	c := b.client(t, cfg)
	keys := samePartitionKeys(2)
	held, other := keys[0], keys[1]
	b.setMaxMessageBytes(t, 4<<20)
	r := newRecorder(b, c)
	r.recordPadded(t, 1200000, held) // above kgo's default and Kafka's default limit
	for range 19 {
		r.recordPadded(t, 0, held, other)
	}
	b.setMaxMessageBytes(t, 1<<20)

	runPub(t, c, publisherOptions{})
	coll := b.db.Collection("outbox")
	eventually(t, "the other key's events published", func() bool {
		return countFind(t, coll, bson.D{{Key: "key", Value: other}, {Key: "published", Value: true}}) == 19
	})
	require.Zero(t, countFind(t, coll, bson.D{{Key: "key", Value: held}, {Key: "published", Value: true}}),
		"events of the held key published while its first event was refused")
	require.EqualValues(t, 1, failedCount(t, b))
	st, err := c.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 19, st.OutboxHeldEvents, "the held key's 19 later events wait behind it")
	for _, rec := range b.kafkaEvents(t, ordersTopic, 19) {
		require.NotEqual(t, held, string(rec.Key), "an event of the held key reached Kafka")
	}
}

// Issue 27, item 8: a scan read, decoded and produced 30 events of 600 KB
// (18 MB) at once for one partition. Rounds are capped at 16 MiB of
// documents, and the backlog still drains without waiting for the
// periodic rescan.
func TestPublisherScanRoundsAreCappedByBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	for _, k := range samePartitionKeys(30) {
		r.recordPadded(t, 600000, k)
	}
	var mu sync.Mutex
	var rounds []int
	runPub(t, c, publisherOptions{rescan: time.Hour, hooks: publish.Hooks{
		Produced: func(_ publish.TopicPartition, items []publish.Item, _, _ time.Time, _ int) {
			n := 0
			for _, it := range items {
				n += len(it.Record.Value)
			}
			mu.Lock()
			rounds = append(rounds, n)
			mu.Unlock()
		},
	}})
	eventually(t, "the backlog published", func() bool { return b.published(t, Config{}) == 30 })
	mu.Lock()
	defer mu.Unlock()
	for _, n := range rounds {
		require.LessOrEqual(t, n, 16<<20, "a round held %d bytes of events", n)
	}
	require.Greater(t, len(rounds), 1)
}

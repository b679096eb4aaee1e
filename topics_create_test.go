package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// freshEvent's topic is not seeded in the test cluster.
type freshEvent struct {
	ID string `json:"id"`
}

const freshTopic = "created.by.client"

func (freshEvent) Topic() string          { return freshTopic }
func (freshEvent) ContentSchema() string  { return "Fresh.v1" }
func (e freshEvent) PartitionKey() string { return e.ID }

// Topics must exist before Record, unless the service opts in to creating
// them.
func TestCreateTopicPartitionsCreatesMissingPublishTopics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	record := func(c *Client) error {
		return c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, freshEvent{ID: "e-1"})
		})
	}

	cfg := b.config("fresh")
	cfg.PublishTopics = []string{freshTopic}
	require.ErrorIs(t, record(b.client(t, cfg)), ErrPartitionsUnknown, "by default a missing topic is not created")
	adm := kadm.NewClient(b.kafka.Client(t))
	details, err := adm.ListTopics(ctx, b.kafkaTopic(freshTopic))
	require.NoError(t, err)
	require.Error(t, details[b.kafkaTopic(freshTopic)].Err, "the topic still does not exist")

	cfg.CreateTopicPartitions = 4
	c := b.client(t, cfg)
	require.NoError(t, record(c))
	// A client of its own: kadm caches the metadata that said unknown.
	adm = kadm.NewClient(b.kafka.Client(t))
	details, err = adm.ListTopics(ctx, b.kafkaTopic(freshTopic))
	require.NoError(t, err)
	require.NoError(t, details[b.kafkaTopic(freshTopic)].Err)
	require.Len(t, details[b.kafkaTopic(freshTopic)].Partitions, 4)
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "topic", Value: freshTopic}, {Key: "partition", Value: bson.D{{Key: "$lt", Value: 4}}}}))

	// An existing topic is left as it is (a second client, as another
	// replica would start).
	cfg.CreateTopicPartitions = 8
	require.NoError(t, record(b.client(t, cfg)))
	adm = kadm.NewClient(b.kafka.Client(t))
	details, err = adm.ListTopics(ctx, b.kafkaTopic(freshTopic))
	require.NoError(t, err)
	require.Len(t, details[b.kafkaTopic(freshTopic)].Partitions, 4)

	cfg.CreateTopicPartitions = -1
	_, err = New(cfg)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "CreateTopicPartitions")
}

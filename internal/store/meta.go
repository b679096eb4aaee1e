package store

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// InboxStamp is the metadata document naming an inbox collection's owner.
type InboxStamp struct {
	ConsumerGroup string    `bson:"consumer_group"`
	Service       string    `bson:"service"`
	StampedAt     time.Time `bson:"stamped_at"`
}

// InboxStampID is the _id of the stamp of the inbox collection named
// inbox in MetaCollection.
func InboxStampID(inbox string) bson.D {
	return bson.D{{Key: "inbox", Value: inbox}}
}

// StampInbox records group (of service) as the owner of the inbox
// collection named inbox if it has none, and returns the stamp in force:
// the caller compares its group. Replicas of one service may call it at
// once: the stamp is an upsert that sets the owner only when it inserts,
// and a replica that loses the insertion race reads the winner's stamp.
func StampInbox(ctx context.Context, meta *mongo.Collection, inbox, group, service string) (InboxStamp, error) {
	id := InboxStampID(inbox)
	_, err := meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{
			{Key: "consumer_group", Value: group},
			{Key: "service", Value: service},
			{Key: "stamped_at", Value: time.Now().UTC()},
		}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		return InboxStamp{}, fmt.Errorf("outbox: stamp inbox collection %q: %w", inbox, err)
	}
	var st InboxStamp
	if err := meta.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&st); err != nil {
		return InboxStamp{}, fmt.Errorf("outbox: read the stamp of inbox collection %q: %w", inbox, err)
	}
	return st, nil
}

// ReadInboxStamp reads the stamp of the inbox collection named inbox;
// nil when it has none.
func ReadInboxStamp(ctx context.Context, meta *mongo.Collection, inbox string) (*InboxStamp, error) {
	var st InboxStamp
	err := meta.FindOne(ctx, bson.D{{Key: "_id", Value: InboxStampID(inbox)}}).Decode(&st)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &st, nil
}

// TopicResetID is the _id of the claim, in MetaCollection, of the reset of
// the consumer group's offsets of the Kafka topic of that topic id (a topic
// deleted and created again): one per group, topic and id.
func TopicResetID(group, topic string, id [16]byte) bson.D {
	return bson.D{{Key: "recreated", Value: group}, {Key: "topic", Value: topic}, {Key: "id", Value: hex.EncodeToString(id[:])}}
}

// TopicReset is the claim of the reset of a recreated topic's offsets:
// the replica that claimed it or set the offsets, and when they were set
// (nil until then).
type TopicReset struct {
	ClaimedAt time.Time  `bson:"claimed_at"`
	DoneAt    *time.Time `bson:"done_at"`
	Replica   string     `bson:"replica"`
}

// TopicResets are the reset claims of one consumer group in Meta, written
// in the name of one replica. The consumer's watcher of recreated topics
// (internal/kafkawatch) uses them so that the group's offsets of a
// recreated topic are set once, by the first replica that claims them.
type TopicResets struct {
	Meta           *mongo.Collection
	Group, Replica string
}

// Claim inserts the claim of the reset of topic (of that id) unless there
// is one; it reports whether this call inserted it.
func (r TopicResets) Claim(ctx context.Context, topic string, id [16]byte) (bool, error) {
	res, err := r.Meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: TopicResetID(r.Group, topic, id)}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{
			{Key: "claimed_at", Value: time.Now().UTC()},
			{Key: "replica", Value: r.Replica},
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

// State reads the claim of the reset of topic (of that id): found is false
// when there is none, done once its offsets were set.
func (r TopicResets) State(ctx context.Context, topic string, id [16]byte) (found, done bool, replica string, err error) {
	var doc TopicReset
	err = r.Meta.FindOne(ctx, bson.D{{Key: "_id", Value: TopicResetID(r.Group, topic, id)}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, false, "", nil
	}
	if err != nil {
		return false, false, "", err
	}
	return true, doc.DoneAt != nil, doc.Replica, nil
}

// Finish marks the claim of the reset of topic (of that id) done by this
// replica, making it if it is missing.
func (r TopicResets) Finish(ctx context.Context, topic string, id [16]byte) error {
	_, err := r.Meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: TopicResetID(r.Group, topic, id)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "done_at", Value: time.Now().UTC()}, {Key: "replica", Value: r.Replica}}}},
		options.UpdateOne().SetUpsert(true))
	return err
}

// Withdraw deletes the claim of the reset of topic (of that id) unless it
// is done, so that the next replica to resubscribe sets the offsets.
func (r TopicResets) Withdraw(ctx context.Context, topic string, id [16]byte) error {
	_, err := r.Meta.DeleteOne(ctx, bson.D{{Key: "_id", Value: TopicResetID(r.Group, topic, id)}, {Key: "done_at", Value: bson.D{{Key: "$exists", Value: false}}}})
	return err
}

// TopicMetaID is the _id of the document, in MetaCollection, of the
// publish topic topic (bare) of the outbox collection named outbox.
func TopicMetaID(outbox, topic string) bson.D {
	return bson.D{{Key: "outbox", Value: outbox}, {Key: "topic", Value: topic}}
}

// TopicMeta is a publish topic's document in MetaCollection: its partition
// count and max.message.bytes (0: not known) as Kafka reported them at
// ReadAt. Record computes partitions from the count, so a replica that
// cannot reach Kafka records with the stored one.
type TopicMeta struct {
	Topic           string
	Partitions      int
	MaxMessageBytes int
	ReadAt          time.Time
}

// ReadTopicMetas reads the stored documents of the publish topics of the
// outbox collection named outbox: of topics, or, when none is given, of
// every topic with a stored count.
func ReadTopicMetas(ctx context.Context, meta *mongo.Collection, outbox string, topics ...string) ([]TopicMeta, error) {
	filter := bson.D{{Key: "_id.outbox", Value: outbox}, {Key: "partitions", Value: bson.D{{Key: "$exists", Value: true}}}}
	if len(topics) > 0 {
		ids := make(bson.A, len(topics))
		for i, t := range topics {
			ids[i] = TopicMetaID(outbox, t)
		}
		filter = bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
	}
	cur, err := meta.Find(ctx, filter)
	if err != nil {
		return nil, err
	}
	var docs []struct {
		ID struct {
			Topic string `bson:"topic"`
		} `bson:"_id"`
		Partitions      int       `bson:"partitions"`
		MaxMessageBytes int       `bson:"max_message_bytes"`
		ReadAt          time.Time `bson:"read_at"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	out := make([]TopicMeta, len(docs))
	for i, d := range docs {
		out[i] = TopicMeta{Topic: d.ID.Topic, Partitions: d.Partitions, MaxMessageBytes: d.MaxMessageBytes, ReadAt: d.ReadAt}
	}
	return out, nil
}

// SaveTopicMeta stores a publish topic's document of the outbox collection
// named outbox (an upsert); a MaxMessageBytes of 0 leaves the stored limit
// as it is. Replicas may save at once: an upsert that loses the insertion
// race to another replica's is taken for saved, both having read Kafka.
func SaveTopicMeta(ctx context.Context, meta *mongo.Collection, outbox string, m TopicMeta) error {
	set := bson.D{{Key: "partitions", Value: m.Partitions}, {Key: "read_at", Value: m.ReadAt}}
	if m.MaxMessageBytes > 0 {
		set = append(set, bson.E{Key: "max_message_bytes", Value: m.MaxMessageBytes})
	}
	_, err := meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: TopicMetaID(outbox, m.Topic)}},
		bson.D{{Key: "$set", Value: set}}, options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return nil
	}
	return err
}

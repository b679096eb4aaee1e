package outbox

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// metaCollection holds the framework's metadata documents in
// Config.Database, next to the outbox and inbox collections:
//
//   - {_id: {inbox: <InboxCollection>}, consumer_group, service, stamped_at}:
//     the consumer group that owns an inbox collection (see ErrInboxOwned);
//   - {_id: {outbox: <OutboxCollection>, topic}, partitions, read_at}: the
//     partition count of a publish topic at the last successful Kafka
//     metadata read (see ErrPartitionsUnknown);
//   - {_id: "replica:<instance id>", kind: "replica", ..., last_seen}: the
//     liveness record of a running Client (see internal/liveness and
//     Admin.Replicas);
//   - {_id: {recreated: <consumer group>, topic, id}, claimed_at, done_at,
//     replica}: the reset of the group's offsets of a topic deleted and
//     created again (id: the new topic's id, in hex) to its start, claimed
//     by one replica and done once (see recreated.go).
//
// A collection of its own rather than reserved documents in the inbox and
// outbox: every query on those collections (claims, parked and held lists,
// status counts, the publisher's scans and change stream, outboxctl, the
// Python event-outbox library in mixed fleets and migrations) would
// otherwise have to know to skip them, and a document whose _id is not an
// InboxID would break any code that decodes a whole inbox. Its name is
// fixed, not configurable, so that two services sharing a database always
// meet the same stamps. Its only index besides _id is meta_replica_ttl, a
// TTL index on last_seen restricted to the replica records (kind
// "replica"): stamps and counts never expire.
const metaCollection = "outbox_meta"

// inboxStamp is the metadata document naming an inbox collection's owner.
type inboxStamp struct {
	ConsumerGroup string    `bson:"consumer_group"`
	Service       string    `bson:"service"`
	StampedAt     time.Time `bson:"stamped_at"`
}

// stampInbox records Config.ConsumerGroup as the owner of the inbox
// collection if it has none, and returns an error wrapping ErrInboxOwned if
// another group owns it. Replicas of one service may call it at once: the
// stamp is an upsert that sets the owner only when it inserts, and a
// replica that loses the insertion race reads the winner's stamp.
func (c *Client) stampInbox(ctx context.Context) error {
	id := bson.D{{Key: "inbox", Value: c.cfg.InboxCollection}}
	_, err := c.meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$setOnInsert", Value: bson.D{
			{Key: "consumer_group", Value: c.cfg.ConsumerGroup},
			{Key: "service", Value: c.cfg.Service},
			{Key: "stamped_at", Value: time.Now().UTC()},
		}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("outbox: stamp inbox collection %q: %w", c.cfg.InboxCollection, err)
	}
	var st inboxStamp
	if err := c.meta.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&st); err != nil {
		return fmt.Errorf("outbox: read the stamp of inbox collection %q: %w", c.cfg.InboxCollection, err)
	}
	if st.ConsumerGroup == c.cfg.ConsumerGroup {
		return nil
	}
	return fmt.Errorf("%w: inbox collection %q of database %q belongs to consumer group %q (service %q, since %s), "+
		"and this client's consumer group is %q: two services sharing an inbox collection skip each other's events. "+
		"Set Config.InboxCollection of this service to a collection of its own (for example %q). "+
		"If the collection was handed over on purpose (a renamed group), delete the document "+
		"{_id: {inbox: %q}} from the %s collection first",
		ErrInboxOwned, c.cfg.InboxCollection, c.cfg.Database, st.ConsumerGroup, st.Service,
		st.StampedAt.Format(time.RFC3339), c.cfg.ConsumerGroup, c.cfg.Service+"_inbox",
		c.cfg.InboxCollection, metaCollection)
}

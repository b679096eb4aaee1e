package store

import (
	"context"
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

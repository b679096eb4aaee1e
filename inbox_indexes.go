package outbox

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// indexInboxParkedPartition is the name of the index of held keys.
const indexInboxParkedPartition = "inbox_parked_partition"

// ensureInboxHoldIndexes creates inbox_parked_partition: {_id.topic,
// partition, partition_key, offset} where parked is true. It serves the
// queries of Config.PoisonPolicy HoldKey (poison.go): the held keys of a
// partition read when a worker starts, the chain of a key, and the events
// held behind a head, in offset order. Being partial, it holds only parked
// events, so it stays small. Idempotent; EnsureIndexes calls it.
func ensureInboxHoldIndexes(ctx context.Context, inbox *mongo.Collection) error {
	_, err := inbox.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "_id.topic", Value: 1}, {Key: "partition", Value: 1}, {Key: "partition_key", Value: 1}, {Key: "offset", Value: 1}},
		Options: options.Index().SetName(indexInboxParkedPartition).
			SetPartialFilterExpression(bson.D{{Key: "parked", Value: true}}),
	})
	if err != nil {
		return fmt.Errorf("outbox: create index %s on %s: %w", indexInboxParkedPartition, inbox.Name(), err)
	}
	return nil
}

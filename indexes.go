package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Index names, part of the storage format.
const (
	indexOutboxPending   = "outbox_pending"
	indexOutboxTTL       = "outbox_published_ttl"
	indexOutboxFailed    = "outbox_failed"
	indexInboxTTL        = "inbox_handled_ttl"
	indexInboxParked     = "inbox_parked"
	codeIndexOptConflict = 85 // IndexOptionsConflict
)

// EnsureIndexes creates the indexes the framework needs, and is idempotent:
//
//   - outbox_pending: {topic, partition, seq, _id} where published is false,
//     the publisher's backlog query (each replica reads only the partitions
//     it owns, in order);
//   - outbox_published_ttl: TTL on published_at where published is true,
//     deleting published events after Config.OutboxRetention;
//   - outbox_failed: {failed_at} where failed is true, for operators;
//   - inbox_handled_ttl: TTL on handled_at where handled is true, deleting
//     handled events after Config.InboxRetention;
//   - inbox_parked: {parked_at} where parked is true, for listing parked
//     events.
//
// Unpublished, unhandled and parked documents never expire. Several replicas
// may call it at once. A changed retention takes effect: the TTL of an
// existing index is updated in place with collMod. Run calls it on start.
func (c *Client) EnsureIndexes(ctx context.Context) error {
	pending := bson.D{{Key: "published", Value: false}}
	if err := ensureIndexes(ctx, c.outbox,
		mongo.IndexModel{
			Keys:    bson.D{{Key: "topic", Value: 1}, {Key: "partition", Value: 1}, {Key: "seq", Value: 1}, {Key: "_id", Value: 1}},
			Options: options.Index().SetName(indexOutboxPending).SetPartialFilterExpression(pending),
		},
		mongo.IndexModel{
			Keys:    bson.D{{Key: "failed_at", Value: 1}},
			Options: options.Index().SetName(indexOutboxFailed).SetPartialFilterExpression(bson.D{{Key: "failed", Value: true}}),
		},
	); err != nil {
		return err
	}
	if err := ensureIndexes(ctx, c.inbox, mongo.IndexModel{
		Keys:    bson.D{{Key: "parked_at", Value: 1}},
		Options: options.Index().SetName(indexInboxParked).SetPartialFilterExpression(bson.D{{Key: "parked", Value: true}}),
	}); err != nil {
		return err
	}
	if err := ensureTTL(ctx, c.outbox, indexOutboxTTL, "published_at", "published", int32(c.cfg.OutboxRetention.Seconds())); err != nil {
		return err
	}
	return ensureTTL(ctx, c.inbox, indexInboxTTL, "handled_at", "handled", int32(c.cfg.InboxRetention.Seconds()))
}

func ensureIndexes(ctx context.Context, coll *mongo.Collection, models ...mongo.IndexModel) error {
	if _, err := coll.Indexes().CreateMany(ctx, models); err != nil {
		return fmt.Errorf("outbox: create indexes on %s: %w", coll.Name(), err)
	}
	return nil
}

// ensureTTL creates a partial TTL index on field where flag is true, or
// updates the expiry of an existing one.
func ensureTTL(ctx context.Context, coll *mongo.Collection, name, field, flag string, seconds int32) error {
	model := mongo.IndexModel{
		Keys: bson.D{{Key: field, Value: 1}},
		Options: options.Index().SetName(name).SetExpireAfterSeconds(seconds).
			SetPartialFilterExpression(bson.D{{Key: flag, Value: true}}),
	}
	_, err := coll.Indexes().CreateOne(ctx, model)
	var cmdErr mongo.CommandError
	if err == nil || !errors.As(err, &cmdErr) || cmdErr.Code != codeIndexOptConflict {
		if err != nil {
			return fmt.Errorf("outbox: create index %s on %s: %w", name, coll.Name(), err)
		}
		return nil
	}
	// Same keys, other expireAfterSeconds: the retention changed.
	err = coll.Database().RunCommand(ctx, bson.D{
		{Key: "collMod", Value: coll.Name()},
		{Key: "index", Value: bson.D{{Key: "name", Value: name}, {Key: "expireAfterSeconds", Value: seconds}}},
	}).Err()
	if err != nil {
		return fmt.Errorf("outbox: update TTL of index %s on %s: %w", name, coll.Name(), err)
	}
	return nil
}

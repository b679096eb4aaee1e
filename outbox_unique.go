package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// flushError wraps the error of the outbox insert of n events: a duplicate
// key error can only come from an idempotency index (the _id is new):
// ours, or the Python event-outbox library's, which a Python replica
// created after this client started (it indexes every one of our documents
// as {null, null, null}; see ErrEventOutboxNotMigrated).
func flushError(n int, err error) error {
	if mongo.IsDuplicateKeyError(err) && strings.Contains(err.Error(), " index: idempotency dup key") {
		return fmt.Errorf("%w: insert %d events: %w", ErrEventOutboxNotMigrated, n, err)
	}
	if mongo.IsDuplicateKeyError(err) {
		return fmt.Errorf("%w (Config.UniqueIdempotencyKeys): insert %d events: %w", ErrDuplicateEvent, n, err)
	}
	return fmt.Errorf("outbox: insert %d events: %w", n, err)
}

// uniqueIndexTimeout bounds the creation of the unique index by the first
// transaction that needs it.
const uniqueIndexTimeout = 10 * time.Second

// ensureUniqueIndex makes sure, before a transaction that may record
// events, that the unique index of Config.UniqueIdempotencyKeys exists:
// without it a duplicate would be accepted under a promise of uniqueness.
// EnsureIndexes (and so Run) leaves it known to exist; a transaction
// before that creates it (bounded by uniqueIndexTimeout and ctx), and
// while it cannot be created the transaction fails instead of recording.
func (c *Client) ensureUniqueIndex(ctx context.Context) error {
	if !c.cfg.UniqueIdempotencyKeys || c.uniqueIndex.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, uniqueIndexTimeout)
	defer cancel()
	if err := ensureIndexes(ctx, c.outbox, outboxIdempotencySpec()); err != nil {
		return fmt.Errorf("outbox: Config.UniqueIdempotencyKeys: the unique index %s of %s is not known to exist and could not be made (Client.EnsureIndexes makes it), so nothing is recorded: %w",
			indexOutboxIdempotency, c.outbox.Name(), err)
	}
	c.uniqueIndex.Store(true)
	return nil
}

// indexOutboxIdempotency is the name of the unique index of
// Config.UniqueIdempotencyKeys.
const indexOutboxIdempotency = "outbox_idempotency"

// outboxIdempotencyKeys is the key of the unique index that
// Config.UniqueIdempotencyKeys adds to the outbox (named
// indexOutboxIdempotency): the stored topic, content schema and idempotency
// key, as the Python library's "idempotency" index on its payload fields.
// It holds only while the first event's document is kept: published events
// expire after Config.OutboxRetention.
func outboxIdempotencyKeys() bson.D {
	return bson.D{{Key: "topic", Value: 1}, {Key: "schema", Value: 1}, {Key: "idempotency_key", Value: 1}}
}

// outboxIdempotencySpec is the unique index of Config.UniqueIdempotencyKeys.
// It is partial, on the documents that have an idempotency key of their
// own: a service that took over a Python event-outbox database (Admin.
// MigrateEventOutbox) keeps the library's published documents until they
// expire, and those have the key inside their payload only; in a full
// index they would all collide on {null, null, null}. The earlier,
// non-partial definition is replaced on start.
func outboxIdempotencySpec() indexSpec {
	return indexSpec{name: indexOutboxIdempotency, keys: outboxIdempotencyKeys(), unique: true,
		partial: bson.D{{Key: "idempotency_key", Value: bson.D{{Key: "$type", Value: "string"}}}},
		replaces: func(ix bson.D) bool {
			key, _ := lookup(ix, "key")
			_, partial := lookup(ix, "partialFilterExpression")
			return !partial && indexBool(ix, "unique") && sameBSON(key, outboxIdempotencyKeys(), true)
		}}
}

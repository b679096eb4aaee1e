package outbox

import (
	"context"

	"github.com/event-outbox/outbox/internal/store"
)

// outboxIndexes are the indexes of the outbox collection.
func (c *Client) outboxIndexes() []store.IndexSpec {
	return store.OutboxIndexes(c.cfg.OutboxRetention, c.cfg.UniqueIdempotencyKeys)
}

// inboxIndexes are the indexes of the inbox collection. Only a client that
// consumes (has handlers) creates them, after checking that the inbox
// belongs to its consumer group (see stampInbox).
func (c *Client) inboxIndexes() []store.IndexSpec {
	return store.InboxIndexes(c.cfg.InboxRetention)
}

// EnsureIndexes prepares the collections, and is idempotent. On the outbox:
//
//   - outbox_pending: {topic, partition, seq, _id} where published is false,
//     the publisher's backlog query (each replica reads only the partitions
//     it owns, in order);
//   - outbox_published_ttl: TTL on published_at where published is true,
//     deleting published events after Config.OutboxRetention;
//   - outbox_failed: {failed_at} where failed is true, for operators;
//   - outbox_idempotency, with Config.UniqueIdempotencyKeys: unique on
//     {topic, schema, idempotency_key}, so an event recorded twice fails
//     with ErrDuplicateEvent.
//
// On the scheduled events' collection (Config.OutboxCollection +
// "_scheduled", see WithPublishAt): outbox_scheduled_due {topic, partition,
// due_at, seq, _id} where promoted and failed are false, the promoter's
// query; outbox_scheduled_key {topic, idempotency_key, schema} for
// CancelScheduled (unique with Config.UniqueIdempotencyKeys);
// outbox_scheduled_promoted_ttl, TTL on promoted_at where promoted is true,
// deleting the record of a promotion after Config.OutboxRetention.
//
// When handlers are registered (the client consumes), it first checks that
// the inbox collection belongs to Config.ConsumerGroup, stamping it for that
// group if it is new (see ErrInboxOwned), then creates on the inbox:
//
//   - inbox_handled_ttl: TTL on handled_at where handled is true, deleting
//     handled events after Config.InboxRetention;
//   - inbox_parked: {parked_at} where parked is true, for listing parked
//     events;
//   - inbox_parked_partition: {_id.topic, partition, partition_key, offset}
//     where parked is true, for the held keys of a partition
//     (Config.PoisonPolicy HoldKey).
//
// With Config.ClaimCheck, a client that publishes creates on the
// claim-check database's outbox_payloads collection payloads_ref (unique
// {ref, n}) and payloads_published_ttl (TTL on published_at where
// published is true, deleting payloads OutboxRetention plus
// ClaimCheck.Margin after their event's latest publication).
//
// On the outbox_meta collection, meta_replica_ttl: TTL on last_seen where
// kind is "replica", deleting the liveness records of replicas (see
// Admin.Replicas) ten minutes after their last refresh.
//
// A client without handlers leaves the inbox alone: its InboxRetention
// must not change the TTL of another service's inbox.
//
// Unpublished, unhandled and parked documents never expire. Indexes are
// matched by key pattern and partial filter, whatever their names: an
// equivalent index created by hand or by another library (the Python
// event-outbox library names its TTL indexes "expiration") is reused, and a
// changed retention updates the TTL of whichever index it is, in place
// (collMod). Several replicas may call it at once. An index that cannot be
// reconciled returns an error wrapping ErrIndexConflict, an inbox of another
// group one wrapping ErrInboxOwned, an outbox collection that a Python
// event-outbox service still uses or that was not migrated from one (its
// "idempotency" index, its unpublished events) one wrapping
// ErrEventOutboxNotMigrated, before anything changes; Run returns these
// instead of retrying.
// Run calls EnsureIndexes on start.
func (c *Client) EnsureIndexes(ctx context.Context) error {
	if err := c.checkNotLibraryOutbox(ctx); err != nil {
		return err
	}
	if err := store.EnsureIndexes(ctx, c.outbox, c.outboxIndexes()...); err != nil {
		return err
	}
	if err := store.EnsureIndexes(ctx, c.scheduled, store.ScheduledIndexes(c.cfg.OutboxRetention, c.cfg.UniqueIdempotencyKeys)...); err != nil {
		return err
	}
	c.uniqueIndex.Store(c.cfg.UniqueIdempotencyKeys)
	if c.claims != nil && len(c.cfg.PublishTopics) > 0 {
		if err := store.EnsureIndexes(ctx, c.claims.Coll, c.claimIndexes()...); err != nil {
			return err
		}
	}
	if err := store.EnsureIndexes(ctx, c.meta, metaIndexes()...); err != nil {
		return err
	}
	if !c.consumes() {
		return nil
	}
	if err := c.stampInbox(ctx); err != nil {
		return err
	}
	if err := store.EnsureIndexes(ctx, c.inbox, c.inboxIndexes()...); err != nil {
		return err
	}
	return c.migrateUnreadable(ctx)
}

// consumes reports whether handlers are registered.
func (c *Client) consumes() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.handlers) > 0
}

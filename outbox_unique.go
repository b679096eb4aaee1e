package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/store"
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
	if err := store.EnsureIndexes(ctx, c.outbox, store.OutboxIdempotencySpec()); err != nil {
		return fmt.Errorf("outbox: Config.UniqueIdempotencyKeys: the unique index %s of %s is not known to exist and could not be made (Client.EnsureIndexes makes it), so nothing is recorded: %w",
			store.IndexOutboxIdempotency, c.outbox.Name(), err)
	}
	c.uniqueIndex.Store(true)
	return nil
}

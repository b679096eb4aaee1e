package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/store"
)

// ErrEventOutboxNotMigrated is returned by EnsureIndexes (and ends Run)
// when the outbox collection is still in use by, or not yet migrated from,
// the Python event-outbox library: it has the library's unique
// "idempotency" index on payload.topic, payload.content_schema and
// payload.idempotency_key, or unpublished events in the library's form.
// Running beside them is not safe: the library's index refuses this
// framework's second event (all of ours index as {null, null, null}), this
// framework never publishes the library's documents, and the library's
// relay stops at the first of ours it reads. Stop every Python replica and
// run `outboxctl migrate event-outbox` first (docs/wire-formats.md).
var ErrEventOutboxNotMigrated = errors.New("outbox: the outbox collection is the Python event-outbox library's: stop its replicas and run `outboxctl migrate event-outbox`")

// libraryIdempotencyKeys is the key of the Python library's unique
// "idempotency" outbox index.
var libraryIdempotencyKeys = store.LibraryIdempotencyKeys()

// checkNotLibraryOutbox refuses an outbox collection that a Python
// event-outbox service still uses, or that was not migrated from one (see
// ErrEventOutboxNotMigrated).
func (c *Client) checkNotLibraryOutbox(ctx context.Context) error {
	specs, err := c.outbox.Indexes().ListSpecifications(ctx)
	var cmdErr mongo.CommandError
	if errors.As(err, &cmdErr) && cmdErr.Code == store.CodeNamespaceNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("outbox: list indexes of %s: %w", c.outbox.Name(), err)
	}
	for _, s := range specs {
		if store.SameIndexKeys(s.KeysDocument, libraryIdempotencyKeys) {
			return fmt.Errorf("%w: %s.%s has the library's index %q on payload.topic, payload.content_schema, payload.idempotency_key "+
				"(a Python replica ran EventOutbox.create_indexes), which refuses this framework's events",
				ErrEventOutboxNotMigrated, c.outbox.Database().Name(), c.outbox.Name(), s.Name)
		}
	}
	var first struct {
		ID any `bson:"_id"`
	}
	err = c.outbox.FindOne(ctx, store.LibraryPendingFilter()).Decode(&first)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("outbox: look for the library's events in %s: %w", c.outbox.Name(), err)
	}
	return fmt.Errorf("%w: %s.%s holds unpublished events in the library's form (for example _id %v), which this framework never publishes",
		ErrEventOutboxNotMigrated, c.outbox.Database().Name(), c.outbox.Name(), first.ID)
}

package outbox

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
)

// Unreadable records.
//
// A record whose envelope cannot be read (no idempotency key, no content
// schema, an unknown wire format, a bad occurred-at time...) is parked at
// once as malformed, under the identity the consumer could make out: its
// content schema "unknown" when it had none, its idempotency key
// "malformed:<partition>:<offset>" when it had none (an invented key that
// would turn every redelivery of the event into a new one). Such an event
// can never be re-driven: no handler is registered for "unknown", and
// handling it under an invented key would break the inbox's dedup. So it is
// stored with unreadable: true, re-drive requests for it are refused
// (ErrNotRedrivable) instead of waiting for a consumer that will never
// serve them, and the way out is to purge it (its held events then go on)
// and, if it mattered, have its producer send it again correctly.
//
// A record whose envelope is fine but whose payload does not decode into
// the handler's type, or fails its validation, is malformed too but not
// unreadable: a later version of the service may accept it, so it can be
// re-driven (and stays parked with the new error while it still fails).

// unreadableError marks the decoding error of a record's envelope, so that
// noteFailure stores the parked document as unreadable.
type unreadableError struct{ err error }

func (e *unreadableError) Error() string { return e.err.Error() }
func (e *unreadableError) Unwrap() error { return e.err }

// unreadable wraps the error of decodeRecord.
func unreadable(err error) error { return &unreadableError{err} }

// migrateUnreadable flags the parked documents stored before the
// unreadable flag existed, which only their invented idempotency key told
// apart. Idempotent; run by EnsureIndexes for a consuming client.
func (c *Client) migrateUnreadable(ctx context.Context) error {
	_, err := c.inbox.UpdateMany(ctx, bson.D{
		{Key: store.InboxParked, Value: true},
		{Key: store.InboxIDIdempotencyKey, Value: bson.D{{Key: "$regex", Value: "^" + inventedKeyPrefix}}},
		{Key: store.InboxUnreadable, Value: bson.D{{Key: "$exists", Value: false}}},
	}, bson.D{{Key: "$set", Value: bson.D{{Key: store.InboxUnreadable, Value: true}}}})
	if err != nil {
		return fmt.Errorf("outbox: flag unreadable parked events: %w", err)
	}
	return nil
}

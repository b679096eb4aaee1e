package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// inboxDoc is the stored form of a received event (see store.InboxDoc).
type inboxDoc = store.InboxDoc[InboxID]

// errAlreadyDone reports that an event's inbox document is handled or parked.
var errAlreadyDone = errors.New("outbox: event already handled or parked")

// claim flips the event's inbox document to handled inside the transaction
// of ctx, inserting it when absent: one round trip. When the document is
// already handled (or parked) the filter does not match, the upsert collides
// with the existing _id and MongoDB answers a duplicate key error, which
// aborts the transaction: claim returns errAlreadyDone. Of two concurrent
// claims one gets a write conflict and, retried, errAlreadyDone.
func (c *Client) claim(ctx context.Context, env *Envelope, offset int64, now time.Time) error {
	filter, update := claimUpdate(env, offset, now)
	_, err := c.inbox.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return errAlreadyDone
	}
	return err
}

// claimUpdate is the filter and update of a claim (see claim).
func claimUpdate(env *Envelope, offset int64, now time.Time) (filter, update bson.D) {
	return store.Claim(inboxIDOf(env), deliveryAt(env, offset), now)
}

// deliveryAt is what the inbox keeps of the delivery of env at offset.
func deliveryAt(env *Envelope, offset int64) store.Delivery {
	return store.Delivery{Partition: env.Partition, Offset: offset, PartitionKey: env.PartitionKey,
		OccurredAt: env.OccurredAt, TraceParent: env.TraceParent, TraceState: env.TraceState}
}

// maxStoredPayload is the largest payload an inbox document stores whole
// (see store.StoredPayload).
const maxStoredPayload = store.MaxStoredPayload

// inboxEnvelope rebuilds the envelope of a stored event.
func inboxEnvelope(d *inboxDoc) Envelope {
	return Envelope{Topic: d.ID.Topic, ContentSchema: d.ID.ContentSchema, IdempotencyKey: d.ID.IdempotencyKey,
		PartitionKey: d.PartitionKey, Partition: d.Partition, OccurredAt: d.OccurredAt,
		TraceParent: d.TraceParent, TraceState: d.TraceState}
}

// storedEvent decodes the stored payload of a parked event.
func (c *Client) storedEvent(h *handler, d *inboxDoc) (Event, error) {
	if d.PayloadTruncated {
		return nil, fmt.Errorf("%w: %s", ErrPayloadTruncated, d.ID)
	}
	return h.decode(c, []byte(d.Payload))
}

// safeRun runs a handler and turns a panic into an error wrapping
// ErrHandlerPanic and, when the panic's value is an error, that error.
func safeRun(ctx context.Context, h *handler, evt Event, meta Metadata) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if rerr, ok := r.(error); ok {
				err = fmt.Errorf("%w: %w", ErrHandlerPanic, rerr)
			} else {
				err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
			}
		}
	}()
	return h.run(ctx, evt, meta)
}

package outbox

import (
	"context"
	"fmt"

	"github.com/event-outbox/outbox/internal/store"
)

// inboxDoc is the stored form of a received event (see store.InboxDoc).
type inboxDoc = store.InboxDoc[InboxID]

// deliveryAt is what the inbox keeps of the delivery of env at offset.
func deliveryAt(env *Envelope, offset int64) store.Delivery {
	return store.Delivery{Partition: env.Partition, Offset: offset, PartitionKey: env.PartitionKey,
		OccurredAt: env.OccurredAt, TraceParent: env.TraceParent, TraceState: env.TraceState}
}

// maxStoredPayload is the largest payload an inbox document stores whole
// (see store.StoredPayload).
const maxStoredPayload = store.MaxStoredPayload

// inventedKeyPrefix starts the idempotency key the consumer gives a record
// that has none (its position).
const inventedKeyPrefix = store.InventedKeyPrefix

const reasonNoHandler = store.ParkReasonNoHandler

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

package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// errLookup is what a payload's own code fails with when the request it
// serves was cancelled.
var errLookup = fmt.Errorf("price lookup: %w", context.Canceled)

// lazyOrder is an event whose JSON encoding and decoding fail with
// errLookup.
type lazyOrder struct{ OrderID string }

func (lazyOrder) Topic() string          { return ordersTopic }
func (lazyOrder) ContentSchema() string  { return "LazyOrder.v1" }
func (e lazyOrder) PartitionKey() string { return e.OrderID }

func (lazyOrder) MarshalJSON() ([]byte, error) { return nil, errLookup }
func (*lazyOrder) UnmarshalJSON([]byte) error  { return errLookup }

// Every path that wraps a cause under one of the package's sentinels keeps
// the cause in the chain (%w, not %v): a caller can tell a cancellation from
// a bad event.
func TestErrorsKeepTheirCause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("orders"))
	ctx := context.Background()

	t.Run("record: encoding the event", func(t *testing.T) {
		err := c.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, lazyOrder{OrderID: "o-1"})
		})
		require.ErrorIs(t, err, ErrInvalidEvent)
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("consume: decoding the payload", func(t *testing.T) {
		require.NoError(t, Handle(c, func(context.Context, lazyOrder, Metadata) error { return nil }))
		h := c.handlerFor(ordersTopic, "LazyOrder.v1")
		require.NotNil(t, h)
		_, err := h.decode(c, []byte(`{"OrderID":"o-1"}`))
		require.ErrorIs(t, err, ErrMalformedRecord)
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("consume: a handler's panic with an error", func(t *testing.T) {
		h := &handler{run: func(context.Context, Event, Metadata) error { panic(errLookup) }}
		err := safeRun(ctx, h, lazyOrder{}, Metadata{})
		require.ErrorIs(t, err, ErrHandlerPanic)
		require.ErrorIs(t, err, context.Canceled)

		h = &handler{run: func(context.Context, Event, Metadata) error { panic("not an error") }}
		err = safeRun(ctx, h, lazyOrder{}, Metadata{})
		require.ErrorIs(t, err, ErrHandlerPanic)
		require.ErrorContains(t, err, "not an error")
	})

	t.Run("codec: a bad occurred-at header", func(t *testing.T) {
		rec := encodeRecord(&Envelope{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k",
			OccurredAt: time.Now()}, []byte(`{}`))
		for i := range rec.Headers {
			if rec.Headers[i].Key == HeaderOccurredAt {
				rec.Headers[i] = kgo.RecordHeader{Key: HeaderOccurredAt, Value: []byte("yesterday")}
			}
		}
		_, _, err := decodeRecord(rec)
		require.ErrorIs(t, err, ErrMalformedRecord)
		var perr *time.ParseError
		require.True(t, errors.As(err, &perr), "the time parser's error stays in the chain: %v", err)
	})
}

package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// parkedSetup runs a consumer whose handler fails while fail is set; events
// are parked at the first failure.
func parkedSetup(t *testing.T) (*bundle, *Client, *atomic.Bool, *atomic.Int64) {
	t.Helper()
	b := setup(t)
	cfg := consumerConfig(b, "parked")
	cfg.MaxAttempts = 1
	// The events of these tests share a key; held keys have tests of their
	// own (poison_test.go).
	cfg.PoisonPolicy = SkipEvent
	c := b.client(t, cfg)
	c.test.redriveEvery = 20 * time.Millisecond
	var fail atomic.Bool
	var handled atomic.Int64
	fail.Store(true)
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		if fail.Load() {
			return errors.New("downstream says no")
		}
		handled.Add(1)
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	start(t, c)
	return b, c, &fail, &handled
}

func TestParkedListRedriveRequestAndPurge(t *testing.T) {
	t.Parallel()
	b, c, fail, handled := parkedSetup(t)
	ctx := context.Background()
	admin := NewAdmin(b.db, "", "")
	for _, key := range []string{"p-1", "p-2", "p-3"} {
		b.produce(t, b.envelope(key), b.payload(t, key, 0))
	}
	eventually(t, "three parked", func() bool {
		st, err := admin.StoreStatus(ctx)
		return err == nil && st.Parked == 3
	})

	all, err := admin.ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, "p-1", all[0].ID.IdempotencyKey)
	require.Contains(t, all[0].LastError, "downstream says no")
	require.False(t, all[0].ParkedAt.IsZero())
	require.Zero(t, all[0].RedriveRequestedAt)

	some, err := admin.ParkedEvents(ctx, ParkedFilter{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", Limit: 2})
	require.NoError(t, err)
	require.Len(t, some, 2)
	none, err := admin.ParkedEvents(ctx, ParkedFilter{Topic: paymentsTopic})
	require.NoError(t, err)
	require.Empty(t, none)
	none, err = admin.ParkedEvents(ctx, ParkedFilter{ParkedBefore: all[0].ParkedAt})
	require.NoError(t, err)
	require.Empty(t, none)
	one, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{all[1].ID}})
	require.NoError(t, err)
	require.Equal(t, []ParkedEvent{all[1]}, one)

	// Dry runs change nothing.
	n, err := admin.RequestRedrive(ctx, ParkedFilter{}, true)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	n, err = admin.PurgeParked(ctx, ParkedFilter{}, true)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	st, err := admin.StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Parked)
	require.Zero(t, st.RedriveRequested)

	// A re-drive request while the handler still fails: served once, the
	// event stays parked with one more attempt and no pending request.
	n, err = admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{all[0].ID}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	eventually(t, "failed re-drive served", func() bool {
		ps, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{all[0].ID}})
		return err == nil && len(ps) == 1 && ps[0].Attempts == 2 && ps[0].RedriveRequestedAt.IsZero()
	})
	require.Zero(t, handled.Load())

	// The handler recovers: the consumer serves the requests.
	fail.Store(false)
	n, err = admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{all[0].ID, all[1].ID}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	eventually(t, "two re-driven", func() bool { return handled.Load() == 2 })
	eventually(t, "one left parked", func() bool {
		st, err := admin.StoreStatus(ctx)
		return err == nil && st.Parked == 1 && st.RedriveRequested == 0
	})

	// Purge the last one: it becomes handled (discarded), and a redelivery
	// is skipped.
	n, err = admin.PurgeParked(ctx, ParkedFilter{Topic: ordersTopic}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "discarded_at", Value: bson.D{{Key: "$exists", Value: true}}}, {Key: "handled", Value: true}}))
	b.produce(t, b.envelope("p-3"), b.payload(t, "p-3", 0))
	b.produce(t, b.envelope("after"), b.payload(t, "after", 0))
	eventually(t, "event after the purged one handled", func() bool { return handled.Load() == 3 })
	require.EqualValues(t, 0, count(t, b.db.Collection("effects"), bson.D{{Key: "key", Value: "p-3"}}))

	// Naming an event that is not parked is an error.
	_, err = admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{all[2].ID}}, false)
	require.ErrorIs(t, err, ErrNotParked)
	_, err = admin.PurgeParked(ctx, ParkedFilter{IDs: []InboxID{all[0].ID}}, true)
	require.ErrorIs(t, err, ErrNotParked)
}

func TestRedriveRequestWithoutHandlerStays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "nohandler")
	c := b.client(t, cfg)
	c.test.redriveEvery = 10 * time.Millisecond
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error { return nil })
	ctx := context.Background()
	// A parked event of a schema this service has no handler for (an older
	// version's, say).
	id := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v0", IdempotencyKey: "old"}
	_, err := c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: false},
		{Key: "parked", Value: true}, {Key: "parked_at", Value: time.Now()}, {Key: "payload", Value: "{}"}})
	require.NoError(t, err)
	// And one it handles, requested together: once that one is served, the
	// loop has seen both.
	ok := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "new"}
	_, err = c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: ok}, {Key: "handled", Value: false},
		{Key: "parked", Value: true}, {Key: "parked_at", Value: time.Now().Add(time.Second)},
		{Key: "payload", Value: string(b.payload(t, "o", 0))}})
	require.NoError(t, err)
	start(t, c)
	n, err := c.Admin().RequestRedrive(ctx, ParkedFilter{}, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	eventually(t, "the handled one re-driven", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id", Value: ok}, {Key: "handled", Value: true}}) == 1
	})
	st, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.RedriveRequested, "the request without a handler stays visible")
}

package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// The insert of the events a handler recorded is the framework's own
// write: when it fails because MongoDB did (here a fail point on the
// insert, armed by the handler itself so that it hits that insert), the
// event did not fail. With MaxAttempts 1 a counted attempt would park it at
// once; it must be retried and handled, its follow-up recorded once.
func TestRecordedEventsInsertFailureIsNoAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fault API")
	}
	cfg := b.config("flushfail")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	var runs atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		if err := b.recordPayment(ctx, e.OrderID); err != nil {
			return err
		}
		if runs.Add(1) == 1 {
			b.mongo.Server.FailCommand(mongofake.FailPoint{Commands: []string{"insert"}, Times: 1, ErrorCode: 6,
				ErrorMessage: "test: host unreachable"})
		}
		return nil
	})
	start(t, c)
	b.produce(t, b.keyed("f1", "A"), b.payload(t, "f1", 1))
	eventually(t, "f1 handled", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "f1"}, {Key: "handled", Value: true}}) == 1
	})
	require.GreaterOrEqual(t, runs.Load(), int64(2), "the fail point never fired")
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}), "a failed insert of recorded events parked the event")
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "idempotency_key", Value: "pay-f1"}}), "the follow-up recorded once")
}

// A re-drive whose caller goes away while the events its handler recorded
// are inserted (the request's context ends) is cut short, not failed: the
// event stays parked as it was, no attempt counted, its last error kept.
func TestRedriveCutDuringRecordedInsertCountsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("flushcut")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	const (
		failing = iota
		cutting
		healed
	)
	var mode atomic.Int32
	var cut atomic.Pointer[context.CancelFunc]
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		switch mode.Load() {
		case failing:
			return errors.New("downstream down")
		case cutting:
			// The handler is done; its caller goes away before the
			// recorded event is inserted.
			(*cut.Load())()
		}
		return b.recordPayment(ctx, e.OrderID)
	})
	start(t, c)
	b.produce(t, b.keyed("r1", "A"), b.payload(t, "r1", 1))
	admin := c.Admin()
	ctx := context.Background()
	id := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "r1"}
	eventually(t, "r1 parked", func() bool {
		ps, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{id}})
		return err == nil && len(ps) == 1
	})
	before, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{id}})
	require.NoError(t, err)

	mode.Store(cutting)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cut.Store(&cancel)
	err = c.Redrive(rctx, id)
	require.ErrorIs(t, err, context.Canceled)
	after, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{id}})
	require.NoError(t, err)
	require.Len(t, after, 1, "the event stays parked")
	require.Equal(t, before[0].Attempts, after[0].Attempts, "a re-drive cut short is no attempt")
	require.Equal(t, before[0].Failures, after[0].Failures)
	require.Equal(t, before[0].LastError, after[0].LastError)
	require.Zero(t, count(t, c.outbox, bson.D{{Key: "idempotency_key", Value: "pay-r1"}}))

	mode.Store(healed)
	require.NoError(t, c.Redrive(ctx, id))
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "idempotency_key", Value: "pay-r1"}}))
}

// A handler that records an event and outlives the transaction lifetime
// finds its transaction ended when the recorded event is inserted
// (NoSuchTransaction): that attempt counts, as its commit would, so the
// next attempt runs (fast here) instead of the slow one for ever.
func TestRecordedInsertAfterTheLifetimeCountsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(300*time.Millisecond)))
	if b.mongo.Real {
		t.Skip("needs the embedded server's short transaction lifetime")
	}
	cfg := b.config("flushslow")
	cfg.MaxAttempts = 3
	cfg.HandlerTimeout = 20 * time.Second
	c := b.client(t, cfg)
	var runs atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		if err := b.recordPayment(ctx, e.OrderID); err != nil {
			return err
		}
		if m.Attempt == 1 {
			runs.Add(1)
			time.Sleep(600 * time.Millisecond) // past the lifetime, ignoring ctx
		}
		return nil
	})
	start(t, c)
	b.produce(t, b.keyed("s1", "A"), b.payload(t, "s1", 1))
	eventually(t, "s1 handled on a later attempt", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "s1"}, {Key: "handled", Value: true}}) == 1
	})
	require.LessOrEqual(t, runs.Load(), int64(3), "slow first attempts not counted ran again and again")
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "idempotency_key", Value: "pay-s1"}}))
}

// An insert of recorded events that fails the same way every time (here a
// server error no one calls transient, as a document validator's refusal
// is) counts as the event's failure: the event ends parked, not retried
// for ever.
func TestRecordedInsertRefusedEveryTimeParks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fault API")
	}
	cfg := b.config("flushrefused")
	cfg.MaxAttempts = 2
	c := b.client(t, cfg)
	var runs atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		runs.Add(1)
		b.mongo.Server.FailCommand(mongofake.FailPoint{Commands: []string{"insert"}, Times: 1, ErrorCode: 121,
			ErrorMessage: "test: Document failed validation", ErrorLabels: []string{}})
		return b.recordPayment(ctx, e.OrderID)
	})
	start(t, c)
	b.produce(t, b.keyed("v1", "A"), b.payload(t, "v1", 1))
	eventually(t, "v1 parked", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "v1"}, {Key: "parked", Value: true}}) == 1
	})
	require.EqualValues(t, 2, runs.Load(), "one run per attempt")
	require.Zero(t, count(t, c.outbox, bson.D{{Key: "idempotency_key", Value: "pay-v1"}}))
}

// recordPayment records the follow-up payment of order orderID in the
// transaction of ctx, under idempotency key "pay-" + orderID.
func (b *bundle) recordPayment(ctx context.Context, orderID string) error {
	return Record(ctx, paymentDone{Run: b.run, OrderID: orderID}, WithIdempotencyKey("pay-"+orderID))
}

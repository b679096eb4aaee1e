package inboxhost

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// fakeDelivery is a decoded record as a test builds it.
type fakeDelivery struct {
	id        ID
	partition int32
	key       string
	payload   []byte
}

func (d *fakeDelivery) InboxID() ID { return d.id }
func (d *fakeDelivery) At(offset int64) store.Delivery {
	return store.Delivery{Partition: d.partition, Offset: offset, PartitionKey: d.key}
}
func (d *fakeDelivery) Payload() []byte  { return d.payload }
func (d *fakeDelivery) Unreadable() bool { return false }
func (d *fakeDelivery) Ref() string      { return "" }

// fakeApp runs handlers as run says, in transactions of client.
type fakeApp struct {
	client *mongo.Client
	// run is every handler; nil handles.
	run        func(ctx context.Context, e *consume.Event) error
	releasable bool
	ran        atomic.Int64
}

func (a *fakeApp) Begin(ctx context.Context) (*Tx, error) {
	sess, err := a.client.StartSession()
	if err != nil {
		return nil, err
	}
	if err := sess.StartTransaction(options.Transaction().SetWriteConcern(writeconcern.Majority())); err != nil {
		sess.EndSession(ctx)
		return nil, err
	}
	return &Tx{Sess: sess, Ctx: mongo.NewSessionContext(ctx, sess),
		Flush: func(context.Context) error { return nil }, Committed: func(context.Context) {}}, nil
}

func (a *fakeApp) Resolve(context.Context, context.Context, []*consume.Event) (consume.Result, bool) {
	return consume.Result{}, true
}

func (a *fakeApp) Transient(error) bool { return false }

func (a *fakeApp) Stored(_ context.Context, d *Doc) (*consume.Event, error) {
	return &consume.Event{Offset: d.Offset, Key: d.PartitionKey, Attempts: int(d.Attempts), Failures: int(d.Failures),
		Data: &fakeDelivery{id: d.ID, partition: d.Partition, key: d.PartitionKey, payload: []byte(d.Payload)}}, nil
}

func (a *fakeApp) Timeout(*consume.Event) time.Duration { return time.Minute }

func (a *fakeApp) Run(ctx context.Context, e *consume.Event, _ int, _ time.Time) (func(error), error) {
	a.ran.Add(1)
	if a.run == nil {
		return func(error) {}, nil
	}
	return func(error) {}, a.run(ctx, e)
}

func (a *fakeApp) Steer(error) (bool, time.Duration, bool) { return false, 0, false }
func (a *fakeApp) Refused(error) bool                      { return false }
func (a *fakeApp) Releasable(ID) bool                      { return a.releasable }

var tp = consume.TopicPartition{Topic: "orders", Partition: 0}

func event(name, key string, offset int64) *consume.Event {
	return &consume.Event{Offset: offset, Key: key, Data: &fakeDelivery{
		id: ID{Topic: tp.Topic, ContentSchema: "Order.v1", IdempotencyKey: name}, key: key, payload: []byte(`{"n":"` + name + `"}`)}}
}

func setup(t *testing.T) (*Host, *fakeApp, *mongo.Collection) {
	t.Helper()
	db := mongotest.Start(t).DB(t)
	app := &fakeApp{client: db.Client()}
	inbox := db.Collection("inbox")
	return New(Config{Inbox: inbox, App: app}), app, inbox
}

// A key's sequence, through the host's operations: a parked head holds
// the events after it, a held head is released in order once the parked
// one is gone, and a claim of an event handled already is a duplicate.
func TestKeySequenceHoldsAndReleasesInOrder(t *testing.T) {
	t.Parallel()
	h, app, inbox := setup(t)
	ctx := context.Background()
	e1, e2, e3 := event("e1", "K", 1), event("e2", "K", 2), event("e3", "K", 3)

	require.ErrorIs(t, h.Hold(ctx, tp, e1), consume.ErrKeyFree)
	tally, err := h.Park(ctx, tp, e1, errors.New("boom"), 1, 1, "handler_error")
	require.NoError(t, err)
	require.Equal(t, consume.Tally{Attempts: 1, Failures: 1}, tally)
	require.NoError(t, h.Hold(ctx, tp, e2))
	require.NoError(t, h.Hold(ctx, tp, e3))
	require.ErrorIs(t, h.Hold(ctx, tp, e2), consume.ErrDone, "held already")

	heads, err := h.Sequences(ctx, tp)
	require.NoError(t, err)
	require.Len(t, heads, 1)
	require.Equal(t, "orders/Order.v1/e1", heads["K"].ID)
	require.False(t, heads["K"].Releasable, "parked by its handler: waits for an operator")
	_, res := h.Release(ctx, tp, "K")
	require.Equal(t, consume.HeadParked, res.Kind)
	require.Zero(t, app.ran.Load())

	stored, err := h.Lookup(ctx, tp, []*consume.Event{e1, e2, event("e4", "K", 4)}, false)
	require.NoError(t, err)
	require.Equal(t, []consume.Stored{{Done: true, Attempts: 1, Failures: 1}, {Done: true}, {}}, stored)

	// The parked head goes (an operator's purge): the held events follow.
	_, err = inbox.DeleteOne(ctx, bson.D{{Key: store.InboxID, Value: e1.Data.(*fakeDelivery).id}})
	require.NoError(t, err)
	head, ok, err := h.Head(ctx, tp, "K")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, head.Releasable, "held: it only waited")
	for _, want := range []string{"e2", "e3"} {
		e, res := h.Release(ctx, tp, "K")
		require.Equal(t, consume.Handled, res.Kind, res.Err)
		require.Equal(t, want, e.Data.(*fakeDelivery).id.IdempotencyKey)
	}
	_, ok, err = h.Head(ctx, tp, "K")
	require.NoError(t, err)
	require.False(t, ok, "the key is free")
	_, res = h.Release(ctx, tp, "K")
	require.Equal(t, consume.Empty, res.Kind)
	require.Equal(t, consume.Duplicate, h.Handle(ctx, tp, []*consume.Event{e2}).Kind, "handled by its release")
}

// A batch claims its events in one transaction: the handler's failure
// rolls every claim back, and a batch meeting a handled event says which.
func TestHandleClaimsTheBatchInOneTransaction(t *testing.T) {
	t.Parallel()
	h, app, inbox := setup(t)
	ctx := context.Background()
	fail := errors.New("handler failed")
	app.run = func(_ context.Context, e *consume.Event) error {
		if e.Data.(*fakeDelivery).id.IdempotencyKey == "b2" {
			return fail
		}
		return nil
	}
	b1, b2 := event("b1", "A", 1), event("b2", "B", 2)
	res := h.Handle(ctx, tp, []*consume.Event{b1, b2})
	require.Equal(t, consume.Failed, res.Kind)
	require.Equal(t, 1, res.At)
	require.ErrorIs(t, res.Err, fail)
	n, err := inbox.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "the batch rolled back")

	app.run = nil
	require.Equal(t, consume.Handled, h.Handle(ctx, tp, []*consume.Event{b1}).Kind)
	res = h.Handle(ctx, tp, []*consume.Event{b2, b1})
	require.Equal(t, consume.Duplicate, res.Kind)
	require.Equal(t, 1, res.At, "b1 is the handled one")
}

// An event without a key parked for want of a handler is released on its
// own, under a sequence key of its own, when this process may run it.
func TestKeylessNoHandlerEventIsReleasedAlone(t *testing.T) {
	t.Parallel()
	h, app, _ := setup(t)
	ctx := context.Background()
	e := event("k1", "", 7)
	_, err := h.Park(ctx, tp, e, errors.New("no handler"), 0, 0, store.ParkReasonNoHandler)
	require.NoError(t, err)
	heads, err := h.Sequences(ctx, tp)
	require.NoError(t, err)
	require.Empty(t, heads, "not releasable here: nothing to do")

	app.releasable = true
	heads, err = h.Sequences(ctx, tp)
	require.NoError(t, err)
	require.Len(t, heads, 1)
	for key := range heads {
		id, ok := keylessID(key)
		require.True(t, ok)
		require.Equal(t, e.Data.(*fakeDelivery).id, id)
		got, res := h.Release(ctx, tp, key)
		require.Equal(t, consume.Handled, res.Kind, res.Err)
		require.Equal(t, int64(7), got.Offset)
	}
	require.EqualValues(t, 1, app.ran.Load())
}

// A re-drive names the event it wants: one held behind another is refused
// with ErrHeld.
func TestReleaseHeadOfAnotherEventIsErrHeld(t *testing.T) {
	t.Parallel()
	h, _, _ := setup(t)
	ctx := context.Background()
	e1, e2 := event("r1", "R", 1), event("r2", "R", 2)
	_, err := h.Park(ctx, tp, e1, errors.New("boom"), 1, 1, "handler_error")
	require.NoError(t, err)
	require.NoError(t, h.Hold(ctx, tp, e2))
	want := e2.Data.(*fakeDelivery).id
	_, res := h.ReleaseHead(ctx, tp, "R", &want)
	require.Equal(t, consume.HeadParked, res.Kind)
	require.ErrorIs(t, res.Err, ErrHeld)
	require.ErrorContains(t, res.Err, "orders/Order.v1/r2 is held behind orders/Order.v1/r1")
}

func TestKeylessSequenceKeyRoundTrips(t *testing.T) {
	t.Parallel()
	for _, id := range []ID{
		{Topic: "t", ContentSchema: "S.v1", IdempotencyKey: "k"},
		{Topic: "t", ContentSchema: "S.v1/x", IdempotencyKey: "a/b%c\x00\xff"},
		{},
	} {
		got, ok := keylessID(keylessSeq(id))
		require.True(t, ok, id)
		require.Equal(t, id, got)
	}
	_, ok := keylessID("K")
	require.False(t, ok, "a partition key is no keyless sequence")
}

// Whose failure it was decides whether a run counts: a stop, a lock or
// MongoDB failing never does; what the handlers caused always does.
func TestResultsSayWhoseFailureItWas(t *testing.T) {
	t.Parallel()
	h := New(Config{App: &fakeApp{}})
	live := context.Background()
	stopped, cancel := context.WithCancel(live)
	cancel()
	conflict := mongo.CommandError{Code: 112, Labels: []string{"TransientTransactionError"}}
	aborted := mongo.CommandError{Code: codeNoSuchTransaction, Labels: []string{"TransientTransactionError"}}
	other := errors.New("handler failed")

	require.Equal(t, consume.Canceled, h.handlerResult(stopped, other).Kind)
	require.Equal(t, consume.Conflict, h.handlerResult(live, conflict).Kind)
	require.Equal(t, consume.Failed, h.handlerResult(live, aborted).Kind, "an aborted transaction is the handler's: it outlived it")
	require.Equal(t, consume.Failed, h.handlerResult(live, other).Kind)

	require.Equal(t, consume.Canceled, h.flushResult(stopped, live, other).Kind)
	require.Equal(t, consume.Locked, h.flushResult(live, live, conflict).Kind)
	require.Equal(t, consume.Failed, h.flushResult(live, live, aborted).Kind)
	require.Equal(t, consume.Failed, h.flushResult(live, stopped, conflict).Kind, "the handlers used up their time")
	require.Equal(t, consume.Infra, h.flushResult(live, live, mongo.CommandError{Code: 6, Labels: []string{"RetryableWriteError"}}).Kind)
	require.Equal(t, consume.Failed, h.flushResult(live, live, other).Kind, "an error that comes back every time must end parked")

	require.Equal(t, consume.Locked, infraResult(live, LockedOr(conflict)).Kind)
	require.Equal(t, consume.Infra, infraResult(live, other).Kind)
	require.Equal(t, consume.Canceled, infraResult(stopped, other).Kind)
}

package outbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// unknownOn is an envelope of a content schema no handler of the tests
// takes, on partition key key.
func (b *bundle) unknownOn(id, key string) Envelope {
	env := b.keyed(id, key)
	env.ContentSchema = "OrderShipped.v9"
	return env
}

// Under SkipUnknownEvents an event of a type no handler takes is skipped
// wherever it meets its key: on arrival behind a parked event, and in the
// release of a key (here the operator's re-drive) where an earlier process
// without the option held it. It never parks with no_handler, and the
// key's later events are released.
func TestSkipUnknownEventsSkipsOnHeldKeys(t *testing.T) {
	t.Parallel()
	h := holdSetup(t, nil)
	b := h.b
	ctx := context.Background()
	// A process without the option holds u1 behind the parked a1.
	h.setFailing("a1")
	stop0 := start(t, h.c)
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	b.produce(t, b.unknownOn("u1", "A"), b.payload(t, "u1", 2))
	b.produce(t, b.keyed("a2", "A"), b.payload(t, "a2", 3))
	eventually(t, "u1 and a2 held", func() bool { return h.held(t) == 2 })
	stop0()

	// The service runs with the option from now on.
	cfg := consumerConfig(b, "hold")
	cfg.MaxAttempts = 2
	cfg.SkipUnknownEvents = true
	c := b.client(t, cfg)
	c.test.redriveEvery = 20 * time.Millisecond
	h.register(c)
	start(t, c)
	b.produce(t, b.unknownOn("u2", "A"), b.payload(t, "u2", 4))
	b.produce(t, b.keyed("a3", "A"), b.payload(t, "a3", 5))
	eventually(t, "a3 held", func() bool {
		return count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "a3"}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}) == 1
	})
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "_id.idempotency_key", Value: "u2"}, {Key: "parked", Value: true}}),
		"an ignored type is skipped on arrival, even on a held key")

	h.setFailing()
	a1 := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a1"}
	require.NoError(t, c.Redrive(ctx, a1))
	require.Equal(t, []string{"a1", "a2", "a3"}, h.effectKeys(t, "A"))
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}), "nothing parked, nothing held")
	var u1 struct {
		Handled    bool   `bson:"handled"`
		SkipReason string `bson:"skip_reason"`
	}
	require.NoError(t, c.inbox.FindOne(ctx, bson.D{{Key: "_id.idempotency_key", Value: "u1"}}).Decode(&u1))
	require.True(t, u1.Handled)
	require.Equal(t, reasonNoHandler, u1.SkipReason)

	// The key is free.
	b.produce(t, b.keyed("a4", "A"), b.payload(t, "a4", 6))
	eventually(t, "a4 handled", func() bool { return len(h.effectKeys(t, "A")) == 4 })
}

// An operator's re-drive request (Admin.RequestRedrive) whose handler
// snoozes is not a failure: nothing is counted, the request stays with its
// reason visible (StoreStatus, ParkedEvent), and it runs once the handler
// lets it; then the held events follow.
func TestRedriveRequestSurvivesASnooze(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "snoozeredrive")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	c.test.redriveEvery = 20 * time.Millisecond
	const (
		failing = iota
		snoozing
		healed
	)
	var mode atomic.Int32
	var snoozes atomic.Int64
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		switch mode.Load() {
		case failing:
			return errors.New("downstream down")
		case snoozing:
			snoozes.Add(1)
			return Snooze(30 * time.Millisecond)
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	start(t, c)
	ctx := context.Background()
	admin := c.Admin()
	b.produce(t, b.keyed("a1", "A"), b.payload(t, "a1", 1))
	b.produce(t, b.keyed("a2", "A"), b.payload(t, "a2", 2))
	eventually(t, "a1 parked, a2 held", func() bool {
		st, err := admin.StoreStatus(ctx)
		return err == nil && st.Parked == 2 && st.Held == 1
	})
	a1 := InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "a1"}
	before, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{a1}})
	require.NoError(t, err)
	require.Len(t, before, 1)

	// A direct re-drive that snoozes returns ErrRedriveDeferred and counts
	// nothing.
	mode.Store(snoozing)
	err = c.Redrive(ctx, a1)
	var deferred *RedriveDeferredError
	require.ErrorAs(t, err, &deferred)
	require.ErrorIs(t, err, ErrRedriveDeferred)
	require.Equal(t, "snoozed", deferred.Reason)

	n, err := admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{a1}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	at := snoozes.Load()
	eventually(t, "the request tried a few times", func() bool { return snoozes.Load() >= at+3 })
	ps, err := admin.ParkedEvents(ctx, ParkedFilter{IDs: []InboxID{a1}})
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.False(t, ps[0].RedriveRequestedAt.IsZero(), "the request stays")
	require.True(t, strings.HasPrefix(ps[0].RedriveDeferred, "snoozed"), ps[0].RedriveDeferred)
	require.Equal(t, before[0].Attempts, ps[0].Attempts, "a snooze is not an attempt")
	require.Equal(t, before[0].Failures, ps[0].Failures)
	st, err := admin.StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.RedriveRequested)
	require.EqualValues(t, 1, st.RedriveDeferred)

	mode.Store(healed)
	eventually(t, "a1 and a2 handled", func() bool { return count(t, effects, bson.D{}) == 2 })
	eventually(t, "no request left", func() bool {
		st, err := admin.StoreStatus(ctx)
		return err == nil && st.Parked == 0 && st.RedriveRequested == 0 && st.RedriveDeferred == 0
	})
}

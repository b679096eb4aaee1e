package outbox

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestTransactCommitRecordsEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("orders"))
	ctx := context.Background()
	orders := b.db.Collection("orders")
	err := c.Transact(ctx, func(ctx context.Context) error {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}}); err != nil {
			return err
		}
		if err := Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1", Amount: 5}); err != nil {
			return err
		}
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1", Amount: 6, Seq: 1})
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, count(t, orders, bson.D{}))

	cur, err := c.outbox.Find(ctx, bson.D{}, nil)
	require.NoError(t, err)
	var docs []outboxDoc
	require.NoError(t, cur.All(ctx, &docs))
	require.Len(t, docs, 2)
	for _, d := range docs {
		require.False(t, d.Published)
		require.Equal(t, ordersTopic, d.Topic)
		require.Equal(t, "o-1", d.Key)
		require.NotZero(t, d.Seq.T, "the server fills the empty timestamp")
	}
	require.Equal(t, docs[0].Partition, docs[1].Partition, "same key, same partition")
	require.True(t, docs[0].Seq.Before(docs[1].Seq), "seq increases within a transaction")
}

func TestTransactAbortRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("orders"))
	ctx := context.Background()
	orders := b.db.Collection("orders")
	boom := errors.New("boom")
	err := c.Transact(ctx, func(ctx context.Context) error {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}}); err != nil {
			return err
		}
		if err := Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, count(t, orders, bson.D{}))
	require.Zero(t, count(t, c.outbox, bson.D{}))
}

func TestTransactInvalidEventRefusesTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("orders"))
	ctx := context.Background()
	orders := b.db.Collection("orders")
	err := c.Transact(ctx, func(ctx context.Context) error {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}}); err != nil {
			return err
		}
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "", Amount: -1})
	})
	var verr *ValidationError
	require.ErrorAs(t, err, &verr)
	require.Contains(t, verr.Field, "OrderID")
	require.Zero(t, count(t, orders, bson.D{}))
	require.Zero(t, count(t, c.outbox, bson.D{}))
}

func TestTransactRetriedAttemptKeepsOnlyLastEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("orders"))
	ctx := context.Background()
	counter := b.db.Collection("counter")
	_, err := counter.InsertOne(ctx, bson.D{{Key: "_id", Value: "c"}, {Key: "n", Value: 0}})
	require.NoError(t, err)

	// Two transactions increment the same document; the first blocks until
	// the second has written, so one of them gets a write conflict and the
	// driver retries it. Each attempt records one event: exactly two events
	// must be committed.
	firstWrote := make(chan struct{})
	release := make(chan struct{})
	attempts := 0
	errs := make(chan error, 2)
	go func() {
		errs <- c.Transact(ctx, func(ctx context.Context) error {
			attempts++
			if _, err := counter.UpdateOne(ctx, bson.D{{Key: "_id", Value: "c"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}); err != nil {
				return err
			}
			if attempts == 1 {
				close(firstWrote)
				<-release
			}
			return Record(ctx, orderPlaced{Run: b.run, OrderID: "a"})
		})
	}()
	<-firstWrote
	go func() {
		errs <- c.Transact(ctx, func(ctx context.Context) error {
			// Recorded before the conflicting write: the attempt that fails
			// must not leave this event behind.
			if err := Record(ctx, orderPlaced{Run: b.run, OrderID: "b"}); err != nil {
				return err
			}
			_, err := counter.UpdateOne(ctx, bson.D{{Key: "_id", Value: "c"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
			if err != nil {
				// The first transaction holds the document: release it so
				// this one is retried after it commits.
				select {
				case <-release:
				default:
					close(release)
				}
			}
			return err
		})
	}()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.EqualValues(t, 2, count(t, c.outbox, bson.D{}))
	var doc bson.M
	require.NoError(t, counter.FindOne(ctx, bson.D{}).Decode(&doc))
	require.EqualValues(t, 2, doc["n"])
}

// Transact of one Client called with the transaction of another (its
// Transact, or its handler's context) is refused, naming both: Record
// would put the event into the other Client's outbox. Nesting within one
// Client joins, and two Clients sharing a mongo.Client each record their
// own events.
func TestTransactRefusesAnotherClientsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfgA, cfgB := b.config("a"), b.config("b")
	cfgA.OutboxCollection, cfgB.OutboxCollection = "outbox_a", "outbox_b"
	a, c := b.client(t, cfgA), b.client(t, cfgB)
	ctx := context.Background()
	record := func(ctx context.Context) error { return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1"}) }

	var inner error
	err := c.Transact(ctx, func(ctx context.Context) error {
		inner = a.Transact(ctx, record)
		return nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, inner, ErrForeignTransaction)
	require.ErrorContains(t, inner, cfgA.Service)
	require.ErrorContains(t, inner, cfgB.Service)
	require.ErrorContains(t, inner, "outbox_a")
	require.ErrorContains(t, inner, "outbox_b")
	// A handler's transaction (the consumer's) is refused the same way.
	inner = nil
	tx, err := hostApp{c}.Begin(ctx)
	require.NoError(t, err)
	inner = a.Transact(tx.Ctx, record)
	require.NoError(t, tx.Commit(ctx))
	tx.End(ctx)
	require.ErrorIs(t, inner, ErrForeignTransaction)
	require.Zero(t, count(t, a.outbox, bson.D{}))
	require.Zero(t, count(t, c.outbox, bson.D{}))

	// The same Client nested joins; each Client records its own.
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		return c.Transact(ctx, record)
	}))
	require.NoError(t, a.Transact(ctx, record))
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{}))
	require.EqualValues(t, 1, count(t, a.outbox, bson.D{}))
}

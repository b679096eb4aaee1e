package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
)

// TestCommitDoom: a handling transaction (it inserts a handler's effect)
// is aborted at its commit, after everything in it ran: the commit fails
// and nothing of it stays, while a write made outside it does. A release
// (it unparks an inbox entry) is told apart; an event is doomed once; a
// transaction without an effect never.
func TestCommitDoom(t *testing.T) {
	t.Parallel()
	srv, err := mongofake.NewServer()
	require.NoError(t, err)
	defer srv.Close()
	ctx := context.Background()
	admin, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	require.NoError(t, err)
	defer func() { _ = admin.Disconnect(ctx) }()
	d := newCommitDoom(1, admin, nil)
	d.rates = doomRates{Chained: 1, Plain: 1, ReleaseChained: 1, ReleasePlain: 1}
	d.armed.Store(true)
	cl, err := mongo.Connect(options.Client().ApplyURI(srv.URI()).SetMonitor(d.monitor("r")))
	require.NoError(t, err)
	defer func() { _ = cl.Disconnect(ctx) }()
	db := cl.Database("doom")
	_, err = db.Collection("inbox").InsertOne(ctx, bson.D{{Key: "_id", Value: "e1"}, {Key: "parked", Value: true}, {Key: "handled", Value: false}})
	require.NoError(t, err)

	// handle runs one handling transaction of event id: a release when
	// release, recording a follow-up outside the transaction when chained.
	handle := func(id string, release, chained bool) error {
		sess, err := cl.StartSession()
		require.NoError(t, err)
		defer sess.EndSession(ctx)
		require.NoError(t, sess.StartTransaction())
		sctx := mongo.NewSessionContext(ctx, sess)
		if release {
			_, err := db.Collection("inbox").UpdateOne(sctx, bson.D{{Key: "_id", Value: id}, {Key: "parked", Value: true}, {Key: "handled", Value: false}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "handled", Value: true}, {Key: "parked", Value: false}}}})
			require.NoError(t, err)
		}
		_, err = db.Collection(collEffects).InsertOne(sctx, bson.D{{Key: "event", Value: id}, {Key: "chained", Value: chained}})
		require.NoError(t, err)
		if chained {
			_, err = db.Collection("outbox").InsertOne(ctx, bson.D{{Key: "idempotency_key", Value: followID(id)}}) // outside: escapes
			require.NoError(t, err)
		}
		return sess.CommitTransaction(ctx)
	}
	count := func(coll string, filter bson.D) int64 {
		n, err := db.Collection(coll).CountDocuments(ctx, filter)
		require.NoError(t, err)
		return n
	}

	require.Error(t, handle("e1", true, true), "a doomed commit fails")
	require.Equal(t, doomCounts{Release: 1, Chained: 1}, d.counts())
	require.Zero(t, count(collEffects, bson.D{{Key: "event", Value: "e1"}}), "the transaction's writes went with it")
	require.Equal(t, int64(1), count("inbox", bson.D{{Key: "_id", Value: "e1"}, {Key: "parked", Value: true}}))
	require.Equal(t, int64(1), count("outbox", bson.D{{Key: "idempotency_key", Value: followID("e1")}}), "what was written outside stays")

	require.NoError(t, handle("e1", true, true), "an event's handling is doomed once")
	require.Equal(t, int64(1), count(collEffects, bson.D{{Key: "event", Value: "e1"}}))

	require.Error(t, handle("e2", false, false), "the ordinary path")
	require.Equal(t, doomCounts{Release: 1, Ordinary: 1, Chained: 1}, d.counts())

	// A transaction without a handler's effect (a recording) commits.
	err = cl.UseSession(ctx, func(sctx context.Context) error {
		sess := mongo.SessionFromContext(sctx)
		if err := sess.StartTransaction(); err != nil {
			return err
		}
		if _, err := db.Collection(collLedger).InsertOne(sctx, bson.D{{Key: "_id", Value: "x"}}); err != nil {
			return err
		}
		return sess.CommitTransaction(sctx)
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), count(collLedger, bson.D{}))

	d.armed.Store(false)
	require.NoError(t, handle("e3", false, true), "disarmed")
}

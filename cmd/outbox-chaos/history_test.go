package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// TestInboxRecorder: the recorder follows an inbox document through the
// states the framework writes (inserted failing, parked, held, released
// and handled, purged), in commit order, and catchUp returns once every
// change before it is in.
func TestInboxRecorder(t *testing.T) {
	t.Parallel()
	srv, err := mongofake.NewServer()
	require.NoError(t, err)
	defer srv.Close()
	cl, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	require.NoError(t, err)
	defer func() { _ = cl.Disconnect(context.Background()) }()
	ctx := context.Background()
	db := cl.Database("history")
	inbox := db.Collection("inbox")

	rec := newInboxRecorder(db, t.Logf)
	require.NoError(t, rec.start(ctx))
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { rec.run(rctx) })
	defer func() {
		stop()
		wg.Wait()
	}()

	a := outbox.InboxID{Topic: "t", ContentSchema: schemaStep, IdempotencyKey: "a"}
	b := outbox.InboxID{Topic: "t", ContentSchema: schemaStep, IdempotencyKey: "b"}
	set := func(id outbox.InboxID, fields bson.D, unset ...string) {
		upd := bson.D{{Key: "$set", Value: fields}}
		if len(unset) > 0 {
			u := bson.D{}
			for _, f := range unset {
				u = append(u, bson.E{Key: f, Value: ""})
			}
			upd = append(upd, bson.E{Key: "$unset", Value: u})
		}
		_, err := inbox.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, upd)
		require.NoError(t, err)
	}
	_, err = inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: a}, {Key: "handled", Value: false}, {Key: "parked", Value: false},
		{Key: "partition", Value: int32(2)}, {Key: "offset", Value: int64(7)}, {Key: "partition_key", Value: "k"},
		{Key: "payload", Value: "big"}, {Key: "attempts", Value: int32(1)}})
	require.NoError(t, err)
	set(a, bson.D{{Key: "parked", Value: true}, {Key: "last_error", Value: "boom"}})
	_, err = inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: b}, {Key: "handled", Value: false}, {Key: "parked", Value: true},
		{Key: "held_by", Value: a}, {Key: "partition", Value: int32(2)}, {Key: "offset", Value: int64(8)}, {Key: "partition_key", Value: "k"}})
	require.NoError(t, err)
	set(a, bson.D{{Key: "handled", Value: true}, {Key: "parked", Value: false}})
	set(b, bson.D{{Key: "handled", Value: true}, {Key: "parked", Value: false}}, "held_by")
	set(a, bson.D{{Key: "last_error", Value: "again"}}) // no state change
	set(b, bson.D{{Key: "discarded_at", Value: time.Now()}})

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, rec.catchUp(cctx))
	changes, lost := rec.snapshot()
	require.NoError(t, lost)
	type step struct {
		id       string
		from, to inboxState
	}
	var got []step
	for _, c := range changes {
		got = append(got, step{c.ID.IdempotencyKey, c.From, c.To})
	}
	require.Equal(t, []step{
		{"a", inboxAbsent, inboxFailing},
		{"a", inboxFailing, inboxParked},
		{"b", inboxAbsent, inboxHeld},
		{"a", inboxParked, inboxHandled},
		{"b", inboxHeld, inboxHandled},
		{"b", inboxHandled, inboxDiscarded},
	}, got)
	require.Equal(t, "k", changes[2].Key)
	require.Equal(t, int64(8), changes[2].Offset)
	require.Equal(t, "boom", changes[1].LastError)
}

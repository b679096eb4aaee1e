package mongofake_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// TestOplogRSRefusesWhatItCannotRender: a query whose answer would lack
// fields (no projection, a filter, another sort) fails with NotImplemented
// instead; a transaction is one applyOps entry; the first entry, once
// older ones were dropped, is the oldest retained write.
func TestOplogRSRefusesWhatItCannotRender(t *testing.T) {
	e := mongotest.StartEmbedded(t, mongotest.ServerOptions(mongofake.OplogSize(3)))
	ctx := context.Background()
	oplog := e.Client.Database("local").Collection("oplog.rs")
	for _, q := range []struct {
		filter any
		opts   *options.FindOptionsBuilder
	}{
		{bson.D{}, options.Find()},
		{bson.D{{Key: "op", Value: "i"}}, options.Find().SetProjection(bson.D{{Key: "ts", Value: 1}})},
		{bson.D{}, options.Find().SetProjection(bson.D{{Key: "o", Value: 1}})},
		{bson.D{}, options.Find().SetProjection(bson.D{{Key: "ts", Value: 1}}).SetSort(bson.D{{Key: "ts", Value: 1}})},
	} {
		_, err := oplog.Find(ctx, q.filter, q.opts)
		var ce mongo.CommandError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, int32(238), ce.Code, "%v", err)
		require.Contains(t, ce.Message, "local.oplog.rs")
	}

	db := e.DB(t)
	coll := db.Collection("c")
	require.NoError(t, e.Client.UseSession(ctx, func(sctx context.Context) error {
		_, err := mongo.SessionFromContext(sctx).WithTransaction(sctx, func(sctx context.Context) (any, error) {
			_, err := coll.InsertMany(sctx, []any{bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}}})
			return nil, err
		})
		return err
	}))
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 3}})
	require.NoError(t, err)

	cur, err := oplog.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "op", Value: 1}, {Key: "ns", Value: 1}, {Key: "_id", Value: 0}}))
	require.NoError(t, err)
	var entries []bson.D
	require.NoError(t, cur.All(ctx, &entries))
	// Three retained entries: the transaction's two inserts (one applyOps)
	// and the single insert; the collection's creation and the initiating
	// no-op were dropped.
	require.Equal(t, []bson.D{
		{{Key: "op", Value: "c"}, {Key: "ns", Value: "admin.$cmd"}},
		{{Key: "op", Value: "i"}, {Key: "ns", Value: db.Name() + ".c"}},
	}, entries)
}

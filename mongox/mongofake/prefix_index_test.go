package mongofake

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Queries that pin the leading fields of a non-unique (partial) index are
// answered from the index's entries; these cases check that the answers
// equal a collection scan's through updates, snapshots and type variants.
func TestEqualityPrefixOfNonUniqueIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := connect(t, newTestServer(t).URI())
	coll := client.Database("prefix").Collection("outbox")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "topic", Value: 1}, {Key: "partition", Value: 1}, {Key: "seq", Value: 1}},
		Options: options.Index().SetName("pending").
			SetPartialFilterExpression(bson.D{{Key: "published", Value: false}}),
	})
	require.NoError(t, err)
	var docs []any
	for i := range 300 {
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "topic", Value: []string{"a", "b"}[i%2]},
			{Key: "partition", Value: int32(i % 3)}, {Key: "seq", Value: 300 - i}, {Key: "published", Value: i%5 == 0}})
	}
	_, err = coll.InsertMany(ctx, docs)
	require.NoError(t, err)

	ids := func(filter bson.D) []int32 {
		t.Helper()
		cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}))
		require.NoError(t, err)
		var got []struct {
			ID int32 `bson:"_id"`
		}
		require.NoError(t, cur.All(ctx, &got))
		out := []int32{}
		for _, g := range got {
			out = append(out, g.ID)
		}
		return out
	}
	want := func(pred func(i int) bool) []int32 {
		out := []int32{}
		for i := 299; i >= 0; i-- { // ascending seq
			if pred(i) {
				out = append(out, int32(i))
			}
		}
		return out
	}
	pending := bson.D{{Key: "published", Value: false}, {Key: "topic", Value: "a"}, {Key: "partition", Value: int64(1)}}
	require.Equal(t, want(func(i int) bool { return i%2 == 0 && i%3 == 1 && i%5 != 0 }), ids(pending))
	// Not implying the partial filter: every document of the prefix.
	require.Equal(t, want(func(i int) bool { return i%2 == 0 && i%3 == 1 }),
		ids(bson.D{{Key: "topic", Value: "a"}, {Key: "partition", Value: 1.0}}))
	// First field only.
	require.Len(t, ids(bson.D{{Key: "topic", Value: "b"}, {Key: "published", Value: false}}), 120)
	// A prefix no document has.
	require.Empty(t, ids(bson.D{{Key: "published", Value: false}, {Key: "topic", Value: "c"}}))

	// Publish two, unpublish one: the index follows.
	_, err = coll.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{4, 16}}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}}}})
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 10}}, bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: false}}}})
	require.NoError(t, err)
	after := want(func(i int) bool { return i%2 == 0 && i%3 == 1 && (i%5 != 0 || i == 10) && i != 4 && i != 16 })
	require.Equal(t, after, ids(pending))

	// A transaction's snapshot still sees a document another client
	// published after the snapshot began.
	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, mongo.WithSession(ctx, sess, func(sctx context.Context) error {
		require.NoError(t, sess.StartTransaction())
		require.Equal(t, after, idsIn(t, sctx, coll, pending))
		_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 22}}, bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}}}})
		require.NoError(t, err)
		require.Equal(t, after, idsIn(t, sctx, coll, pending), "snapshot")
		// Its own inserts are found too.
		_, err = coll.InsertOne(sctx, bson.D{{Key: "_id", Value: 1000}, {Key: "topic", Value: "a"}, {Key: "partition", Value: 1}, {Key: "seq", Value: -1}, {Key: "published", Value: false}})
		require.NoError(t, err)
		require.Equal(t, append([]int32{1000}, after...), idsIn(t, sctx, coll, pending), "own insert")
		return sess.AbortTransaction(sctx)
	}))
	require.NotContains(t, ids(pending), int32(22))
	require.NotContains(t, ids(pending), int32(1000))

	// Deleted documents leave the index.
	_, err = coll.DeleteMany(ctx, bson.D{{Key: "topic", Value: "a"}, {Key: "partition", Value: 1}})
	require.NoError(t, err)
	require.Empty(t, ids(pending))
	// An index built on existing documents answers the same way.
	coll2 := client.Database("prefix").Collection("later")
	_, err = coll2.InsertMany(ctx, docs)
	require.NoError(t, err)
	_, err = coll2.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "partition", Value: 1}, {Key: "topic", Value: 1}}})
	require.NoError(t, err)
	require.Len(t, idsIn(t, ctx, coll2, bson.D{{Key: "partition", Value: 2}, {Key: "topic", Value: "b"}}), 50)
}

func idsIn(t *testing.T, ctx context.Context, coll *mongo.Collection, filter bson.D) []int32 {
	t.Helper()
	cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}))
	require.NoError(t, err)
	var got []bson.M
	require.NoError(t, cur.All(ctx, &got))
	out := []int32{}
	for _, g := range got {
		out = append(out, g["_id"].(int32))
	}
	return out
}

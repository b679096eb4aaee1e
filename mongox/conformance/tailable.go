package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Tailable cursors on capped collections.
// https://www.mongodb.com/docs/v7.0/core/tailable-cursors/
func tailableCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"TailableCursor", testTailableCursor},
		{"TailableRules", testTailableRules},
	})
}

// testTailableCursor: a tailable cursor stays open at the end of a capped
// collection and returns the documents inserted later, in insertion order;
// with awaitData a getMore waits for them.
func testTailableCursor(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createCapped(t, db, "c", options.CreateCollection().SetCapped(true).SetSizeInBytes(4096))
	insert(t, ctx, coll, `[{"_id":1,"k":"a"},{"_id":2,"k":"b"},{"_id":3,"k":"a"}]`)

	want := []any{int32(1), int32(3)} // the matching documents so far
	for i, ct := range []options.CursorType{options.Tailable, options.TailableAwait} {
		cur, err := coll.Find(ctx, D(`{"k":"a"}`), options.Find().SetCursorType(ct).SetBatchSize(1).SetMaxAwaitTime(50e6))
		require.NoError(t, err)
		var seen []any
		next := func() {
			t.Helper()
			eventually(t, caseTimeout, "the tailable cursor returns the next document", func() bool {
				if cur.TryNext(ctx) {
					seen = append(seen, cur.Current.Lookup("_id").Int32())
					return true
				}
				require.NoError(t, cur.Err())
				require.NotZero(t, cur.ID(), "the tailable cursor stays open")
				return false
			})
		}
		for range want {
			next()
		}
		require.False(t, cur.TryNext(ctx), "nothing more yet: %s", cur.Current)
		require.NoError(t, cur.Err())
		require.NotZero(t, cur.ID(), "still open at the end")
		id := int32(10 * (i + 1))
		_, err = coll.InsertMany(ctx, []any{bson.D{{Key: "_id", Value: id}, {Key: "k", Value: "b"}}, bson.D{{Key: "_id", Value: id + 1}, {Key: "k", Value: "a"}}})
		require.NoError(t, err)
		next()
		want = append(want, id+1)
		require.Equal(t, want, seen)
		require.NoError(t, cur.Close(ctx))
	}
}

// testTailableRules: tailable cursors need a capped collection, take no
// sort but {$natural: 1}, and awaitData needs tailable.
func testTailableRules(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	insert(t, ctx, db.Collection("plain"), `[{"_id":1}]`)
	createCapped(t, db, "capped", options.CreateCollection().SetCapped(true).SetSizeInBytes(4096))
	insert(t, ctx, db.Collection("capped"), `[{"_id":1}]`)

	err := db.RunCommand(ctx, D(`{"find":"plain","tailable":true}`)).Err()
	requireCode(t, err, 2, "tailable on a collection that is not capped")
	err = db.RunCommand(ctx, D(`{"find":"capped","tailable":true,"sort":{"_id":1}}`)).Err()
	requireCode(t, err, 2, "tailable with a sort")
	err = db.RunCommand(ctx, D(`{"find":"capped","awaitData":true}`)).Err()
	require.Error(t, err, "awaitData without tailable")
	require.NoError(t, db.RunCommand(ctx, D(`{"find":"capped","tailable":true,"sort":{"$natural":1}}`)).Err())
}

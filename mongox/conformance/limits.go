package conformance

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

func limitCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"NestingDepth", testNestingDepth},
	})
}

// testNestingDepth: mongod validates every incoming message
// (net.wireObjectCheck) and refuses a document nesting embedded documents
// and arrays more than maxBSONDepth levels deep (default 200) with code 15,
// Overflow; the connection goes on serving. A stored document may nest 100
// levels at least (the manual's limit).
// https://www.mongodb.com/docs/manual/reference/parameters/#mongodb-parameter-param.maxBSONDepth
// https://www.mongodb.com/docs/manual/reference/limits/#mongodb-limit-Nested-Depth-for-BSON-Documents
func testNestingDepth(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	nest := func(id, levels int) bson.D {
		var v any = int32(1)
		for i := range levels {
			if i%2 == 0 {
				v = bson.D{{Key: "a", Value: v}}
			} else {
				v = bson.A{v}
			}
		}
		return bson.D{{Key: "_id", Value: int32(id)}, {Key: "v", Value: v}}
	}
	_, err := coll.InsertOne(ctx, nest(1, 100))
	require.NoError(t, err)
	var got bson.D
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&got))
	require.Equal(t, nest(1, 100), got)

	_, err = coll.InsertOne(ctx, nest(2, 300))
	var we mongo.WriteException
	var ce mongo.CommandError
	switch {
	case errors.As(err, &ce):
		require.Equal(t, int32(15), ce.Code, ce.Message)
	case errors.As(err, &we) && len(we.WriteErrors) == 1:
		require.Equal(t, 15, we.WriteErrors[0].Code, we.WriteErrors[0].Message)
	default:
		t.Fatalf("insert of a document 300 levels deep: want an Overflow (15) error, got %v", err)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the connection still serves")
}

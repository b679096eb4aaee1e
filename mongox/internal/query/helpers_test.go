package query

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// d parses relaxed extended JSON into a bson.D.
func d(t testing.TB, s string) bson.D {
	t.Helper()
	var out bson.D
	require.NoError(t, bson.UnmarshalExtJSON([]byte(s), false, &out), s)
	return out
}

package publish

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func toJSON(t *testing.T, a bson.A) string {
	t.Helper()
	out := "["
	for i, st := range a {
		b, err := bson.MarshalExtJSON(st, false, false)
		require.NoError(t, err)
		if i > 0 {
			out += ","
		}
		out += string(b)
	}
	return out + "]"
}

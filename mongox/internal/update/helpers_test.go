package update

import (
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// j parses relaxed extended JSON into a bson.D (1 -> int32, 1.0 -> double,
// {"$numberLong": "1"} -> int64).
func j(t testing.TB, s string) bson.D {
	t.Helper()
	var d bson.D
	require.NoError(t, bson.UnmarshalExtJSON([]byte(s), false, &d), s)
	return d
}

// canon renders a value as canonical extended JSON, which spells out types.
func canon(t testing.TB, v any) string {
	t.Helper()
	b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, true, false)
	require.NoError(t, err)
	return string(b)
}

// requireSame asserts two values are identical, types and order included.
func requireSame(t testing.TB, want, got any) {
	t.Helper()
	require.Equal(t, canon(t, want), canon(t, got))
}

// requireCode asserts err is an *mongoerr.Error with the given code.
func requireCode(t testing.TB, err error, code int32, msgContains string) {
	t.Helper()
	require.Error(t, err)
	var ue *mongoerr.Error
	require.ErrorAs(t, err, &ue)
	require.Equal(t, code, ue.Code, ue.Msg)
	require.NotEmpty(t, ue.CodeName)
	require.Contains(t, ue.Msg, msgContains)
}

func mustParse(t testing.TB, s string) *Update {
	t.Helper()
	u, err := Parse(j(t, s))
	require.NoError(t, err, s)
	return u
}

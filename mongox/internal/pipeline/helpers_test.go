package pipeline

import (
	"errors"
	"testing"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// testEnv is a fixed environment so $$NOW is deterministic.
var testEnv = Env{
	Now:         time.Date(2024, 5, 6, 7, 8, 9, 10_000_000, time.UTC),
	ClusterTime: bson.Timestamp{T: 100, I: 2},
}

// doc parses relaxed extended JSON into a document.
func doc(t testing.TB, s string) bson.D {
	t.Helper()
	var d bson.D
	require.NoError(t, bson.UnmarshalExtJSON([]byte(s), false, &d), s)
	return d
}

// docs parses a JSON array of documents.
func docs(t testing.TB, s string) []bson.D {
	t.Helper()
	w := doc(t, `{"a": `+s+`}`)
	arr := w[0].Value.(bson.A)
	out := make([]bson.D, len(arr))
	for i, e := range arr {
		out[i] = e.(bson.D)
	}
	return out
}

// val parses a JSON value.
func val(t testing.TB, s string) any {
	t.Helper()
	return doc(t, `{"v": `+s+`}`)[0].Value
}

// js renders documents as canonical extended JSON for exact comparisons
// (types included).
func js(t testing.TB, v any) string {
	t.Helper()
	b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, true, false)
	require.NoError(t, err)
	return string(b)
}

// run compiles and runs a pipeline given as JSON.
func run(t testing.TB, pipeline string, input string) ([]bson.D, error) {
	t.Helper()
	stages := val(t, pipeline).(bson.A)
	p, err := Compile(stages, testEnv)
	if err != nil {
		return nil, err
	}
	return p.Run(docs(t, input))
}

// requireCode asserts err is an *mongoerr.Error with the code.
func requireCode(t testing.TB, err error, code int32) {
	t.Helper()
	require.Error(t, err)
	var pe *mongoerr.Error
	require.True(t, errors.As(err, &pe), "not an *mongoerr.Error: %v", err)
	require.Equal(t, code, pe.Code, pe.Msg)
}

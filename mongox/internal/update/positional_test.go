package update

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestPositionalOperator(t *testing.T) {
	cases := []struct {
		name, doc, query, update, want string
	}{
		{"field of matched element", `{"_id":1,"items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`, `{"items.sku":"b"}`, `{"$set":{"items.$.qty":5}}`,
			`{"_id":1,"items":[{"sku":"a","qty":1},{"sku":"b","qty":5}]}`},
		{"scalar element", `{"_id":1,"grades":[80,90,95]}`, `{"grades":{"$gte":90}}`, `{"$inc":{"grades.$":1}}`, `{"_id":1,"grades":[80,91,95]}`},
		{"elemMatch", `{"_id":1,"a":[{"x":1,"y":1},{"x":1,"y":2}]}`, `{"a":{"$elemMatch":{"x":1,"y":2}}}`, `{"$set":{"a.$.z":true}}`,
			`{"_id":1,"a":[{"x":1,"y":1},{"x":1,"y":2,"z":true}]}`},
		{"and of predicates on the array", `{"_id":1,"a":[{"x":1,"y":1},{"x":2,"y":2}]}`, `{"_id":1,"a.x":2}`, `{"$unset":{"a.$.y":""}}`,
			`{"_id":1,"a":[{"x":1,"y":1},{"x":2}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := Parse(mustDoc(t, tc.update))
			require.NoError(t, err)
			got, err := u.Apply(mustDoc(t, tc.doc), ApplyOptions{Query: mustDoc(t, tc.query)})
			require.NoError(t, err)
			require.Equal(t, mustDoc(t, tc.want), got)
		})
	}
	u, err := Parse(mustDoc(t, `{"$set":{"a.$":1}}`))
	require.NoError(t, err)
	_, err = u.Apply(bson.D{}, ApplyOptions{IsInsert: true, Query: mustDoc(t, `{"a":1}`)})
	require.ErrorContains(t, err, "positional operator did not find the match", "an upsert's insert has no matched element")
}

func mustDoc(t *testing.T, s string) bson.D {
	t.Helper()
	var d bson.D
	require.NoError(t, bson.UnmarshalExtJSON([]byte(s), false, &d))
	return d
}

func TestDiffDescription(t *testing.T) {
	d := DiffDescription(mustDoc(t, `{"_id":1,"arr":["a",{"x":1},1,2],"a":{"1":1},"b":[{"1":1}]}`),
		mustDoc(t, `{"_id":1,"arr":["a",{"x":1}],"a":{"1":2},"b":[{"1":2}]}`))
	require.Equal(t, []Truncation{{Field: "arr", NewSize: 2}}, d.Truncated, "an array that lost trailing elements is truncated, not updated")
	require.Equal(t, mustDoc(t, `{"a.1":2,"b.0.1":2}`), d.Updated)
	require.Equal(t, bson.D{
		{Key: "a.1", Value: bson.A{"a", "1"}},
		{Key: "b.0.1", Value: bson.A{"b", int32(0), "1"}},
	}, d.Disambiguated, "numeric field names and array indexes make a path ambiguous")
}

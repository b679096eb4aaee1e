package query

import (
	"errors"
	"slices"
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestSortCompare(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		a, b string
		want int
	}{
		{`{"a": 1}`, `{"a": 1}`, `{"a": 2}`, -1},
		{`{"a": -1}`, `{"a": 1}`, `{"a": 2}`, 1},
		{`{"a": 1}`, `{"a": 2}`, `{"a": 2.0}`, 0},
		{`{"a": 1}`, `{"a": {"$numberLong": "3"}}`, `{"a": {"$numberDecimal": "2.5"}}`, 1},
		{`{"a": 1}`, `{}`, `{"a": null}`, 0},
		{`{"a": 1}`, `{}`, `{"a": 1}`, -1},
		{`{"a": -1}`, `{}`, `{"a": 1}`, 1},
		{`{"a": 1}`, `{"a": "x"}`, `{"a": 5}`, 1},
		{`{"a": 1}`, `{"a": {"$minKey": 1}}`, `{"a": null}`, -1},
		{`{"a": 1}`, `{"a": {"$maxKey": 1}}`, `{"a": "z"}`, 1},
		{`{"a": 1}`, `{"a": [1, 5]}`, `{"a": 2}`, -1},
		{`{"a": -1}`, `{"a": [1, 5]}`, `{"a": 2}`, -1},
		{`{"a": 1}`, `{"a": []}`, `{"a": null}`, -1},
		{`{"a": 1}`, `{"a": []}`, `{}`, -1},
		{`{"a": -1}`, `{"a": []}`, `{}`, 1},
		{`{"a": 1}`, `{"a": []}`, `{"a": {"$minKey": 1}}`, 1},
		{`{"a": 1}`, `{"a": [[1], 2]}`, `{"a": 3}`, -1},
		{`{"a.b": 1}`, `{"a": {"b": 2}}`, `{"a": {"b": 1}}`, 1},
		{`{"a.b": 1}`, `{"a": [{"b": 3}, {"b": 1}]}`, `{"a": {"b": 2}}`, -1},
		{`{"a.b": -1}`, `{"a": [{"b": 3}, {"b": 1}]}`, `{"a": {"b": 2}}`, -1},
		{`{"a.b": 1}`, `{"a": [{"b": 3}, {"c": 1}]}`, `{"a": {"b": 2}}`, -1},
		{`{"a.0": 1}`, `{"a": [3, 1]}`, `{"a": [2, 0]}`, 1},
		{`{"a": 1, "b": -1}`, `{"a": 1, "b": 1}`, `{"a": 1, "b": 2}`, 1},
		{`{"a": 1, "b": -1}`, `{"a": 0, "b": 1}`, `{"a": 1, "b": 2}`, -1},
		{`{"a": 1.0, "b": {"$numberLong": "-1"}}`, `{"a": 1, "b": 3}`, `{"a": 1, "b": 2}`, -1},
		{`{}`, `{"a": 1}`, `{"a": 2}`, 0},
		{`{"a": 1}`, `{"a": {"x": 1}}`, `{"a": {"x": 2}}`, -1},
	}
	for _, c := range cases {
		t.Run(c.spec+" "+c.a+" "+c.b, func(t *testing.T) {
			t.Parallel()
			s, err := CompileSort(d(t, c.spec))
			require.NoError(t, err)
			a, b := d(t, c.a), d(t, c.b)
			require.Equal(t, c.want, s.Compare(a, b))
			require.Equal(t, -c.want, s.Compare(b, a))
			require.Equal(t, c.want, s.CompareKeys(s.Key(a), s.Key(b)))
		})
	}
}

func TestSortSlice(t *testing.T) {
	t.Parallel()
	s, err := CompileSort(d(t, `{"n": -1, "_id": 1}`))
	require.NoError(t, err)
	docs := []bson.D{
		d(t, `{"_id": 1, "n": 1}`),
		d(t, `{"_id": 2}`),
		d(t, `{"_id": 3, "n": [0, 7]}`),
		d(t, `{"_id": 4, "n": 5}`),
		d(t, `{"_id": 5, "n": "s"}`),
		d(t, `{"_id": 6, "n": 5}`),
	}
	slices.SortStableFunc(docs, s.Compare)
	var ids []any
	for _, doc := range docs {
		ids = append(ids, doc[0].Value)
	}
	require.Equal(t, []any{int32(5), int32(3), int32(4), int32(6), int32(1), int32(2)}, ids)
}

func TestCompileSortErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		code int32
		msg  string
	}{
		{`{"a": 2}`, 2, "$sort key ordering must be 1 (for ascending) or -1 (for descending)"},
		{`{"a": 0}`, 2, "$sort key ordering must be 1"},
		{`{"a": "asc"}`, 2, "$sort key ordering must be 1"},
		{`{"a": true}`, 2, "$sort key ordering must be 1"},
		{`{"a": {"$meta": "textScore"}}`, 238, "$meta"},
		{`{"a": {"x": 1}}`, 2, "Illegal key in $sort specification"},
		{`{"": 1}`, 2, "field names cannot be empty"},
	}
	for _, c := range cases {
		_, err := CompileSort(d(t, c.spec))
		var qe *mongoerr.Error
		require.True(t, errors.As(err, &qe), c.spec)
		require.Equal(t, c.code, qe.Code, c.spec)
		require.Contains(t, qe.Msg, c.msg, c.spec)
	}
}

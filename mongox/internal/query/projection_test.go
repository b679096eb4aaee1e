package query

import (
	"errors"
	"testing"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestProjectionApply(t *testing.T) {
	t.Parallel()
	doc := `{"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, {"g": 3}, 5, [{"f": 4}]], "h": [1, 2, 3, 4, 5]}`
	cases := []struct {
		spec, doc, want string
	}{
		{`{}`, doc, doc},
		{`{"a": 1}`, doc, `{"_id": 1, "a": 1}`},
		{`{"a": true}`, doc, `{"_id": 1, "a": 1}`},
		{`{"a": 1, "_id": 0}`, doc, `{"a": 1}`},
		{`{"_id": 0, "a": {"$numberLong": "1"}}`, doc, `{"a": 1}`},
		{`{"b": 1, "a": 1}`, doc, `{"_id": 1, "a": 1, "b": {"c": 2, "d": 3}}`},
		{`{"_id": 1}`, doc, `{"_id": 1}`},
		{`{"_id": 0}`, doc, `{"a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, {"g": 3}, 5, [{"f": 4}]], "h": [1, 2, 3, 4, 5]}`},
		{`{"b.c": 1}`, doc, `{"_id": 1, "b": {"c": 2}}`},
		{`{"b": {"c": 1}}`, doc, `{"_id": 1, "b": {"c": 2}}`},
		{`{"b.x": 1}`, doc, `{"_id": 1, "b": {}}`},
		{`{"a.x": 1}`, doc, `{"_id": 1}`},
		{`{"missing": 1}`, doc, `{"_id": 1}`},
		{`{"e.f": 1}`, doc, `{"_id": 1, "e": [{"f": 1}, {}, [{"f": 4}]]}`},
		{`{"a": 0}`, doc, `{"_id": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, {"g": 3}, 5, [{"f": 4}]], "h": [1, 2, 3, 4, 5]}`},
		{`{"a": false, "e": 0, "h": 0, "_id": 0}`, doc, `{"b": {"c": 2, "d": 3}}`},
		{`{"b.c": 0, "e.f": 0, "h": 0}`, doc, `{"_id": 1, "a": 1, "b": {"d": 3}, "e": [{"g": 2}, {"g": 3}, 5, [{}]]}`},
		{`{"a": 0, "_id": 1}`, doc, `{"_id": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, {"g": 3}, 5, [{"f": 4}]], "h": [1, 2, 3, 4, 5]}`},
		{`{"h": {"$slice": 2}}`, doc, `{"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}, {"g": 3}, 5, [{"f": 4}]], "h": [1, 2]}`},
		{`{"h": {"$slice": 2}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [1, 2]}`},
		{`{"h": {"$slice": -2}, "_id": 0, "a": 1}`, doc, `{"a": 1, "h": [4, 5]}`},
		{`{"h": {"$slice": 0}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": []}`},
		{`{"h": {"$slice": 10}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [1, 2, 3, 4, 5]}`},
		{`{"h": {"$slice": -10}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [1, 2, 3, 4, 5]}`},
		{`{"h": {"$slice": [1, 2]}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [2, 3]}`},
		{`{"h": {"$slice": [-2, 1]}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [4]}`},
		{`{"h": {"$slice": [-9, 2]}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": [1, 2]}`},
		{`{"h": {"$slice": [9, 2]}, "a": 1}`, doc, `{"_id": 1, "a": 1, "h": []}`},
		{`{"a": {"$slice": 1}, "_id": 0, "b": 1}`, doc, `{"a": 1, "b": {"c": 2, "d": 3}}`},
		{`{"x.y": {"$slice": 1}, "_id": 0, "x.z": 1}`, `{"x": [{"y": [1, 2], "z": 1, "w": 0}, {"y": [3, 4]}]}`, `{"x": [{"y": [1], "z": 1}, {"y": [3]}]}`},
		{`{"x.y": {"$slice": 1}, "a": 0}`, `{"a": 1, "x": {"y": [1, 2], "z": 1}}`, `{"x": {"y": [1], "z": 1}}`},
		{`{"e": {"$elemMatch": {"g": {"$gt": 2}}}}`, doc, `{"_id": 1, "e": [{"g": 3}]}`},
		{`{"e": {"$elemMatch": {"g": {"$gt": 1}}}, "a": 1}`, doc, `{"_id": 1, "a": 1, "e": [{"f": 1, "g": 2}]}`},
		{`{"e": {"$elemMatch": {"g": {"$gt": 9}}}, "a": 1}`, doc, `{"_id": 1, "a": 1}`},
		{`{"h": {"$elemMatch": {"$gt": 3}}, "_id": 0}`, doc, `{"h": [4]}`},
		{`{"a": {"$elemMatch": {"$gt": 0}}, "_id": 0}`, doc, `{}`},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			t.Parallel()
			p, err := CompileProjection(d(t, c.spec))
			require.NoError(t, err)
			in := d(t, c.doc)
			before := d(t, c.doc)
			require.Equal(t, d(t, c.want), normalize(p.Apply(in)))
			require.Equal(t, before, in, "input modified")
		})
	}
}

// normalize turns empty non-nil containers into the shape ExtJSON decoding
// produces, so results compare with expected documents.
func normalize(doc bson.D) bson.D {
	out := bson.D{}
	for _, e := range doc {
		out = append(out, bson.E{Key: e.Key, Value: normalizeValue(e.Value)})
	}
	return out
}

func normalizeValue(v any) any {
	switch x := v.(type) {
	case bson.D:
		return normalize(x)
	case bson.A:
		out := bson.A{}
		for _, e := range x {
			out = append(out, normalizeValue(e))
		}
		return out
	}
	return v
}

func TestCompileProjectionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		code int32
		msg  string
	}{
		{`{"a": 1, "b": 0}`, 31254, "Cannot do exclusion on field b in inclusion projection"},
		{`{"a": 0, "b": 1}`, 31253, "Cannot do inclusion on field b in exclusion projection"},
		{`{"a": 0, "b": {"$elemMatch": {"x": 1}}}`, 31253, "Cannot do inclusion on field b in exclusion projection"},
		{`{"a": 1, "a.b": 1}`, 31249, "Path collision at a.b"},
		{`{"a.b": 1, "a": 1}`, 31249, "Path collision at a"},
		{`{"a": {"$slice": 1}, "a.b": 1}`, 31249, "Path collision"},
		{`{"a.$": 1}`, 238, "positional projection operator (a.$)"},
		{`{"$a": 1}`, 16410, "may not start with '$'"},
		{`{"a": "$b"}`, 238, "projection expression at field a"},
		{`{"a": {"$literal": 1}}`, 238, "$literal"},
		{`{"a": {"$meta": "textScore"}}`, 238, "$meta"},
		{`{"a": {"$slice": "x"}}`, 2, "$slice only supports numbers"},
		{`{"a": {"$slice": [1]}}`, 2, "[skip, limit]"},
		{`{"a": {"$slice": [1, 0]}}`, 2, "$slice limit must be positive"},
		{`{"a.b": {"$elemMatch": {"x": 1}}}`, 2, "nested field"},
		{`{"a": {"$elemMatch": 1}}`, 2, "$elemMatch needs an Object"},
		{`{"a": {}}`, 2, "empty sub-projection"},
		{`{"a..b": 1}`, 2, "invalid"},
	}
	for _, c := range cases {
		_, err := CompileProjection(d(t, c.spec))
		var qe *mongoerr.Error
		require.True(t, errors.As(err, &qe), "%s: %v", c.spec, err)
		require.Equal(t, c.code, qe.Code, c.spec)
		require.Contains(t, qe.Msg, c.msg, c.spec)
	}
}

func TestProjectionNil(t *testing.T) {
	t.Parallel()
	var p *Projection
	doc := bson.D{{Key: "a", Value: 1}}
	require.Equal(t, doc, p.Apply(doc))
}

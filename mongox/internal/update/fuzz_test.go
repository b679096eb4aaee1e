package update

import (
	"testing"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// FuzzApply checks that no update/document pair panics or mutates its
// input, and that Diff describes every successful result.
func FuzzApply(f *testing.F) {
	add := func(update, doc string) {
		var u, d bson.D
		require.NoError(f, bson.UnmarshalExtJSON([]byte(update), false, &u))
		require.NoError(f, bson.UnmarshalExtJSON([]byte(doc), false, &d))
		ub, err := bson.Marshal(u)
		require.NoError(f, err)
		db, err := bson.Marshal(d)
		require.NoError(f, err)
		f.Add(ub, db)
	}
	add(`{"$set": {"a.b.2": 1, "c": [1]}, "$inc": {"n": 2}}`, `{"_id": 1, "a": {"b": [1]}, "n": 1}`)
	add(`{"$push": {"a": {"$each": [3, 1], "$sort": 1, "$slice": -2, "$position": 0}}}`, `{"_id": 1, "a": [5, 4]}`)
	add(`{"$pull": {"a": {"$gte": 2}}, "$addToSet": {"b": {"$each": [1, 1]}}}`, `{"_id": 1, "a": [1, 2, 3], "b": []}`)
	add(`{"$rename": {"a.b": "c.d"}, "$unset": {"x.0": 1}, "$pop": {"y": -1}}`, `{"_id": 1, "a": {"b": 1}, "x": [1], "y": [1, 2]}`)
	add(`{"$mul": {"a": {"$numberDecimal": "1.5"}}, "$max": {"b": 3}, "$min": {"c": 1}}`, `{"_id": 1, "a": 2, "b": 1, "c": 5}`)
	add(`{"$set": {"a.$[].b": 1}, "$currentDate": {"t": {"$type": "timestamp"}}}`, `{"_id": 1, "a": [{"b": 0}, {}]}`)
	add(`{"b": 1}`, `{"_id": 1, "a": 1}`)
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ub, db []byte) {
		var u, d bson.D
		if bson.Unmarshal(ub, &u) != nil || bson.Unmarshal(db, &d) != nil {
			return
		}
		up, err := Parse(u)
		if err != nil {
			var ue *mongoerr.Error
			require.ErrorAs(t, err, &ue)
			return
		}
		before, err := bson.Marshal(d)
		require.NoError(t, err)
		for _, insert := range []bool{false, true} {
			out, err := up.Apply(d, ApplyOptions{IsInsert: insert, Now: now})
			after, merr := bson.Marshal(d)
			require.NoError(t, merr)
			require.Equal(t, before, after, "input mutated")
			if err != nil {
				var ue *mongoerr.Error
				require.ErrorAs(t, err, &ue)
				continue
			}
			Diff(d, out)
		}
	})
}

package plan

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestChoose(t *testing.T) {
	t.Parallel()
	docs := []bson.D{
		{{Key: "_id", Value: int32(3)}, {Key: "a", Value: int32(30)}, {Key: "b", Value: "x"}},
		{{Key: "_id", Value: int32(1)}, {Key: "a", Value: int32(10)}, {Key: "b", Value: "y"}},
		{{Key: "_id", Value: int32(2)}, {Key: "a", Value: int32(20)}, {Key: "b", Value: "x"}},
	}
	indexes := []Index{
		{Name: "_id_", Key: bson.D{{Key: "_id", Value: int32(1)}}, Unique: true},
		{Name: "a_-1", Key: bson.D{{Key: "a", Value: int32(-1)}}},
		{Name: "b_text", Key: bson.D{{Key: "b", Value: "text"}}, Special: "text"},
	}
	gte := bson.D{{Key: "a", Value: bson.D{{Key: "$gte", Value: int32(20)}}}}
	for _, c := range []struct {
		name    string
		q       Query
		kind    Kind
		index   string
		keys    map[int]bson.D
		matched int64
		err     bool
	}{
		{name: "no usable index: collection scan", q: Query{Filter: bson.D{{Key: "b", Value: "x"}}}, kind: CollScan, matched: 3},
		{name: "_id equality: IDHACK", q: Query{Filter: bson.D{{Key: "_id", Value: int32(2)}}}, kind: IDHack, index: "_id_",
			keys: map[int]bson.D{2: {{Key: "_id", Value: int32(2)}}}, matched: 1},
		{name: "range on an indexed field", q: Query{Filter: gte}, kind: IxScan, index: "a_-1",
			keys: map[int]bson.D{0: {{Key: "a", Value: int32(30)}}, 2: {{Key: "a", Value: int32(20)}}}, matched: 2},
		{name: "an index that provides the sort", q: Query{Sort: bson.D{{Key: "_id", Value: int32(-1)}}}, kind: IxScan, index: "_id_", matched: 3},
		{name: "hint by name", q: Query{Hint: "a_-1"}, kind: IxScan, index: "a_-1", matched: 3},
		{name: "hint $natural", q: Query{Filter: gte, Hint: bson.D{{Key: "$natural", Value: int32(-1)}}}, kind: CollScan, matched: 3},
		{name: "hint of no index", q: Query{Hint: "nope"}, err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, _, err := Choose(indexes, docs, c.q)
			if c.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.kind, p.Kind)
			if c.index != "" {
				require.Equal(t, c.index, p.Index.Name)
			}
			if c.keys != nil {
				require.Equal(t, c.keys, p.Keys)
			}
			require.Equal(t, c.matched, p.Matched)
			if c.kind == IxScan && len(c.q.Sort) > 0 {
				require.True(t, p.ProvidesSort)
				require.True(t, p.Backward, "the sort runs the _id index backward")
			}
		})
	}
}

package bsonkit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func dec(t *testing.T, s string) bson.Decimal128 {
	t.Helper()
	d, err := bson.ParseDecimal128(s)
	require.NoError(t, err)
	return d
}

func TestCompareTypeOrder(t *testing.T) {
	t.Parallel()
	ordered := []any{
		bson.MinKey{}, nil, int32(1), "a", bson.D{{Key: "a", Value: 1}}, bson.A{1},
		bson.Binary{Data: []byte{1}}, bson.NewObjectID(), false, bson.DateTime(1),
		bson.Timestamp{T: 1}, bson.Regex{Pattern: "a"}, bson.MaxKey{},
	}
	for i := range ordered {
		for j := range ordered {
			want := cmpInt(i, j)
			require.Equal(t, want, Compare(ordered[i], ordered[j]), "%T vs %T", ordered[i], ordered[j])
		}
	}
}

func TestCompareNumbersAcrossTypes(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, Compare(int32(1), int64(1)))
	require.Equal(t, 0, Compare(int32(1), 1.0))
	require.Equal(t, 0, Compare(dec(t, "1.0"), int64(1)))
	require.Equal(t, 0, Compare(dec(t, "2.5"), 2.5))
	require.Equal(t, -1, Compare(int64(math.MaxInt64-1), int64(math.MaxInt64)))
	require.Equal(t, 1, Compare(int64(math.MaxInt64), float64(math.MaxInt64-1024)))
	require.Equal(t, -1, Compare(math.NaN(), math.Inf(-1)))
	require.Equal(t, 0, Compare(math.NaN(), dec(t, "NaN")))
	require.Equal(t, 1, Compare(dec(t, "Infinity"), 1e308))
	require.Equal(t, -1, Compare(nil, int32(0)))
	require.Equal(t, 0, Compare(nil, bson.Undefined{}))
}

func TestCompareDocumentsAndArrays(t *testing.T) {
	t.Parallel()
	require.Equal(t, -1, Compare(bson.D{{Key: "a", Value: 1}}, bson.D{{Key: "a", Value: 2}}))
	require.Equal(t, -1, Compare(bson.D{{Key: "a", Value: 1}}, bson.D{{Key: "b", Value: 1}}))
	require.Equal(t, -1, Compare(bson.D{{Key: "a", Value: 1}}, bson.D{{Key: "a", Value: 1}, {Key: "b", Value: 1}}))
	require.Equal(t, 0, Compare(bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: 1.0}}))
	// A number sorts before a string whatever the field name.
	require.Equal(t, -1, Compare(bson.D{{Key: "z", Value: 1}}, bson.D{{Key: "a", Value: "x"}}))
	require.Equal(t, -1, Compare(bson.A{1, 2}, bson.A{1, 3}))
	require.Equal(t, 1, Compare(bson.A{1, 2, 0}, bson.A{1, 2}))
}

func TestKeyAgreesWithEqual(t *testing.T) {
	t.Parallel()
	vals := []any{
		int32(1), int64(1), 1.0, dec(t, "1"), dec(t, "1.00"), 1.5, dec(t, "1.5"), 0.1, dec(t, "0.1"),
		"1", bson.D{{Key: "a", Value: int32(1)}}, bson.D{{Key: "a", Value: 1.0}}, bson.A{int64(2)}, bson.A{2.0},
		nil, bson.Undefined{}, math.NaN(), dec(t, "NaN"), math.Inf(1), dec(t, "Infinity"), true, false,
		bson.DateTime(5), bson.Timestamp{T: 5, I: 1}, bson.MinKey{}, bson.MaxKey{},
	}
	for _, a := range vals {
		for _, b := range vals {
			require.Equal(t, Equal(a, b), Key(a) == Key(b), "%#v vs %#v", a, b)
		}
	}
}

func TestLookupAndCopy(t *testing.T) {
	t.Parallel()
	doc := bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: bson.A{int32(7), bson.D{{Key: "c", Value: "x"}}}}}}}
	v, ok := Lookup(doc, "a.b.1.c")
	require.True(t, ok)
	require.Equal(t, "x", v)
	_, ok = Lookup(doc, "a.b.c")
	require.False(t, ok)
	cp := CopyDoc(doc)
	cp[0].Value.(bson.D)[0].Value.(bson.A)[0] = int32(8)
	v, _ = Lookup(doc, "a.b.0")
	require.Equal(t, int32(7), v)
}

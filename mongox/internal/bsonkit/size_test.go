package bsonkit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestSizeMatchesMarshal(t *testing.T) {
	t.Parallel()
	oid := bson.NewObjectID()
	dec, err := bson.ParseDecimal128("1.5")
	require.NoError(t, err)
	big := make(bson.A, 120)
	for i := range big {
		big[i] = int32(i)
	}
	for _, d := range []bson.D{
		{},
		{{Key: "_id", Value: oid}, {Key: "s", Value: "héllo"}, {Key: "n", Value: nil}},
		{{Key: "i", Value: int32(1)}, {Key: "l", Value: int64(2)}, {Key: "f", Value: 1.5}, {Key: "b", Value: true}, {Key: "int", Value: 7}, {Key: "bigint", Value: 1 << 40}},
		{{Key: "d", Value: bson.DateTime(5)}, {Key: "t", Value: bson.Timestamp{T: 1, I: 2}}, {Key: "dec", Value: dec}, {Key: "tm", Value: time.Unix(5, 0)}},
		{{Key: "bin", Value: bson.Binary{Subtype: 0, Data: []byte{1, 2, 3}}}, {Key: "old", Value: bson.Binary{Subtype: 2, Data: []byte{1}}}},
		{{Key: "re", Value: bson.Regex{Pattern: "a.b", Options: "i"}}, {Key: "js", Value: bson.JavaScript("x")}, {Key: "sym", Value: bson.Symbol("y")}},
		{{Key: "min", Value: bson.MinKey{}}, {Key: "max", Value: bson.MaxKey{}}, {Key: "u", Value: bson.Undefined{}}},
		{{Key: "sub", Value: bson.D{{Key: "a", Value: bson.A{int32(1), "x", bson.D{{Key: "b", Value: big}}}}}}},
		{{Key: "ptr", Value: bson.DBPointer{DB: "db.c", Pointer: oid}}, {Key: "cws", Value: bson.CodeWithScope{Code: "f", Scope: bson.D{{Key: "a", Value: int32(1)}}}}},
	} {
		raw, err := bson.Marshal(d)
		require.NoError(t, err)
		require.Equal(t, len(raw), Size(d), "%v", d)
	}
}

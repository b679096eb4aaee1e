package bsonkit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// codecSamples are documents holding every BSON type, the edge values of
// each, and the Go types the server puts in replies.
func codecSamples() []bson.D {
	oid := bson.NewObjectIDFromTimestamp(time.Unix(1700000000, 0))
	dec, _ := bson.ParseDecimal128("-1.5E+10")
	return []bson.D{
		{},
		{{Key: "a", Value: bson.D{}}, {Key: "b", Value: bson.A{}}, {Key: "c", Value: bson.A{bson.D{}, bson.A{}, nil}}},
		{{Key: "insert", Value: "c"}, {Key: "ordered", Value: true}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
			{Key: "txnNumber", Value: int64(3)}, {Key: "$db", Value: "bench"},
			{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: oid}, {Key: "v", Value: "x"}}}}},
		{{Key: "f", Value: 1.5}, {Key: "nan", Value: math.NaN()}, {Key: "inf", Value: math.Inf(-1)}, {Key: "negz", Value: math.Copysign(0, -1)},
			{Key: "i32", Value: int32(math.MinInt32)}, {Key: "i64", Value: int64(math.MaxInt64)},
			{Key: "s", Value: "h\x00llo é"}, {Key: "empty", Value: ""}, {Key: "t", Value: true}, {Key: "f0", Value: false},
			{Key: "dt", Value: bson.DateTime(-5)}, {Key: "null", Value: nil}, {Key: "u", Value: bson.Undefined{}},
			{Key: "re", Value: bson.Regex{Pattern: "^a.*", Options: "im"}}, {Key: "js", Value: bson.JavaScript("f()")},
			{Key: "sym", Value: bson.Symbol("s")}, {Key: "ts", Value: bson.Timestamp{T: 1<<32 - 1, I: 7}},
			{Key: "dec", Value: dec}, {Key: "min", Value: bson.MinKey{}}, {Key: "max", Value: bson.MaxKey{}},
			{Key: "bin0", Value: bson.Binary{Data: []byte{}}}, {Key: "bin5", Value: bson.Binary{Subtype: 0x80, Data: []byte{1, 2}}},
			{Key: "old", Value: bson.Binary{Subtype: 2, Data: []byte{9, 9}}},
			{Key: "dbp", Value: bson.DBPointer{DB: "db.c", Pointer: oid}},
			{Key: "cws", Value: bson.CodeWithScope{Code: "x", Scope: bson.D{{Key: "q", Value: int32(1)}}}},
			{Key: "", Value: int32(0)}, {Key: "deep", Value: bson.D{{Key: "x", Value: bson.A{bson.A{bson.D{{Key: "y", Value: oid}}}}}}}},
		// Go types only the encoder meets.
		{{Key: "int", Value: 5}, {Key: "bigint", Value: math.MaxInt32 + 1}, {Key: "negint", Value: math.MinInt32 - 1},
			{Key: "time", Value: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)},
			{Key: "m", Value: bson.M{"k": "v"}}, {Key: "ss", Value: []string{"a", "b"}}, {Key: "anys", Value: []any{int8(1), uint16(2)}},
			{Key: "raw", Value: bson.Raw(mustMarshal(bson.D{{Key: "r", Value: int32(1)}}))}, {Key: "nilD", Value: bson.D(nil)},
			{Key: "nilA", Value: bson.A(nil)}, {Key: "f32", Value: float32(1.25)}, {Key: "ptr", Value: (*int)(nil)},
			{Key: "st", Value: struct {
				A int `bson:"a"`
			}{A: 1}}},
	}
}

func mustMarshal(v any) []byte {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestCodecMatchesDriver: AppendDocument produces bson.Marshal's bytes and
// Decode bson.Unmarshal's bson.D, for every sample and for random documents.
func TestCodecMatchesDriver(t *testing.T) {
	t.Parallel()
	docs := codecSamples()
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		docs = append(docs, randomDoc(r, 3))
	}
	var dec Decoder
	for i, d := range docs {
		want, err := bson.Marshal(d)
		require.NoError(t, err, "sample %d", i)
		got, ok := AppendDocument([]byte{1, 2}, d)
		require.True(t, ok, "sample %d", i)
		require.Equal(t, want, got[2:], "sample %d: %v", i, d)

		var wantD bson.D
		require.NoError(t, bson.Unmarshal(want, &wantD))
		gotD, err := dec.Decode(want)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%#v", wantD), fmt.Sprintf("%#v", gotD), "sample %d", i) // %#v: NaN equals NaN
		require.Empty(t, dec.elems)
		require.Empty(t, dec.vals)
	}
}

func randomDoc(r *rand.Rand, depth int) bson.D {
	n := r.IntN(6)
	d := make(bson.D, 0, n)
	for i := range n {
		d = append(d, bson.E{Key: "k" + strconv.Itoa(i) + string(rune('a'+r.IntN(26))), Value: randomValue(r, depth)})
	}
	return d
}

func randomValue(r *rand.Rand, depth int) any {
	k := r.IntN(14)
	if depth == 0 && k < 2 {
		k = 2
	}
	switch k {
	case 0:
		return randomDoc(r, depth-1)
	case 1:
		a := bson.A{}
		for range r.IntN(4) {
			a = append(a, randomValue(r, depth-1))
		}
		return a
	case 2:
		return r.Int32()
	case 3:
		return r.Int64()
	case 4:
		return r.NormFloat64()
	case 5:
		return strconv.Itoa(r.Int())
	case 6:
		return r.IntN(2) == 0
	case 7:
		return nil
	case 8:
		return bson.DateTime(r.Int64())
	case 9:
		var oid bson.ObjectID
		for i := range oid {
			oid[i] = byte(r.UintN(256))
		}
		return oid
	case 10:
		return bson.Timestamp{T: r.Uint32(), I: r.Uint32()}
	case 11:
		b := make([]byte, r.IntN(5))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return bson.Binary{Subtype: byte(r.UintN(6)), Data: b}
	case 12:
		return bson.NewDecimal128(r.Uint64(), r.Uint64())
	default:
		return r.IntN(1 << 40)
	}
}

// TestAppendDocumentRefusesWhatMarshalRejects: a NUL in a key (which
// bson.Marshal rejects) or a value the driver cannot encode leaves dst as
// it was and reports false.
func TestAppendDocumentRefusesWhatMarshalRejects(t *testing.T) {
	t.Parallel()
	for _, d := range []bson.D{
		{{Key: "a\x00b", Value: 1}},
		{{Key: "x", Value: bson.D{{Key: "a\x00", Value: 1}}}},
		{{Key: "c", Value: make(chan int)}},
		{{Key: "re", Value: bson.Regex{Pattern: "a\x00"}}},
	} {
		_, err := bson.Marshal(d)
		require.Error(t, err)
		out, ok := AppendDocument([]byte{7}, d)
		require.False(t, ok)
		require.Equal(t, []byte{7}, out)
	}
}

// FuzzDecode: on any input Decode returns what bson.Unmarshal returns, or
// fails when it fails.
func FuzzDecode(f *testing.F) {
	for _, d := range codecSamples()[:4] {
		f.Add(mustMarshal(d))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want bson.D
		wantErr := bson.Unmarshal(raw, &want)
		var dec Decoder
		got, err := dec.Decode(raw)
		if wantErr != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%#v", want), fmt.Sprintf("%#v", got))
	})
}

package bsonkit

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Key returns a string that identifies v up to Equal: two values have the
// same key exactly when Compare reports them equal (so 1, int64(1), 1.0 and
// decimal 1 share a key). Keys are for hashing (unique indexes, $group,
// $addToSet); they do not sort.
func Key(v any) string {
	var b strings.Builder
	writeKey(&b, v)
	return b.String()
}

func writeKey(b *strings.Builder, v any) {
	r := Rank(v)
	b.WriteByte(byte(r))
	switch r {
	case RankMinKey, RankNull, RankMaxKey:
	case RankNumber:
		writeNumberKey(b, v)
	case RankString:
		s := stringOf(v)
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	case RankObject:
		d := AsDoc(v)
		b.WriteString(strconv.Itoa(len(d)))
		b.WriteByte('{')
		for _, e := range d {
			b.WriteString(strconv.Itoa(len(e.Key)))
			b.WriteByte(':')
			b.WriteString(e.Key)
			writeKey(b, e.Value)
		}
	case RankArray:
		a := AsArray(v)
		b.WriteString(strconv.Itoa(len(a)))
		b.WriteByte('[')
		for _, e := range a {
			writeKey(b, e)
		}
	case RankBinary:
		bin := binaryOf(v)
		b.WriteByte(bin.Subtype)
		b.WriteString(strconv.Itoa(len(bin.Data)))
		b.WriteByte(':')
		b.Write(bin.Data)
	case RankObjectID:
		o := v.(bson.ObjectID)
		b.Write(o[:])
	case RankBool:
		if v.(bool) {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case RankDate:
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], uint64(v.(bson.DateTime)))
		b.Write(buf[:])
	case RankTimestamp:
		t := v.(bson.Timestamp)
		var buf [8]byte
		binary.BigEndian.PutUint32(buf[:4], t.T)
		binary.BigEndian.PutUint32(buf[4:], t.I)
		b.Write(buf[:])
	case RankRegex:
		re := v.(bson.Regex)
		b.WriteString(strconv.Itoa(len(re.Pattern)))
		b.WriteByte(':')
		b.WriteString(re.Pattern)
		b.WriteString(re.Options)
	default:
		// Rare types: their extended JSON is an exact, canonical text.
		raw, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, true, false)
		if err == nil {
			b.Write(raw)
		}
	}
}

func writeNumberKey(b *strings.Builder, v any) {
	if i, ok := ToInt64(v); ok {
		b.WriteByte('i')
		b.WriteString(strconv.FormatInt(i, 10))
		return
	}
	if f, ok := v.(float64); ok {
		switch {
		case math.IsNaN(f):
			b.WriteString("nan")
		case math.IsInf(f, 1):
			b.WriteString("+inf")
		case math.IsInf(f, -1):
			b.WriteString("-inf")
		default:
			b.WriteString(toBig(v).f.Text('p', 0))
		}
		return
	}
	n := toBig(v)
	switch {
	case n.nan:
		b.WriteString("nan")
	case n.f.IsInf() && n.f.Sign() > 0:
		b.WriteString("+inf")
	case n.f.IsInf():
		b.WriteString("-inf")
	default:
		b.WriteString(n.f.Text('p', 0))
	}
}

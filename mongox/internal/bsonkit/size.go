package bsonkit

import (
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Size returns the length of d's BSON encoding (what bson.Marshal(d) would
// produce), without encoding it. Values of types AppendDocument does not
// encode itself are encoded to be measured.
func Size(d bson.D) int {
	n := 5 // length and terminating zero
	for _, e := range d {
		n += 2 + len(e.Key) + valueSize(e.Value)
	}
	return n
}

func arraySize(a bson.A) int {
	n := 5
	for i, v := range a {
		n += 2 + digits(i) + valueSize(v)
	}
	return n
}

// digits is the number of decimal digits of a non-negative array index.
func digits(i int) int {
	n := 1
	for i >= 10 {
		i /= 10
		n++
	}
	return n
}

// valueSize is the size of a value's encoding, without type and name.
func valueSize(v any) int {
	switch x := v.(type) {
	case nil, bson.Undefined, bson.MinKey, bson.MaxKey:
		return 0
	case bson.D:
		if x != nil {
			return Size(x)
		}
	case bson.A:
		if x != nil {
			return arraySize(x)
		}
	case string:
		return 5 + len(x)
	case bson.JavaScript:
		return 5 + len(x)
	case bson.Symbol:
		return 5 + len(x)
	case bool:
		return 1
	case int32:
		return 4
	case int:
		if int64(x) >= -1<<31 && int64(x) < 1<<31 {
			return 4
		}
		return 8
	case int64, float64, bson.DateTime, bson.Timestamp:
		return 8
	case bson.ObjectID:
		return 12
	case bson.Decimal128:
		return 16
	case bson.Binary:
		if x.Subtype == 2 {
			return 9 + len(x.Data)
		}
		return 5 + len(x.Data)
	case bson.Regex:
		return 2 + len(x.Pattern) + len(x.Options)
	}
	_, b, err := bson.MarshalValue(v)
	if err != nil {
		return 0
	}
	return len(b)
}

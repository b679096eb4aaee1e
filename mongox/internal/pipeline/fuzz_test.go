package pipeline

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// FuzzEval checks that no expression, however malformed, panics.
func FuzzEval(f *testing.F) {
	for _, s := range []string{
		`{"$substrBytes": ["abc", 1, 9223372036854775807]}`,
		`{"$substrCP": ["abc", 1, {"$numberLong": "9223372036854775807"}]}`,
		`{"$slice": [[1, 2, 3], -9223372036854775807, 9223372036854775807]}`,
		`{"$slice": [[1, 2, 3], {"$numberLong": "-9223372036854775808"}]}`,
		`{"$round": [1.5e300, -20]}`,
		`{"$divide": [{"$numberDecimal": "1E-6176"}, {"$numberDecimal": "9E+6144"}]}`,
		`{"$pow": [-1, {"$numberLong": "9223372036854775807"}]}`,
		`{"$toInt": "99999999999999999999"}`,
		`{"$indexOfCP": ["abc", "", 5, 2]}`,
		`{"$range": [0, 5, -1]}`,
		`{"$arrayElemAt": [[1], -9223372036854775807]}`,
	} {
		f.Add(s)
	}
	d := bson.D{{Key: "a", Value: int32(1)}, {Key: "s", Value: "héllo"}, {Key: "arr", Value: bson.A{int32(1), "x"}}}
	f.Fuzz(func(t *testing.T, s string) {
		var w bson.D
		if err := bson.UnmarshalExtJSON([]byte(`{"v": `+s+`}`), false, &w); err != nil || len(w) != 1 {
			return
		}
		_, _ = Eval(w[0].Value, d, testEnv)
	})
}

package bsonkit

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestCollationKeys(t *testing.T) {
	c, err := ParseCollation(bson.D{{Key: "locale", Value: "en"}, {Key: "strength", Value: int32(2)}})
	require.NoError(t, err)
	require.Equal(t, c.Key("ping"), c.Key("PING"), "strength 2 ignores case")
	require.NotEqual(t, c.Key("ping"), c.Key("péng"), "strength 2 keeps diacritics")
	require.Less(t, Compare(c.Value("a"), c.Value("B")), 0, "keys order as the locale does")
	require.Equal(t, 0, Compare(c.Doc(bson.D{{Key: "x", Value: bson.A{"Q"}}}), c.Doc(bson.D{{Key: "x", Value: bson.A{"q"}}})))

	simple, err := ParseCollation(bson.D{{Key: "locale", Value: "simple"}})
	require.NoError(t, err)
	require.Nil(t, simple)
	require.Equal(t, "A", simple.Value("A"), "a nil collation leaves values alone")
}

func TestCollationRefusals(t *testing.T) {
	for _, d := range []bson.D{
		{{Key: "locale", Value: "en"}, {Key: "strength", Value: int32(4)}},
		{{Key: "locale", Value: "en"}, {Key: "caseFirst", Value: "upper"}},
		{{Key: "locale", Value: "en"}, {Key: "alternate", Value: "shifted"}},
		{{Key: "locale", Value: "en"}, {Key: "backwards", Value: true}},
	} {
		_, err := ParseCollation(d)
		var ce *CollationError
		require.ErrorAs(t, err, &ce, "%v", d)
		require.Equal(t, int32(238), ce.Code, "%v is refused as not implemented, naming the option: %v", d, err)
	}
	_, err := ParseCollation(bson.D{{Key: "strength", Value: int32(1)}})
	require.Error(t, err, "locale is required")
}

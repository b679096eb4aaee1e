package mongoerr

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestCodeName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "BadValue", CodeName(2))
	require.Equal(t, "DuplicateKey", CodeName(11000))
	require.Equal(t, "ConflictingUpdateOperators", CodeName(40))
	require.Equal(t, "InvalidPipelineOperator", CodeName(168))
	require.Equal(t, "Location51091", CodeName(51091))
}

func TestNew(t *testing.T) {
	t.Parallel()
	e := New(14, "wrong type %s", "string")
	require.Equal(t, &Error{Code: 14, CodeName: "TypeMismatch", Msg: "wrong type string"}, e)
	require.Equal(t, "wrong type string", e.Error())
}

func TestTypeName(t *testing.T) {
	t.Parallel()
	for v, want := range map[any]string{
		nil: "null", 1.5: "double", "s": "string", int32(1): "int", int64(1): "long",
		true: "bool", bson.DateTime(0): "date", bson.Timestamp{}: "timestamp",
		bson.MinKey{}: "minKey", bson.MaxKey{}: "maxKey", bson.Undefined{}: "undefined",
		bson.Symbol("x"): "symbol", bson.JavaScript("x"): "javascript",
	} {
		require.Equal(t, want, TypeName(v), "%T", v)
	}
	require.Equal(t, "object", TypeName(bson.D{}))
	require.Equal(t, "array", TypeName(bson.A{}))
	require.Equal(t, "binData", TypeName(bson.Binary{}))
	require.Equal(t, "regex", TypeName(bson.Regex{}))
	require.Equal(t, "struct {}", TypeName(struct{}{}))
	_, ok := TypeAlias(struct{}{})
	require.False(t, ok)
}

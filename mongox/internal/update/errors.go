package update

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// MongoDB error codes returned by this package.
const (
	CodeBadValue                   = 2
	CodeFailedToParse              = 9
	CodeTypeMismatch               = 14
	CodePathNotViable              = 28
	CodeConflictingUpdateOperators = 40
	CodeDollarPrefixedFieldName    = 52
	CodeInvalidIDField             = 53
	CodeNotSingleValueField        = 54
	CodeEmptyFieldName             = 56
	CodeImmutableField             = 66
	CodeNotImplemented             = 238
)

func newErr(code int32, format string, args ...any) *mongoerr.Error {
	return mongoerr.New(code, format, args...)
}

// fmtValue renders a value roughly as MongoDB prints it in error messages.
func fmtValue(v any) string {
	var b strings.Builder
	writeValue(&b, v, 0)
	return b.String()
}

func writeValue(b *strings.Builder, v any, depth int) {
	if depth > 20 {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case string:
		b.WriteString(strconv.Quote(x))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int32:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("nan.0")
		case math.IsInf(x, 1):
			b.WriteString("inf.0")
		case math.IsInf(x, -1):
			b.WriteString("-inf.0")
		case x == math.Trunc(x) && math.Abs(x) < 1e15:
			b.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
		default:
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case bson.D:
		writeDoc(b, x, depth)
	case bson.A:
		b.WriteString("[ ")
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeValue(b, e, depth+1)
		}
		b.WriteString(" ]")
	case bson.ObjectID:
		b.WriteString("ObjectId('" + x.Hex() + "')")
	case bson.DateTime:
		b.WriteString("new Date(" + strconv.FormatInt(int64(x), 10) + ")")
	case bson.Timestamp:
		fmt.Fprintf(b, "Timestamp(%d, %d)", x.T, x.I)
	case bson.Decimal128:
		b.WriteString("NumberDecimal(\"" + x.String() + "\")")
	default:
		fmt.Fprintf(b, "%v", x)
	}
}

func writeDoc(b *strings.Builder, d bson.D, depth int) {
	if len(d) == 0 {
		b.WriteString("{}")
		return
	}
	b.WriteString("{ ")
	for i, e := range d {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(e.Key)
		b.WriteString(": ")
		writeValue(b, e.Value, depth+1)
	}
	b.WriteString(" }")
}

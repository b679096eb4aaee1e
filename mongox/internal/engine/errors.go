package engine

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
)

// Error is an engine error carrying a MongoDB error code: the server's one
// error type, which it turns into a command error or a write error.
type Error = mongoerr.Error

// Well-known error codes.
const (
	CodeBadValue              = 2
	CodeNamespaceNotFound     = 26
	CodeIndexNotFound         = 27
	CodeNamespaceExists       = 48
	CodeMaxTimeMSExpired      = 50
	CodeInvalidOptions        = 72
	CodeIndexOptionsConflict  = 85
	CodeIndexKeySpecsConflict = 86
	CodeWriteConflict         = 112
	CodeNoSuchTransaction     = 251
	CodeDuplicateKey          = 11000
	CodeIllegalOperation      = 20
	CodeChangeStreamHistory   = 286
	CodeInvalidNamespace      = 73
	CodeCannotCreateIndex     = 67
	CodeTransactionCommitted  = 256
	// CodeAmbiguousIndexKeyPattern: a key pattern names several indexes.
	CodeAmbiguousIndexKeyPattern = 181
	// CodeLockTimeout: a transaction could not take a collection a catalog
	// operation waits for.
	CodeLockTimeout = 24
	// CodeSnapshotUnavailable: a transaction's snapshot predates a catalog
	// change of the collection it writes.
	CodeSnapshotUnavailable = 246
)

// LabelTransient is the TransientTransactionError label.
const LabelTransient = "TransientTransactionError"

// ErrHistoryLost is returned when an oplog position older than the oldest
// retained entry is read (the server replies 286 ChangeStreamHistoryLost).
var ErrHistoryLost = &Error{Code: CodeChangeStreamHistory, CodeName: "ChangeStreamHistoryLost",
	Msg: "Resume of change stream was not possible, as the resume point may no longer be in the oplog."}

// AsError returns err as an *Error when it is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

func errWriteConflict() *Error {
	return &Error{Code: CodeWriteConflict, CodeName: "WriteConflict",
		Msg:    "Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
		Labels: []string{LabelTransient}}
}

// errLockTimeout is what a transaction gets when it cannot take a
// collection a catalog operation is waiting for.
func errLockTimeout(ns NS) *Error {
	return &Error{Code: CodeLockTimeout, CodeName: "LockTimeout",
		Msg: "Unable to acquire IX lock on '" + ns.String() + "' within 5ms: a catalog operation is waiting for the transactions " +
			"that use the collection (maxTransactionLockRequestTimeoutMillis)"}
}

func errMaxTime() *Error {
	return &Error{Code: CodeMaxTimeMSExpired, CodeName: "MaxTimeMSExpired", Msg: "operation exceeded time limit"}
}

// abortReason words the error that aborted a transaction for the
// NoSuchTransaction errors that follow: "CodeName: message", as the
// engine's errors have always read there.
func abortReason(err error) string {
	if e, ok := AsError(err); ok {
		return e.CodeName + ": " + e.Msg
	}
	return err.Error()
}

func errNoSuchTxn(t *Txn) *Error {
	msg := fmt.Sprintf("Transaction with { txnNumber: %d } has been aborted.", t.Meta.TxnNumber)
	if t.abortReason != "" {
		msg += " Reason: " + t.abortReason
	}
	return &Error{Code: CodeNoSuchTransaction, CodeName: "NoSuchTransaction", Msg: msg, Labels: []string{LabelTransient}}
}

func errDupKey(ns NS, ix *index, kv bson.D) *Error {
	return &Error{Code: CodeDuplicateKey, CodeName: "DuplicateKey",
		Msg: fmt.Sprintf("E11000 duplicate key error collection: %s index: %s dup key: %s",
			ns, ix.name, FormatValue(kv)),
		Extra: bson.D{{Key: "keyPattern", Value: ix.keys}, {Key: "keyValue", Value: kv}}}
}

// FormatValue renders a value the way the mongo shell prints it in error
// messages ({ a: 1, b: "x" }).
func FormatValue(v any) string {
	var b strings.Builder
	formatValue(&b, v)
	return b.String()
}

func formatValue(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bson.D:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{ ")
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(e.Key)
			b.WriteString(": ")
			formatValue(b, e.Value)
		}
		b.WriteString(" }")
	case bson.A:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[ ")
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			formatValue(b, e)
		}
		b.WriteString(" ]")
	case string:
		b.WriteString(strconv.Quote(x))
	case int32:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		if x == math.Trunc(x) && !math.IsInf(x, 0) && math.Abs(x) < 1e15 {
			b.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
		} else {
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case bson.ObjectID:
		b.WriteString("ObjectId('" + x.Hex() + "')")
	case bson.DateTime:
		b.WriteString("new Date(" + strconv.FormatInt(int64(x), 10) + ")")
	case bson.Timestamp:
		fmt.Fprintf(b, "Timestamp(%d, %d)", x.T, x.I)
	case bson.Decimal128:
		b.WriteString(x.String())
	case bson.Binary:
		fmt.Fprintf(b, "BinData(%d, %X)", x.Subtype, x.Data)
	case bson.MinKey:
		b.WriteString("MinKey")
	case bson.MaxKey:
		b.WriteString("MaxKey")
	case bson.Undefined:
		b.WriteString("undefined")
	default:
		fmt.Fprintf(b, "%v", x)
	}
}

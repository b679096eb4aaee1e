// Package mongoerr is the embedded server's error vocabulary: the error
// type its query, update and pipeline packages return, MongoDB's table of
// error code names, and the $type aliases error messages name values by.
package mongoerr

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Error is an error carrying the MongoDB error code and code name the
// server replies with: the one error type of the embedded server, from the
// query, update and pipeline packages through the engine to the command
// layer.
type Error struct {
	// Code is MongoDB's numeric error code.
	Code int32
	// CodeName is MongoDB's name for Code ("Location<code>" for codes
	// without a name).
	CodeName string
	// Msg is the human-readable message (errmsg).
	Msg string
	// Labels are the errorLabels of the reply (TransientTransactionError...).
	Labels []string
	// Extra are fields added to the error reply or write error, for
	// example keyPattern and keyValue of a duplicate key error.
	Extra bson.D
}

// Error returns the message.
func (e *Error) Error() string { return e.Msg }

// New builds an *Error with the code's name (see CodeName) and a message
// formatted as fmt.Sprintf does.
func New(code int32, format string, args ...any) *Error {
	return &Error{Code: code, CodeName: CodeName(code), Msg: fmt.Sprintf(format, args...)}
}

// codeNames maps mongod error codes to their names.
var codeNames = map[int32]string{
	1: "InternalError", 2: "BadValue", 6: "HostUnreachable", 7: "HostNotFound",
	8: "UnknownError", 9: "FailedToParse", 11: "UserNotFound", 13: "Unauthorized",
	14: "TypeMismatch", 15: "Overflow", 18: "AuthenticationFailed", 20: "IllegalOperation",
	24: "LockTimeout", 26: "NamespaceNotFound", 27: "IndexNotFound", 28: "PathNotViable",
	40: "ConflictingUpdateOperators", 43: "CursorNotFound", 48: "NamespaceExists",
	50: "MaxTimeMSExpired", 52: "DollarPrefixedFieldName", 53: "InvalidIdField",
	54: "NotSingleValueField", 56: "EmptyFieldName",
	59: "CommandNotFound", 63: "StaleShardVersion", 64: "WriteConcernFailed",
	66: "ImmutableField", 67: "CannotCreateIndex", 72: "InvalidOptions", 73: "InvalidNamespace",
	79: "UnknownReplWriteConcern", 85: "IndexOptionsConflict",
	86: "IndexKeySpecsConflict", 89: "NetworkTimeout", 91: "ShutdownInProgress",
	96: "OperationFailed", 100: "UnsatisfiableWriteConcern", 112: "WriteConflict",
	115: "CommandNotSupported", 125: "CommandFailed", 134: "ReadConcernMajorityNotAvailableYet",
	136: "CappedPositionLost", 146: "ExceededMemoryLimit", 150: "StaleEpoch",
	168: "InvalidPipelineOperator", 175: "QueryPlanKilled",
	189: "PrimarySteppedDown", 211: "KeyNotFound", 225: "TransactionTooOld",
	237: "CursorKilled", 238: "NotImplemented", 239: "SnapshotTooOld",
	241: "ConversionFailure", 246: "SnapshotUnavailable",
	251: "NoSuchTransaction", 256: "TransactionCommitted", 257: "TransactionTooLarge",
	262: "ExceededTimeLimit", 263: "OperationNotSupportedInTransaction",
	267: "PreparedTransactionInProgress", 280: "ChangeStreamFatalError",
	286: "ChangeStreamHistoryLost", 352: "UnsupportedOpQueryCommand",
	9001: "SocketException", 10107: "NotWritablePrimary", 11000: "DuplicateKey",
	11600: "InterruptedAtShutdown", 11601: "Interrupted",
	11602: "InterruptedDueToReplStateChange", 13435: "NotPrimaryNoSecondaryOk",
	13436: "NotPrimaryOrSecondary",
}

// CodeName returns the name of a code, or "Location<code>" as mongod names
// codes without a symbolic name.
func CodeName(code int32) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return "Location" + strconv.Itoa(int(code))
}

// TypeAlias returns MongoDB's $type alias of a value, accepting the Go
// conveniences a caller may put into a spec (bson.M, []any, int, float32,
// []byte), and false for a type BSON has no alias for.
func TypeAlias(v any) (string, bool) {
	switch v.(type) {
	case nil, bson.Null:
		return "null", true
	case bson.Undefined:
		return "undefined", true
	case float64, float32:
		return "double", true
	case string:
		return "string", true
	case bson.D, bson.M, bson.Raw:
		return "object", true
	case bson.A, []any:
		return "array", true
	case bson.Binary, []byte:
		return "binData", true
	case bson.ObjectID:
		return "objectId", true
	case bool:
		return "bool", true
	case bson.DateTime:
		return "date", true
	case bson.Regex:
		return "regex", true
	case bson.DBPointer:
		return "dbPointer", true
	case bson.JavaScript:
		return "javascript", true
	case bson.Symbol:
		return "symbol", true
	case bson.CodeWithScope:
		return "javascriptWithScope", true
	case int32, int:
		return "int", true
	case bson.Timestamp:
		return "timestamp", true
	case int64:
		return "long", true
	case bson.Decimal128:
		return "decimal", true
	case bson.MinKey:
		return "minKey", true
	case bson.MaxKey:
		return "maxKey", true
	}
	return "", false
}

// TypeName returns MongoDB's $type alias of a value, or its Go type
// ("%T") for a type BSON has no alias for.
func TypeName(v any) string {
	if n, ok := TypeAlias(v); ok {
		return n
	}
	return fmt.Sprintf("%T", v)
}

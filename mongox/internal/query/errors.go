package query

import "fmt"

// MongoDB error codes used by this package.
const (
	CodeBadValue       = 2
	CodeFailedToParse  = 9
	CodeTypeMismatch   = 14
	CodeNotImplemented = 238
	CodeInvalidRegex   = 51091
	CodePathCollision  = 31249
	CodeInclusionInExc = 31253
	CodeExclusionInInc = 31254
)

// Error is a query, projection or sort error carrying the MongoDB error code
// and code name the server should reply with.
type Error struct {
	Code     int32
	CodeName string
	Msg      string
}

// Error returns the message.
func (e *Error) Error() string { return e.Msg }

func codeName(code int32) string {
	switch code {
	case CodeBadValue:
		return "BadValue"
	case CodeFailedToParse:
		return "FailedToParse"
	case CodeTypeMismatch:
		return "TypeMismatch"
	case CodeNotImplemented:
		return "NotImplemented"
	}
	return fmt.Sprintf("Location%d", code)
}

func newErr(code int32, format string, args ...any) *Error {
	return &Error{Code: code, CodeName: codeName(code), Msg: fmt.Sprintf(format, args...)}
}

func badValue(format string, args ...any) *Error {
	return newErr(CodeBadValue, format, args...)
}

func unsupported(what string) *Error {
	return newErr(CodeNotImplemented, "unsupported: %s is not supported by this server", what)
}

package query

import "github.com/event-outbox/outbox/mongox/internal/mongoerr"

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

func newErr(code int32, format string, args ...any) *mongoerr.Error {
	return mongoerr.New(code, format, args...)
}

func badValue(format string, args ...any) *mongoerr.Error {
	return newErr(CodeBadValue, format, args...)
}

func unsupported(what string) *mongoerr.Error {
	return newErr(CodeNotImplemented, "unsupported: %s is not supported by this server", what)
}

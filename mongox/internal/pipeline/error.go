package pipeline

import "github.com/event-outbox/outbox/mongox/internal/mongoerr"

// Named MongoDB error codes used by the package.
const (
	codeBadValue                = 2
	codeFailedToParse           = 9
	codeTypeMismatch            = 14
	codeInvalidPipelineOperator = 168
	codeConversionFailure       = 241
	codeNotImplemented          = 238
	codeOverflow                = 15
	codeIllegalOperation        = 20
	codeExceededMemoryLimit     = 146
)

// errf builds a *mongoerr.Error; codes without a name get "Location<code>".
func errf(code int32, format string, args ...any) *mongoerr.Error {
	return mongoerr.New(code, format, args...)
}

package pipeline

import "fmt"

// Error is a parse or evaluation error with MongoDB's error code and code
// name, as the server reports it to clients.
type Error struct {
	// Code is MongoDB's numeric error code.
	Code int32
	// CodeName is MongoDB's name for Code ("Location<code>" for codes
	// without a name).
	CodeName string
	// Msg is the human-readable message.
	Msg string
}

// Error implements error.
func (e *Error) Error() string { return e.Msg }

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

var codeNames = map[int32]string{
	codeBadValue:                "BadValue",
	codeFailedToParse:           "FailedToParse",
	codeTypeMismatch:            "TypeMismatch",
	codeInvalidPipelineOperator: "InvalidPipelineOperator",
	codeConversionFailure:       "ConversionFailure",
	codeNotImplemented:          "NotImplemented",
	codeOverflow:                "Overflow",
	codeIllegalOperation:        "IllegalOperation",
	codeExceededMemoryLimit:     "ExceededMemoryLimit",
}

// errf builds an *Error; codes without a name get "Location<code>".
func errf(code int32, format string, args ...any) *Error {
	name, ok := codeNames[code]
	if !ok {
		name = fmt.Sprintf("Location%d", code)
	}
	return &Error{Code: code, CodeName: name, Msg: fmt.Sprintf(format, args...)}
}

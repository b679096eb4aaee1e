package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
)

// jsonErrors answers the requests mux has no route for with the API's JSON
// errors: 404 for an unknown path, 405 (with Allow) for a known path and
// another method. http.ServeMux answers those in plain text itself.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h, pattern := mux.Handler(req)
		if pattern != "" {
			mux.ServeHTTP(w, req)
			return
		}
		// No route: let the mux decide between 404, 405 and a redirect
		// (a path that needs cleaning or a trailing slash), and keep its
		// decision, not its text.
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, req)
		switch rec.code {
		case http.StatusNotFound:
			writeError(w, http.StatusNotFound, "no such endpoint: %s %s", req.Method, req.URL.Path)
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeError(w, http.StatusMethodNotAllowed, "method %s not allowed on %s (allowed: %s)",
				req.Method, req.URL.Path, rec.header.Get("Allow"))
		default:
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.code)
			_, _ = w.Write(rec.body.Bytes())
		}
	})
}

// statusRecorder keeps what a handler writes.
type statusRecorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *statusRecorder) Header() http.Header { return r.header }

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}

// wholeNumber is a JSON number with an integral value: 42, 42.0 and 1e3
// are accepted (JSON has one number type, and 1e3 is the integer 1000),
// 1.5 and "42" are refused.
type wholeNumber int64

// errNotWhole is the error of a number wholeNumber refuses; the decoder
// passes it through unchanged.
type errNotWhole struct{ msg string }

func (e *errNotWhole) Error() string { return e.msg }

// UnmarshalJSON reads a JSON number with an integral value in int64's
// range.
func (n *wholeNumber) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) == 0 || !(s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
		return &errNotWhole{"must be a number, got " + jsonKind(b)}
	}
	f, _, err := big.ParseFloat(s, 10, 0, big.ToNearestEven)
	if err != nil {
		return &errNotWhole{"must be a number, got " + s}
	}
	if !f.IsInt() {
		return &errNotWhole{"must be a whole number, got " + s}
	}
	i, acc := f.Int64()
	if acc != big.Exact {
		return &errNotWhole{"is out of range: " + s}
	}
	*n = wholeNumber(i)
	return nil
}

// jsonKind names the JSON type of a value for error messages.
func jsonKind(b []byte) string {
	switch {
	case len(b) == 0:
		return "nothing"
	case b[0] == '"':
		return "a string"
	case b[0] == '{':
		return "an object"
	case b[0] == '[':
		return "an array"
	case b[0] == 't' || b[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// bodyError rewrites a JSON decoding error for the API's users: the field
// and what was wrong, without Go's type names (no "Go struct field
// createOrderRequest.amount of type int64").
func bodyError(err error) string {
	var (
		syntax    *json.SyntaxError
		typ       *json.UnmarshalTypeError
		notWhole  *errNotWhole
		unmarshal *json.InvalidUnmarshalError
	)
	switch {
	case errors.As(err, &notWhole):
		// The decoder does not say which field an UnmarshalJSON error
		// belongs to; amount is the only wholeNumber of the API.
		return "amount " + notWhole.msg
	case errors.As(err, &typ):
		what := "a " + typ.Value
		if typ.Value == "object" || typ.Value == "array" {
			what = "an " + typ.Value
		}
		if typ.Field == "" {
			return "the body must be a JSON object, got " + what
		}
		want := map[string]string{"customer": "a string", "amount": "a whole number"}[typ.Field]
		if want == "" {
			want = "another type"
		}
		return fmt.Sprintf("%s must be %s, got %s", typ.Field, want, what)
	case errors.As(err, &syntax):
		return fmt.Sprintf("invalid JSON at byte %d: %s", syntax.Offset, strings.TrimPrefix(syntax.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "invalid JSON: the body ends too early"
	case errors.As(err, &unmarshal):
		return "invalid JSON body"
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if name, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return "unknown field " + name + ` (fields: "customer", "amount")`
	}
	return "invalid JSON body: " + msg
}

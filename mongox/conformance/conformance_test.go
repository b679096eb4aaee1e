package conformance_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/mongox/conformance"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestEmbedded runs the suite against the embedded server, one server per
// case (so fail points and server options stay within their case).
func TestEmbedded(t *testing.T) {
	conformance.Run(t, func(t *testing.T, opts ...mongotest.Option) *mongotest.Env {
		return mongotest.StartEmbedded(t, opts...)
	})
}

// TestReal runs the suite against a real MongoDB (OUTBOX_TEST_MONGODB_URI);
// it skips when the variable is unset. The module
// mongox/mongotest/mongocontainer runs it against a mongo:7 container. One
// deployment serves every case; each case has its own database.
func TestReal(t *testing.T) {
	env := mongotest.StartReal(t)
	conformance.Run(t, func(*testing.T, ...mongotest.Option) *mongotest.Env {
		return env
	})
}

package mongocontainer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/mongox/conformance"
	"github.com/event-outbox/outbox/mongox/mongotest"
	"github.com/event-outbox/outbox/mongox/mongotest/mongocontainer"
)

func TestStartSkipsWithoutBackend(t *testing.T) {
	if mongotest.RealConfigured() {
		t.Skip("OUTBOX_TEST_MONGODB_URI is set")
	}
	t.Parallel()
	start := time.Now()
	var skipped, real bool
	t.Run("real", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		env := mongocontainer.Start(t)
		real = env.Real
	})
	if !skipped {
		require.True(t, real, "Start never returns the embedded server")
		return
	}
	require.Less(t, time.Since(start), 15*time.Second, "the Docker check is bounded")
}

func TestStartUsesURI(t *testing.T) {
	if mongotest.RealConfigured() {
		t.Skip("OUTBOX_TEST_MONGODB_URI is set")
	}
	srv := mongotest.StartEmbedded(t).Server // a replica set member, as a real one
	t.Setenv(mongotest.EnvURI, srv.URI())
	env := mongocontainer.Start(t)
	require.True(t, env.Real)
	require.Nil(t, env.Server, "a deployment from the URI, not a container nor the embedded server")
	require.Equal(t, srv.URI(), env.URI)
	require.NoError(t, env.Client.Ping(context.Background(), nil))
}

// TestConformance runs the conformance suite against a mongo:7 container; it
// skips without Docker, and when OUTBOX_TEST_MONGODB_URI is set, since the
// conformance package's own TestReal covers that deployment. One container
// serves every case; each case has its own database.
func TestConformance(t *testing.T) {
	if mongotest.RealConfigured() {
		t.Skip("OUTBOX_TEST_MONGODB_URI is set: mongox/conformance's TestReal runs the suite against it")
	}
	env := mongocontainer.Start(t)
	conformance.Run(t, func(*testing.T, ...mongotest.Option) *mongotest.Env {
		return env
	})
}

package mongocontainer

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/mongodb"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// ContainerImage is the image [Start] runs when no
// OUTBOX_TEST_MONGODB_URI is set and Docker is available.
const ContainerImage = "mongo:7"

// dockerCheckTimeout bounds the Docker engine health check.
const dockerCheckTimeout = 3 * time.Second

// skipNoReal is the skip message when no real MongoDB can be had.
const skipNoReal = "real MongoDB: set OUTBOX_TEST_MONGODB_URI or run Docker (testcontainers); skipping"

// Start returns a real MongoDB deployment for t, never the embedded
// server:
//
//   - OUTBOX_TEST_MONGODB_URI when set (it must be a replica set), as
//     [mongotest.StartReal];
//   - else, when a Docker engine answers, a new mongo:7 container started
//     as a single-node replica set (rs0) with testcontainers-go and
//     terminated in t.Cleanup (this takes seconds: call Start once per
//     top-level test and give subtests their own [mongotest.Env.DB]);
//   - else t.Skip.
//
// A missing or stopped Docker engine is never a failure: the health check
// is bounded by a short timeout and any error skips the test.
func Start(t testing.TB, opts ...mongotest.Option) *mongotest.Env {
	t.Helper()
	if uri := strings.TrimSpace(os.Getenv(mongotest.EnvURI)); uri != "" {
		return mongotest.Connect(t, uri, opts...)
	}
	if err := dockerAvailable(); err != nil {
		t.Skipf("%s (%v)", skipNoReal, err)
	}
	uri := startContainer(t)
	return mongotest.Connect(t, uri, opts...)
}

var (
	dockerOnce sync.Once
	dockerErr  error
)

// dockerAvailable reports, once per process, whether a Docker engine
// answers testcontainers' health check.
func dockerAvailable() error {
	dockerOnce.Do(func() { dockerErr = checkDocker() })
	return dockerErr
}

func checkDocker() (err error) {
	defer func() {
		// testcontainers panics when it finds no Docker host at all.
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker host: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	defer func() { _ = provider.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), dockerCheckTimeout)
	defer cancel()
	if err := provider.Health(ctx); err != nil {
		return fmt.Errorf("docker health: %w", err)
	}
	return nil
}

// startContainer runs ContainerImage as a single-node replica set and
// returns a direct connection string to it. The replica set member is
// registered under the container's internal address, so the client connects
// directly (directConnection=true) rather than through replica set discovery;
// sessions, transactions and change streams work the same on a direct
// connection to a primary.
func startContainer(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := mongodb.Run(ctx, ContainerImage, mongodb.WithReplicaSet("rs0"))
	if c != nil {
		t.Cleanup(func() {
			if err := testcontainers.TerminateContainer(c); err != nil {
				t.Logf("mongocontainer: terminate container: %v", err)
			}
		})
	}
	if err != nil {
		// Docker answered but the container did not start (no network to
		// pull the image, ...): not the code under test's fault.
		t.Skipf("%s (start %s: %v)", skipNoReal, ContainerImage, err)
	}
	endpoint, err := c.PortEndpoint(ctx, "27017/tcp", "")
	if err != nil {
		t.Fatalf("mongocontainer: container endpoint: %v", err)
	}
	return "mongodb://" + endpoint + "/?directConnection=true"
}

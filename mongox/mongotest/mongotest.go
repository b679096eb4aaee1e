package mongotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
)

// EnvURI is the environment variable naming a real MongoDB deployment (a
// replica set connection string). When it is set, [Start] and [StartReal]
// use it instead of the embedded server.
const EnvURI = "OUTBOX_TEST_MONGODB_URI"

// opTimeout bounds the administrative operations of this package (ping,
// hello, dropping databases).
const opTimeout = 30 * time.Second

// Env is a MongoDB deployment for one test, with a connected client.
type Env struct {
	// URI is the connection string of the deployment.
	URI string
	// Client is connected to URI and disconnected in t.Cleanup.
	Client *mongo.Client
	// Real reports whether the deployment is a real MongoDB (from
	// OUTBOX_TEST_MONGODB_URI or a container) rather than the embedded
	// server.
	Real bool
	// Server is the embedded server, for fault injection (FailCommand,
	// DropConnections). It is nil against a real MongoDB.
	Server *mongofake.Server

	clientOpts []*options.ClientOptions
}

// Option configures [Start] and [StartReal].
type Option func(*config)

type config struct {
	serverOpts []mongofake.Option
	clientOpts []*options.ClientOptions
}

// ServerOptions passes options to the embedded server (mongofake.NewServer),
// after this package's defaults (test commands enabled). They are ignored
// against a real MongoDB.
func ServerOptions(opts ...mongofake.Option) Option {
	return func(c *config) { c.serverOpts = append(c.serverOpts, opts...) }
}

// ClientOptions are applied after the connection string when connecting
// Env.Client and every client made by [Env.NewClient].
func ClientOptions(opts ...*options.ClientOptions) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// Start returns a MongoDB deployment for t.
//
// When OUTBOX_TEST_MONGODB_URI is set, it connects to that deployment, which
// must be a replica set (transactions and change streams need one); the
// test fails otherwise. Otherwise it calls [StartEmbedded].
//
// Use [Env.DB] for a database of the test's own.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	if uri := strings.TrimSpace(os.Getenv(EnvURI)); uri != "" {
		return Connect(t, uri, opts...)
	}
	return StartEmbedded(t, opts...)
}

// StartEmbedded starts a new embedded [mongofake.Server] for t, whatever
// the environment says, with test commands enabled (configureFailPoint) and
// the ServerOptions applied after that default. The server is closed in
// t.Cleanup. A server per call keeps fault injection and server options
// within one test; startup takes about a millisecond.
func StartEmbedded(t testing.TB, opts ...Option) *Env {
	t.Helper()
	cfg := newConfig(opts)
	sopts := append([]mongofake.Option{mongofake.EnableTestCommands(true)}, cfg.serverOpts...)
	srv, err := mongofake.NewServer(sopts...)
	if err != nil {
		t.Fatalf("mongotest: start embedded server: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("mongotest: close embedded server: %v", err)
		}
	})
	env := &Env{URI: srv.URI(), Server: srv, clientOpts: cfg.clientOpts}
	env.Client = env.NewClient(t)
	return env
}

// skipNoReal is the skip message of [StartReal] without a real MongoDB.
const skipNoReal = "real MongoDB: set OUTBOX_TEST_MONGODB_URI, or start a container with package " +
	"github.com/event-outbox/outbox/mongox/mongotest/mongocontainer (a module of its own); skipping"

// StartReal returns the real MongoDB deployment named by
// OUTBOX_TEST_MONGODB_URI for t, never the embedded server, and skips t
// when the variable is unset. The deployment must be a replica set; the
// test fails otherwise.
//
// Package mongocontainer (module
// github.com/event-outbox/outbox/mongox/mongotest/mongocontainer) adds a
// mongo:7 container started with testcontainers-go when a Docker engine
// answers; it is a module of its own so that testcontainers-go and the
// Docker client weigh only on the tests that import it.
func StartReal(t testing.TB, opts ...Option) *Env {
	t.Helper()
	uri := strings.TrimSpace(os.Getenv(EnvURI))
	if uri == "" {
		t.Skip(skipNoReal)
	}
	return Connect(t, uri, opts...)
}

// RealConfigured reports whether OUTBOX_TEST_MONGODB_URI is set.
func RealConfigured() bool { return strings.TrimSpace(os.Getenv(EnvURI)) != "" }

func newConfig(opts []Option) config {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// Connect returns the real MongoDB deployment at uri for t, with a client
// disconnected in t.Cleanup. The test fails unless the deployment answers
// as a replica set member (transactions and change streams need one).
// ServerOptions are ignored.
func Connect(t testing.TB, uri string, opts ...Option) *Env {
	t.Helper()
	cfg := newConfig(opts)
	env := &Env{URI: uri, Real: true, clientOpts: cfg.clientOpts}
	env.Client = env.NewClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var hello bson.M
	if err := env.Client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Fatalf("mongotest: hello on %s: %v", redact(uri), err)
	}
	if _, ok := hello["setName"]; !ok {
		t.Fatalf("mongotest: %s is not a replica set member (hello has no setName); "+
			"transactions and change streams need a replica set (a single-node one is enough: mongod --replSet rs0, then rs.initiate())",
			redact(uri))
	}
	return env
}

// NewClient returns another client connected to the deployment, with the
// Option's client options followed by opts, disconnected in t.Cleanup.
// It pings the deployment before returning.
func (e *Env) NewClient(t testing.TB, opts ...*options.ClientOptions) *mongo.Client {
	t.Helper()
	all := []*options.ClientOptions{options.Client().ApplyURI(e.URI)}
	all = append(all, e.clientOpts...)
	all = append(all, opts...)
	cl, err := mongo.Connect(all...)
	if err != nil {
		t.Fatalf("mongotest: connect to %s: %v", redact(e.URI), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := cl.Disconnect(ctx); err != nil {
			t.Logf("mongotest: disconnect: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := cl.Ping(ctx, nil); err != nil {
		t.Fatalf("mongotest: ping %s: %v", redact(e.URI), err)
	}
	return cl
}

// DB returns a database with a name unique to this call, derived from the
// test's name, and drops it in t.Cleanup. Tests sharing a deployment are
// isolated by using only their own databases.
func (e *Env) DB(t testing.TB) *mongo.Database {
	t.Helper()
	db := e.Client.Database(UniqueName(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Logf("mongotest: drop database %s: %v", db.Name(), err)
		}
	})
	return db
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// UniqueName returns a name unique to this call derived from the test's
// name, valid as a MongoDB database or collection name: letters, digits,
// '-' and '_', at most 50 bytes.
func UniqueName(t testing.TB) string {
	base := strings.Trim(unsafeName.ReplaceAllString(t.Name(), "_"), "_")
	if len(base) > 37 {
		base = base[len(base)-37:]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t_" + base + "_" + hex.EncodeToString(b[:])
}

// userinfo matches the user and password of a connection string.
var userinfo = regexp.MustCompile(`://([^:@/]+):[^@/]*@`)

// redact hides the password of a connection string in messages.
func redact(uri string) string { return userinfo.ReplaceAllString(uri, "://$1:***@") }

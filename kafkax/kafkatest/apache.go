package kafkatest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// EnvApacheRequired is the environment variable that turns the skip of
// [StartApache] (no Java, no Maven, jars not resolvable) into a failure,
// for CI machines that are meant to run the real broker.
const EnvApacheRequired = "OUTBOX_TEST_APACHE_REQUIRED"

// ApacheVersion is the Apache Kafka release [StartApache] runs.
const ApacheVersion = apachekafka.Version

// apacheStartTimeout bounds a cluster's start, including a first
// resolution of the jars with Maven.
const apacheStartTimeout = 5 * time.Minute

// StartApache starts real Apache Kafka brokers ([ApacheVersion], KRaft,
// every node a broker and a controller) for t on free ports of 127.0.0.1:
// one node, or as many as [NumBrokers] says; from three nodes, topics and
// the internal topics get replication factor 3 and min.insync.replicas=2.
// The JVMs are killed and their data removed in t.Cleanup. The first start
// on a machine fetches the jars with Maven into a cache
// (~/.cache/outbox-kafka; later starts are offline).
//
// It skips t, naming what to install, when Java or Maven is missing or the
// jars cannot be fetched, and fails it instead when
// OUTBOX_TEST_APACHE_REQUIRED is set. The returned Env can kill, pause,
// resume and restart its nodes ([Env.Kill], [Env.Pause], [Env.Resume],
// [Env.Restart]) and name the leader of a partition and the active
// controller. [ClusterOptions] does not apply; [SeedTopics] does.
func StartApache(t testing.TB, opts ...Option) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("real Apache Kafka starts JVMs: skipped in -short mode")
	}
	cfg := newConfig(opts)
	ctx, cancel := context.WithTimeout(context.Background(), apacheStartTimeout)
	defer cancel()
	c, err := apachekafka.Start(ctx, apachekafka.Options{Nodes: cfg.numBrokers, Progress: testWriter{t}})
	if errors.Is(err, apachekafka.ErrMissingTool) || errors.Is(err, apachekafka.ErrResolve) {
		if os.Getenv(EnvApacheRequired) != "" {
			t.Fatalf("kafkatest: real Apache Kafka required (%s is set): %v", EnvApacheRequired, err)
		}
		t.Skipf("kafkatest: real Apache Kafka unavailable, skipping: %v", err)
	}
	if err != nil {
		t.Fatalf("kafkatest: start Apache Kafka: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("kafkatest: stop Apache Kafka: %v", err)
		}
	})
	return cfg.connect(t, &Env{Seeds: c.Brokers(), Real: true, apache: c})
}

// testWriter writes the progress of a start to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// apacheCluster returns the cluster of an Env from [StartApache], and
// fails t for any other Env.
func (e *Env) apacheCluster(t testing.TB) *apachekafka.Cluster {
	t.Helper()
	if e.apache == nil {
		t.Fatal("kafkatest: node control needs an Env from StartApache")
	}
	return e.apache
}

// node returns node i of the cluster, failing t when there is none.
func (e *Env) node(t testing.TB, i int) *apachekafka.Node {
	t.Helper()
	n := e.apacheCluster(t).Node(i)
	if n == nil {
		t.Fatalf("kafkatest: no node %d (the cluster has %d)", i, len(e.apache.Nodes()))
	}
	return n
}

// Nodes returns the number of brokers of an Env from [StartApache], 0 for
// any other Env.
func (e *Env) Nodes() int {
	if e.apache == nil {
		return 0
	}
	return len(e.apache.Nodes())
}

// NodeAddr returns the client address (host:port) of node i.
func (e *Env) NodeAddr(t testing.TB, i int) string {
	t.Helper()
	return e.node(t, i).Addr
}

// NodeID returns the Kafka node.id of node i (i+1).
func (e *Env) NodeID(t testing.TB, i int) int32 {
	t.Helper()
	return e.node(t, i).ID
}

// Kill kills node i's JVM with SIGKILL, as a crash would, and waits until
// it has exited: its ports are closed when Kill returns.
func (e *Env) Kill(t testing.TB, i int) {
	t.Helper()
	if err := e.node(t, i).Kill(); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// Pause stops node i's JVM with SIGSTOP: its connections stay open and it
// answers nothing until [Env.Resume].
func (e *Env) Pause(t testing.TB, i int) {
	t.Helper()
	if err := e.node(t, i).Pause(); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// Resume continues node i after [Env.Pause] (SIGCONT).
func (e *Env) Resume(t testing.TB, i int) {
	t.Helper()
	if err := e.node(t, i).Resume(); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// Restart kills node i when it runs, starts it again on the same ports
// and data, and returns once every running node lists it as a broker.
func (e *Env) Restart(t testing.TB, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apacheStartTimeout)
	defer cancel()
	if err := e.node(t, i).Restart(ctx); err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
}

// PartitionLeader returns the index of the node leading partition of
// topic.
func (e *Env) PartitionLeader(t testing.TB, topic string, partition int32) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	n, err := e.apacheCluster(t).Leader(ctx, topic, partition)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return n.Index
}

// Controller returns the index of the active controller (the leader of
// the KRaft metadata quorum).
func (e *Env) Controller(t testing.TB) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	n, err := e.apacheCluster(t).Controller(ctx)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	return n.Index
}

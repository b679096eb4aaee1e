package apachekafka

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start starts a cluster of n nodes for t, stopped in t.Cleanup, and skips
// t when java or mvn is missing.
func start(t *testing.T, n int) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts JVMs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	c, err := Start(ctx, Options{Nodes: n, Progress: &progress})
	if errors.Is(err, ErrMissingTool) {
		t.Skipf("real Apache Kafka: %v", err)
	}
	require.NoError(t, err, progress.String())
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	return c
}

// requireClosed fails t unless nothing listens on addr.
func requireClosed(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("%s still listens", addr)
	}
}

func produceOne(ctx context.Context, t *testing.T, c *Cluster, topic string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.DefaultProduceTopic(topic))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr())
}

func TestSingleNodeKillRestart(t *testing.T) {
	c := start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Node(0)
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(c.Brokers()...))
	require.NoError(t, err)
	defer adm.Close()
	_, err = adm.CreateTopic(ctx, 2, -1, nil, "t1")
	require.NoError(t, err)
	produceOne(ctx, t, c, "t1")

	require.NoError(t, n.Kill())
	require.False(t, n.Running())
	requireClosed(t, n.Addr)
	requireClosed(t, n.ControllerAddr)

	require.NoError(t, n.Restart(ctx))
	produceOne(ctx, t, c, "t1") // the topic survived: same data dir
	ends, err := adm.ListEndOffsets(ctx, "t1")
	require.NoError(t, err)
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	require.Equal(t, int64(2), total)

	ctrl, err := c.Controller(ctx)
	require.NoError(t, err)
	require.Equal(t, n, ctrl)

	log, err := os.ReadFile(n.LogPath())
	require.NoError(t, err)
	require.Contains(t, string(log), "Kafka Server started", "the broker logs to its file")

	require.NoError(t, c.Stop())
	requireClosed(t, n.Addr)
	_, err = os.Stat(filepath.Dir(n.Dir))
	require.True(t, os.IsNotExist(err), "Stop removes the temporary directory")
}

func TestPomPinsVersions(t *testing.T) {
	s := string(pom)
	require.Contains(t, s, "<artifactId>kafka_2.13</artifactId>\n      <version>"+Version+"</version>")
	require.Equal(t, 2, strings.Count(s, "<version>"+Log4jVersion+"</version>"))
}

// docker-compose.yml and package kafkacontainer run the same Kafka release
// as the tests.
func TestImagesUsePinnedVersion(t *testing.T) {
	for _, f := range []string{"../../docker-compose.yml", "../../kafkax/kafkatest/kafkacontainer/kafkacontainer.go"} {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		tags := regexp.MustCompile(`apache/kafka:([^"\s]+)`).FindAllStringSubmatch(string(data), -1)
		require.NotEmpty(t, tags, f)
		for _, m := range tags {
			require.Equal(t, Version, m[1], f)
		}
	}
}

func TestClusterID(t *testing.T) {
	for range 100 {
		id := newClusterID()
		require.Len(t, id, 22)
		require.False(t, strings.HasPrefix(id, "-"))
	}
}

func TestDownloadedJar(t *testing.T) {
	name, ok := downloadedJar("[INFO] Downloaded from central: https://repo.example/maven2/org/apache/kafka/kafka-server/4.4.0/kafka-server-4.4.0.jar (1.2 MB at 3.4 MB/s)")
	require.True(t, ok)
	require.Equal(t, "kafka-server-4.4.0.jar (1.2 MB)", name)
	_, ok = downloadedJar("[INFO] Downloaded from central: https://repo.example/maven2/x/y/1/y-1.pom (2 kB at 1 kB/s)")
	require.False(t, ok)
	_, ok = downloadedJar("[INFO] Copying y-1.jar to lib")
	require.False(t, ok)
}

// The nodes' ports come from below the ephemeral range, which outgoing
// connections draw from between the pick and the bind (and across a
// node's restart).
func TestFreeAddrsAvoidTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low-minPort < 1000 {
		t.Skipf("no room below the ephemeral range (it starts at %d)", low)
	}
	addrs, err := freeAddrs(6, "")
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, a := range addrs {
		require.False(t, seen[a], "%s picked twice", a)
		seen[a] = true
		_, p, err := net.SplitHostPort(a)
		require.NoError(t, err)
		port, err := strconv.Atoi(p)
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, minPort)
		require.Less(t, port, low, "%s is in the ephemeral range, from %d", a, low)
	}
}

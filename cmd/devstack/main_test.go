package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestDevstackStartsServesAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := buildDevstack(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, vals := startDevstack(t, ctx, bin, "-mongo-addr", "127.0.0.1:0", "-kafka-addr", "127.0.0.1:0", "-topics", "events,orders", "-partitions", "3")
	uri, brokers := vals["MONGODB_URI"], vals["KAFKA_BROKERS"]
	require.NotEmpty(t, uri)

	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
	require.NoError(t, err)
	require.NoError(t, client.Ping(ctx, nil))
	require.NoError(t, client.Disconnect(ctx))

	kc, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	require.NoError(t, err)
	require.NoError(t, kc.Ping(ctx))
	kc.Close()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "devstack must exit 0 on SIGTERM")
	require.Equal(t, 0, cmd.ProcessState.ExitCode())
}

// startDevstack runs bin with args and returns it with the values of its
// KEY=VALUE lines, once it printed "ready".
func startDevstack(t *testing.T, ctx context.Context, bin string, args ...string) (*exec.Cmd, map[string]string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	// A devstack killed with SIGKILL leaves its brokers' directory behind.
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	vals := map[string]string{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if k, v, ok := strings.Cut(line, "="); ok {
			vals[k] = v
		}
		if strings.Contains(line, "ready") {
			break
		}
	}
	go func() { // drain the rest
		for sc.Scan() {
		}
	}()
	require.NotEmpty(t, vals["KAFKA_BROKERS"], "devstack exited before ready")
	return cmd, vals
}

// children returns the pids of pid's child processes (Linux /proc).
func children(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	require.NoError(t, err)
	var out []int
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(data)) {
			n, err := strconv.Atoi(s)
			require.NoError(t, err)
			out = append(out, n)
		}
	}
	return out
}

// requireGone fails t unless every pid has exited within the deadline.
func requireGone(t *testing.T, pids []int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "a JVM outlived devstack: %v", pids)
}

// -kafka apache serves a real broker; SIGINT kills its JVM and closes its
// port before devstack exits 0, and SIGKILL of devstack takes the JVM down
// with it (Pdeathsig).
func TestDevstackApacheKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary and starts a JVM")
	}
	if runtime.GOOS != "linux" {
		t.Skip("counts child processes in /proc")
	}
	bin := buildDevstack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "-kafka-resolve-only").CombinedOutput(); err != nil {
		if os.Getenv("OUTBOX_TEST_APACHE_REQUIRED") != "" {
			t.Fatalf("devstack -kafka-resolve-only: %v\n%s", err, out)
		}
		t.Skipf("real Apache Kafka unavailable, skipping: %s", out)
	}
	args := []string{"-kafka", "apache", "-mongo-addr", "127.0.0.1:0", "-kafka-addr", "127.0.0.1:0", "-topics", "events", "-partitions", "2"}

	cmd, vals := startDevstack(t, ctx, bin, args...)
	jvms := children(t, cmd.Process.Pid)
	require.Len(t, jvms, 1, "one JVM for one node")
	kc, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(vals["KAFKA_BROKERS"], ",")...))
	require.NoError(t, err)
	adm := kadm.NewClient(kc)
	md, err := adm.Metadata(ctx, "events")
	require.NoError(t, err)
	require.Len(t, md.Topics["events"].Partitions, 2)
	kc.Close()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "devstack must exit 0 on SIGINT")
	requireGone(t, jvms)
	for _, addr := range strings.Split(vals["KAFKA_BROKERS"], ",") {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			t.Fatalf("%s still listens after devstack stopped", addr)
		}
	}

	cmd, _ = startDevstack(t, ctx, bin, args...)
	jvms = children(t, cmd.Process.Pid)
	require.Len(t, jvms, 1)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	requireGone(t, jvms)
}

// buildDevstack builds the command into the test's temporary directory and
// returns the binary's path.
func buildDevstack(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "devstack")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	return bin
}

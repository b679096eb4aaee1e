package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestDevstackStartsServesAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "devstack")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-mongo-addr", "127.0.0.1:0", "-kafka-addr", "127.0.0.1:0", "-topics", "events,orders", "-partitions", "3")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()

	var uri, brokers string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "MONGODB_URI="); ok {
			uri = v
		}
		if v, ok := strings.CutPrefix(line, "KAFKA_BROKERS="); ok {
			brokers = v
		}
		if strings.Contains(line, "ready") {
			break
		}
	}
	require.NotEmpty(t, uri)
	require.NotEmpty(t, brokers)
	go func() { // drain the rest
		for sc.Scan() {
		}
	}()

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

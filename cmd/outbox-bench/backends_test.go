package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/event-outbox/outbox/internal/apachekafka"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// Command-line mistakes are usage errors (exit status 2) and start no
// server; other failures exit 1.
func TestKafkaFlagUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-kafka", "nope"},
		{"-kafka", "kfake,apache,KFAKE"},
		{"-kafka", "kfake,kfake"},
		{"-kafka", "kfake, apache ,kfake"},
		{"-kafka", "brokers"},
		{"-kafka", "kfake", "-kafka-brokers", "127.0.0.1:1"},
		{"-servers", "elsewhere"},
		{"-phases", "relay,nope"},
		{"-partitions", "0"},
		{"-no-such-flag"},
		{"-events", "x"},
		{"-kafka", "kfake", "extra"},
	} {
		var out, errs bytes.Buffer
		err := run(context.Background(), args, &out, &errs)
		require.Error(t, err, "%v", args)
		require.Equal(t, 2, exitCode(err), "%v: %v", args, err)
		require.Empty(t, out.String(), "%v", args)
	}
	require.Equal(t, 1, exitCode(errors.New("phase relay: broken")))
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &out, &errs)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Contains(t, errs.String(), "-kafka")
}

func TestParseBackends(t *testing.T) {
	b, err := parseBackends("", "")
	require.NoError(t, err)
	require.Empty(t, b, "no -kafka: the single run of before")
	b, err = parseBackends(" apache, kfake ,", "")
	require.NoError(t, err)
	require.Equal(t, []string{"apache", "kfake"}, b, "in the order given")
	b, err = parseBackends("kfake,brokers", "host:9092")
	require.NoError(t, err)
	require.Equal(t, []string{"kfake", "brokers"}, b)
	_, err = parseBackends("brokers", "")
	require.ErrorContains(t, err, "needs -kafka-brokers")
	_, err = parseBackends("apache", "host:9092")
	require.ErrorContains(t, err, "does not name brokers")
}

// -kafka kfake,brokers runs the phases on kfake and on the cluster of
// -kafka-brokers (another kfake here, so that no JVM is needed) and
// prints each run's table, then the figures side by side.
func TestKafkaCompareSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs part of the benchmark twice")
	}
	cl, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err = run(ctx, []string{"-kafka", "kfake,brokers", "-kafka-brokers", cl.ListenAddrs()[0], "-phases", "relay,consume",
		"-events", "300", "-partitions", "2"}, &out, &errs)
	require.NoError(t, err, errs.String())
	for _, want := range []string{"=== Kafka: kfake ===", "=== Kafka: brokers ===", "kafka brokers", "=== side by side ===",
		"outbox relay (backlog)", "outbox consumer (trivial handler)"} {
		require.Contains(t, out.String(), want)
	}
	require.Contains(t, errs.String(), "[brokers] relay...")
	require.Contains(t, out.String(), "CPU, phase relay: this process")
}

// -kafka kfake,apache starts a real one-node Apache Kafka for its second
// run, measures the phases of issue 39's comparison on both, and stops the
// broker: its port is closed when run returns. Skipped without Java (or
// the jars), unless OUTBOX_TEST_APACHE_REQUIRED is set.
func TestKafkaApacheSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JVM and runs part of the benchmark twice")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-json", "-kafka", "kfake,apache", "-phases", "relay,latency,consume,takeover",
		"-events", "400", "-partitions", "2", "-duration", "300ms", "-rate", "200", "-latency-runs", "1", "-takeover-kc", "1"}, &out, &errs)
	if errors.Is(err, apachekafka.ErrMissingTool) || errors.Is(err, apachekafka.ErrResolve) {
		if os.Getenv(kafkatest.EnvApacheRequired) != "" {
			t.Fatalf("real Apache Kafka required (%s is set): %v", kafkatest.EnvApacheRequired, err)
		}
		t.Skipf("real Apache Kafka unavailable, skipping: %v", err)
	}
	require.NoError(t, err, errs.String())
	var c comparison
	require.NoError(t, json.Unmarshal(out.Bytes(), &c))
	require.Len(t, c.Runs, 2)
	require.Equal(t, "kfake", c.Runs[0].Kafka)
	require.Equal(t, "apache", c.Runs[1].Kafka)
	for _, r := range c.Runs {
		require.NotNil(t, r.Relay, r.Kafka)
		require.Equal(t, 400, r.Relay.Events, r.Kafka)
		require.NotNil(t, r.Latency, r.Kafka)
		require.NotNil(t, r.Consume, r.Kafka)
		require.Len(t, r.Takeover, 2, r.Kafka)
		for _, tr := range r.Takeover {
			require.Positive(t, tr.TakeoverSeconds, r.Kafka)
		}
	}
	figs := map[string]comparedFigure{}
	for _, f := range c.Figures {
		figs[f.Name] = f
	}
	for _, want := range []string{"outbox relay (backlog)", "latency commit → handler start, p99", "outbox consumer (trivial handler)",
		"takeover, KeyConcurrency 1, look-up on: kill → first handler start", "CPU, phase relay: this process"} {
		require.Len(t, figs[want].Values, 2, want)
	}
	// kfake's CPU is this process's; only the JVM's is the broker's own.
	require.Equal(t, []string{"apache"}, slices.Collect(maps.Keys(figs["CPU, phase relay: broker JVM"].Values)))
	require.Positive(t, figs["CPU, phase relay: broker JVM"].Values["apache"])
	brokers, ok := c.Runs[1].Options["kafka_brokers"].([]any)
	require.True(t, ok, "%v", c.Runs[1].Options)
	require.NotEmpty(t, brokers)
	for _, b := range brokers {
		conn, err := net.DialTimeout("tcp", b.(string), time.Second)
		if err == nil {
			conn.Close()
			t.Fatalf("the broker at %s still listens after the run", b)
		}
	}
}

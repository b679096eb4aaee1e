package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every phase briefly and checks that the output is
// complete. It asserts nothing about speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole benchmark briefly")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-duration", "300ms", "-events", "600", "-backlog", "1000", "-rate", "200", "-partitions", "3", "-latency-runs", "2"}, &out, &errs)
	require.NoError(t, err, errs.String())
	for _, want := range []string{"raw franz-go produce", "outbox relay (backlog)", "floor: the relay's MongoDB work", "naive relay", "polling relay",
		"latency runs", "run 2", "worst of 2 runs", "relay / its MongoDB work alone (floor)",
		"outbox consumer", "bare one-document", "latency commit", "memory, backlog of 1000", "target"} {
		require.Contains(t, out.String(), want)
	}
}

// TestKeyConcAndTakeoverSmoke runs the keyconc and takeover phases
// briefly (takeover at KeyConcurrency 1 only: a killed replica's group
// session must time out first) and checks that the output is complete.
func TestKeyConcAndTakeoverSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two phases of the benchmark briefly")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-phases", "keyconc,takeover", "-duration", "300ms", "-events", "400", "-partitions", "2",
		"-keyconc-rate", "50", "-takeover-kc", "1"}, &out, &errs)
	require.NoError(t, err, errs.String())
	for _, want := range []string{"20ms handler + one insert, 1000 keys", "KeyConcurrency 64", "trivial handler (consume phase)",
		"takeover after a kill", "KeyConcurrency 1, look-up on", "KeyConcurrency 1, look-up off (before)",
		"20ms handler: events/s at KeyConcurrency 64 / at 1", "trivial handler: events/s at KeyConcurrency 64 / at 1"} {
		require.Contains(t, out.String(), want)
	}
}

func TestJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs part of the benchmark")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-json", "-events", "300", "-partitions", "2", "-phases", "raw,relay,floor"}, &out, &errs)
	require.NoError(t, err, errs.String())
	var r results
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	require.NotNil(t, r.Raw)
	require.NotNil(t, r.Relay)
	require.Equal(t, 300, r.Relay.Events)
	require.NotNil(t, r.Floor)
	require.Equal(t, 300, r.Floor.Events)
	require.Nil(t, r.Consume)
	require.NotEmpty(t, r.Targets)
}

func TestBadFlags(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"-phases", "relay,nope"}, &out, &errs)
	require.ErrorContains(t, err, `unknown phase "nope"`)
	err = run(context.Background(), []string{"-takeover-kc", "1,x"}, &out, &errs)
	require.ErrorContains(t, err, `-takeover-kc: "x"`)
	err = run(context.Background(), []string{"-partitions", "0"}, &out, &errs)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "must be positive"))
}

func TestLatencyRunsMedianAndWorst(t *testing.T) {
	runs := latencyRuns(
		[]latencyResult{{P50ms: 1, P99ms: 10}, {P50ms: 1, P99ms: 5}, {P50ms: 1, P99ms: 20}, {P99ms: 0}},
		[]latencyResult{{P99ms: 110}, {P99ms: 100}, {P99ms: 100}, {P99ms: 100}})
	require.InDelta(t, 11, runs[0].Ratio, 1e-9)
	require.InDelta(t, 20, runs[1].Ratio, 1e-9)
	require.InDelta(t, 5, runs[2].Ratio, 1e-9)
	require.Zero(t, runs[3].Ratio, "no ratio without a relay p99")
	require.Equal(t, 2, medianRun(runs), "ratios 0, 5, 11, 20: the lower middle one is 5")
	require.Equal(t, 0, medianRun(runs[:3]), "ratios 5, 11, 20: 11")
	require.Zero(t, worstRatio(runs))
	require.InDelta(t, 5, worstRatio(runs[:3]), 1e-9)
}

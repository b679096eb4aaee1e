package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestChaosShort is the CI run of the harness: a short, small-rate run on
// the embedded servers with kills, joins, MongoDB and Kafka faults, poison
// and malformed records. It asserts the invariants, never timings.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	var progress bytes.Buffer
	cfg := config{
		duration:   12 * time.Second,
		replicas:   3,
		rate:       120,
		seed:       7,
		keys:       40,
		partitions: 6,
		killEvery:  2 * time.Second,
		faultEvery: 300 * time.Millisecond,
		quiesce:    2 * time.Minute,
		transient:  5,
		poison:     0.02,
		abort:      0.05,
		progress:   &progress,
	}
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		cfg.progress = os.Stderr
	}
	res, err := runHarness(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(res.summary())
	require.Empty(t, res.Failures, "invariants broken:\n%s\nprogress:\n%s", strings.Join(res.Failures, "\n"), progress.String())
	require.Positive(t, res.Events)
	require.Equal(t, res.Events, res.Handled+countPoison(res), "every committed step event handled")
	require.Positive(t, res.Kills)
	require.Positive(t, res.Faults)
}

// countPoison is the number of committed poison events: every parked event
// that is not a malformed record.
func countPoison(r *result) int { return r.Poisons }

// TestScheduleIsReproducible: the same seed gives the same schedule.
func TestScheduleIsReproducible(t *testing.T) {
	t.Parallel()
	a := schedule(42, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, true, true)
	b := schedule(42, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, true, true)
	c := schedule(43, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, true, true)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	kills := 0
	for _, x := range a {
		if x.kind == actKill {
			kills++
		}
	}
	require.Positive(t, kills)
}

// TestRunFlags: bad flags are refused with exit code 2, without a run.
func TestRunFlags(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"-replicas", "0"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-replicas")
	require.Equal(t, 2, run(context.Background(), []string{"-nope"}, &out, &errOut))
	require.Empty(t, out.String())
}

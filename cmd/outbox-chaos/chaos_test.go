package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestChaosShort is the CI run of the harness: a short, small-rate run on
// the embedded servers with kills, joins, MongoDB and Kafka faults, poison
// and malformed records, and every scenario kind (slow handlers, downstream
// outages with re-drives, a small max.message.bytes window, a replica
// started with Kafka down, a pause storm). It asserts the invariants, never
// timings.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	var progress bytes.Buffer
	cfg := config{
		duration:      15 * time.Second,
		replicas:      3,
		rate:          120,
		seed:          7,
		keys:          40,
		partitions:    6,
		killEvery:     2 * time.Second,
		faultEvery:    300 * time.Millisecond,
		scenarioEvery: 2 * time.Second,
		txnLifetime:   2 * time.Second,
		queueRecords:  16,
		queueBytes:    256 << 10,
		sameKey:       0.5,
		stall:         time.Minute,
		replayEvery:   2 * time.Second,
		chainPct:      25,
		transient:     5,
		poison:        0.02,
		abort:         0.05,
		progress:      &progress,
		topicPrefix:   "chaos.",
		massKeys:      30,
		migrated:      true,
		// Enough duplicate recordings that a short run on a loaded machine
		// (a few hundred transactions) refuses some: at the default 0.5%
		// one run in about forty refused none.
		dupRatio: 0.05,
	}
	if raceEnabled {
		// kfake's SleepControl races with itself (bsleep.enqueue updates a
		// queued request's fields while its waitQueue goroutine reads them,
		// kfake cluster.go), which the race detector reports against the
		// test. The stalls still run in builds without -race and in the
		// long runs.
		cfg.skip = map[actionKind]bool{fKafkaProduceStall: true, fKafkaFetchStall: true}
	}
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		cfg.progress = os.Stderr
	}
	if d, err := time.ParseDuration(os.Getenv("OUTBOX_CHAOS_SLOW_FOR")); err == nil {
		cfg.slowFor = d // -slow-for: slow runs that the waits-visible check judges
	}
	cfg.stacks = os.Getenv("OUTBOX_CHAOS_STACKS") // goroutine stacks once nothing progressed for 10 s
	if path := os.Getenv("OUTBOX_CHAOS_LOG"); path != "" {
		// The replicas' framework logs, at Info, for a failure to explain.
		f, err := os.Create(path)
		require.NoError(t, err)
		defer f.Close()
		cfg.logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	// Every run's invariants are judged. What a run exercised depends on
	// timing (a replay finds nothing committed to rewind, no duplicate
	// recording meets the migrated dataset): a scenario that did not run
	// leaves the run inconclusive about it, never wrong, so a second seed
	// may cover it, in a run twice as long (what a loaded machine gets
	// through in 15 s may not be enough). The union of at most two runs
	// must cover everything.
	var missing []string
	for run := range 2 {
		progress.Reset()
		res, err := runHarness(context.Background(), cfg)
		require.NoError(t, err)
		t.Log(res.summary())
		require.Empty(t, res.Failures, "invariants broken:\n%s\nprogress:\n%s", strings.Join(res.Failures, "\n"), progress.String())
		require.Positive(t, res.Events)
		require.Equal(t, res.Events, res.Handled+countPoison(res), "every committed step event handled")
		now := uncovered(res, cfg)
		if run > 0 {
			now = slices.DeleteFunc(now, func(m string) bool { return !slices.Contains(missing, m) })
		}
		missing = now
		if len(missing) == 0 {
			return
		}
		t.Logf("seed %d did not cover: %s\nprogress:\n%s", cfg.seed, strings.Join(missing, "; "), progress.String())
		cfg.seed++
		cfg.duration *= 2
	}
	t.Fatalf("two seeds did not cover: %s", strings.Join(missing, "; "))
}

// uncovered lists what a short run was meant to exercise and did not.
func uncovered(res *result, cfg config) []string {
	var out []string
	need := func(ok bool, what string) {
		if !ok {
			out = append(out, what)
		}
	}
	need(res.Kills > 0, "no kill")
	need(res.Faults > 0, "no fault")
	for _, k := range append(slices.Clone(scenarios), extras...) {
		need(res.Scenarios[k] > 0, fmt.Sprintf("scenario %s never ran", k))
	}
	need(res.EventOutboxKeyed > 0, "no keyed event-outbox record handled")
	need(res.EventOutboxKeyless > 0, "no key-less event-outbox record handled")
	need(res.EventOutboxNoID > 0, "no event-outbox record without idempotency_key written")
	need(res.MaxHeldKeys >= cfg.massKeys, "the mass hold never held all its keys at once")
	need(res.NoHandlerReleased > 0, "no event without handler released after the deploy")
	need(res.DuplicatesRefused > 0, "no duplicate recording refused on the migrated dataset")
	need(res.OutageRedriven > 0, "the downstream outage parked nothing to re-drive")
	need(res.Redelivered > 0, "no event was delivered again after it was handled")
	need(res.Chained > 0, "no follow-up was handled")
	need(res.Doomed.Ordinary > 0, "no handling commit doomed on the ordinary path")
	need(res.Doomed.Release > 0, "no handling commit doomed in a release of a held key")
	need(res.Doomed.Chained > 0, "no doomed handling had recorded a follow-up")
	need(res.TopicsRecreated > 0, "no topic was deleted and created again")
	need(res.RecreatedHandled > 0, "no event recorded after a topic's recreation was handled")
	// A replay may find nothing to do on a machine so loaded that the
	// group commits nothing in 15 s (TestCommitAsMember covers the
	// rewind's commit on its own); one of them must run.
	need(res.Scenarios[fOffsetRewind]+res.Scenarios[fRogueProducer] > 0, "no replay ran")
	return out
}

// countPoison is the number of committed poison events: every parked event
// that is not a malformed record.
func countPoison(r *result) int { return r.Poisons }

// TestScheduleIsReproducible: the same seed gives the same schedule.
func TestScheduleIsReproducible(t *testing.T) {
	t.Parallel()
	a := schedule(42, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, 4*time.Second, true, true)
	b := schedule(42, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, 4*time.Second, true, true)
	c := schedule(43, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, 4*time.Second, true, true)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	kills := 0
	for _, x := range a {
		if x.kind == actKill {
			kills++
		}
	}
	require.Positive(t, kills)
	seen := map[actionKind]bool{}
	for _, x := range a {
		seen[x.kind] = true
	}
	for _, k := range append(slices.Clone(scenarios), replays...) {
		require.True(t, seen[k], "scenario %s not scheduled", k)
	}
	without := schedule(42, time.Minute, 3, 3*time.Second, 500*time.Millisecond, 5*time.Second, 4*time.Second, false, true)
	for _, x := range without {
		require.NotEqual(t, fSlowHandler, x.kind, "slow handlers need the embedded MongoDB")
	}
}

// TestShortRunSchedulesEveryScenario: the go test run's schedule has every
// scenario kind, whatever the timing of the run.
func TestShortRunSchedulesEveryScenario(t *testing.T) {
	t.Parallel()
	seen := map[actionKind]int{}
	for _, x := range schedule(7, 15*time.Second, 3, 2*time.Second, 300*time.Millisecond, 2*time.Second, 2*time.Second, true, true) {
		seen[x.kind]++
	}
	for _, k := range append(slices.Clone(scenarios), replays...) {
		require.Positive(t, seen[k], "scenario %s not scheduled", k)
	}
}

// TestPlanSameKey: multi-event transactions often record consecutive
// events of one key, so that a swap inside a batch is visible.
func TestPlanSameKey(t *testing.T) {
	t.Parallel()
	w := &workload{keys: []string{"a", "b", "c", "d", "e", "f", "g", "h"}, sameKey: 0.5}
	rng := rand.New(rand.NewPCG(1, 2))
	multi, same := 0, 0
	for range 1000 {
		p := w.newPlan(rng)
		if len(p.keys) < 2 {
			continue
		}
		multi++
		if p.keys[0] == p.keys[1] {
			same++
		}
	}
	require.Greater(t, same, multi/3, "%d of %d multi-event transactions record one key", same, multi)
}

// TestKafkaCaused: the errors a replica gets when it needs Kafka to record
// are recognised; MongoDB's are not.
func TestKafkaCaused(t *testing.T) {
	t.Parallel()
	require.True(t, kafkaCaused(fmt.Errorf("%w %q: unable to dial: %v", outbox.ErrTopicMetadata, "t", errKafkaDown)))
	require.True(t, kafkaCaused(fmt.Errorf("record: %w", errKafkaDown)))
	require.True(t, kafkaCaused(errors.New("outbox: partition count of topic t unknown")))
	require.False(t, kafkaCaused(errors.New("(WriteConflict) chaos: write conflict")))
	require.False(t, kafkaCaused(errKilled))
}

// TestRunFlags: bad flags are refused with exit code 2, without a run.
func TestRunFlags(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"-replicas", "0"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-replicas")
	require.Equal(t, 2, run(context.Background(), []string{"-key-concurrency", "0"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-key-concurrency")
	require.Equal(t, 2, run(context.Background(), []string{"-nope"}, &out, &errOut))
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"-group-protocol", "kip848"}, &out, &errOut))
	require.Contains(t, errOut.String(), `invalid value "kip848" for flag -group-protocol: outbox: unknown group protocol "kip848" (want classic or consumer)`)
	require.Empty(t, out.String())

	// A run says at once what it does (it printed nothing for 79 s); a
	// canceled context ends it before the load.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errOut.Reset()
	run(ctx, []string{"-duration", "1s"}, &out, &errOut)
	first, _, _ := strings.Cut(errOut.String(), "\n")
	require.Equal(t, "outbox-chaos: 1s of load and faults (seed 1, 3 replicas, 300 events/s, classic group protocol), then settling and judging; -v prints progress", first)
	errOut.Reset()
	run(ctx, []string{"-duration", "1s", "-group-protocol", "consumer"}, &out, &errOut)
	first, _, _ = strings.Cut(errOut.String(), "\n")
	require.Contains(t, first, "consumer group protocol")
}

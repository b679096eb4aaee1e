package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBrokerFaultSchedule: the broker faults come from the seed; kills every
// two thirds to four thirds of -broker-kill-every, their kinds in turn;
// pauses outlast the session timeout and the broker's controller session;
// none in the last fifth of the load.
func TestBrokerFaultSchedule(t *testing.T) {
	t.Parallel()
	const every = 45 * time.Second
	a := scheduleBrokerFaults(1, 10*time.Minute, every, 2*time.Minute, 6*time.Second)
	require.Equal(t, a, scheduleBrokerFaults(1, 10*time.Minute, every, 2*time.Minute, 6*time.Second))
	require.NotEqual(t, a, scheduleBrokerFaults(2, 10*time.Minute, every, 2*time.Minute, 6*time.Second))
	var kills []action
	seen := map[actionKind]int{}
	for _, x := range a {
		seen[x.kind]++
		require.Less(t, x.at, 8*time.Minute, "%s in the last fifth", x)
		switch x.kind {
		case fBrokerKill, fBrokerKillPartLeader, fBrokerKillController:
			kills = append(kills, x)
			require.GreaterOrEqual(t, x.d, 2*time.Second)
			require.LessOrEqual(t, x.d, 10*time.Second)
		case fBrokerPause:
			require.Greater(t, x.d, 9*time.Second, "a pause must outlast the sessions")
		case fBrokerRefuse:
			require.Positive(t, x.d)
		default:
			t.Fatalf("not a broker fault: %s", x)
		}
	}
	for i := 1; i < len(kills); i++ {
		gap := kills[i].at - kills[i-1].at
		require.GreaterOrEqual(t, gap, every*2/3, "kills %s and %s", kills[i-1], kills[i])
		require.LessOrEqual(t, gap, every*4/3+time.Nanosecond, "kills %s and %s", kills[i-1], kills[i])
		require.NotEqual(t, kills[i-1].kind, kills[i].kind, "kinds in turn")
	}
	for _, k := range append(brokerKills, brokerPauses...) {
		require.Positive(t, seen[k], "%s never scheduled", k)
	}
	require.Empty(t, scheduleBrokerFaults(1, 10*time.Minute, 0, 0, 6*time.Second), "0 disables them")
	// The short run (CI): one kill.
	short := scheduleBrokerFaults(1, 2*time.Minute, 90*time.Second, 0, 6*time.Second)
	require.Len(t, short, 1)
	require.Equal(t, fBrokerKill, short[0].kind)
}

// TestRestartCounter: the fetch watch's restarts and re-subscriptions are
// counted from the replicas' logs whatever the level the harness logs at,
// with the replica and partition; the rest passes through as before.
func TestRestartCounter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	var notes []string
	rc := &restarts{note: func(m string) { notes = append(notes, m) }}
	inner := slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError})
	l := slog.New(&restartCounter{inner: inner, rc: rc}).With("replica", "r1.2")
	l.Warn(msgFetchRestart, "partition", "t/3", "offset", 17)
	l.WithGroup("g").Warn(msgFetchResubscribe, "partition", "t/3")
	l.Warn("something else")
	l.Error("an error")
	require.Equal(t, 1, rc.restarts)
	require.Equal(t, 1, rc.resubs)
	require.Equal(t, []string{"fetch watch restart: replica=r1.2 partition=t/3 offset=17",
		"fetch watch re-subscription: replica=r1.2 partition=t/3"}, notes)
	require.NotContains(t, out.String(), "restarting", "Warn is below the inner handler's level")
	require.Contains(t, out.String(), "an error")
}

// TestKafkaFlags: -kafka takes kfake or apache, and apache starts its own
// cluster, so -kafka-brokers is refused beside it: exit code 2, no run.
func TestKafkaFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-kafka", "confluent"},
		{"-kafka", "apache", "-kafka-brokers", "127.0.0.1:9092"},
		{"-kafka", "apache", "-kafka-nodes", "0"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), args, &out, &errOut), "%v", args)
		require.Contains(t, errOut.String(), "-kafka", "%v", args)
		require.Empty(t, out.String())
	}
}

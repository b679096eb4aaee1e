package liveness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The refresh period is a fifth of the session timeout, kept between 1 s
// and 5 s, so that a dead replica's record is stale (StaleAfter periods)
// before its group session ends.
func TestInterval(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Second, Interval(time.Second))
	require.Equal(t, 2*time.Second, Interval(10*time.Second))
	require.Equal(t, 5*time.Second, Interval(45*time.Second))
	for _, st := range []time.Duration{6 * time.Second, 10 * time.Second, 45 * time.Second} {
		require.Less(t, StaleAfter*Interval(st), st+5*time.Second, "session timeout %s", st)
	}
}

// A record is silent after two refresh periods, at least 2 s, by the
// reader's view of MongoDB's clock.
func TestSilent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	d := Doc{RefreshMS: 500, LastSeen: now.Add(-1900 * time.Millisecond)}
	require.False(t, silent(d, now), "under the 2 s floor")
	d.LastSeen = now.Add(-2100 * time.Millisecond)
	require.True(t, silent(d, now))
	d = Doc{RefreshMS: 5000, LastSeen: now.Add(-9 * time.Second)}
	require.False(t, silent(d, now))
	d.LastSeen = now.Add(time.Second) // a clock ahead: never negative silence
	require.False(t, silent(d, now))
}

func TestDocState(t *testing.T) {
	t.Parallel()
	require.True(t, Doc{State: "stopped"}.Stopped())
	require.False(t, Doc{State: "running"}.Stopped())
	require.Equal(t, 1500*time.Millisecond, Doc{RefreshMS: 1500}.Refresh())
}

// SessionPool names a mongo.Client's pool once: the same name for the same
// client, none for no client.
func TestSessionPoolOfNoClient(t *testing.T) {
	t.Parallel()
	require.Empty(t, SessionPool(nil))
}

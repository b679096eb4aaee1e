package lifecycle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// process returns a Process serving handler on a local port, with the
// given units, and its base URL.
func process(t *testing.T, handler http.Handler, units ...Unit) (*Process, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Process{
		HTTP:           &http.Server{Handler: handler, ReadHeaderTimeout: time.Second},
		Listener:       ln,
		Units:          units,
		Grace:          5 * time.Second,
		RequestTimeout: time.Minute,
		ReadyPath:      "/readyz",
		LivePath:       "/livez",
		Ready:          func() error { return nil },
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		State:          &State{},
	}
	return p, "http://" + ln.Addr().String()
}

// waitUnit runs until its context ends.
func waitUnit(name string) Unit {
	var running atomic.Bool
	running.Store(true)
	return Unit{Name: name, Running: running.Load, Run: func(ctx context.Context) error {
		defer running.Store(false)
		<-ctx.Done()
		return nil
	}}
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// A unit's failure ends Run with the failure, named, after the other units
// stopped.
func TestRunEndsOnAUnitsFailure(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	other := waitUnit("other")
	p, _ := process(t, http.NotFoundHandler(), other,
		Unit{Name: "failing", Running: func() bool { return false }, Run: func(context.Context) error { return boom }})
	err := p.Run(context.Background())
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "failing: boom")
	require.False(t, other.Running(), "the other unit stopped before Run returned")
	require.True(t, p.State.Stopping())
	require.False(t, p.State.Serving())
}

// The probes answer from Ready; other requests reach the handler with the
// request deadline.
func TestProbesAndRequestDeadline(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	var sawDeadline atomic.Bool
	p, base := process(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := r.Context().Deadline()
		sawDeadline.Store(ok)
	}), waitUnit("u"))
	p.Ready = func() error {
		if !ready.Load() {
			return errors.New("waiting")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	require.Eventually(t, p.State.Serving, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, http.StatusOK, get(t, base+"/livez"))
	require.Equal(t, http.StatusServiceUnavailable, get(t, base+"/readyz"))
	ready.Store(true)
	require.Equal(t, http.StatusOK, get(t, base+"/readyz"))
	require.Equal(t, http.StatusOK, get(t, base+"/other"))
	require.True(t, sawDeadline.Load())
	cancel()
	require.NoError(t, <-done)
}

// A unit that outlives the grace period is named in Run's error, which
// wraps context.DeadlineExceeded; Run does not wait for it.
func TestShutdownNamesAUnitThatDidNotStop(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	stopped := make(chan struct{})
	var running atomic.Bool
	running.Store(true)
	stuck := Unit{Name: "stuck", Running: running.Load, Run: func(context.Context) error {
		defer close(stopped)
		defer running.Store(false)
		<-release
		return nil
	}}
	p, _ := process(t, http.NotFoundHandler(), stuck)
	p.Grace = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Run(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "client stuck")
	close(release)
	<-stopped
}

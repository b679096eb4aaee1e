package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// freePort returns a local port nothing listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// get GETs url and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// Kafka down at start: the example keeps running (it used to exit with
// "create topics: unable to dial"): alive, not ready, saying what it waits
// for in its answers and its log; requests that need Kafka answer 503 in
// time. Once Kafka comes up it creates its topics, gets ready and charges
// orders; it stops within its shutdown timeout.
func TestKafkaDownAtStart(t *testing.T) {
	t.Parallel()
	mongoSrv, err := mongofake.NewServer()
	require.NoError(t, err)
	t.Cleanup(func() { _ = mongoSrv.Close() })
	kafkaPort := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	env := map[string]string{
		envMongoURI: mongoSrv.URI(),
		envBrokers:  fmt.Sprintf("127.0.0.1:%d", kafkaPort),
	}
	var logs testkit.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", addr}, func(k string) string { return env[k] }, &logs) }()
	base := "http://" + addr

	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/livez")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 20*time.Millisecond, "alive while Kafka is down")
	require.Eventually(t, func() bool {
		code, body := get(t, base+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, body)
		return strings.Contains(body, "waiting for Kafka")
	}, time.Minute, 20*time.Millisecond, "not ready, waiting for Kafka")
	code, order := do(t, http.MethodPost, base+"/orders", `{"customer": "ada", "amount": 42}`)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", order)
	require.Contains(t, order["error"], "Kafka")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "waiting for Kafka") },
		time.Minute, 20*time.Millisecond, "a log line says it waits for Kafka")
	select {
	case err := <-done:
		t.Fatalf("the example exited while Kafka was down: %v\n%s", err, logs.String())
	default:
	}

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(kafkaPort))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	require.Eventually(t, func() bool { code, _ := get(t, base+"/readyz"); return code == http.StatusOK },
		settleTimeout, 50*time.Millisecond, "ready once Kafka is up")
	r := &runningReplica{url: base}
	id := r.createOrder(t, "ada", 42)
	require.Equal(t, StatusPaid, r.waitSettled(t, id)["status"])

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(shutdownTimeout + 30*time.Second):
		t.Fatalf("no shutdown within %v\n%s", shutdownTimeout+30*time.Second, logs.String())
	}
}

// MongoDB down mid-request: requests answer 503 with a JSON error within
// the request deadline (they used to hang for 120 s), liveness holds, and
// the replica stops within its shutdown timeout (SIGTERM used to take
// 30-50 s).
func TestMongoDBDownMidRequest(t *testing.T) {
	t.Parallel()
	s := setupWith(t, 1, outbox.FormatNative, func(r *runningReplica) {
		r.shutdownTimeout = 5 * time.Second
		r.lateStopOK = true
	})
	r := s.replicas[0]
	id := r.createOrder(t, "ada", 42)
	require.Equal(t, StatusPaid, r.waitSettled(t, id)["status"])

	require.NoError(t, s.stack.mongoServer.Close())
	// requestTimeout (5 s) plus the abort (2 s) and a loaded machine's
	// margin; it took 35 s (the driver's abort) and up to 120 s.
	cl := &http.Client{Timeout: 25 * time.Second}
	for _, req := range []struct{ method, path, body string }{
		{http.MethodPost, "/orders", `{"customer": "ada", "amount": 42}`},
		{http.MethodGet, "/orders/" + id, ""},
	} {
		hr, err := http.NewRequest(req.method, r.url+req.path, strings.NewReader(req.body))
		require.NoError(t, err)
		hr.Header.Set("Content-Type", "application/json")
		began := time.Now()
		resp, err := cl.Do(hr)
		t.Logf("%s %s answered after %v", req.method, req.path, time.Since(began).Round(time.Millisecond))
		require.NoError(t, err, "%s %s answers within its deadline", req.method, req.path)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.Contains(t, string(b), "MongoDB did not answer within 5s")
	}
	code, _ := get(t, r.url+"/livez")
	require.Equal(t, http.StatusOK, code)

	began := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.stop()
	}()
	select {
	case <-done:
	case <-time.After(r.shutdownTimeout + 20*time.Second):
		t.Fatalf("the replica did not stop within %v of its %v shutdown timeout", 20*time.Second, r.shutdownTimeout)
	}
	t.Logf("stopped %v after the signal, MongoDB down", time.Since(began).Round(time.Millisecond))
}

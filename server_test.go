package outbox

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serve starts s.Run(ctx) on a random local port and returns its base URL
// and a function that ends ctx and returns Run's error.
func serve(t *testing.T, s *Server) (url string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.Listener = ln
	s.Logger = debugLogger
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var result error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("Server.Run did not return within 2 minutes")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), stop
}

// probe GETs url and decodes its JSON body.
func probe(t *testing.T, url string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]string
	raw, _ := io.ReadAll(resp.Body)
	require.NoError(t, json.Unmarshal(raw, &body), "body %s", raw)
	return resp.StatusCode, body
}

// A Server answers liveness at once, readiness once its Client started,
// gives each request a deadline, and stops cleanly: readiness false during
// the shutdown, Run returning nil.
func TestServerProbesAndCleanShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("served"))
	registerConsumer(t, c)
	mux := http.NewServeMux()
	deadline := make(chan time.Duration, 1)
	mux.HandleFunc("GET /deadline", func(w http.ResponseWriter, r *http.Request) {
		d, ok := r.Context().Deadline()
		require.True(t, ok, "the request's context has a deadline")
		deadline <- time.Until(d)
	})
	srv := &Server{HTTP: &http.Server{Handler: mux}, Clients: []*Client{c}, RequestTimeout: time.Minute}
	url, stop := serve(t, srv)

	code, body := probe(t, url+"/livez")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "alive", body["status"])
	eventually(t, "ready", func() bool { code, _ := probe(t, url+"/readyz"); return code == http.StatusOK })

	resp, err := http.Get(url + "/deadline")
	require.NoError(t, err)
	resp.Body.Close()
	d := <-deadline
	require.Greater(t, d, 50*time.Second)
	require.LessOrEqual(t, d, time.Minute)

	require.NoError(t, stop())
	require.ErrorIs(t, srv.Ready(), ErrNotReady, "not ready once stopped")
	require.False(t, c.isRunning())
}

// Kafka down at start: the Server runs, alive and not ready, saying it
// waits for Kafka (the partition counts of a first start are unknown); it
// shuts down within its ShutdownTimeout.
func TestServerKafkaDownAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	cfg := b.config("nokafka")
	cfg.Brokers = []string{dead}
	c := b.client(t, cfg)
	registerConsumer(t, c)
	srv := &Server{HTTP: &http.Server{}, Clients: []*Client{c}, ShutdownTimeout: 10 * time.Second}
	url, stop := serve(t, srv)

	code, _ := probe(t, url+"/livez")
	require.Equal(t, http.StatusOK, code)
	var body map[string]string
	eventually(t, "not ready, waiting for Kafka", func() bool {
		code, body = probe(t, url+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, "never ready without Kafka")
		return body["status"] == "not ready" && c.isRunning() && errors.Is(c.Ready(), ErrNotReady) &&
			strings.Contains(body["error"], "waiting for Kafka")
	})
	require.Contains(t, body["error"], "orders")
	began := time.Now()
	err = stop()
	took := time.Since(began)
	require.Less(t, took, 2*time.Minute)
	if err != nil {
		// Only a shutdown cut short by ShutdownTimeout may fail it.
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

// A request that never ends does not hold the process: the shutdown closes
// it after ShutdownTimeout, and Run says so.
func TestServerShutdownIsBounded(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	entered := make(chan struct{})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	mux.HandleFunc("GET /stuck", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release // ignores its context, as a handler stuck in a call without one would
	})
	srv := &Server{HTTP: &http.Server{Handler: mux}, ShutdownTimeout: 500 * time.Millisecond}
	url, stop := serve(t, srv)
	go func() {
		resp, err := http.Get(url + "/stuck")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	err := stop()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "HTTP requests in flight")
}

// A Server without HTTP is a configuration error, not a panic.
func TestServerNeedsHTTP(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, (&Server{}).Run(context.Background()), ErrConfig)
}

// Bad Server configuration is an error naming the field before anything
// is served, never a panic: a nil Client, one listed twice, a TLSConfig
// that has no certificate (serving it in clear would drop the encryption
// its caller asked for), negative durations.
func TestServerConfigErrors(t *testing.T) {
	t.Parallel()
	c, err := New(validConfig(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a Server that passed its checks returns at once
	err = Serve(ctx, &http.Server{}, nil)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "Server.Clients[0] is nil")
	for field, s := range map[string]*Server{
		"Server.Clients[1]":           {HTTP: &http.Server{}, Clients: []*Client{c, c}},
		"Server.HTTP.TLSConfig":       {HTTP: &http.Server{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}},
		"Server.ShutdownTimeout":      {HTTP: &http.Server{}, ShutdownTimeout: -time.Second},
		"Server.ShutdownDelay":        {HTTP: &http.Server{}, ShutdownDelay: -time.Second},
		"Server.Clients[0] is nil":    {HTTP: &http.Server{}, Clients: []*Client{nil, c}},
		"Server.Clients[2] is listed": {HTTP: &http.Server{}, Clients: []*Client{c, nil, c}},
	} {
		err := s.Run(ctx)
		require.ErrorIs(t, err, ErrConfig, field)
		require.ErrorContains(t, err, field)
	}
	require.False(t, c.isRunning())
}

// An http.Server with a TLSConfig is served over TLS, not in clear.
func TestServerServesTLS(t *testing.T) {
	t.Parallel()
	ts := httptest.NewTLSServer(http.NotFoundHandler())
	cert := ts.TLS.Certificates
	pool := ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	ts.Close()
	srv := &Server{HTTP: &http.Server{TLSConfig: &tls.Config{Certificates: cert, MinVersion: tls.VersionTLS12}}}
	url, stop := serve(t, srv)
	url = "https" + strings.TrimPrefix(url, "http")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "example.com", MinVersion: tls.VersionTLS12}}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get(url + "/livez")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotNil(t, resp.TLS, "answered over TLS")
	resp, err = http.Get("http" + strings.TrimPrefix(url, "https") + "/livez")
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a plain-HTTP request gets Go's TLS server's refusal")
	}
	require.NoError(t, stop())
}

// A topic that does not exist is named as such, with the two ways out,
// not as "waiting for Kafka" (Kafka answers: the topic is not there).
func TestReadyNamesATopicThatDoesNotExist(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("notopic")
	cfg.PublishTopics = []string{"no-such-topic"}
	c := b.client(t, cfg)
	registerConsumer(t, c)
	start(t, c)
	var err error
	eventually(t, "not ready, naming the missing topic", func() bool {
		err = c.Ready()
		return err != nil && strings.Contains(err.Error(), "to exist in Kafka")
	})
	require.ErrorIs(t, err, ErrNotReady)
	require.ErrorContains(t, err, "waiting for topics no-such-topic to exist in Kafka: create them, or set Config.CreateTopicPartitions")
}

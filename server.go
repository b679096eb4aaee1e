package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Server defaults.
const (
	// defaultShutdownTimeout is Server.ShutdownTimeout's default:
	// Kubernetes' default grace period (terminationGracePeriodSeconds,
	// 30 s) minus 5 s for the process to exit and the kubelet to notice.
	defaultShutdownTimeout = 25 * time.Second
	// defaultRequestTimeout is Server.RequestTimeout's default.
	defaultRequestTimeout = 10 * time.Second
	// groupLeaveMargin is what a Client's stop takes after its drain
	// (Config.DrainTimeout): committing offsets, leaving both groups,
	// marking the replica record stopped.
	groupLeaveMargin = 3 * time.Second
	// notReadyRelog is how often a Server that is not ready says what it
	// waits for.
	notReadyRelog = 5 * time.Second
)

// Server runs Clients beside an HTTP server for the life of a process, so
// that a service's main needs one call:
//
//	srv := &outbox.Server{HTTP: &http.Server{Addr: ":8080", Handler: mux}, Clients: []*outbox.Client{client}}
//	if err := srv.Run(context.Background()); err != nil {
//		log.Fatal(err)
//	}
//
// Run serves HTTP at once (liveness), runs every Client (Client.Run), and
// answers readiness once every Client is ready (Client.Ready: started, the
// partition counts known): while MongoDB or Kafka is down at start, the
// process keeps running, GET /readyz answers 503 saying what it waits for,
// and a log line says it every few seconds. Each request's context gets a
// deadline (RequestTimeout), so that a request waiting on a MongoDB that is
// down ends in time for a handler to answer 503.
//
// On SIGINT or SIGTERM (or when ctx ends, or a Client fails), readiness
// turns false, the HTTP server stops accepting and finishes the requests in
// flight while, at the same time, the Clients drain (the consumer's
// transactions in hand get Config.DrainTimeout) and leave their groups.
// Run returns at most ShutdownTimeout after the shutdown began, whatever is
// down; what did not stop by then is named in its error, left to the
// process's exit. A second signal during the shutdown ends the process at
// once (Go's default handling).
type Server struct {
	// HTTP serves the service's routes. Required. Run serves it on
	// Listener, or listens on its Addr (":http" when empty), and wraps its
	// Handler to answer ReadyPath and LivePath and to give each request's
	// context its deadline. With a TLSConfig, Run serves HTTPS with its
	// certificates (Certificates, GetCertificate or GetConfigForClient;
	// without any, Run fails rather than serve in clear).
	HTTP *http.Server
	// Listener, when set, is served instead of listening on HTTP.Addr.
	// Defaults to nil.
	Listener net.Listener
	// Clients are run (Client.Run) while the server runs, and ready
	// (Client.Ready) before the server is; none nil, none twice. Defaults
	// to none.
	Clients []*Client
	// ShutdownTimeout bounds the shutdown, from the signal to Run's
	// return. Keep it below the orchestrator's grace period (Kubernetes:
	// terminationGracePeriodSeconds, 30 s by default), and above each
	// Client's Config.DrainTimeout plus a few seconds for leaving the
	// Kafka groups (Run logs a warning otherwise). Defaults to 25 s.
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long the server goes on serving, unready, after
	// the signal and before it stops accepting connections, so that load
	// balancers stop sending new requests first (part of
	// ShutdownTimeout). Defaults to 0.
	ShutdownDelay time.Duration
	// RequestTimeout is the deadline given to every request's context
	// (probes excepted); a handler whose MongoDB or downstream call ends
	// with context.DeadlineExceeded answers in time (503, say). Negative
	// sets none. Defaults to 10 s.
	RequestTimeout time.Duration
	// ReadyPath answers 200 {"status": "ready"} when the server and every
	// Client are ready, else 503 {"status": "not ready", "error": what it
	// waits for}. "-" disables it. Defaults to "/readyz".
	ReadyPath string
	// LivePath answers 200 {"status": "alive"} while the process serves,
	// shutdown included (an orchestrator must not restart a process that
	// waits for MongoDB or Kafka, nor one that drains). "-" disables it.
	// Defaults to "/livez".
	LivePath string
	// Signals start the shutdown. Defaults to SIGINT and SIGTERM.
	Signals []os.Signal
	// Logger receives the server's lines: serving, ready, what it waits
	// for, shutting down, stopped. Defaults to slog.Default().
	Logger *slog.Logger

	stopping atomic.Bool
	serving  atomic.Bool
}

// Serve runs clients beside srv until SIGINT or SIGTERM, with Server's
// defaults: (&Server{HTTP: srv, Clients: clients}).Run(ctx).
func Serve(ctx context.Context, srv *http.Server, clients ...*Client) error {
	return (&Server{HTTP: srv, Clients: clients}).Run(ctx)
}

// Ready reports nil when the server serves, is not shutting down, and
// every Client is ready (Client.Ready); otherwise an error, wrapping
// ErrNotReady, naming what it waits for.
func (s *Server) Ready() error {
	switch {
	case s.stopping.Load():
		return fmt.Errorf("%w: shutting down", ErrNotReady)
	case !s.serving.Load():
		return fmt.Errorf("%w: not serving yet", ErrNotReady)
	}
	var waits []string
	for _, c := range s.Clients {
		if err := c.Ready(); err != nil {
			waits = append(waits, strings.TrimPrefix(err.Error(), ErrNotReady.Error()+": "))
		}
	}
	if len(waits) > 0 {
		return fmt.Errorf("%w: %s", ErrNotReady, strings.Join(waits, "; "))
	}
	return nil
}

// Run serves and runs the Clients until a signal of Signals arrives, ctx
// ends, the HTTP server fails or a Client fails, then shuts down (see
// Server) and returns nil after a clean shutdown, the first failure, or
// an error naming what did not stop within ShutdownTimeout. It fails at
// once when it cannot listen, or with errors wrapping ErrConfig when the
// Server's fields are invalid (no HTTP, a nil Client, a TLSConfig without
// a certificate).
func (s *Server) Run(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	log := cmp.Or(s.Logger, slog.Default())
	grace := cmp.Or(s.ShutdownTimeout, defaultShutdownTimeout)
	for _, c := range s.Clients {
		if c.cfg.DrainTimeout+groupLeaveMargin > grace {
			log.WarnContext(ctx, "outbox: a Client's DrainTimeout leaves no time to leave its groups within the server's ShutdownTimeout",
				"outbox.service", c.cfg.Service, "drain_timeout", c.cfg.DrainTimeout.String(), "shutdown_timeout", grace.String())
		}
	}
	ln := s.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cmp.Or(s.HTTP.Addr, ":http")); err != nil {
			return fmt.Errorf("outbox: listen: %w", err)
		}
	}
	next := s.HTTP.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	s.HTTP.Handler = s.handler(next)

	sigs := s.Signals
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	sctx, stopSignals := signal.NotifyContext(ctx, sigs...)
	defer stopSignals()

	// The Clients run under a context of their own, canceled by the
	// shutdown, so that they drain while the HTTP server does.
	runCtx, stopClients := context.WithCancel(context.WithoutCancel(ctx))
	defer stopClients()
	fatal := make(chan error, len(s.Clients))
	var clients sync.WaitGroup
	for _, c := range s.Clients {
		clients.Go(func() {
			if err := c.Run(runCtx); err != nil {
				fatal <- fmt.Errorf("%s: %w", c.cfg.Service, err)
			}
		})
	}
	clientsDone := make(chan struct{})
	go func() { clients.Wait(); close(clientsDone) }()

	serveErr := make(chan error, 1)
	if s.HTTP.TLSConfig != nil {
		// The certificates are in TLSConfig (check made sure), so no files.
		go func() { serveErr <- s.HTTP.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- s.HTTP.Serve(ln) }()
	}
	s.serving.Store(true)
	log.InfoContext(ctx, "outbox: serving", "addr", ln.Addr().String(), "shutdown_timeout", grace.String())

	// The readiness reporter (owned by Run, ended before it returns): says
	// when the server becomes ready, and what it waits for meanwhile.
	repCtx, stopReporter := context.WithCancel(sctx)
	var reporter sync.WaitGroup
	reporter.Go(func() { s.reportReadiness(repCtx, log) })

	var first error
	select {
	case <-sctx.Done():
		if ctx.Err() == nil {
			log.InfoContext(ctx, "outbox: signal received; shutting down", "grace", grace.String())
		}
	case first = <-fatal:
		log.ErrorContext(ctx, "outbox: a client failed; shutting down", "err", first)
	case err := <-serveErr:
		serveErr <- err
		if !errors.Is(err, http.ErrServerClosed) {
			first = fmt.Errorf("outbox: serve HTTP: %w", err)
			log.ErrorContext(ctx, "outbox: the HTTP server failed; shutting down", "err", err)
		}
	}
	stopSignals() // a second signal now ends the process at once
	stopReporter()
	reporter.Wait()
	err := s.shutdown(ctx, log, grace, stopClients, clientsDone, serveErr)
	// fatal stays open: a Client still running after the grace period
	// may yet send to it (its buffer holds one error per Client).
	for drained := false; !drained; {
		select {
		case e := <-fatal:
			first = cmp.Or(first, e)
		default:
			drained = true
		}
	}
	return cmp.Or(first, err)
}

// check reports every mistake in the Server's configuration, each
// wrapping ErrConfig, before anything is served or run.
func (s *Server) check() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if s.HTTP == nil {
		bad("Server.HTTP is required")
	} else if tc := s.HTTP.TLSConfig; tc != nil && len(tc.Certificates) == 0 && tc.GetCertificate == nil && tc.GetConfigForClient == nil {
		// Serving it without TLS would send in clear what the caller
		// meant to encrypt; there are no certificate files to fall back on.
		bad("Server.HTTP.TLSConfig has no certificate (Certificates, GetCertificate or GetConfigForClient)")
	}
	seen := map[*Client]bool{}
	for i, c := range s.Clients {
		switch {
		case c == nil:
			bad("Server.Clients[%d] is nil", i)
		case seen[c]:
			bad("Server.Clients[%d] is listed twice", i)
		}
		seen[c] = true
	}
	if s.ShutdownTimeout < 0 {
		bad("Server.ShutdownTimeout must not be negative")
	}
	if s.ShutdownDelay < 0 {
		bad("Server.ShutdownDelay must not be negative")
	}
	return errors.Join(errs...)
}

// shutdown turns readiness false, waits ShutdownDelay, then stops the HTTP
// server and the Clients at the same time, bounded by grace in all.
func (s *Server) shutdown(ctx context.Context, log *slog.Logger, grace time.Duration, stopClients func(),
	clientsDone <-chan struct{}, serveErr <-chan error) error {
	began := time.Now()
	s.stopping.Store(true)
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if d := s.ShutdownDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-gctx.Done():
		}
		t.Stop()
	}
	stopClients()
	var late []string
	if err := s.HTTP.Shutdown(gctx); err != nil {
		_ = s.HTTP.Close()
		late = append(late, "HTTP requests in flight (their connections were closed)")
	}
	<-serveErr // Serve returns at once after Shutdown or Close
	select {
	case <-clientsDone:
	case <-gctx.Done():
		for _, c := range s.Clients {
			if c.isRunning() {
				late = append(late, "client "+c.cfg.Service)
			}
		}
	}
	s.serving.Store(false)
	if len(late) > 0 {
		err := fmt.Errorf("outbox: shutdown exceeded ShutdownTimeout (%v); still running: %s: %w", grace, strings.Join(late, ", "), context.DeadlineExceeded)
		log.ErrorContext(ctx, "outbox: stopped, not cleanly", "err", err)
		return err
	}
	log.InfoContext(ctx, "outbox: stopped", "shutdown_took", time.Since(began).Round(time.Millisecond).String())
	return nil
}

// handler wraps next with the probes and the request deadline.
func (s *Server) handler(next http.Handler) http.Handler {
	ready, live := cmp.Or(s.ReadyPath, "/readyz"), cmp.Or(s.LivePath, "/livez")
	timeout := cmp.Or(s.RequestTimeout, defaultRequestTimeout)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case ready:
				if err := s.Ready(); err != nil {
					writeProbe(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "error": err.Error()})
					return
				}
				writeProbe(w, http.StatusOK, map[string]string{"status": "ready"})
				return
			case live:
				writeProbe(w, http.StatusOK, map[string]string{"status": "alive"})
				return
			}
		}
		if timeout > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), timeout)
			defer cancel()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

func writeProbe(w http.ResponseWriter, code int, body map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// reportReadiness logs what the server waits for every notReadyRelog
// while it is not ready, and once when it becomes ready, until ctx ends.
func (s *Server) reportReadiness(ctx context.Context, log *slog.Logger) {
	began := time.Now()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var loggedAt time.Time
	for {
		err := s.Ready()
		if err == nil {
			log.InfoContext(ctx, "outbox: ready", "after", time.Since(began).Round(time.Millisecond).String())
			return
		}
		if time.Since(began) >= notReadyRelog && time.Since(loggedAt) >= notReadyRelog {
			loggedAt = time.Now()
			log.WarnContext(ctx, "outbox: not ready yet", "waiting_for", err.Error(), "for", time.Since(began).Round(time.Second).String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// isRunning reports whether Run runs.
func (c *Client) isRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

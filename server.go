package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/event-outbox/outbox/internal/lifecycle"
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

	state lifecycle.State
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
	case s.state.Stopping():
		return fmt.Errorf("%w: shutting down", ErrNotReady)
	case !s.state.Serving():
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
	units := make([]lifecycle.Unit, len(s.Clients))
	for i, c := range s.Clients {
		if c.cfg.DrainTimeout+groupLeaveMargin > grace {
			log.WarnContext(ctx, "outbox: a Client's DrainTimeout leaves no time to leave its groups within the server's ShutdownTimeout",
				"outbox.service", c.cfg.Service, "drain_timeout", c.cfg.DrainTimeout.String(), "shutdown_timeout", grace.String())
		}
		units[i] = lifecycle.Unit{Name: c.cfg.Service, Run: c.Run, Running: c.isRunning}
	}
	p := &lifecycle.Process{
		HTTP:           s.HTTP,
		Listener:       s.Listener,
		Units:          units,
		Grace:          grace,
		Delay:          s.ShutdownDelay,
		RequestTimeout: cmp.Or(s.RequestTimeout, defaultRequestTimeout),
		ReadyPath:      cmp.Or(s.ReadyPath, "/readyz"),
		LivePath:       cmp.Or(s.LivePath, "/livez"),
		Signals:        s.Signals,
		Ready:          s.Ready,
		Logger:         log,
		State:          &s.state,
	}
	return p.Run(ctx)
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

// isRunning reports whether Run runs.
func (c *Client) isRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

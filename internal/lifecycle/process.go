package lifecycle

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

// notReadyRelog is how often a process that is not ready says what it
// waits for.
const notReadyRelog = 5 * time.Second

// Unit is one thing the process runs while it serves.
type Unit struct {
	// Name names the Unit in errors ("client <Name>" when it did not
	// stop in time).
	Name string
	// Run runs until its context ends and returns the first fatal error.
	Run func(ctx context.Context) error
	// Running reports whether Run has not returned yet.
	Running func() bool
}

// State is the process's serving and stopping state, which readiness
// reads: a process is ready only while it serves and is not stopping.
type State struct {
	stopping, serving atomic.Bool
}

// Stopping reports whether the shutdown began.
func (s *State) Stopping() bool { return s.stopping.Load() }

// Serving reports whether the HTTP server serves.
func (s *State) Serving() bool { return s.serving.Load() }

// Process is one run of a process's HTTP server and Units. Every field is
// resolved by the caller (no defaults here but the signals and the
// listening address).
type Process struct {
	// HTTP serves the routes; Run wraps its Handler (nil: the default
	// mux) with the probes and the request deadline. With a TLSConfig it
	// is served as HTTPS with the configuration's certificates.
	HTTP *http.Server
	// Listener is served when set; otherwise Run listens on HTTP.Addr
	// (":http" when empty).
	Listener net.Listener
	Units    []Unit
	// Grace bounds the shutdown, from its start to Run's return.
	Grace time.Duration
	// Delay is how long the process goes on serving, unready, before it
	// stops accepting connections (part of Grace).
	Delay time.Duration
	// RequestTimeout is every request's deadline but the probes'; 0 or
	// negative sets none.
	RequestTimeout time.Duration
	// ReadyPath and LivePath are the probes' paths.
	ReadyPath, LivePath string
	// Signals start the shutdown; none: SIGINT and SIGTERM.
	Signals []os.Signal
	// Ready reports nil when the process is ready, else what it waits for.
	Ready  func() error
	Logger *slog.Logger
	State  *State
}

// Run serves and runs the Units until a signal of Signals arrives, ctx
// ends, the HTTP server fails or a Unit fails, then shuts down and returns
// nil after a clean shutdown, the first failure (a Unit's wrapped with its
// Name), or an error naming what did not stop within Grace. It fails at
// once when it cannot listen.
func (p *Process) Run(ctx context.Context) error {
	log := p.Logger
	ln := p.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cmp.Or(p.HTTP.Addr, ":http")); err != nil {
			return fmt.Errorf("outbox: listen: %w", err)
		}
	}
	next := p.HTTP.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	p.HTTP.Handler = p.handler(next)

	sigs := p.Signals
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	sctx, stopSignals := signal.NotifyContext(ctx, sigs...)
	defer stopSignals()

	// The Units run under a context of their own, canceled by the
	// shutdown, so that they drain while the HTTP server does.
	runCtx, stopUnits := context.WithCancel(context.WithoutCancel(ctx))
	defer stopUnits()
	fatal := make(chan error, len(p.Units))
	var units sync.WaitGroup
	for _, u := range p.Units {
		units.Go(func() {
			if err := u.Run(runCtx); err != nil {
				fatal <- fmt.Errorf("%s: %w", u.Name, err)
			}
		})
	}
	unitsDone := make(chan struct{})
	go func() { units.Wait(); close(unitsDone) }()

	serveErr := make(chan error, 1)
	if p.HTTP.TLSConfig != nil {
		// The certificates are in TLSConfig (the caller checked), so no
		// files.
		go func() { serveErr <- p.HTTP.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- p.HTTP.Serve(ln) }()
	}
	p.State.serving.Store(true)
	log.InfoContext(ctx, "outbox: serving", "addr", ln.Addr().String(), "shutdown_timeout", p.Grace.String())

	// The readiness reporter (owned by Run, ended before it returns): says
	// when the process becomes ready, and what it waits for meanwhile.
	repCtx, stopReporter := context.WithCancel(sctx)
	var reporter sync.WaitGroup
	reporter.Go(func() { p.reportReadiness(repCtx) })

	var first error
	select {
	case <-sctx.Done():
		if ctx.Err() == nil {
			log.InfoContext(ctx, "outbox: signal received; shutting down", "grace", p.Grace.String())
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
	err := p.shutdown(ctx, stopUnits, unitsDone, serveErr)
	// fatal stays open: a Unit still running after the grace period may
	// yet send to it (its buffer holds one error per Unit).
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

// shutdown turns readiness false, waits Delay, then stops the HTTP server
// and the Units at the same time, bounded by Grace in all.
func (p *Process) shutdown(ctx context.Context, stopUnits func(), unitsDone <-chan struct{}, serveErr <-chan error) error {
	began := time.Now()
	p.State.stopping.Store(true)
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.Grace)
	defer cancel()
	if d := p.Delay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-gctx.Done():
		}
		t.Stop()
	}
	stopUnits()
	var late []string
	if err := p.HTTP.Shutdown(gctx); err != nil {
		_ = p.HTTP.Close()
		late = append(late, "HTTP requests in flight (their connections were closed)")
	}
	<-serveErr // Serve returns at once after Shutdown or Close
	select {
	case <-unitsDone:
	case <-gctx.Done():
		for _, u := range p.Units {
			if u.Running() {
				late = append(late, "client "+u.Name)
			}
		}
	}
	p.State.serving.Store(false)
	if len(late) > 0 {
		err := fmt.Errorf("outbox: shutdown exceeded ShutdownTimeout (%v); still running: %s: %w", p.Grace, strings.Join(late, ", "), context.DeadlineExceeded)
		p.Logger.ErrorContext(ctx, "outbox: stopped, not cleanly", "err", err)
		return err
	}
	p.Logger.InfoContext(ctx, "outbox: stopped", "shutdown_took", time.Since(began).Round(time.Millisecond).String())
	return nil
}

// handler wraps next with the probes and the request deadline.
func (p *Process) handler(next http.Handler) http.Handler {
	ready, live, timeout := p.ReadyPath, p.LivePath, p.RequestTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case ready:
				if err := p.Ready(); err != nil {
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

// reportReadiness logs what the process waits for every notReadyRelog
// while it is not ready, and once when it becomes ready, until ctx ends.
func (p *Process) reportReadiness(ctx context.Context) {
	began := time.Now()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var loggedAt time.Time
	for {
		err := p.Ready()
		if err == nil {
			p.Logger.InfoContext(ctx, "outbox: ready", "after", time.Since(began).Round(time.Millisecond).String())
			return
		}
		if time.Since(began) >= notReadyRelog && time.Since(loggedAt) >= notReadyRelog {
			loggedAt = time.Now()
			p.Logger.WarnContext(ctx, "outbox: not ready yet", "waiting_for", err.Error(), "for", time.Since(began).Round(time.Second).String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

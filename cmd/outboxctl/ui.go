package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/console"
)

// ui serves the operations console (package console) until ctx ends:
//
//	outboxctl -db shop_orders,shop_payments -service orders,payments ui -addr 127.0.0.1:8090
//
// -db may list several databases, one per service; -service names them in
// the same order (their Kafka groups derive from the names as in
// outbox.Config) and defaults to the database names. -brokers (default
// $KAFKA_BROKERS) feeds the partitions page; without it that page says
// Kafka is not configured. -claim-check-db names the databases, on the
// -uri cluster, whose outbox_payloads collection holds the payloads the
// services stored out of band (Config.ClaimCheck.Database): one per -db
// database in the same order, or one for all; it defaults to each
// service's own database, the default of Config.ClaimCheck.Database. The
// event pages read an out-of-band payload's stored size and publication
// mark there. -find-indexes creates the indexes of the find page first.
//
// The console answers only to localhost, IP addresses and the names given
// with -allowed-hosts (the name operators open it by, through a proxy or
// DNS): any other Host gets 421, which defeats DNS rebinding. It is
// read-only unless -actions is given, and -actions needs an operator
// password in $OUTBOX_CONSOLE_PASSWORD (an environment variable, not a
// flag, so that it shows in no process list): operators sign in with it
// before any action. Pages are readable by whoever reaches the address:
// listen on loopback, or put the console behind a proxy that
// authenticates. -secure-cookies marks its cookies Secure behind a proxy
// that terminates TLS.
//
// The server runs until ctx ends (SIGINT, SIGTERM), then shuts down within
// 5 s. -timeout does not apply: it bounds one-shot commands.
func (o *cliOptions) ui(ctx context.Context, stdout io.Writer) error {
	dbs := splitList(o.db)
	names := splitList(o.services)
	if len(names) == 0 {
		names = dbs
	}
	if len(names) != len(dbs) {
		return usagef("ui: -service names %d services but -db lists %d databases", len(names), len(dbs))
	}
	claimDBs := splitList(o.claimCheckDBs)
	switch len(claimDBs) {
	case 0:
		claimDBs = dbs
	case 1:
		claimDBs = slices.Repeat(claimDBs, len(dbs))
	case len(dbs):
	default:
		return usagef("ui: -claim-check-db lists %d databases but -db lists %d: give one per -db database, or one for all", len(claimDBs), len(dbs))
	}
	if o.actions && len(o.consolePassword) < 8 {
		return usagef("ui -actions needs an operator password of at least 8 characters in $%s: operators sign in with it before any action", envConsolePassword)
	}
	mc, err := o.connect("outboxctl-ui", 10*time.Second)
	if err != nil {
		return err
	}
	defer disconnect(ctx, mc)
	opts := console.Options{EnableActions: o.actions, Title: "outbox console", AllowedHosts: splitList(o.allowedHosts),
		SecureCookies: o.secureCookies}
	if o.actions {
		opts.OperatorPassword = o.consolePassword
	}
	for i, db := range dbs {
		s := console.Service{Name: names[i], Database: mc.Database(db), OutboxCollection: o.outbox, InboxCollection: o.inbox,
			ClaimCheckDatabase: mc.Database(claimDBs[i])}
		if o.findIndexes {
			ictx, cancel := context.WithTimeout(ctx, o.timeout)
			err := console.EnsureFindIndexes(ictx, s)
			cancel()
			if err != nil {
				return err
			}
		}
		opts.Services = append(opts.Services, s)
	}
	if brokers := splitList(o.brokers); len(brokers) > 0 {
		kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("outboxctl-ui"))
		if err != nil {
			return fmt.Errorf("kafka client: %w", err)
		}
		defer kc.Close()
		opts.Kafka = kadm.NewClient(kc)
	}
	c, err := console.New(opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.addr, err)
	}
	srv := newUIServer(c)
	mode := "read-only"
	if o.actions {
		mode = "actions enabled for signed-in operators"
	}
	fmt.Fprintf(stdout, "outbox console (%s) on http://%s/\n", mode, ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }() // owned by ui: stopped by Shutdown below
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// envConsolePassword holds the operator password of ui -actions.
const envConsolePassword = "OUTBOX_CONSOLE_PASSWORD"

// newUIServer returns the HTTP server of ui: every phase of a request is
// bounded, so that slow or idle clients cannot hold connections open
// (headers 5 s, the whole request 30 s, writing the answer 60 s: pages
// take at most the console's 10 s query timeout; idle keep-alive 2 min).
func newUIServer(h http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

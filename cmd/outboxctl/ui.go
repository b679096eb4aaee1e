package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

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
// Kafka is not configured. The console is read-only unless -actions is
// given. -find-indexes creates the indexes of the find page first. The
// console has no authentication: listen on a loopback address, or put it
// behind a proxy that authenticates.
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
	copts := options.Client().ApplyURI(o.uri)
	if copts.AppName == nil {
		copts.SetAppName("outboxctl-ui")
	}
	if copts.ServerSelectionTimeout == nil {
		copts.SetServerSelectionTimeout(10 * time.Second)
	}
	if err := copts.Validate(); err != nil {
		return usagef("invalid MongoDB URI %s: %v", redactURI(o.uri), err)
	}
	mc, err := mongo.Connect(copts)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redactURI(o.uri), err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = mc.Disconnect(dctx)
	}()
	opts := console.Options{EnableActions: o.actions, Title: "outbox console"}
	for i, db := range dbs {
		s := console.Service{Name: names[i], Database: mc.Database(db), OutboxCollection: o.outbox, InboxCollection: o.inbox}
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
	mux := http.NewServeMux()
	mux.Handle("/", c)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	mode := "read-only"
	if o.actions {
		mode = "actions enabled"
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

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// Database names of the two bounded contexts. Each context keeps its
// business collections and its own outbox and inbox in its database, as two
// separate services would.
const (
	ordersDB   = "shop_orders"
	paymentsDB = "shop_payments"
)

// replica is one instance of the example service: the orders and payments
// contexts, each with its own framework Client, behind one HTTP server.
// Replicas of the same stack split the Kafka partitions between them.
type replica struct {
	// name tells replicas apart in logs, GET /outbox/status and Kafka
	// client ids (see replicaNames).
	name     string
	log      *slog.Logger
	stack    *stack
	orders   *ordersService
	payments *paymentsService
	server   *http.Server
	ln       net.Listener
	// metrics feeds GET /metrics; both contexts' clients report to it.
	metrics *metrics
	// console is served at /outbox/ui/; consoleKafka reads its groups.
	console      http.Handler
	consoleKafka *kgo.Client
}

// tuning adjusts the framework configuration of a replica (tests shorten
// timeouts with it).
type tuning func(*outbox.Config)

// newReplica wires a replica named name listening on ln.
func newReplica(name string, st *stack, ln net.Listener, log *slog.Logger, tune tuning) (*replica, error) {
	log = log.With("replica", name)
	m, err := newMetrics()
	if err != nil {
		return nil, err
	}
	base := outbox.Config{
		Mongo:        st.mongo,
		Brokers:      st.brokers,
		KafkaOptions: st.kafkaOpts,
	}
	if tune != nil {
		tune(&base)
	}
	// configure fills in what differs between the contexts. The Kafka
	// client id names the replica, so that operators can tell the members
	// of the groups apart (kafka-consumer-groups.sh --describe --members).
	configure := func(cfg *outbox.Config, db, service, topic string) {
		cfg.Database = db
		cfg.Service = service
		cfg.PublishTopics = []string{topic}
		if topic == paymentsTopic && st.paymentsFormat != outbox.FormatNative {
			cfg.WireFormats = map[string]outbox.Format{topic: st.paymentsFormat}
		}
		cfg.Logger = log.With("service", service)
		cfg.MeterProvider = m.forService(service)
		clientID := "outbox-example-" + name + "-" + service
		cfg.KafkaOptions = append(slices.Clone(cfg.KafkaOptions), kgo.ClientID(clientID))
	}

	ocfg := base
	configure(&ocfg, ordersDB, "orders", ordersTopic)
	oc, err := outbox.New(ocfg)
	if err != nil {
		_ = m.shutdown(context.Background())
		return nil, fmt.Errorf("orders: %w", err)
	}

	pcfg := base
	configure(&pcfg, paymentsDB, "payments", paymentsTopic)
	pc, err := outbox.New(pcfg)
	if err != nil {
		_ = m.shutdown(context.Background())
		return nil, fmt.Errorf("payments: %w", err)
	}

	r := &replica{
		name:     name,
		log:      log,
		stack:    st,
		orders:   newOrdersService(oc, st.mongo.Database(ordersDB)),
		payments: newPaymentsService(pc, st.mongo.Database(paymentsDB)),
		ln:       ln,
		metrics:  m,
	}
	cons, consKafka, err := r.newConsole()
	if err != nil {
		_ = m.shutdown(context.Background())
		return nil, fmt.Errorf("console: %w", err)
	}
	r.console, r.consoleKafka = cons, consKafka
	r.server = &http.Server{
		Handler:           r.routes(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return r, nil
}

// Addr is the HTTP address the replica serves on.
func (r *replica) Addr() string { return r.ln.Addr().String() }

// clients returns the framework clients of the two contexts, by context.
func (r *replica) clients() map[string]*outbox.Client {
	return map[string]*outbox.Client{"orders": r.orders.client, "payments": r.payments.client}
}

// close releases what newReplica acquired, for a replica that never runs
// (run releases it otherwise).
func (r *replica) close() {
	_ = r.metrics.shutdown(context.Background())
	r.consoleKafka.Close()
}

// run serves HTTP and runs both framework clients until ctx ends. Shutdown
// order: stop accepting requests and finish those in flight (so no request
// records an event after its context is gone), then let the clients drain
// (handlers in hand finish and commit their offsets, the publishers leave
// their groups so other replicas take over at once), then shut the meter
// provider down.
func (r *replica) run(ctx context.Context) error {
	runCtx, stopClients := context.WithCancel(context.WithoutCancel(ctx))
	defer stopClients()

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for name, c := range r.clients() {
		wg.Go(func() {
			if err := c.Run(runCtx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- r.server.Serve(r.ln) }()
	r.log.Info("serving", "addr", "http://"+r.Addr())

	var fatal error
	select {
	case <-ctx.Done():
	case fatal = <-errs:
		r.log.Error("framework stopped", "err", fatal)
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			fatal = fmt.Errorf("http: %w", err)
		}
	}

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.server.Shutdown(shutdownCtx); err != nil {
		r.log.Warn("http shutdown", "err", err)
	}
	stopClients()
	wg.Wait()
	r.consoleKafka.Close()
	close(errs)
	for err := range errs {
		fatal = cmpErr(fatal, err)
	}
	// The clients are stopped: nothing reports any more.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer mcancel()
	if err := r.metrics.shutdown(mctx); err != nil {
		r.log.Warn("metrics shutdown", "err", err)
	}
	r.log.Info("stopped")
	return fatal
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

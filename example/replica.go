package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/console"
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
	// shutdownTimeout overrides the package's shutdownTimeout (tests).
	shutdownTimeout time.Duration
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
		cfg.Logger = log // the framework adds outbox.service itself
		cfg.ReplicaID = name
		cfg.CreateTopicPartitions = st.createPartitions
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

// requestTimeout bounds every request (outbox.Server.RequestTimeout): a
// request that waits on a MongoDB that is down answers 503 by then.
const requestTimeout = 5 * time.Second

// shutdownTimeout bounds a replica's shutdown whatever is down
// (outbox.Server.ShutdownTimeout): below Kubernetes' default grace period
// of 30 s, above the consumers' DrainTimeout (20 s) plus leaving the
// groups.
const shutdownTimeout = 25 * time.Second

// run serves HTTP and runs both framework clients until ctx ends, through
// outbox.Server: HTTP first (GET /livez answers at once), the clients
// beside it, ready (GET /readyz) once both clients are, however long
// MongoDB or Kafka are down at start. On shutdown the HTTP server finishes
// the requests in flight while the clients drain (handlers in hand finish
// and commit their offsets, the publishers leave their groups so other
// replicas take over at once), all within shutdownTimeout; then the meter
// provider shuts down.
func (r *replica) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ictx, stopIndexes := context.WithCancel(ctx)
	defer stopIndexes()
	wg.Go(func() { r.ensureFindIndexes(ictx) })

	srv := &outbox.Server{
		HTTP:            r.server,
		Listener:        r.ln,
		Clients:         []*outbox.Client{r.orders.client, r.payments.client},
		RequestTimeout:  requestTimeout,
		ShutdownTimeout: cmp.Or(r.shutdownTimeout, shutdownTimeout),
		Logger:          r.log,
	}
	fatal := srv.Run(ctx)
	stopIndexes()
	r.consoleKafka.Close()
	// The clients are stopped: nothing reports any more.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer mcancel()
	if err := r.metrics.shutdown(mctx); err != nil {
		r.log.Warn("metrics shutdown", "err", err)
	}
	return fatal
}

// ensureFindIndexes creates the indexes the console's find page needs
// (console.EnsureFindIndexes), retried with backoff while MongoDB is down,
// until they exist or ctx ends.
func (r *replica) ensureFindIndexes(ctx context.Context) {
	for _, s := range r.consoleServices() {
		for attempt := 0; ; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := console.EnsureFindIndexes(cctx, s)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			if attempt%5 == 0 {
				r.log.Warn("creating the console's find indexes failed; retrying", "service", s.Name, "err", err)
			}
			t := time.NewTimer(min(time.Duration(attempt+1)*time.Second, 10*time.Second))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

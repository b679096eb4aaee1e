// Command example is a shop made of two bounded contexts, orders and
// payments, that talk only through events, wired with the outbox framework
// and embedded in an HTTP server's lifespan.
//
//	POST /orders {"customer": "ada", "amount": 42}
//	  orders: insert the order (PENDING) + record OrderCreated   (one transaction)
//	  publisher -> Kafka "orders"
//	payments handles OrderCreated:
//	  insert the payment + record PaymentCompleted or PaymentFailed (one transaction,
//	  with the inbox entry); amounts over 1000 are declined
//	  publisher -> Kafka "payments"
//	orders handles PaymentCompleted / PaymentFailed:
//	  order status PAID / FAILED                                  (one transaction)
//
// GET /outbox/status reports both contexts' framework Status, GET /metrics
// the framework's metrics in Prometheus text format (OpenTelemetry SDK with
// the Prometheus exporter).
//
// With no environment it starts the embedded MongoDB server and kfake
// in-process; with MONGODB_URI and KAFKA_BROKERS it uses real servers (see
// stack.go for TLS and SASL settings). -replicas N runs N replicas against
// the same servers on consecutive HTTP ports. -payments-format (or
// PAYMENTS_WIRE_FORMAT) publishes the payments context's events in another
// wire format: event-outbox (the Python event-outbox library's) or
// cloudevents; the orders context reads any of them. -replica-id (or
// REPLICA_ID) names the process in logs, GET /outbox/status and Kafka
// client ids; by default it is the host name and process id, so that
// processes started separately tell themselves apart. The console at
// /outbox/ui/ is read-only unless OUTBOX_CONSOLE_PASSWORD is set (operators
// sign in with it to re-drive, purge, retry or discard), and answers only
// to localhost, IP addresses and the names in OUTBOX_CONSOLE_HOSTS.
//
// Usage:
//
//	go run ./example [-addr 127.0.0.1:8080] [-replicas 1] [-replica-id NAME] [-payments-format native] [-v]
//	go run ./example -healthcheck http://127.0.0.1:8080/healthz
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/event-outbox/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// run parses the flags and runs the service until ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "HTTP listen address of the first replica; replica i listens on port+i")
	replicas := fs.Int("replicas", 1, "number of replicas to run against the same servers")
	replicaID := fs.String("replica-id", getenv(envReplicaID),
		"name of this process in logs, /outbox/status and Kafka client ids; with -replicas N each gets -rI appended ($"+envReplicaID+" when set, else host name-pid)")
	verbose := fs.Bool("v", false, "debug logs, including the framework's")
	health := fs.String("healthcheck", "", "GET this URL, exit 0 on a 2xx answer and 1 otherwise (for container health checks)")
	paymentsFormat := fs.String("payments-format", cmp.Or(getenv(envPaymentsFormat), "native"),
		"wire format of the payments context's events: native, event-outbox or cloudevents ($"+envPaymentsFormat+" when set)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	format, err := outbox.ParseFormat(*paymentsFormat)
	if err != nil {
		return fmt.Errorf("-payments-format: %w", err)
	}
	if *health != "" {
		return healthcheck(ctx, *health)
	}
	if *replicas < 1 || *replicas > 64 {
		return fmt.Errorf("-replicas %d: want 1 to 64", *replicas)
	}
	names, err := replicaNames(*replicaID, *replicas)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	listeners, err := listen(*addr, *replicas)
	if err != nil {
		return err
	}
	st, err := openStack(ctx, getenv, log)
	if err != nil {
		closeAll(listeners)
		return err
	}
	defer st.Close()
	st.paymentsFormat = format
	st.console = consoleAccessFrom(getenv)

	var reps []*replica
	for i, ln := range listeners {
		r, err := newReplica(names[i], st, ln, log, nil)
		if err != nil {
			for _, r := range reps {
				r.close()
			}
			closeAll(listeners)
			return err
		}
		reps = append(reps, r)
	}

	// Each replica stops on the signal; the first fatal error stops all.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, r := range reps {
		wg.Go(func() {
			if err := r.run(ctx); err != nil {
				once.Do(func() { first = fmt.Errorf("replica %s: %w", r.name, err) })
				cancel()
			}
		})
	}
	wg.Wait()
	return first
}

// envReplicaID names the process when -replica-id is not given.
const envReplicaID = "REPLICA_ID"

// replicaNames names the n replicas of this process. Processes started
// separately must not share names, so the default is the host name and
// process id (unique on a host, and across containers, whose host names
// differ); replicas of one process add -r1, -r2... An explicit name must be
// short and printable: it goes into Kafka client ids and logs.
func replicaNames(base string, n int) ([]string, error) {
	if base == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "example"
		}
		base = fmt.Sprintf("%s-%d", host, os.Getpid())
	} else if len(base) > 64 || strings.IndexFunc(base, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) >= 0 {
		return nil, fmt.Errorf("-replica-id %q: want at most 64 letters, digits, '.', '_' or '-'", base)
	}
	if n == 1 {
		return []string{base}, nil
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-r%d", base, i+1)
	}
	return names, nil
}

// listen opens n listeners on consecutive ports starting at addr's port
// (port 0 gives each a random port).
func listen(addr string, n int) ([]net.Listener, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port+n-1 > 65535 {
		return nil, fmt.Errorf("-addr %q: invalid port for %d replicas", addr, n)
	}
	var lns []net.Listener
	for i := range n {
		p := port
		if p != 0 {
			p += i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			closeAll(lns)
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// healthcheck GETs url; the image has no shell or curl, so the binary checks
// itself.
func healthcheck(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New("unhealthy: " + resp.Status)
	}
	return nil
}

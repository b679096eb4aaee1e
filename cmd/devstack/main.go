// Command devstack runs an in-process MongoDB-compatible server (mongofake,
// a single-node replica set with test commands enabled) and Kafka on local
// ports, for development without Docker: a fake cluster (kfake, in
// process) by default, or real Apache Kafka brokers with -kafka apache.
//
// Usage:
//
//	go run ./cmd/devstack [-mongo-addr 127.0.0.1:27017] [-kafka-addr 127.0.0.1:9092]
//	    [-topics events,orders] [-partitions 6] [-replset rs0] [-ttl-interval 60s]
//	    [-kafka kfake|apache] [-kafka-nodes 1] [-kafka-resolve-only]
//
// It prints the MongoDB URI and the Kafka bootstrap addresses, then a line
// containing "ready", and runs until SIGINT or SIGTERM. All data is lost
// when it exits.
//
// With -kafka apache it runs Apache Kafka (the release pinned by package
// internal/apachekafka) in KRaft mode, one JVM per node (-kafka-nodes; the
// first node's client listener is -kafka-addr, the others take free ports
// of 127.0.0.1), with its data in a temporary directory. It needs Java 17+,
// and Maven on the first start, which fetches the jars into a cache
// (~/.cache/outbox-kafka, or $OUTBOX_KAFKA_CACHE) and prints its progress
// on stderr; later starts are offline. From three nodes, topics get
// replication factor 3 and min.insync.replicas=2. SIGINT or SIGTERM kills
// every JVM before devstack exits, and the kernel kills them if devstack
// itself is killed. -kafka-resolve-only fetches the jars and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/event-outbox/outbox/mongox/mongofake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

// run starts both servers, reports their addresses on stdout and blocks
// until ctx ends; then it closes both.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mongoAddr := fs.String("mongo-addr", "127.0.0.1:27017", "MongoDB listen address (port 0 picks a free port)")
	kafkaAddr := fs.String("kafka-addr", "127.0.0.1:9092", "Kafka listen address (port 0 picks a free port)")
	ttlInterval := fs.Duration("ttl-interval", 60*time.Second, "how often the TTL monitor deletes expired documents")
	topics := fs.String("topics", "", "comma-separated Kafka topics to create at start (others are auto-created)")
	partitions := fs.Int("partitions", 6, "partitions of each seeded topic")
	replSet := fs.String("replset", "rs0", "replica set name")
	verbose := fs.Bool("v", false, "log connection and server events to stderr")
	kafkaKind := fs.String("kafka", "kfake", "Kafka to serve: kfake (in process) or apache (real brokers; needs Java 17+, and Maven once)")
	kafkaNodes := fs.Int("kafka-nodes", 1, "Kafka brokers to run")
	resolveOnly := fs.Bool("kafka-resolve-only", false, "fetch the Apache Kafka jars into the cache and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *partitions < 1 {
		return fmt.Errorf("-partitions must be at least 1, got %d", *partitions)
	}
	if *kafkaNodes < 1 {
		return fmt.Errorf("-kafka-nodes must be at least 1, got %d", *kafkaNodes)
	}
	if *kafkaKind != "kfake" && *kafkaKind != "apache" {
		return fmt.Errorf("-kafka must be kfake or apache, got %q", *kafkaKind)
	}
	if *resolveOnly {
		return resolveJars(ctx, stdout)
	}

	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	srv, err := mongofake.NewServer(
		mongofake.ListenAddr(*mongoAddr),
		mongofake.ReplicaSetName(*replSet),
		mongofake.TTLInterval(*ttlInterval),
		mongofake.EnableTestCommands(true),
		mongofake.Logger(logger),
	)
	if err != nil {
		return err
	}
	defer srv.Close()

	var seed []string
	for _, t := range strings.Split(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			seed = append(seed, t)
		}
	}
	var brokers []string
	if *kafkaKind == "apache" {
		cluster, err := startApache(ctx, *kafkaAddr, *kafkaNodes, int32(*partitions), seed, stderr)
		if err != nil {
			return fmt.Errorf("kafka: %w", err)
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(stderr, "devstack: stopping kafka:", err)
			}
		}()
		brokers = cluster.Brokers()
	} else {
		var first atomic.Bool
		kopts := []kfake.Opt{
			kfake.NumBrokers(*kafkaNodes),
			kfake.AllowAutoTopicCreation(),
			// kfake listens on 127.0.0.1:<port>; the first broker listens
			// on the requested address instead.
			kfake.ListenFn(func(network, addr string) (net.Listener, error) {
				if first.CompareAndSwap(false, true) {
					return net.Listen(network, *kafkaAddr)
				}
				return net.Listen(network, addr)
			}),
		}
		if len(seed) > 0 {
			kopts = append(kopts, kfake.SeedTopics(int32(*partitions), seed...))
		}
		cluster, err := kfake.NewCluster(kopts...)
		if err != nil {
			return fmt.Errorf("kafka: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	}

	fmt.Fprintf(stdout, "MONGODB_URI=%s\n", srv.URI())
	fmt.Fprintf(stdout, "KAFKA_BROKERS=%s\n", strings.Join(brokers, ","))
	fmt.Fprintln(stdout, "devstack ready (Ctrl-C to stop)")

	<-ctx.Done()
	fmt.Fprintln(stdout, "devstack stopping")
	return nil
}

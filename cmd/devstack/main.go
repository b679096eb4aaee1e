// Command devstack runs an in-process MongoDB-compatible server (mongofake,
// a single-node replica set with test commands enabled) and a fake Kafka
// cluster (kfake) on local ports, for development without Docker.
//
// Usage:
//
//	go run ./cmd/devstack [-mongo-addr 127.0.0.1:27017] [-kafka-addr 127.0.0.1:9092]
//	    [-topics events,orders] [-partitions 6] [-replset rs0] [-ttl-interval 60s]
//
// It prints the MongoDB URI and the Kafka bootstrap address, then a line
// containing "ready", and runs until SIGINT or SIGTERM. All data lives in
// memory and is lost when it exits.
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *partitions < 1 {
		return fmt.Errorf("-partitions must be at least 1, got %d", *partitions)
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

	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		// kfake listens on 127.0.0.1:<port>; listen on the requested
		// address instead.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, *kafkaAddr) }),
	}
	var seed []string
	for _, t := range strings.Split(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			seed = append(seed, t)
		}
	}
	if len(seed) > 0 {
		kopts = append(kopts, kfake.SeedTopics(int32(*partitions), seed...))
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cluster.Close()

	fmt.Fprintf(stdout, "MONGODB_URI=%s\n", srv.URI())
	fmt.Fprintf(stdout, "KAFKA_BROKERS=%s\n", strings.Join(cluster.ListenAddrs(), ","))
	fmt.Fprintln(stdout, "devstack ready (Ctrl-C to stop)")

	<-ctx.Done()
	fmt.Fprintln(stdout, "devstack stopping")
	return nil
}

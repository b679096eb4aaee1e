package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// Environment variables that select real servers instead of the embedded
// ones: outbox.ConfigFromEnv reads MONGODB_URI, KAFKA_BROKERS and the
// Kafka TLS and SASL variables (KAFKA_TLS, KAFKA_SASL_USER,
// KAFKA_SASL_PASSWORD, KAFKA_SASL_MECHANISM; see kafkax.FromEnv).
const (
	envMongoURI   = outbox.EnvMongoURI // e.g. mongodb://localhost:27017/?replicaSet=rs0
	envBrokers    = kafkax.EnvBrokers  // e.g. localhost:9092,localhost:9093
	envPartitions = "KAFKA_PARTITIONS" // partitions of topics the example creates; defaults to 6
	// envPaymentsFormat is the wire format of the payments context's
	// events (native, event-outbox or cloudevents); -payments-format
	// overrides it.
	envPaymentsFormat = "PAYMENTS_WIRE_FORMAT"
)

// defaultPartitions is the partition count of the example's topics. It caps
// how many replicas share the work: a replica beyond it owns no partition
// and waits as a hot standby.
const defaultPartitions = 6

// stack is the MongoDB and Kafka the replicas share.
type stack struct {
	mongo     *mongo.Client
	brokers   []string
	kafkaOpts []kgo.Opt
	embedded  bool
	// createPartitions, with real servers, is the partition count of the
	// topics the contexts create when missing (Config.CreateTopicPartitions;
	// KAFKA_PARTITIONS). The embedded Kafka starts with its topics.
	createPartitions int32
	// kfake is the embedded Kafka cluster; nil with real servers. Tests
	// use it to inject faults.
	kfake *kfake.Cluster
	// mongoServer is the embedded MongoDB server; nil with real servers.
	// Tests stop it to take MongoDB down.
	mongoServer *mongofake.Server
	closers     []func()
	// paymentsFormat is the wire format the payments context publishes
	// in; the zero value is native.
	paymentsFormat outbox.Format
	// console is who may reach and drive the console (run reads it from
	// the environment); the zero value is read-only.
	console consoleAccess
}

// Close disconnects and stops what the stack started, in reverse order.
func (s *stack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// openStack connects to the servers named by the environment, or starts
// embedded ones when neither MONGODB_URI nor KAFKA_BROKERS is set. getenv is
// os.Getenv in main and a map lookup in tests. It does no I/O with real
// servers: MongoDB or Kafka may be down at start, and the replicas wait
// for them (not ready, alive) instead of exiting.
func openStack(ctx context.Context, getenv func(string) string, log *slog.Logger) (*stack, error) {
	uri, brokers := getenv(envMongoURI), getenv(envBrokers)
	if uri == "" && brokers == "" {
		return startEmbedded(ctx, log)
	}
	if uri == "" || brokers == "" {
		return nil, fmt.Errorf("set both %s and %s to use real servers, or neither for the embedded ones", envMongoURI, envBrokers)
	}
	partitions := int32(defaultPartitions)
	if v := getenv(envPartitions); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("%s=%q: want a positive number of partitions", envPartitions, v)
		}
		partitions = int32(n)
	}
	kc, err := kafkax.FromEnv(getenv)
	if err != nil {
		return nil, err
	}
	cfg, err := outbox.ConfigFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	s := &stack{mongo: cfg.Mongo, brokers: cfg.Brokers, kafkaOpts: cfg.KafkaOptions, createPartitions: partitions}
	s.closers = append(s.closers, func() { _ = cfg.Mongo.Disconnect(context.Background()) })
	log.Info("using real servers", "mongodb", redactURI(uri), "kafka", kc.String())
	return s, nil
}

// startEmbedded starts the in-process MongoDB-compatible server and a kfake
// cluster with the example's topics, on random local ports.
func startEmbedded(ctx context.Context, log *slog.Logger) (*stack, error) {
	s := &stack{embedded: true}
	srv, err := mongofake.NewServer()
	if err != nil {
		return nil, fmt.Errorf("start embedded MongoDB server: %w", err)
	}
	s.closers = append(s.closers, func() { _ = srv.Close() })
	s.mongoServer = srv
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(defaultPartitions, ordersTopic, paymentsTopic))
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("start embedded Kafka (kfake): %w", err)
	}
	s.closers = append(s.closers, kc.Close)
	s.kfake = kc
	s.brokers = kc.ListenAddrs()
	mc, err := mongo.Connect(options.Client().ApplyURI(srv.URI()).SetAppName("outbox-example"))
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("connect to embedded MongoDB server: %w", err)
	}
	s.mongo = mc
	s.closers = append(s.closers, func() { _ = mc.Disconnect(context.Background()) })
	log.Info("started embedded servers", "mongodb", srv.URI(), "kafka", strings.Join(s.brokers, ","))
	return s, nil
}

// redactURI hides the password of a connection string for logs.
func redactURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URI)"
	}
	return u.Redacted()
}

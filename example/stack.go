package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// Environment variables that select real servers instead of the embedded
// ones.
const (
	envMongoURI      = "MONGODB_URI"          // e.g. mongodb://localhost:27017/?replicaSet=rs0
	envBrokers       = "KAFKA_BROKERS"        // e.g. localhost:9092,localhost:9093
	envKafkaTLS      = "KAFKA_TLS"            // "1" or "true": dial brokers with TLS
	envSASLUser      = "KAFKA_SASL_USER"      // SASL user name
	envSASLPassword  = "KAFKA_SASL_PASSWORD"  // SASL password (never logged)
	envSASLMechanism = "KAFKA_SASL_MECHANISM" // PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; defaults to PLAIN
	envPartitions    = "KAFKA_PARTITIONS"     // partitions of topics the example creates; defaults to 6
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
	// kfake is the embedded Kafka cluster; nil with real servers. Tests
	// use it to inject faults.
	kfake   *kfake.Cluster
	closers []func()
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
// os.Getenv in main and a map lookup in tests.
func openStack(ctx context.Context, getenv func(string) string, log *slog.Logger) (*stack, error) {
	uri, brokers := getenv(envMongoURI), getenv(envBrokers)
	if uri == "" && brokers == "" {
		return startEmbedded(ctx, log)
	}
	if uri == "" || brokers == "" {
		return nil, fmt.Errorf("set both %s and %s to use real servers, or neither for the embedded ones", envMongoURI, envBrokers)
	}
	s := &stack{brokers: splitList(brokers)}
	kopts, desc, err := kafkaOptions(getenv)
	if err != nil {
		return nil, err
	}
	s.kafkaOpts = kopts
	log.Info("using real servers", "mongodb", redactURI(uri), "kafka", strings.Join(s.brokers, ","), "kafka_security", desc)

	mc, err := mongo.Connect(options.Client().ApplyURI(uri).SetAppName("outbox-example"))
	if err != nil {
		return nil, fmt.Errorf("connect to MongoDB at %s: %w", redactURI(uri), err)
	}
	s.mongo = mc
	s.closers = append(s.closers, func() { _ = mc.Disconnect(context.Background()) })
	pingCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := mc.Ping(pingCtx, nil); err != nil {
		s.Close()
		return nil, fmt.Errorf("ping MongoDB at %s: %w", redactURI(uri), err)
	}
	partitions := int32(defaultPartitions)
	if v := getenv(envPartitions); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			s.Close()
			return nil, fmt.Errorf("%s=%q: want a positive number of partitions", envPartitions, v)
		}
		partitions = int32(n)
	}
	if err := s.ensureTopics(pingCtx, partitions, log); err != nil {
		s.Close()
		return nil, err
	}
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

// ensureTopics creates the example's topics when they are missing.
func (s *stack) ensureTopics(ctx context.Context, partitions int32, log *slog.Logger) error {
	opts := append([]kgo.Opt{}, s.kafkaOpts...)
	opts = append(opts, kgo.SeedBrokers(s.brokers...))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	resps, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, -1, nil, ordersTopic, paymentsTopic)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, r := range resps.Sorted() {
		switch {
		case r.Err == nil:
			log.Info("created topic", "topic", r.Topic, "partitions", partitions)
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
		default:
			return fmt.Errorf("create topic %q: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// kafkaOptions builds the TLS and SASL options from the environment and a
// description for the log that never contains the password.
func kafkaOptions(getenv func(string) string) ([]kgo.Opt, string, error) {
	var opts []kgo.Opt
	desc := []string{}
	switch v := strings.ToLower(getenv(envKafkaTLS)); v {
	case "", "0", "false", "no":
		desc = append(desc, "plaintext")
	case "1", "true", "yes":
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
		desc = append(desc, "tls")
	default:
		return nil, "", fmt.Errorf("%s=%q: want true or false", envKafkaTLS, v)
	}
	user, pass := getenv(envSASLUser), getenv(envSASLPassword)
	if user == "" && pass == "" {
		return opts, strings.Join(desc, "+"), nil
	}
	if user == "" || pass == "" {
		return nil, "", fmt.Errorf("set both %s and %s for SASL", envSASLUser, envSASLPassword)
	}
	mech := strings.ToUpper(getenv(envSASLMechanism))
	switch mech {
	case "", "PLAIN":
		mech = "PLAIN"
		opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	default:
		return nil, "", fmt.Errorf("%s=%q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", envSASLMechanism, mech)
	}
	desc = append(desc, "sasl/"+mech+" user "+user)
	return opts, strings.Join(desc, "+"), nil
}

// redactURI hides the password of a connection string for logs.
func redactURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(unparsable URI)"
	}
	return u.Redacted()
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

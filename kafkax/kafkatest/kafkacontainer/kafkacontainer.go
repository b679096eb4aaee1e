package kafkacontainer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// ContainerImage is the image [Start] runs when
// OUTBOX_TEST_KAFKA_BROKERS is unset and a Docker engine answers: one
// Kafka node in KRaft mode, broker and controller, the image of the
// development stack (docker-compose.yml).
const ContainerImage = "apache/kafka:4.4.0"

// dockerCheckTimeout bounds the Docker engine health check.
const dockerCheckTimeout = 3 * time.Second

// containerStartTimeout bounds pulling and starting the container.
const containerStartTimeout = 3 * time.Minute

// skipNoReal is the skip message when no real Kafka can be had.
const skipNoReal = "real Kafka: set OUTBOX_TEST_KAFKA_BROKERS or run Docker (testcontainers); skipping"

// Start returns real Kafka brokers for t, never the embedded kfake cluster:
//
//   - OUTBOX_TEST_KAFKA_BROKERS when set (as [kafkatest.StartReal] does);
//   - else, when a Docker engine answers, a new single-broker container of
//     [ContainerImage] started with testcontainers-go and terminated in
//     t.Cleanup (this takes seconds: call Start once per top-level test and
//     give subtests their own [kafkatest.Env.Topic]);
//   - else t.Skip.
//
// A missing or stopped Docker engine is never a failure: the health check
// is bounded by a short timeout and any error skips the test, as does a
// container that cannot start (no network to pull the image).
// [kafkatest.NumBrokers] and [kafkatest.ClusterOptions] do not apply;
// [kafkatest.SeedTopics] does. [kafkatest.Env.Cluster] is nil.
func Start(t testing.TB, opts ...kafkatest.Option) *kafkatest.Env {
	t.Helper()
	if seeds := kafkatest.EnvSeeds(); len(seeds) > 0 {
		return kafkatest.Connect(t, seeds, opts...)
	}
	if err := dockerAvailable(); err != nil {
		t.Skipf("%s (%v)", skipNoReal, err)
	}
	return kafkatest.Connect(t, startContainer(t), opts...)
}

var (
	dockerOnce sync.Once
	dockerErr  error
)

// dockerAvailable reports, once per process, whether a Docker engine
// answers testcontainers' health check.
func dockerAvailable() error {
	dockerOnce.Do(func() { dockerErr = checkDocker() })
	return dockerErr
}

func checkDocker() (err error) {
	defer func() {
		// testcontainers panics when it finds no Docker host at all.
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker host: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	defer func() { _ = provider.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), dockerCheckTimeout)
	defer cancel()
	if err := provider.Health(ctx); err != nil {
		return fmt.Errorf("docker health: %w", err)
	}
	return nil
}

// The container's listeners: PLAINTEXT between the node and itself,
// CONTROLLER for KRaft, HOST for the tests, published on a host port.
const (
	hostListenerPort = "29092/tcp"
	// advertisedFile receives the HOST listener's address once the host
	// port is known; the container waits for it before starting Kafka.
	advertisedFile = "/tmp/outbox-kafkacontainer-advertised"
	// kafkaRun is the apache/kafka image's start command.
	kafkaRun = "/etc/kafka/docker/run"
)

// containerEnv configures the node. The image replaces its whole default
// configuration when any KAFKA_ variable is set, so every required setting
// is here; KAFKA_ADVERTISED_LISTENERS is exported by the start command.
var containerEnv = map[string]string{
	"KAFKA_NODE_ID":                                  "1",
	"KAFKA_PROCESS_ROLES":                            "broker,controller",
	"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
	"KAFKA_LISTENERS":                                "PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:29092",
	"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOST:PLAINTEXT",
	"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
	"KAFKA_INTER_BROKER_LISTENER_NAME":               "PLAINTEXT",
	"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
	"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":             "1",
	"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
	"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
	"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
	"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "false",
	"KAFKA_LOG_DIRS":                                 "/tmp/kraft-combined-logs",
}

// startContainer runs ContainerImage and returns its bootstrap address, the
// HOST listener's published port. Kafka must advertise that address, which
// Docker chooses only when the container starts: the container's command
// waits for advertisedFile, which a post-start hook writes, then starts
// Kafka with it.
func startContainer(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), containerStartTimeout)
	defer cancel()
	var seed string
	c, err := testcontainers.Run(ctx, ContainerImage,
		testcontainers.WithEnv(containerEnv),
		testcontainers.WithExposedPorts(hostListenerPort),
		testcontainers.WithEntrypoint("sh", "-c"),
		testcontainers.WithCmd(fmt.Sprintf(
			`while [ ! -s %[1]s ]; do sleep 0.1; done; export KAFKA_ADVERTISED_LISTENERS="$(cat %[1]s)"; exec %[2]s`,
			advertisedFile, kafkaRun)),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{func(ctx context.Context, c testcontainers.Container) error {
				ep, err := c.PortEndpoint(ctx, hostListenerPort, "")
				if err != nil {
					return fmt.Errorf("host listener endpoint: %w", err)
				}
				seed = ep
				listeners := "PLAINTEXT://localhost:9092,HOST://" + ep
				return c.CopyToContainer(ctx, []byte(listeners), advertisedFile, 0o644)
			}},
		}),
		// The readiness wait runs after the hook above.
		testcontainers.WithWaitStrategy(wait.ForLog("Kafka Server started").WithStartupTimeout(2*time.Minute)),
	)
	if c != nil {
		t.Cleanup(func() {
			if err := testcontainers.TerminateContainer(c); err != nil {
				t.Logf("kafkacontainer: terminate container: %v", err)
			}
		})
	}
	if err != nil {
		// Docker answered but the container did not start (no network to
		// pull the image, ...): not the code under test's fault.
		t.Skipf("%s (start %s: %v)", skipNoReal, ContainerImage, err)
	}
	return []string{seed}
}

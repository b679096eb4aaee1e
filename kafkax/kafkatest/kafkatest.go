package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// EnvBrokers is the environment variable naming real Kafka brokers
// (comma-separated host:port list). When it is set, [Start] uses those
// brokers instead of an embedded kfake cluster.
const EnvBrokers = "OUTBOX_TEST_KAFKA_BROKERS"

// EnvGroupProtocol is the environment variable naming the consumer-group
// protocol the tests' groups ask for: "classic" (the default when unset) or
// "consumer" (Kafka 4's KIP-848 protocol). Read it with [GroupProtocolName];
// a test that needs one protocol keeps asking for it whatever the variable
// says.
const EnvGroupProtocol = "OUTBOX_TEST_GROUP_PROTOCOL"

// GroupProtocolName returns the protocol named by OUTBOX_TEST_GROUP_PROTOCOL
// ([EnvGroupProtocol]), trimmed and lower-cased, or "classic" when it is
// unset. The caller checks the name (another value is a mistake to report,
// never a protocol to fall back from).
func GroupProtocolName() string {
	if p := strings.ToLower(strings.TrimSpace(os.Getenv(EnvGroupProtocol))); p != "" {
		return p
	}
	return "classic"
}

// adminTimeout bounds every administrative request made by this package.
const adminTimeout = 30 * time.Second

// Env is a running Kafka backend for one test.
type Env struct {
	// Seeds are the bootstrap brokers (host:port) to give to kgo.SeedBrokers.
	Seeds []string
	// Real reports whether the brokers are real Kafka: from
	// OUTBOX_TEST_KAFKA_BROKERS or a container started by [StartReal].
	Real bool
	// Cluster is the embedded kfake cluster, for fault injection
	// (ControlKey, SleepControl, Fault). It is nil against real brokers.
	Cluster *kfake.Cluster

	admin  *kadm.Client
	apache *apachekafka.Cluster // from StartApache, else nil
}

// Option configures [Start].
type Option func(*config)

type config struct {
	numBrokers int
	seeds      []seedTopic
	kfakeOpts  []kfake.Opt
}

type seedTopic struct {
	partitions int32
	topics     []string
}

// NumBrokers sets the number of brokers of the embedded cluster, or of the
// Apache Kafka cluster of [StartApache]. It is ignored against the brokers
// of OUTBOX_TEST_KAFKA_BROKERS. Defaults to 1.
func NumBrokers(n int) Option {
	return func(c *config) { c.numBrokers = n }
}

// SeedTopics creates the given topics with the given number of partitions
// before Start returns. Against real brokers, topics that already exist are
// kept as they are.
func SeedTopics(partitions int32, topics ...string) Option {
	return func(c *config) {
		c.seeds = append(c.seeds, seedTopic{partitions: partitions, topics: topics})
	}
}

// ClusterOptions passes extra options to kfake.NewCluster (for example
// kfake.GroupMinSessionTimeout). They are ignored against real brokers.
func ClusterOptions(opts ...kfake.Opt) Option {
	return func(c *config) { c.kfakeOpts = append(c.kfakeOpts, opts...) }
}

// Start returns a Kafka backend for t: real brokers when OUTBOX_TEST_KAFKA_BROKERS
// is set, otherwise a new embedded kfake cluster closed in t.Cleanup.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	cfg := newConfig(opts)
	if seeds := EnvSeeds(); len(seeds) > 0 {
		return Connect(t, seeds, opts...)
	}
	kopts := []kfake.Opt{kfake.NumBrokers(cfg.numBrokers)}
	kopts = append(kopts, cfg.kfakeOpts...)
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		t.Fatalf("kafkatest: start kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return cfg.connect(t, &Env{Cluster: c, Seeds: c.ListenAddrs()})
}

// skipNoReal is the skip message of [StartReal] without real brokers.
const skipNoReal = "real Kafka: set OUTBOX_TEST_KAFKA_BROKERS (or use package kafkacontainer for a Docker container); skipping"

// StartReal returns the real Kafka brokers named by OUTBOX_TEST_KAFKA_BROKERS
// for t, never the embedded kfake cluster, and skips t when the variable is
// unset. Package kafkacontainer (a module of its own, so that its Docker
// dependencies weigh only on the tests that import it) adds a Kafka
// container started with testcontainers-go when a Docker engine answers.
// [NumBrokers] and [ClusterOptions] do not apply; [SeedTopics] does.
func StartReal(t testing.TB, opts ...Option) *Env {
	t.Helper()
	seeds := EnvSeeds()
	if len(seeds) == 0 {
		t.Skip(skipNoReal)
	}
	return Connect(t, seeds, opts...)
}

func newConfig(opts []Option) config {
	cfg := config{numBrokers: 1}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// EnvSeeds returns the brokers named by OUTBOX_TEST_KAFKA_BROKERS ([EnvBrokers]),
// none when it is unset.
func EnvSeeds() []string {
	var seeds []string
	for _, b := range strings.Split(os.Getenv(EnvBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			seeds = append(seeds, b)
		}
	}
	return seeds
}

// Connect returns an Env on the real Kafka brokers at seeds (host:port) for
// t, with an admin client closed in t.Cleanup, and creates the topics of
// [SeedTopics]. [NumBrokers] and [ClusterOptions] do not apply.
func Connect(t testing.TB, seeds []string, opts ...Option) *Env {
	t.Helper()
	return newConfig(opts).connect(t, &Env{Seeds: seeds, Real: true})
}

// connect gives env its admin client, closed in t.Cleanup, and creates the
// seed topics.
func (cfg config) connect(t testing.TB, env *Env) *Env {
	t.Helper()
	admin, err := kadm.NewOptClient(kgo.SeedBrokers(env.Seeds...))
	if err != nil {
		t.Fatalf("kafkatest: admin client for %v: %v", env.Seeds, err)
	}
	t.Cleanup(admin.Close)
	env.admin = admin

	for _, s := range cfg.seeds {
		for _, topic := range s.topics {
			env.CreateTopic(t, s.partitions, topic)
		}
	}
	return env
}

// Admin returns an admin client connected to the backend. It is closed in the
// cleanup of the test given to [Start].
func (e *Env) Admin() *kadm.Client { return e.admin }

// CreateTopic creates topic with the given number of partitions and waits
// until its metadata is visible. A topic that already exists is accepted.
// The topic is not deleted afterwards; use [Env.Topic] for a throwaway topic.
func (e *Env) CreateTopic(t testing.TB, partitions int32, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	_, err := e.admin.CreateTopic(ctx, partitions, -1, nil, topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("kafkatest: create topic %q with %d partitions: %v", topic, partitions, err)
	}
	// Wait until every partition has a leader so that the first produce
	// does not race the topic's creation on real clusters.
	for {
		md, err := e.admin.Metadata(ctx, topic)
		if err == nil {
			if td, ok := md.Topics[topic]; ok && td.Err == nil && len(td.Partitions) > 0 {
				ready := true
				for _, p := range td.Partitions {
					if p.Err != nil || p.Leader < 0 {
						ready = false
					}
				}
				if ready {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kafkatest: topic %q not ready after %v (last error: %v)", topic, adminTimeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SetTopicConfig sets a config of topic, as an operator would with
// kafka-configs.sh (IncrementalAlterConfigs); a nil value deletes it, so
// the broker's default applies again. kfake accepts any key.
func (e *Env) SetTopicConfig(t testing.TB, topic, key string, value *string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	op := kadm.SetConfig
	if value == nil {
		op = kadm.DeleteConfig
	}
	resp, err := e.admin.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: op, Name: key, Value: value}}, topic)
	if err == nil {
		err = resp[0].Err
	}
	if err != nil {
		t.Fatalf("kafkatest: set %s of topic %q: %v", key, topic, err)
	}
}

// Topic creates a topic with a unique name derived from the test's name and
// the given number of partitions, deletes it in t.Cleanup, and returns its
// name.
func (e *Env) Topic(t testing.TB, partitions int32) string {
	t.Helper()
	topic := UniqueName(t)
	e.CreateTopic(t, partitions, topic)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if _, err := e.admin.DeleteTopics(ctx, topic); err != nil {
			t.Logf("kafkatest: delete topic %q: %v", topic, err)
		}
	})
	return topic
}

// Client returns a kgo client for the backend's seeds with the extra options
// appended, closed in t.Cleanup.
func (e *Env) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(e.Seeds...)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("kafkatest: new client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// UniqueName returns a name unique to this call, derived from the test's
// name: letters, digits, '-' and '_' only, at most 60 characters. It suits
// topic and consumer group names.
func UniqueName(t testing.TB) string {
	base := unsafeName.ReplaceAllString(t.Name(), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.Trim(base, "_") + "-" + hex.EncodeToString(b[:])
}

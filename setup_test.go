package outbox

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Test events use fixed topics; each test gets its own database and its
// own Kafka topics: Config.TopicPrefix is unique to the test, so the tests
// run on an embedded kfake cluster of their own or on shared real brokers
// (OUTBOX_TEST_KAFKA_BROKERS) alike.
const (
	ordersTopic   = "orders"
	paymentsTopic = "payments"
)

type orderPlaced struct {
	Run     string `json:"run" validate:"required"`
	OrderID string `json:"order_id" validate:"required"`
	Amount  int    `json:"amount" validate:"gte=0"`
	Seq     int    `json:"seq"`
}

func (orderPlaced) Topic() string          { return ordersTopic }
func (orderPlaced) ContentSchema() string  { return "OrderPlaced.v1" }
func (e orderPlaced) PartitionKey() string { return e.OrderID }

type paymentDone struct {
	Run     string `json:"run"`
	OrderID string `json:"order_id" validate:"required"`
}

func (paymentDone) Topic() string          { return paymentsTopic }
func (paymentDone) ContentSchema() string  { return "PaymentDone.v1" }
func (e paymentDone) PartitionKey() string { return e.OrderID }

// bundle is what an integration test needs.
type bundle struct {
	mongo *mongotest.Env
	kafka *kafkatest.Env
	db    *mongo.Database
	run   string
	// prefix is the test's Config.TopicPrefix: its Kafka topics are
	// prefix+ordersTopic and prefix+paymentsTopic.
	prefix string
	// protocol is the Config.GroupProtocol of the test's configs
	// (forEachGroupProtocol).
	protocol GroupProtocol
}

func setup(t *testing.T, mopts ...mongotest.Option) *bundle {
	t.Helper()
	return setupWith(t, nil, mopts...)
}

// setupWith is setup with extra options of the Kafka backend.
func setupWith(t *testing.T, kopts []kafkatest.Option, mopts ...mongotest.Option) *bundle {
	t.Helper()
	m := mongotest.Start(t, mopts...)
	run := kafkatest.UniqueName(t)
	prefix := run + "."
	proto := groupProtocolOf(t)
	kopts = append([]kafkatest.Option{kafkatest.SeedTopics(3, prefix+ordersTopic, prefix+paymentsTopic), kafkatest.ClusterOptions(kip848Settings...)}, kopts...)
	k := kafkatest.Start(t, kopts...)
	return &bundle{mongo: m, kafka: k, db: m.DB(t), run: run, prefix: prefix, protocol: proto}
}

// kafkaTopic is the test's Kafka topic of topic.
func (b *bundle) kafkaTopic(topic string) string { return b.prefix + topic }

// cluster returns the test's embedded kfake cluster, for fault injection,
// and skips the test against real brokers, saying which fault (fault) a
// real broker cannot be made to cause.
func (b *bundle) cluster(t *testing.T, fault string) *kfake.Cluster {
	t.Helper()
	if b.kafka.Cluster == nil {
		t.Skipf("needs the embedded kfake cluster (unset OUTBOX_TEST_KAFKA_BROKERS) to %s: a real broker has no such control", fault)
	}
	return b.kafka.Cluster
}

func (b *bundle) config(service string) Config {
	return Config{
		Mongo:             b.mongo.Client,
		Database:          b.db.Name(),
		Brokers:           b.kafka.Seeds,
		Service:           service + "-" + b.run,
		PublishTopics:     []string{ordersTopic, paymentsTopic},
		TopicPrefix:       b.prefix,
		RetryMinBackoff:   10 * time.Millisecond,
		RetryMaxBackoff:   100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		FenceMargin:       2 * time.Second,
		GroupProtocol:     b.protocol,
		Logger:            debugLogger,
	}
}

func (b *bundle) client(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// start runs c until the test ends (or stop is called) and checks that Run
// returned nil.
func start(t *testing.T, c *Client) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(60 * time.Second):
				t.Error("Run did not return within 60s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// produce writes a framework record straight to Kafka, bypassing the
// outbox, to the test's Kafka topic of env.Topic.
func (b *bundle) produce(t *testing.T, env Envelope, payload []byte) {
	t.Helper()
	cl := b.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if env.OccurredAt.IsZero() {
		env.OccurredAt = time.Now()
	}
	rec := encodeRecord(&env, payload)
	rec.Topic = b.kafkaTopic(rec.Topic)
	rec.Partition = 0
	require.NoError(t, cl.ProduceSync(context.Background(), rec).FirstErr())
}

// produceMany writes framework records straight to Kafka in one call, to
// partition 0 of the test's Kafka topics.
func (b *bundle) produceMany(t *testing.T, envs []Envelope, payloads [][]byte) {
	t.Helper()
	cl := b.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, len(envs))
	for i := range envs {
		env := envs[i]
		if env.OccurredAt.IsZero() {
			env.OccurredAt = time.Now()
		}
		recs[i] = encodeRecord(&env, payloads[i])
		recs[i].Topic = b.kafkaTopic(recs[i].Topic)
		recs[i].Partition = 0
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
}

// produceRaw writes rec to the test's Kafka topic of rec.Topic (a bare
// topic, as the test's events name it).
func (b *bundle) produceRaw(t *testing.T, rec *kgo.Record) {
	t.Helper()
	rec.Topic = b.kafkaTopic(rec.Topic)
	cl := b.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, cl.ProduceSync(context.Background(), rec).FirstErr())
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, what, cond)
}

func count(t *testing.T, coll *mongo.Collection, filter bson.D) int64 {
	t.Helper()
	n, err := coll.CountDocuments(context.Background(), filter)
	require.NoError(t, err)
	return n
}

var _ = mongofake.TTLInterval // used by TTL tests
// debugLogger logs the framework's debug output when OUTBOX_TEST_DEBUG is
// set; tests are quiet otherwise.
var debugLogger = func() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

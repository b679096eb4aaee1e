package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// offlineMongo returns a client that never dials (nothing listens there);
// enough for what New checks.
func offlineMongo(t *testing.T) *mongo.Client {
	t.Helper()
	cl, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/?connect=direct&serverSelectionTimeoutMS=100"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Disconnect(context.Background()) })
	return cl
}

func validConfig(t *testing.T) Config {
	return Config{Mongo: offlineMongo(t), Database: "db", Brokers: []string{"127.0.0.1:1"}, Service: "svc", PublishTopics: []string{"orders"}}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	cases := map[string]func(*Config){
		"Mongo":             func(c *Config) { c.Mongo = nil },
		"Database":          func(c *Config) { c.Database = "" },
		"Brokers":           func(c *Config) { c.Brokers = nil },
		"Service":           func(c *Config) { c.Service = "" },
		"InboxCollection":   func(c *Config) { c.InboxCollection = "outbox" },
		"MaxAttempts":       func(c *Config) { c.MaxAttempts = -1 },
		"RetryMaxBackoff":   func(c *Config) { c.RetryMaxBackoff = time.Millisecond },
		"HeartbeatInterval": func(c *Config) { c.HeartbeatInterval = time.Minute },
		"FenceMargin":       func(c *Config) { c.FenceMargin = 9 * time.Second },
		"PublishTopics":     func(c *Config) { c.PublishTopics = []string{"a", "a"} },
		"PublisherGroup":    func(c *Config) { c.PublisherGroup = "svc" },
		"InboxRetention":    func(c *Config) { c.InboxRetention = time.Millisecond },
	}
	for field, mutate := range cases {
		cfg := validConfig(t)
		mutate(&cfg)
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, field)
		require.Contains(t, err.Error(), field)
	}
	c, err := New(validConfig(t))
	require.NoError(t, err)
	require.Equal(t, "svc.outbox-publisher", c.cfg.PublisherGroup)
	require.Equal(t, "svc", c.cfg.ConsumerGroup)
	require.Equal(t, 30*24*time.Hour, c.cfg.InboxRetention)
}

// Every invalid field is reported at once, each naming its field, so that
// a service's first start lists everything to fix instead of one thing per
// try.
func TestConfigReportsEveryInvalidField(t *testing.T) {
	t.Parallel()
	_, err := New(Config{MaxAttempts: -1, PublishLinger: -time.Second})
	require.ErrorIs(t, err, ErrConfig)
	var joined interface{ Unwrap() []error }
	require.ErrorAs(t, err, &joined)
	var fields []string
	for _, e := range joined.Unwrap() {
		require.ErrorIs(t, e, ErrConfig)
		fields = append(fields, strings.Fields(strings.TrimPrefix(e.Error(), ErrConfig.Error()+": "))[0])
	}
	require.Equal(t, []string{"Mongo", "Database", "Brokers", "Service", "MaxAttempts", "PublishLinger"}, fields)
}

// A Config without a Logger logs to slog.Default(), so that no warning is
// swallowed; ReplicaID defaults to the host name and process id.
func TestConfigDefaultsLoggerAndReplicaID(t *testing.T) {
	t.Parallel()
	require.Same(t, slog.Default(), validConfig(t).withDefaults().Logger)
	c, err := New(validConfig(t))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("-%d", os.Getpid()), c.cfg.ReplicaID[strings.LastIndex(c.cfg.ReplicaID, "-"):])
	cfg := validConfig(t)
	cfg.ReplicaID = "orders-7"
	c, err = New(cfg)
	require.NoError(t, err)
	require.Equal(t, "orders-7", c.cfg.ReplicaID)
	cfg.ReplicaID = "bad\nname"
	_, err = New(cfg)
	require.ErrorContains(t, err, "ReplicaID")
}

type testEvent struct {
	ID     string `json:"id" validate:"required"`
	Amount int    `json:"amount" validate:"gte=0"`
}

func (testEvent) Topic() string               { return "orders" }
func (testEvent) ContentSchema() string       { return "TestEvent.v1" }
func (e testEvent) PartitionKey() string      { return e.ID }
func (*ptrEvent) Topic() string               { return "orders" }
func (*ptrEvent) ContentSchema() string       { return "PtrEvent.v1" }
func (e *ptrEvent) PartitionKey() string      { return e.ID }
func (otherTopicEvent) Topic() string         { return "elsewhere" }
func (otherTopicEvent) ContentSchema() string { return "Other.v1" }
func (otherTopicEvent) PartitionKey() string  { return "k" }

type ptrEvent struct{ ID string }
type otherTopicEvent struct{}

func TestHandleRegistration(t *testing.T) {
	t.Parallel()
	c, err := New(validConfig(t))
	require.NoError(t, err)
	noop := func(context.Context, testEvent, Metadata) error { return nil }
	require.NoError(t, Handle(c, noop))
	require.ErrorIs(t, Handle(c, noop), ErrDuplicateHandler)
	require.NoError(t, Handle(c, func(context.Context, *ptrEvent, Metadata) error { return nil }))
	require.ErrorIs(t, Handle[Event](c, func(context.Context, Event, Metadata) error { return nil }), ErrConfig)
	require.ErrorIs(t, Handle[testEvent](c, nil), ErrConfig)
	require.Equal(t, []string{"orders"}, c.subscribedTopics())
	require.Panics(t, func() { MustHandle(c, noop) })
}

func TestRecordRefusals(t *testing.T) {
	t.Parallel()
	c, err := New(validConfig(t))
	require.NoError(t, err)
	c.topics.Set("orders", 6)
	ctx := context.Background()
	require.ErrorIs(t, Record(ctx, testEvent{ID: "a"}), ErrNoTransaction)

	tx := &txState{client: c}
	tctx := context.WithValue(ctx, txKey{}, tx)
	err = Record(tctx, testEvent{ID: ""})
	var verr *ValidationError
	require.ErrorAs(t, err, &verr)
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.Equal(t, "testEvent.ID", verr.Field)
	require.ErrorIs(t, Record(tctx, otherTopicEvent{}), ErrUnknownTopic)
	require.ErrorIs(t, Record(tctx, nil), ErrInvalidEvent)
	// A typed nil is refused as an untyped one, not dereferenced inside
	// the caller's transaction.
	var nilPtr *ptrEvent
	require.ErrorIs(t, Record(tctx, nilPtr), ErrInvalidEvent)
	var nilValue *testEvent // value methods: calling one dereferences
	require.ErrorIs(t, Record(tctx, nilValue), ErrInvalidEvent)
	require.Empty(t, tx.docs)

	require.NoError(t, Record(tctx, testEvent{ID: "order-1", Amount: 3}, WithIdempotencyKey("fixed")))
	require.Len(t, tx.docs, 1)
	doc := tx.docs[0].(*outboxDoc)
	require.Equal(t, "fixed", doc.IdempotencyKey)
	require.Equal(t, `{"id":"order-1","amount":3}`, doc.Payload)
	require.False(t, doc.Published)
	require.GreaterOrEqual(t, doc.Partition, int32(0))
	require.Less(t, doc.Partition, int32(6))
}

// Names the servers can never have are refused by New, naming the field:
// topics by Kafka's rules (with TopicPrefix), the database and collections
// by MongoDB's. A running service would otherwise fail every request that
// uses them.
func TestConfigRefusesIllegalNames(t *testing.T) {
	t.Parallel()
	cases := []struct {
		field  string
		mutate func(*Config)
	}{
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{"orders v2"} }},
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{"orders/v2"} }},
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{"."} }},
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{".."} }},
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{""} }},
		{"PublishTopics", func(c *Config) { c.PublishTopics = []string{"commandes-é"} }},
		{"PublishTopics", func(c *Config) { c.TopicPrefix, c.PublishTopics = ".", []string{"."} }},
		{"Database", func(c *Config) { c.Database = "shop.eu" }},
		{"Database", func(c *Config) { c.Database = "shop$" }},
		{"Database", func(c *Config) { c.Database = "shop eu" }},
		{"Database", func(c *Config) { c.Database = "shop/eu" }},
		{"Database", func(c *Config) { c.Database = strings.Repeat("d", 64) }},
		{"OutboxCollection", func(c *Config) { c.OutboxCollection = "outbox_meta" }},
		{"OutboxCollection", func(c *Config) { c.OutboxCollection = "out$box" }},
		{"OutboxCollection", func(c *Config) { c.OutboxCollection = "system.outbox" }},
		{"InboxCollection", func(c *Config) { c.InboxCollection = "outbox_meta" }},
		{"InboxCollection", func(c *Config) { c.InboxCollection = "in\x00box" }},
		{"InboxCollection", func(c *Config) { c.InboxCollection = strings.Repeat("i", 255) }},
	}
	for _, tc := range cases {
		cfg := validConfig(t)
		tc.mutate(&cfg)
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig, "%s: %+v", tc.field, cfg.PublishTopics)
		require.ErrorContains(t, err, tc.field)
	}
	for _, mutate := range []func(*Config){
		func(c *Config) { c.PublishTopics = []string{"orders.v2", "orders_v2", "Orders-2", "..."} },
		func(c *Config) { c.TopicPrefix, c.PublishTopics = "staging.", []string{"."} },
		func(c *Config) { c.Database = "shop-eu_1" },
		func(c *Config) { c.OutboxCollection, c.InboxCollection = "orders.outbox", "orders.inbox" },
	} {
		cfg := validConfig(t)
		mutate(&cfg)
		_, err := New(cfg)
		require.NoError(t, err)
	}

	// A handled topic follows the same rules, at Handle.
	c, err := New(validConfig(t))
	require.NoError(t, err)
	err = Handle(c, func(context.Context, illegalTopicEvent, Metadata) error { return nil })
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorContains(t, err, `"orders v2"`)
}

// illegalTopicEvent's topic is not a legal Kafka topic.
type illegalTopicEvent struct{}

func (illegalTopicEvent) Topic() string         { return "orders v2" }
func (illegalTopicEvent) ContentSchema() string { return "Illegal.v1" }
func (illegalTopicEvent) PartitionKey() string  { return "" }

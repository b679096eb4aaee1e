package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Client is the framework's entry point in a service: it records events in
// transactions (Transact, Record), publishes them (Run) and runs the
// handlers registered with Handle (Run).
//
// Create one per process with New, register handlers, call EnsureIndexes
// once at start (Run also does), then Run it for the life of the process
// next to the HTTP server. Transact may be used before and while Run runs;
// events recorded while Run is not running are published when it runs.
type Client struct {
	cfg           Config
	outbox, inbox *mongo.Collection
	validate      *validator.Validate
	publishTopics map[string]bool
	topics        *topicCache
	pub           atomic.Pointer[publisher] // the running publisher, for status
	tel           *telemetry                // metrics, spans, runtime state for Status
	redriveEvery  time.Duration             // period of the re-drive request loop; tests shorten it

	mu       sync.Mutex // guards handlers and running
	handlers map[handlerKey]*handler
	running  bool
	stopRun  context.CancelCauseFunc // cancels Run with a fatal error; set by Run
}

// New checks cfg and returns a Client. It does no I/O.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	db := cfg.Mongo.Database(cfg.Database)
	c := &Client{
		cfg:           cfg,
		outbox:        db.Collection(cfg.OutboxCollection),
		inbox:         db.Collection(cfg.InboxCollection),
		validate:      validator.New(validator.WithRequiredStructEnabled()),
		publishTopics: make(map[string]bool, len(cfg.PublishTopics)),
		topics:        &topicCache{cfg: &cfg, counts: map[string]int{}},
		handlers:      map[handlerKey]*handler{},
	}
	c.tel = newTelemetry(&c.cfg)
	if c.tel.instrumentErr != nil {
		cfg.Logger.Warn("outbox: some metric instruments could not be created", "err", c.tel.instrumentErr)
	}
	for _, t := range cfg.PublishTopics {
		c.publishTopics[t] = true
	}
	return c, nil
}

// validateEvent runs the event's validator struct tags.
func (c *Client) validateEvent(schema string, e Event) error {
	err := c.validate.Struct(e)
	if err == nil {
		return nil
	}
	var verrs validator.ValidationErrors
	if errors.As(err, &verrs) && len(verrs) > 0 {
		return &ValidationError{ContentSchema: schema, Field: verrs[0].Namespace(), Tag: verrs[0].Tag(), Err: err}
	}
	var inv *validator.InvalidValidationError
	if errors.As(err, &inv) {
		// Not a struct (or a nil pointer): nothing to validate by tags.
		return nil
	}
	return fmt.Errorf("%w: %s: %v", ErrInvalidEvent, schema, err)
}

// topicCache holds the partition counts of the topics events are recorded
// for. A count is fetched from Kafka on first use and kept; the publisher
// refreshes counts it sees in its own metadata.
type topicCache struct {
	cfg    *Config
	mu     sync.Mutex
	counts map[string]int
}

// ErrTopicMetadata wraps failures to learn a topic's partition count.
var ErrTopicMetadata = errors.New("outbox: cannot read topic metadata")

func (tc *topicCache) partitions(ctx context.Context, topic string) (int, error) {
	tc.mu.Lock()
	n, ok := tc.counts[topic]
	tc.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := tc.fetch(ctx, topic)
	if err != nil {
		return 0, err
	}
	tc.set(topic, n)
	return n, nil
}

func (tc *topicCache) set(topic string, n int) {
	if n <= 0 {
		return
	}
	tc.mu.Lock()
	tc.counts[topic] = n
	tc.mu.Unlock()
}

// fetch asks Kafka for a topic's partition count with a short-lived client.
func (tc *topicCache) fetch(ctx context.Context, topic string) (int, error) {
	opts := append([]kgo.Opt{}, tc.cfg.KafkaOptions...)
	opts = append(opts, kgo.SeedBrokers(tc.cfg.Brokers...))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("%w %q: %v", ErrTopicMetadata, topic, err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("%w %q: %v", ErrTopicMetadata, topic, err)
	}
	d, ok := details[topic]
	switch {
	case !ok:
		return 0, fmt.Errorf("%w %q: not in metadata", ErrTopicMetadata, topic)
	case d.Err != nil:
		return 0, fmt.Errorf("%w %q: %v", ErrTopicMetadata, topic, d.Err)
	case len(d.Partitions) == 0:
		return 0, fmt.Errorf("%w %q: no partitions", ErrTopicMetadata, topic)
	}
	return len(d.Partitions), nil
}

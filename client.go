package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/liveness"
	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/topicmeta"
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
	scheduled     *mongo.Collection // the scheduled events (schedule.go)
	meta          *mongo.Collection // metaCollection: inbox stamps, partition counts, replica records
	validate      *validator.Validate
	publishTopics map[string]bool
	topics        *topicmeta.Topics
	compressor    func() kgo.Compressor             // the producer's codec, for Record's size check (internal/publish/producer.go)
	pub           atomic.Pointer[publish.Publisher] // the running publisher, for status
	doctor        atomic.Pointer[DoctorReport]      // the doctor's report at Run's start, for status
	tel           *telemetry                        // metrics, spans, runtime state for Status
	sessions      liveness.Sessions                 // the consumer's sessions, for takeover (internal/liveness)
	claims        *claimcheck.Store                 // Config.ClaimCheck's payload collection; nil without one
	uniqueIndex   atomic.Bool                       // the index of Config.UniqueIdempotencyKeys is known to exist (outbox_unique.go)
	test          testKnobs                         // settings only tests change; the zero value is production's

	mu        sync.Mutex // guards handlers, running, started and startWait
	handlers  map[handlerKey]*handler
	running   bool
	started   bool                    // Run is past its start (indexes created) and its context has not ended
	startWait string                  // what Run's start waits for, for Ready
	stopRun   context.CancelCauseFunc // cancels Run with a fatal error; set by Run
}

// testKnobs are the settings of a Client that only tests change: shorter
// periods, so that a test sees a loop's next round in milliseconds rather
// than seconds, and hooks that observe or crash one step of a mechanism.
// They are gathered here, apart from the Client's state, so that a reader
// sees at once what production never sets. The zero value is production's:
// a zero period falls back to its default, a nil hook is not called. Tests
// set them after New and before Run.
type testKnobs struct {
	// redriveEvery is the period of the re-drive request loop (parked.go).
	redriveEvery time.Duration
	// metadataEvery is the period of Run's partition count refresh
	// (internal/topicmeta).
	metadataEvery time.Duration
	// replicaEvery is the period of Run's liveness record refresh
	// (internal/liveness).
	replicaEvery time.Duration
	// fetchCheckEvery, fetchQuietFor and fetchRestartEvery are the fetch
	// watch's period, quiet time and restart spacing (internal/kafkawatch).
	fetchCheckEvery, fetchQuietFor, fetchRestartEvery time.Duration
	// fetchRestartHook hears each restart of the fetch watch before it
	// acts (reason set_offsets or resubscribe).
	fetchRestartHook func(tp consume.TopicPartition, reason string)
	// resetWait is how long a resubscribing replica waits for another
	// replica's reset of a recreated topic's offsets, and resetHook
	// crashes a reset at a step when it returns true (internal/kafkawatch,
	// RecreationWatch.Crash).
	resetWait time.Duration
	resetHook func(ctx context.Context, step string) (crashed bool)
	// reapedHook hears each replica record whose sessions a reap ended,
	// before the reap removes their ids from it (internal/liveness).
	reapedHook func(ctx context.Context, replicaID string)
	// scheduleRefill is how often a promotion loop reads its horizon of
	// due times again whatever it was told (internal/schedule).
	scheduleRefill time.Duration
}

// New checks cfg and returns a Client. It does no I/O.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Namespaced, so that a service's own "service" attribute does not
	// collide with it.
	cfg.Logger = cfg.Logger.With(slog.String("outbox.service", cfg.Service))
	db := cfg.Mongo.Database(cfg.Database)
	c := &Client{
		cfg:           cfg,
		outbox:        db.Collection(cfg.OutboxCollection),
		inbox:         db.Collection(cfg.InboxCollection),
		scheduled:     db.Collection(cfg.OutboxCollection + store.ScheduledSuffix),
		validate:      validator.New(validator.WithRequiredStructEnabled()),
		publishTopics: make(map[string]bool, len(cfg.PublishTopics)),
		meta:          db.Collection(metaCollection, options.Collection().SetWriteConcern(writeconcern.Majority())),
		handlers:      map[handlerKey]*handler{},
	}
	c.topics = topicmeta.New(topicmeta.Config{
		Topics:           c.cfg.PublishTopics,
		KafkaTopic:       c.cfg.kafkaTopic,
		KafkaOptions:     append(append([]kgo.Opt{}, c.cfg.KafkaOptions...), kgo.SeedBrokers(c.cfg.Brokers...)),
		CreatePartitions: c.cfg.CreateTopicPartitions,
		Meta:             c.meta,
		Database:         c.cfg.Database,
		Outbox:           c.cfg.OutboxCollection,
		Log:              c.cfg.Logger,
		Backoff:          c.cfg.backoff(),
	})
	c.claims = claimStore(&c.cfg)
	c.compressor = sync.OnceValue(func() kgo.Compressor {
		return publish.Compressor(append([]kgo.Opt{c.cfg.producerCompression()}, c.cfg.KafkaOptions...))
	})
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
	return fmt.Errorf("%w: %s: %w", ErrInvalidEvent, schema, err)
}

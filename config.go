package outbox

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Config wires a Client. Required fields are marked; every other field's
// comment ends with its default.
type Config struct {
	// Mongo is a connected MongoDB client; the deployment must be a replica
	// set (transactions and change streams need one). Required.
	Mongo *mongo.Client
	// Database holds the outbox and inbox collections: a MongoDB database
	// name (at most 63 bytes, none of /\. "$*<>:|? or NUL). Required.
	Database string
	// OutboxCollection is the outbox collection's name: a MongoDB
	// collection name (no '$' or NUL, not system.*), not "outbox_meta",
	// which the framework keeps its metadata in. Defaults to "outbox".
	OutboxCollection string
	// InboxCollection is the inbox collection's name, under the same
	// rules as OutboxCollection's and different from it. Defaults to
	// "inbox".
	InboxCollection string

	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOptions are added to every Kafka client the framework creates
	// (TLS, SASL, client id...). Options that the framework sets itself
	// (groups, topics, commit and rebalance behaviour, the publisher's
	// batch size limits, which follow the topics' max.message.bytes) are
	// overridden. Choose the publisher's codec with Compression rather
	// than with kgo.ProducerBatchCompression here (franz-go modifies that
	// option's codec list when a client is created, a data race when the
	// framework creates its clients at once). Defaults to none.
	KafkaOptions []kgo.Opt

	// Compression is the codec of the publisher's record batches:
	// CompressionGzip, which every mainstream Kafka client reads without
	// extra libraries, CompressionNone, or CompressionSnappy, CompressionLZ4
	// and CompressionZstd, which some consumers cannot read (kafkajs without
	// a codec plugin, kafka-python without python-snappy). See Compression
	// for the measurements behind the default. Defaults to CompressionGzip.
	Compression Compression

	// Service names this service. Kafka group names derive from it.
	// Required.
	Service string
	// ConsumerGroup is the Kafka consumer group that receives the events of
	// registered handlers. Defaults to Service.
	ConsumerGroup string
	// PublisherGroup is the Kafka consumer group whose partition assignment
	// decides which replica publishes which partition. Its members never
	// fetch records. Defaults to Service + ".outbox-publisher".
	PublisherGroup string
	// PublishTopics lists the topics this service records events for. An
	// event for any other topic is refused when it is recorded, so that no
	// event can sit unpublished forever. Each, with TopicPrefix, must be a
	// legal Kafka topic (letters, digits, '.', '_' and '-', at most 249
	// bytes, neither "." nor ".."). Defaults to none (recording refused;
	// a consume-only service).
	PublishTopics []string
	// TopicPrefix is prepended to every topic name at the Kafka boundary,
	// so that several environments (or test runs) can share one Kafka
	// cluster: with "staging.", the events recorded for topic "orders" are
	// published to the Kafka topic "staging.orders", and a handler of
	// "orders" consumes "staging.orders". Only Kafka sees the prefix: the
	// outbox and inbox documents, inbox ids, handlers, Metadata, status and
	// metrics keep the bare name, and a consumer strips the prefix from a
	// record's topic before anything else reads it. Partition counts, lag,
	// topic creation (CreateTopicPartitions) and both consumer groups use
	// the prefixed names; group names are not prefixed (set ConsumerGroup
	// and PublisherGroup, or Service, per environment). It may hold
	// letters, digits, '.', '_' and '-', and the prefixed names must fit
	// Kafka's 249 bytes. The event-outbox wire format's body names the bare
	// topic. Changing it moves a service to other Kafka topics: events
	// still unpublished go to the new ones, and the old ones are no longer
	// read. Defaults to "" (topics used as named).
	TopicPrefix string
	// CreateTopicPartitions, when positive, makes the client create the
	// topics of PublishTopics that Kafka does not have, with this many
	// partitions and the brokers' default replication factor, when it
	// first reads their partition counts (at Run's start, or before the
	// first Transact that records for them). Choose the count with care:
	// it caps the replicas that share a topic, and adding partitions later
	// moves keys to other partitions. Defaults to 0: the topics must exist,
	// and Record fails with ErrPartitionsUnknown for a topic Kafka does not
	// have.
	CreateTopicPartitions int32
	// WireFormats chooses the wire format of the events recorded for a
	// topic of PublishTopics (see Format): FormatNative, FormatEventOutbox
	// (the Python event-outbox library's flat JSON body) or
	// FormatCloudEvents (CloudEvents 1.0, Kafka binding, binary mode).
	// Consumers detect the format of each record whatever this says.
	// Defaults to none: every topic native.
	WireFormats map[string]Format
	// CloudEventsSource is the CloudEvents source attribute (ce_source) of
	// the events recorded for FormatCloudEvents topics. Defaults to "/"
	// followed by Service.
	CloudEventsSource string
	// EventOutboxPartitioning lists topics of PublishTopics whose events
	// choose their partition as the Python event-outbox library does: the
	// partition key must be a decimal integer (the empty key counts as 0)
	// and the partition is that integer modulo the partition count, instead
	// of Kafka's murmur2 hash of the key. Use it where Go and Python
	// services record events of the same keys on one topic, so that both
	// land on the same partition. Defaults to none.
	EventOutboxPartitioning []string
	// UniqueIdempotencyKeys adds a unique index on the outbox's topic,
	// content schema and idempotency key, as the Python library does:
	// recording an event a second time with the same idempotency key fails
	// (ErrDuplicateEvent) instead of publishing it twice, as long as the
	// first one is kept (OutboxRetention after it was published). The
	// index is made by Client.EnsureIndexes (and Run); a transaction
	// (Client.Transact, or a handler's) before that makes it first, and
	// fails instead of recording while it cannot: duplicates are never
	// accepted for want of the index. Defaults to false.
	UniqueIdempotencyKeys bool
	// ClaimCheck, when set, stores payloads too large for their topic's
	// records in MongoDB, and resolves the records that refer to such
	// payloads (see ClaimCheck). Defaults to nil: Record refuses an event
	// over its topic's limit (ErrEventTooLarge), and a record carrying a
	// reference is parked (ErrClaimCheckNotConfigured).
	ClaimCheck *ClaimCheck

	// OutboxRetention is how long published outbox documents are kept before
	// the TTL index deletes them. Defaults to 7 days.
	OutboxRetention time.Duration
	// InboxRetention is how long handled inbox documents are kept. It must
	// outlast the longest time a record can be redelivered (the topics'
	// retention plus the longest consumer downtime you tolerate): an event
	// replayed after its inbox document expired is handled again. Defaults
	// to 30 days, four times Kafka's default topic retention of 7 days.
	InboxRetention time.Duration

	// MaxAttempts is how many times a failing handler runs before its event
	// is parked. Runs cut short (the process died or lost the partition
	// while running the event) do not count against it, unless they keep
	// coming: an event with more than MaxAttempts runs that ended without
	// a result (a handler that kills its process) is parked with
	// ErrAttemptsExhausted. Defaults to 10.
	MaxAttempts int
	// PoisonPolicy says what happens to the later events of a partition
	// key once one of its events is parked by the consumer (its handler
	// failed MaxAttempts times, or asked to park) or refused for good by
	// Kafka in the publisher. HoldKey keeps per-key order: the later events
	// of that key wait behind it (held) until it is re-driven, retried or
	// purged, while other keys move on. SkipEvent lets the later events of
	// the key go on without it, giving up per-key order for that key.
	// Defaults to HoldKey.
	PoisonPolicy PoisonPolicy
	// HandlerTimeout bounds one handling attempt: a handler's context
	// (and the MongoDB transaction it runs in, claim and commit included)
	// ends this long after the attempt starts. It must stay below the
	// server's transactionLifetimeLimitSeconds (60 s by default): a
	// transaction older than that is aborted by the server, and its commit
	// fails. A handler that returns nil but whose commit fails (deadline
	// passed, transaction aborted) has used an attempt. Defaults to 45 s.
	HandlerTimeout time.Duration
	// MaxSnoozes bounds how often a handler may return Snooze for one event
	// without using an attempt: the snoozes after the first MaxSnoozes of
	// an event in a process count as attempts, so a handler that snoozes
	// for ever still ends parked. Defaults to 100.
	MaxSnoozes int
	// DrainTimeout bounds how long a stopping consumer (Run's context ended)
	// and a revoked partition let the transactions in hand finish and
	// commit before their handlers' contexts are canceled. Keep it below
	// the orchestrator's grace period (Kubernetes: 30 s by default) minus
	// a few seconds for leaving the groups. Defaults to 20 s.
	DrainTimeout time.Duration
	// KeyConcurrency is how many events of different partition keys of one
	// partition may be handled at the same time, each key still strictly
	// in offset order (events of one key never run side by side). 1 handles
	// a partition one transaction at a time. Raise it for handlers that
	// wait on I/O (an external API, another database): with a handler that
	// waits 20 ms, one partition handles about 50 events a second per slot.
	// Hot keys do not gain from it, and it costs concurrent transactions on
	// MongoDB. With more than one slot, consecutive events share a
	// transaction (HandleBatchSize) only while handlers are fast (about
	// 5 ms of handling per transaction), so that the slots spread over
	// keys. The offset committed is the lowest one not yet settled, so a
	// crash redelivers at most the records taken past it (bounded by the
	// queue bound of 5000 records or 8 MiB per partition), which the inbox
	// skips. Defaults to 1.
	KeyConcurrency int
	// SkipUnknownEvents acknowledges and skips events that no registered
	// handler accepts (topic and content schema), counted in
	// outbox.events.skipped with reason no_handler, wherever they meet
	// their key: on arrival (also behind a parked event of the key), and
	// in a release or a re-drive of the key (then marked handled, with
	// skip_reason no_handler). By default they are
	// kept instead: parked with reason no_handler, holding their key
	// (HoldKey), and released by the first replica that has their handler,
	// so that a producer may deploy a new event type or version before its
	// consumers. Defaults to false.
	SkipUnknownEvents bool
	// HandleBatchSize caps how many consecutive events of one partition are
	// handled in one MongoDB transaction. Batching saves a commit per event;
	// when any event of a batch fails (handler error, duplicate, conflict),
	// the batch is rolled back and its events up to the failing one are
	// handled one transaction each, with the usual retries. Handlers must
	// not rely on running alone in their transaction. 1 disables batching.
	// Defaults to 32.
	HandleBatchSize int
	// RetryMinBackoff is the first retry delay of a failing handler; each
	// retry doubles it, with jitter, up to RetryMaxBackoff. Defaults to
	// 100 ms.
	RetryMinBackoff time.Duration
	// RetryMaxBackoff caps handler retry delays and the backoff of loops
	// that talk to MongoDB or Kafka. Defaults to 10 s.
	RetryMaxBackoff time.Duration

	// PublishBatchSize caps the events published and marked in one round.
	// Defaults to 500.
	PublishBatchSize int
	// PublishLinger is how long the publisher lets new events gather
	// between two reads of the outbox change stream while events are
	// flowing. 0 reads again at once: the lowest latency, at the price of
	// about one getMore command per few events at a moderate load. A
	// positive value adds up to PublishLinger of latency and caps the
	// stream's reads at one per PublishLinger (for example 20 ms: at most
	// 50 getMores a second, whatever the load). An idle stream waits on the
	// server either way. Defaults to 0; negative is invalid.
	PublishLinger time.Duration
	// SessionTimeout is the Kafka group session timeout of both groups. A
	// replica that stops heartbeating loses its partitions after it, and
	// the publisher stops publishing a partition once its lease (renewed by
	// successful heartbeats) is older than SessionTimeout minus
	// FenceMargin. Shorter means faster failover and more rebalances on
	// slow networks. Defaults to 10 s.
	SessionTimeout time.Duration
	// HeartbeatInterval is the Kafka group heartbeat interval. Defaults to
	// 1 s.
	HeartbeatInterval time.Duration
	// FenceMargin is the safety margin of the publisher's lease. Defaults
	// to 3 s.
	FenceMargin time.Duration
	// GroupProtocol is the consumer-group protocol of both groups (the
	// publisher's and the consumer's). GroupClassic, the default, is the
	// protocol every Kafka version speaks: the clients assign partitions
	// (cooperative-sticky), with SessionTimeout and HeartbeatInterval.
	// GroupConsumer is Kafka 4's protocol (KIP-848): the broker assigns
	// partitions, revocation is always incremental, and the session
	// timeout and heartbeat interval are the broker's settings
	// (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms),
	// so SessionTimeout and HeartbeatInterval no longer apply to the groups.
	// It needs Kafka 4.0 or later (4.3 or later recommended: before 4.3 an
	// offset commit can meet STALE_MEMBER_EPOCH); against a broker without
	// it, the clients fall back to the classic protocol. See
	// docs/guarantees.md.
	GroupProtocol GroupProtocol

	// ReplicaID names this process (one replica of the service) in its
	// liveness record (Replica.Name, the console's partitions page),
	// Status.Replica and the framework's logs (attribute outbox.replica).
	// Give each replica its own, for example the pod name or a REPLICA_ID
	// variable. Defaults to the host name and process id ("host-4242").
	ReplicaID string

	// Logger receives the framework's logs: warnings and errors, each
	// state change once (partitions assigned or lost, a change stream
	// reopened, a key held), and a summary of the events recorded,
	// published, handled and parked every LogSummaryInterval (only when
	// some were). The framework's attributes are namespaced ("outbox.*"),
	// so they do not collide with a service's own. Defaults to
	// slog.Default(), the process's default logger.
	Logger *slog.Logger
	// LogSummaryInterval is the period of the info line that sums up the
	// events recorded, published, handled and parked meanwhile; nothing is
	// logged for a period without any. Negative disables it. Defaults to
	// 1 minute.
	LogSummaryInterval time.Duration
	// MeterProvider receives the framework's metrics (see the Telemetry
	// section of the package documentation). Defaults to the global
	// provider of go.opentelemetry.io/otel (a no-op until one is set).
	MeterProvider metric.MeterProvider
	// TracerProvider receives the framework's spans: one per handling
	// attempt, continuing the trace recorded with the event, and one per
	// published batch. Defaults to the global provider of
	// go.opentelemetry.io/otel (a no-op until one is set).
	TracerProvider trace.TracerProvider
}

// GroupProtocol is a consumer-group protocol (Config.GroupProtocol).
type GroupProtocol int

const (
	// GroupClassic is Kafka's classic group protocol (JoinGroup, SyncGroup,
	// Heartbeat): the clients assign the partitions. The default.
	GroupClassic GroupProtocol = iota
	// GroupConsumer is Kafka 4's consumer-group protocol (KIP-848,
	// ConsumerGroupHeartbeat): the broker assigns the partitions.
	GroupConsumer
)

// String returns the protocol's name as Kafka's group.protocol setting
// spells it: "classic" or "consumer".
func (p GroupProtocol) String() string {
	switch p {
	case GroupClassic:
		return "classic"
	case GroupConsumer:
		return "consumer"
	}
	return fmt.Sprintf("GroupProtocol(%d)", int(p))
}

// MarshalText writes the String form.
func (p GroupProtocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads the String form, "classic" or "consumer".
func (p *GroupProtocol) UnmarshalText(b []byte) error {
	for _, v := range []GroupProtocol{GroupClassic, GroupConsumer} {
		if string(b) == v.String() {
			*p = v
			return nil
		}
	}
	return fmt.Errorf("outbox: unknown group protocol %q (want classic or consumer)", b)
}

// groupOpts are the kgo options of Config.GroupProtocol for a group client.
// kgo.ServerSideBalancer applies when the first balancer is sticky,
// cooperative-sticky (sent as the broker's "uniform" assignor) or range,
// and only against a broker that serves ConsumerGroupHeartbeat v1; kgo
// falls back to the classic protocol otherwise.
func (c *Config) groupOpts() []kgo.Opt {
	if c.GroupProtocol == GroupConsumer {
		return []kgo.Opt{kgo.ServerSideBalancer()}
	}
	return nil
}

// PoisonPolicy is what a poison event (parked by the consumer, or refused
// for good by Kafka in the publisher) does to the later events of its
// partition key. See Config.PoisonPolicy.
type PoisonPolicy int

const (
	// HoldKey holds the later events of the poison event's key, in order,
	// until the poison event is re-driven, retried or purged: per-key order
	// is kept. The default.
	HoldKey PoisonPolicy = iota
	// SkipEvent lets the later events of the key go on without the poison
	// event: the key's order is given up for it.
	SkipEvent
)

// String returns "hold-key" or "skip-event".
func (p PoisonPolicy) String() string {
	switch p {
	case HoldKey:
		return "hold-key"
	case SkipEvent:
		return "skip-event"
	}
	return fmt.Sprintf("PoisonPolicy(%d)", int(p))
}

// backoff spaces the retries of every loop of a Client, consumer and
// publisher alike: RetryMinBackoff doubled per retry up to RetryMaxBackoff.
func (c *Config) backoff() retry.Backoff {
	return retry.Backoff{Min: c.RetryMinBackoff, Max: c.RetryMaxBackoff}
}

// maxKeyConcurrency caps Config.KeyConcurrency: each slot may hold a
// MongoDB transaction open.
const maxKeyConcurrency = 1024

func (c Config) withDefaults() Config {
	c = c.wireDefaults().claimCheckDefaults()
	c.OutboxCollection = cmp.Or(c.OutboxCollection, "outbox")
	c.InboxCollection = cmp.Or(c.InboxCollection, "inbox")
	c.ConsumerGroup = cmp.Or(c.ConsumerGroup, c.Service)
	if c.PublisherGroup == "" && c.Service != "" {
		c.PublisherGroup = c.Service + ".outbox-publisher"
	}
	c.Compression = cmp.Or(c.Compression, CompressionGzip)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, 7*24*time.Hour)
	c.InboxRetention = cmp.Or(c.InboxRetention, 30*24*time.Hour)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.HandleBatchSize = cmp.Or(c.HandleBatchSize, 32)
	c.KeyConcurrency = cmp.Or(c.KeyConcurrency, 1)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, 20*time.Second)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, 45*time.Second)
	c.MaxSnoozes = cmp.Or(c.MaxSnoozes, 100)
	c.RetryMinBackoff = cmp.Or(c.RetryMinBackoff, 100*time.Millisecond)
	c.RetryMaxBackoff = cmp.Or(c.RetryMaxBackoff, 10*time.Second)
	c.PublishBatchSize = cmp.Or(c.PublishBatchSize, 500)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 10*time.Second)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, time.Second)
	c.FenceMargin = cmp.Or(c.FenceMargin, 3*time.Second)
	if c.ReplicaID == "" {
		c.ReplicaID = defaultReplicaID()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.LogSummaryInterval = cmp.Or(c.LogSummaryInterval, time.Minute)
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	return c
}

// validate checks every field and reports every invalid one: the errors,
// each wrapping ErrConfig and naming its field, joined (errors.Join).
func (c Config) validate() error {
	var errs []error
	bad := func(field, why string) { errs = append(errs, fmt.Errorf("%w: %s %s", ErrConfig, field, why)) }
	if c.Mongo == nil {
		bad("Mongo", "is required")
	}
	if err := checkMongoDatabase(c.Database); err != nil {
		bad("Database", err.Error())
	}
	if len(c.Brokers) == 0 {
		bad("Brokers", "is required")
	}
	if c.Service == "" {
		bad("Service", "is required")
	}
	if err := checkMongoCollection(c.Database, c.OutboxCollection); err != nil {
		bad("OutboxCollection", err.Error())
	}
	if err := checkMongoCollection(c.Database, c.InboxCollection); err != nil {
		bad("InboxCollection", err.Error())
	} else if c.OutboxCollection == c.InboxCollection {
		bad("InboxCollection", "must differ from OutboxCollection")
	}
	if c.OutboxRetention < time.Second {
		bad("OutboxRetention", "must be at least 1s")
	}
	if c.InboxRetention < time.Second {
		bad("InboxRetention", "must be at least 1s")
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", "must be at least 1")
	}
	if c.GroupProtocol != GroupClassic && c.GroupProtocol != GroupConsumer {
		bad("GroupProtocol", "must be GroupClassic or GroupConsumer")
	}
	if c.PoisonPolicy != HoldKey && c.PoisonPolicy != SkipEvent {
		bad("PoisonPolicy", "must be HoldKey or SkipEvent")
	}
	if c.DrainTimeout < 0 {
		bad("DrainTimeout", "must not be negative")
	}
	if c.HandlerTimeout < 0 {
		bad("HandlerTimeout", "must not be negative")
	}
	if c.MaxSnoozes < 0 {
		bad("MaxSnoozes", "must not be negative")
	}
	if c.HandleBatchSize < 1 {
		bad("HandleBatchSize", "must be at least 1")
	}
	if c.KeyConcurrency < 1 || c.KeyConcurrency > maxKeyConcurrency {
		bad("KeyConcurrency", fmt.Sprintf("must be between 1 and %d", maxKeyConcurrency))
	}
	if c.RetryMinBackoff <= 0 || c.RetryMaxBackoff < c.RetryMinBackoff {
		bad("RetryMaxBackoff", "must be at least RetryMinBackoff, both positive")
	}
	if c.PublishBatchSize < 1 {
		bad("PublishBatchSize", "must be at least 1")
	}
	if c.PublishLinger < 0 {
		bad("PublishLinger", "must not be negative")
	}
	if c.CreateTopicPartitions < 0 {
		bad("CreateTopicPartitions", "must not be negative")
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.SessionTimeout {
		bad("HeartbeatInterval", "must be positive and shorter than SessionTimeout")
	}
	if c.FenceMargin <= 0 || c.FenceMargin >= c.SessionTimeout-c.HeartbeatInterval {
		bad("FenceMargin", "must be positive and shorter than SessionTimeout minus HeartbeatInterval")
	}
	if c.ConsumerGroup != "" && c.ConsumerGroup == c.PublisherGroup {
		bad("PublisherGroup", "must differ from ConsumerGroup")
	}
	if why := replicaIDProblem(c.ReplicaID); why != "" {
		bad("ReplicaID", why)
	}
	if _, err := c.Compression.codec(); err != nil {
		bad("Compression", err.Error())
	}
	if err := checkTopicPrefix(c.TopicPrefix); err != nil {
		bad("TopicPrefix", err.Error())
	}
	seen := map[string]bool{}
	for _, t := range c.PublishTopics {
		if seen[t] {
			bad("PublishTopics", fmt.Sprintf("lists %q twice", t))
		} else if err := checkKafkaTopic(c.TopicPrefix + t); err != nil {
			bad("PublishTopics", fmt.Sprintf("has topic %q: %s", t, err))
		}
		seen[t] = true
	}
	errs = append(errs, c.validateWire()...)
	errs = append(errs, c.validateClaimCheck()...)
	return errors.Join(errs...)
}

// replicaIDProblem says why id cannot be a Config.ReplicaID (it names the
// process in logs, status and Kafka client ids), or "" when it can.
func replicaIDProblem(id string) string {
	if len(id) > maxNameLen || strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Sprintf("must be printable and at most %d bytes", maxNameLen)
	}
	return ""
}

// defaultReplicaID is Config.ReplicaID's default: the host name and the
// process id, unique on a host and across containers.
func defaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "replica"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

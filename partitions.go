package outbox

// Partition counts for recording.
//
// Record stores the partition of each event (murmur2 of its key modulo the
// topic's partition count), so it needs the count of every publish topic,
// and it must never ask Kafka for it: it runs inside the caller's MongoDB
// transaction, and a Kafka outage must only delay publishing. The counts
// therefore live in memory (partitionCounts), persisted in MongoDB (one
// outbox_meta document per topic, from the last successful Kafka metadata
// read), and are obtained before any transaction starts:
//
//   - Run's refresh goroutine (Client.refreshPartitions) loads them from
//     MongoDB at start, then reads Kafka's metadata every metadataInterval
//     (with backoff after failures) and persists changed counts;
//   - Transact and the handlers' transactions first call prepare, outside
//     the transaction: it returns at once when every count is known and
//     fresh, else loads them from MongoDB, and only for a topic still
//     unknown (a first-ever start: nothing persisted) reads Kafka, bounded
//     by lookupTimeout and at most once per kafkaRetry while Kafka fails.
//     So Transact works before Run (and without it) when Kafka is up.
//
// A restart during a Kafka outage records normally with the persisted
// counts. A first-ever start with Kafka down records nothing: Record fails
// at once with ErrPartitionsUnknown, and Transact returns that error within
// about lookupTimeout instead of hanging in an open transaction.
//
// Each read also learns the topics' max.message.bytes (DescribeConfigs:
// the topic's own value, or the broker's message.max.bytes it inherits),
// kept and persisted with the counts: Record refuses an event that cannot
// fit (ErrEventTooLarge) and the publisher sizes its producer's batches by
// it (publisher_producer.go). A failed config read (an ACL, say) leaves the
// limit unknown and never fails the count.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Partition count tuning that the Config does not expose.
const (
	// metadataInterval is the period of Run's metadata reads.
	metadataInterval = time.Minute
	// staleAfter is the age after which prepare reloads the counts from
	// MongoDB, so that a client recording without Run still learns added
	// partitions. Longer than metadataInterval: while Run refreshes them,
	// prepare has nothing to do.
	staleAfter = 2 * metadataInterval
	// metadataTimeout bounds one metadata read of Run's refresh loop.
	metadataTimeout = 10 * time.Second
	// partitionLookupTimeout bounds the Kafka read of prepare.
	partitionLookupTimeout = 5 * time.Second
	// kafkaRetry is how long prepare leaves Kafka alone after a failed
	// read (its own or the refresh loop's): while Kafka is down, Transact
	// fails fast instead of waiting lookupTimeout every time.
	kafkaRetry = 10 * time.Second
	// loadRetry is the least time between two loads from MongoDB by
	// prepare while a count is unknown.
	loadRetry = time.Second
)

// partitionCount is a topic's partition count and when Kafka reported it.
type partitionCount struct {
	n  int
	at time.Time
}

// partitionCounts holds the partition counts of the publish topics.
type partitionCounts struct {
	cfg           *Config
	meta          *mongo.Collection
	lookupTimeout time.Duration // bound of prepare's Kafka read; tests shorten it
	slow          chan struct{} // one prepare slow path at a time

	mu        sync.Mutex
	counts    map[string]partitionCount
	limits    map[string]int        // max.message.bytes by topic, when known
	persisted map[string]storedMeta // what is known to be stored in MongoDB
	loadedAt  time.Time             // last load from MongoDB or read from Kafka that succeeded
	triedAt   time.Time             // last load attempt from MongoDB
	failedAt  time.Time             // last failed Kafka read
	lastErr   error                 // last failure to learn a count, for ErrPartitionsUnknown
	limitErr  string                // last failure to read the limits, logged when it changes
	changed   chan struct{}         // closed and replaced when a count or a limit changes
}

// storedMeta is what a topic's outbox_meta document holds.
type storedMeta struct {
	partitions, maxMessageBytes int
}

func newPartitionCounts(cfg *Config, meta *mongo.Collection) *partitionCounts {
	return &partitionCounts{
		cfg:           cfg,
		meta:          meta,
		lookupTimeout: partitionLookupTimeout,
		slow:          make(chan struct{}, 1),
		counts:        map[string]partitionCount{},
		limits:        map[string]int{},
		persisted:     map[string]storedMeta{},
		changed:       make(chan struct{}),
	}
}

// maxMessageBytes returns topic's max.message.bytes, when known.
func (pc *partitionCounts) maxMessageBytes(topic string) (int, bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	n, ok := pc.limits[topic]
	return n, ok
}

// limitsSnapshot returns the known limits, by topic.
func (pc *partitionCounts) limitsSnapshot() map[string]int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return maps.Clone(pc.limits)
}

// watch returns a channel closed at the next change of a count or a limit.
func (pc *partitionCounts) watch() <-chan struct{} {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.changed
}

// notifyLocked wakes the watchers; pc.mu is held.
func (pc *partitionCounts) notifyLocked() {
	close(pc.changed)
	pc.changed = make(chan struct{})
}

// get returns the partition count of topic from memory; it does no I/O.
func (pc *partitionCounts) get(topic string) (int, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if c, ok := pc.counts[topic]; ok {
		return c.n, nil
	}
	msg := fmt.Sprintf("%q: no count stored in %s.%s and none read from Kafka yet", topic, pc.cfg.Database, metaCollection)
	if pc.lastErr != nil {
		return 0, fmt.Errorf("%w %s (last failure: %w)", ErrPartitionsUnknown, msg, pc.lastErr)
	}
	return 0, fmt.Errorf("%w %s", ErrPartitionsUnknown, msg)
}

// set records a count read from Kafka in memory.
func (pc *partitionCounts) set(topic string, n int) {
	if n <= 0 {
		return
	}
	pc.mu.Lock()
	if pc.counts[topic].n != n {
		pc.notifyLocked()
	}
	pc.counts[topic] = partitionCount{n: n, at: time.Now()}
	pc.mu.Unlock()
}

// ready reports whether every publish topic's count is known and fresh.
func (pc *partitionCounts) ready(now time.Time) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return len(pc.missingLocked()) == 0 && now.Sub(pc.loadedAt) < staleAfter
}

func (pc *partitionCounts) missing() []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.missingLocked()
}

func (pc *partitionCounts) missingLocked() []string {
	var out []string
	for _, t := range pc.cfg.PublishTopics {
		if _, ok := pc.counts[t]; !ok {
			out = append(out, t)
		}
	}
	return out
}

// prepare makes the counts of the publish topics known before a
// transaction starts (see the file comment). It never fails: a count it
// cannot learn makes Record fail with ErrPartitionsUnknown, so a
// transaction that records no event for that topic still runs.
func (pc *partitionCounts) prepare(ctx context.Context) {
	if len(pc.cfg.PublishTopics) == 0 || pc.ready(time.Now()) {
		return
	}
	select {
	case pc.slow <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-pc.slow }()
	now := time.Now()
	if pc.ready(now) {
		return
	}
	pc.mu.Lock()
	load := now.Sub(pc.triedAt) >= loadRetry
	pc.mu.Unlock()
	if load {
		_ = pc.load(ctx)
	}
	missing := pc.missing()
	pc.mu.Lock()
	askKafka := len(missing) > 0 && (pc.failedAt.IsZero() || now.Sub(pc.failedAt) >= kafkaRetry)
	pc.mu.Unlock()
	if !askKafka || ctx.Err() != nil {
		return
	}
	kctx, cancel := context.WithTimeout(ctx, pc.lookupTimeout)
	defer cancel()
	counts, limits, err := pc.fetch(kctx, nil, missing)
	pc.apply(ctx, counts, limits)
	if err != nil && ctx.Err() == nil {
		pc.failed(err)
		pc.cfg.Logger.Warn("outbox: partition counts unknown and Kafka unreachable; recording for these topics fails until Kafka answers",
			"topics", missing, "error", err)
	}
}

// load reads the persisted counts of the publish topics from MongoDB. A
// stored count replaces the one in memory when it was read from Kafka more
// recently (by another replica).
func (pc *partitionCounts) load(ctx context.Context) error {
	pc.mu.Lock()
	pc.triedAt = time.Now()
	pc.mu.Unlock()
	ids := make(bson.A, len(pc.cfg.PublishTopics))
	for i, t := range pc.cfg.PublishTopics {
		ids[i] = pc.id(t)
	}
	cur, err := pc.meta.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return pc.loadFailed(err)
	}
	var docs []struct {
		ID struct {
			Topic string `bson:"topic"`
		} `bson:"_id"`
		Partitions      int       `bson:"partitions"`
		MaxMessageBytes int       `bson:"max_message_bytes"`
		ReadAt          time.Time `bson:"read_at"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return pc.loadFailed(err)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	changed := false
	for _, d := range docs {
		if d.Partitions <= 0 {
			continue
		}
		pc.persisted[d.ID.Topic] = storedMeta{partitions: d.Partitions, maxMessageBytes: d.MaxMessageBytes}
		if c, ok := pc.counts[d.ID.Topic]; !ok || d.ReadAt.After(c.at) {
			changed = changed || c.n != d.Partitions
			pc.counts[d.ID.Topic] = partitionCount{n: d.Partitions, at: d.ReadAt}
			if d.MaxMessageBytes > 0 && pc.limits[d.ID.Topic] != d.MaxMessageBytes {
				pc.limits[d.ID.Topic] = d.MaxMessageBytes
				changed = true
			}
		}
	}
	if changed {
		pc.notifyLocked()
	}
	pc.loadedAt = time.Now()
	return nil
}

func (pc *partitionCounts) loadFailed(err error) error {
	err = fmt.Errorf("outbox: load partition counts from %s: %w", metaCollection, err)
	pc.mu.Lock()
	pc.lastErr = err
	pc.mu.Unlock()
	return err
}

// id is the _id of a topic's count document.
func (pc *partitionCounts) id(topic string) bson.D {
	return bson.D{{Key: "outbox", Value: pc.cfg.OutboxCollection}, {Key: "topic", Value: topic}}
}

// fetch reads the partition counts and the max.message.bytes of topics
// (bare, read from their Kafka topics: Config.TopicPrefix) from Kafka, with
// cl or, when cl is nil, a short-lived client. It returns the counts and
// the limits it learnt, by bare topic, and an error wrapping
// ErrTopicMetadata, naming Kafka topics, when it could not learn every
// count (a limit it cannot read is left out, see readLimits).
func (pc *partitionCounts) fetch(ctx context.Context, cl *kgo.Client, bare []string) (counts, limits map[string]int, err error) {
	topics := pc.cfg.kafkaTopics(bare)
	if cl == nil {
		var err error
		if cl, err = pc.newKafkaClient(); err != nil {
			return nil, nil, fmt.Errorf("%w %q: %w", ErrTopicMetadata, topics, err)
		}
		defer cl.Close()
		// kgo does not cancel a connection's initialization (ApiVersions,
		// SASL) with the request's context: a black-holed broker holds the
		// request for the request timeout overhead (10 s by default).
		// Closing the client does end it.
		defer context.AfterFunc(ctx, cl.Close)()
	}
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, topics...)
	if err == nil {
		details, err = pc.createMissing(ctx, adm, details, topics)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, nil, fmt.Errorf("%w %q: %w", ErrTopicMetadata, topics, err)
	}
	counts = map[string]int{}
	var errs []error
	for i, topic := range topics {
		d, ok := details[topic]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%w %q: not in metadata", ErrTopicMetadata, topic))
		case d.Err != nil:
			errs = append(errs, fmt.Errorf("%w %q: %w", ErrTopicMetadata, topic, d.Err))
		case len(d.Partitions) == 0:
			errs = append(errs, fmt.Errorf("%w %q: no partitions", ErrTopicMetadata, topic))
		default:
			counts[bare[i]] = len(d.Partitions)
		}
	}
	return counts, pc.readLimits(ctx, adm, bare), errors.Join(errs...)
}

// readLimits reads the max.message.bytes of topics (bare) with adm: the
// value Kafka applies, the topic's own or the broker's message.max.bytes
// it inherits. Topics whose config cannot be read are left out, and the
// failure is logged when it differs from the last one.
func (pc *partitionCounts) readLimits(ctx context.Context, adm *kadm.Client, bare []string) map[string]int {
	limits := map[string]int{}
	rcs, err := adm.DescribeTopicConfigs(ctx, pc.cfg.kafkaTopics(bare)...)
	if err == nil {
		byName := map[string]kadm.ResourceConfig{}
		for _, rc := range rcs {
			byName[rc.Name] = rc
		}
		var errs []error
		for _, t := range bare {
			rc, ok := byName[pc.cfg.kafkaTopic(t)]
			if !ok || rc.Err != nil {
				errs = append(errs, fmt.Errorf("%q: %v", t, cmp.Or(rc.Err, errors.New("not described"))))
				continue
			}
			for _, c := range rc.Configs {
				if c.Key != "max.message.bytes" || c.Value == nil {
					continue
				}
				if n, perr := strconv.Atoi(*c.Value); perr == nil && n > 0 {
					limits[t] = n
				}
			}
		}
		err = errors.Join(errs...)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	pc.mu.Lock()
	report := msg != pc.limitErr
	pc.limitErr = msg
	pc.mu.Unlock()
	if report && msg != "" && ctx.Err() == nil {
		pc.cfg.Logger.Warn("outbox: cannot read max.message.bytes of publish topics (DescribeConfigs); events are sized against Kafka's default until it can be read",
			"error", err)
	}
	return limits
}

func (pc *partitionCounts) newKafkaClient() (*kgo.Client, error) {
	opts := append([]kgo.Opt{}, pc.cfg.KafkaOptions...)
	opts = append(opts, kgo.SeedBrokers(pc.cfg.Brokers...))
	return kgo.NewClient(opts...)
}

// apply records counts and limits read from Kafka in memory and persists
// the ones that differ from what MongoDB holds (a limit only with its
// topic's count). A failed write is logged and tried again at the next
// read.
func (pc *partitionCounts) apply(ctx context.Context, counts, limits map[string]int) {
	if len(counts) == 0 && len(limits) == 0 {
		return
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	pc.mu.Lock()
	notify := false
	for topic, n := range limits {
		if pc.limits[topic] != n {
			pc.limits[topic] = n
			notify = true
		}
	}
	var changed []string
	for topic, n := range counts {
		if pc.counts[topic].n != n {
			notify = true
		}
		pc.counts[topic] = partitionCount{n: n, at: now}
		if want := (storedMeta{n, pc.limits[topic]}); pc.persisted[topic] != want {
			changed = append(changed, topic)
		}
	}
	if notify {
		pc.notifyLocked()
	}
	if len(counts) > 0 {
		pc.loadedAt = time.Now()
		pc.failedAt = time.Time{}
		pc.lastErr = nil
	}
	pc.mu.Unlock()
	for _, topic := range changed {
		pc.mu.Lock()
		m := storedMeta{counts[topic], pc.limits[topic]}
		pc.mu.Unlock()
		set := bson.D{{Key: "partitions", Value: m.partitions}, {Key: "read_at", Value: now}}
		if m.maxMessageBytes > 0 {
			set = append(set, bson.E{Key: "max_message_bytes", Value: m.maxMessageBytes})
		}
		_, err := pc.meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: pc.id(topic)}},
			bson.D{{Key: "$set", Value: set}}, options.UpdateOne().SetUpsert(true))
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			pc.cfg.Logger.Warn("outbox: storing a partition count failed", "topic", topic, "partitions", m.partitions, "error", err)
			continue
		}
		pc.mu.Lock()
		pc.persisted[topic] = m
		pc.mu.Unlock()
	}
}

// lastFailure is the last failure to learn a count, or nil.
func (pc *partitionCounts) lastFailure() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.lastErr
}

// failed records a failed Kafka read.
func (pc *partitionCounts) failed(err error) {
	pc.mu.Lock()
	pc.failedAt = time.Now()
	pc.lastErr = err
	pc.mu.Unlock()
}

// snapshot returns the counts in memory (for tests and status).
func (pc *partitionCounts) snapshot() map[string]int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	out := make(map[string]int, len(pc.counts))
	for t, c := range pc.counts {
		out[t] = c.n
	}
	return out
}

// refreshPartitions keeps the partition counts of the publish topics
// current while Run runs: one goroutine of Run's group, started when
// Config.PublishTopics is not empty and stopped by Run's context (it never
// ends Run). It loads the persisted counts from MongoDB, then reads Kafka's
// metadata with a client of its own every metadataInterval, persisting
// counts that changed. After a failed read it reloads the counts from
// MongoDB (another replica may reach Kafka) and retries with backoff
// (Config.RetryMinBackoff to RetryMaxBackoff).
func (c *Client) refreshPartitions(ctx context.Context) error {
	pc := c.topics
	cl, err := pc.newKafkaClient()
	if err != nil {
		return fmt.Errorf("outbox: create the Kafka metadata client: %w", err)
	}
	defer cl.Close()
	// Close ends a metadata read stuck in a connection's initialization
	// (see fetch), so that Run stops at once.
	defer context.AfterFunc(ctx, cl.Close)()
	_ = pc.load(ctx)
	rl := newRateLog(waitLogEvery) // once, then every few seconds while Kafka is down
	for attempt := 1; ; {
		rctx, cancel := context.WithTimeout(ctx, metadataTimeout)
		counts, limits, err := pc.fetch(rctx, cl, c.cfg.PublishTopics)
		cancel()
		pc.apply(ctx, counts, limits)
		wait := cmp.Or(c.test.metadataEvery, metadataInterval)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			pc.failed(err)
			_ = pc.load(ctx)
			if missing := pc.missing(); len(missing) > 0 && errors.Is(err, kerr.UnknownTopicOrPartition) {
				rl.warn(c.cfg.Logger, "outbox: waiting for topics to exist in Kafka: create them, or set Config.CreateTopicPartitions; recording for them fails until then",
					"absent", "topics", missing, "error", err, "attempt", attempt)
			} else if len(missing) > 0 {
				rl.warn(c.cfg.Logger, "outbox: waiting for Kafka: reading topic metadata failed, and these topics have no stored partition count, so recording for them fails until Kafka answers",
					"missing", "topics", missing, "error", err, "attempt", attempt)
			} else {
				rl.warn(c.cfg.Logger, "outbox: reading topic metadata failed; recording uses the stored partition counts",
					"stored", "error", err, "attempt", attempt)
			}
			wait = c.cfg.backoff().Delay(attempt - 1)
			attempt++
		} else {
			attempt = 1
		}
		if !retry.Sleep(ctx, nil, wait) {
			return nil
		}
	}
}

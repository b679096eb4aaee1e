package topicmeta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/store"
)

// ErrPartitionsUnknown is returned by Topics.Get for a topic whose
// partition count is neither stored nor read from Kafka yet. The root
// package's outbox.ErrPartitionsUnknown is this error.
var ErrPartitionsUnknown = errors.New("outbox: partition count of topic unknown")

// ErrTopicMetadata wraps failures to learn a topic's partition count from
// Kafka. The root package's outbox.ErrTopicMetadata is this error.
var ErrTopicMetadata = errors.New("outbox: cannot read topic metadata")

// Tuning that the root's Config does not expose.
const (
	// metadataInterval is the period of Run's metadata reads.
	metadataInterval = time.Minute
	// staleAfter is the age after which Prepare reloads the counts from
	// MongoDB, so that a client recording without Run still learns added
	// partitions. Longer than metadataInterval: while Run refreshes them,
	// Prepare has nothing to do.
	staleAfter = 2 * metadataInterval
	// metadataTimeout bounds one metadata read of Run and of Refresh.
	metadataTimeout = 10 * time.Second
	// lookupTimeout bounds the Kafka read of Prepare.
	lookupTimeout = 5 * time.Second
	// kafkaRetry is how long Prepare leaves Kafka alone after a failed
	// read (its own or Run's): while Kafka is down, Transact fails fast
	// instead of waiting the lookup timeout every time.
	kafkaRetry = 10 * time.Second
	// loadRetry is the least time between two loads from MongoDB by
	// Prepare while a count is unknown.
	loadRetry = time.Second
)

// Config is what Topics needs of a Client's configuration.
type Config struct {
	// Topics are the publish topics, bare.
	Topics []string
	// KafkaTopic names a bare topic as Kafka knows it (its prefix added).
	KafkaTopic func(bare string) string
	// KafkaOptions make the Kafka clients of the metadata reads: the
	// brokers and the user's Kafka options.
	KafkaOptions []kgo.Opt
	// CreatePartitions, when positive, makes a read create the publish
	// topics Kafka does not know, with that many partitions.
	CreatePartitions int32
	// Meta is the outbox_meta collection, Database its database's name
	// (for errors), Outbox the outbox collection's name (the documents'
	// _id.outbox).
	Meta     *mongo.Collection
	Database string
	Outbox   string
	// Log takes the warnings.
	Log *slog.Logger
	// Backoff spaces Run's reads after failures.
	Backoff retry.Backoff
	// LookupTimeout replaces lookupTimeout, the bound of Prepare's Kafka
	// read, when positive.
	LookupTimeout time.Duration
}

// count is a topic's partition count and when Kafka reported it.
type count struct {
	n  int
	at time.Time
}

// stored is what a topic's outbox_meta document holds.
type stored struct {
	partitions, maxMessageBytes int
}

// Topics holds the partition counts and max.message.bytes of the publish
// topics (see the package comment).
type Topics struct {
	cfg  Config
	slow chan struct{} // one Prepare slow path at a time

	mu        sync.Mutex
	counts    map[string]count
	limits    map[string]int    // max.message.bytes by topic, when known
	persisted map[string]stored // what is known to be stored in MongoDB
	loadedAt  time.Time         // last load from MongoDB or read from Kafka that succeeded
	triedAt   time.Time         // last load attempt from MongoDB
	failedAt  time.Time         // last failed Kafka read
	lastErr   error             // last failure to learn a count, for ErrPartitionsUnknown
	limitErr  string            // last failure to read the limits, logged when it changes
	changed   chan struct{}     // closed and replaced when a count or a limit changes
}

// New returns the Topics of cfg; it does no I/O.
func New(cfg Config) *Topics {
	cfg.LookupTimeout = cmp.Or(cfg.LookupTimeout, lookupTimeout)
	return &Topics{
		cfg:       cfg,
		slow:      make(chan struct{}, 1),
		counts:    map[string]count{},
		limits:    map[string]int{},
		persisted: map[string]stored{},
		changed:   make(chan struct{}),
	}
}

// SetLookupTimeout replaces the bound of Prepare's Kafka read, for tests
// that make Kafka unreachable; they call it before the Topics are used.
func (t *Topics) SetLookupTimeout(d time.Duration) { t.cfg.LookupTimeout = d }

// MaxMessageBytes returns topic's max.message.bytes, when known.
func (t *Topics) MaxMessageBytes(topic string) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.limits[topic]
	return n, ok
}

// Limits returns the known max.message.bytes, by topic.
func (t *Topics) Limits() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.limits)
}

// Watch returns a channel closed at the next change of a count or a limit.
func (t *Topics) Watch() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// notifyLocked wakes the watchers; t.mu is held.
func (t *Topics) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// Get returns the partition count of topic from memory; it does no I/O.
// Without one it fails with ErrPartitionsUnknown, naming the last failure
// to learn it.
func (t *Topics) Get(topic string) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.counts[topic]; ok {
		return c.n, nil
	}
	msg := fmt.Sprintf("%q: no count stored in %s.%s and none read from Kafka yet", topic, t.cfg.Database, store.MetaCollection)
	if t.lastErr != nil {
		return 0, fmt.Errorf("%w %s (last failure: %w)", ErrPartitionsUnknown, msg, t.lastErr)
	}
	return 0, fmt.Errorf("%w %s", ErrPartitionsUnknown, msg)
}

// Set records a count read from Kafka in memory, without persisting it.
func (t *Topics) Set(topic string, n int) {
	if n <= 0 {
		return
	}
	t.mu.Lock()
	if t.counts[topic].n != n {
		t.notifyLocked()
	}
	t.counts[topic] = count{n: n, at: time.Now()}
	t.mu.Unlock()
}

// ready reports whether every publish topic's count is known and fresh.
func (t *Topics) ready(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.missingLocked()) == 0 && now.Sub(t.loadedAt) < staleAfter
}

// Missing lists the publish topics whose count is not known.
func (t *Topics) Missing() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.missingLocked()
}

func (t *Topics) missingLocked() []string {
	var out []string
	for _, topic := range t.cfg.Topics {
		if _, ok := t.counts[topic]; !ok {
			out = append(out, topic)
		}
	}
	return out
}

// Prepare makes the counts of the publish topics known before a
// transaction starts (see the package comment). It never fails: a count it
// cannot learn makes Get fail with ErrPartitionsUnknown, so a transaction
// that records no event for that topic still runs.
func (t *Topics) Prepare(ctx context.Context) {
	if len(t.cfg.Topics) == 0 || t.ready(time.Now()) {
		return
	}
	select {
	case t.slow <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-t.slow }()
	now := time.Now()
	if t.ready(now) {
		return
	}
	t.mu.Lock()
	load := now.Sub(t.triedAt) >= loadRetry
	t.mu.Unlock()
	if load {
		_ = t.load(ctx)
	}
	missing := t.Missing()
	t.mu.Lock()
	askKafka := len(missing) > 0 && (t.failedAt.IsZero() || now.Sub(t.failedAt) >= kafkaRetry)
	t.mu.Unlock()
	if !askKafka || ctx.Err() != nil {
		return
	}
	kctx, cancel := context.WithTimeout(ctx, t.cfg.LookupTimeout)
	defer cancel()
	counts, limits, err := t.fetch(kctx, nil, missing)
	t.Apply(ctx, counts, limits)
	if err != nil && ctx.Err() == nil {
		t.failed(err)
		t.cfg.Log.Warn("outbox: partition counts unknown and Kafka unreachable; recording for these topics fails until Kafka answers",
			"topics", missing, "error", err)
	}
}

// load reads the persisted counts of the publish topics from MongoDB. A
// stored count replaces the one in memory when it was read from Kafka more
// recently (by another replica).
func (t *Topics) load(ctx context.Context) error {
	t.mu.Lock()
	t.triedAt = time.Now()
	t.mu.Unlock()
	docs, err := store.ReadTopicMetas(ctx, t.cfg.Meta, t.cfg.Outbox, t.cfg.Topics...)
	if err != nil {
		err = fmt.Errorf("outbox: load partition counts from %s: %w", store.MetaCollection, err)
		t.mu.Lock()
		t.lastErr = err
		t.mu.Unlock()
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := false
	for _, d := range docs {
		if d.Partitions <= 0 {
			continue
		}
		t.persisted[d.Topic] = stored{partitions: d.Partitions, maxMessageBytes: d.MaxMessageBytes}
		if c, ok := t.counts[d.Topic]; !ok || d.ReadAt.After(c.at) {
			changed = changed || c.n != d.Partitions
			t.counts[d.Topic] = count{n: d.Partitions, at: d.ReadAt}
			if d.MaxMessageBytes > 0 && t.limits[d.Topic] != d.MaxMessageBytes {
				t.limits[d.Topic] = d.MaxMessageBytes
				changed = true
			}
		}
	}
	if changed {
		t.notifyLocked()
	}
	t.loadedAt = time.Now()
	return nil
}

// Apply records counts and limits read from Kafka in memory and persists
// the ones that differ from what MongoDB holds (a limit only with its
// topic's count). A failed write is logged and tried again at the next
// read.
func (t *Topics) Apply(ctx context.Context, counts, limits map[string]int) {
	if len(counts) == 0 && len(limits) == 0 {
		return
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	t.mu.Lock()
	notify := false
	for topic, n := range limits {
		if t.limits[topic] != n {
			t.limits[topic] = n
			notify = true
		}
	}
	var changed []string
	for topic, n := range counts {
		if t.counts[topic].n != n {
			notify = true
		}
		t.counts[topic] = count{n: n, at: now}
		if want := (stored{n, t.limits[topic]}); t.persisted[topic] != want {
			changed = append(changed, topic)
		}
	}
	if notify {
		t.notifyLocked()
	}
	if len(counts) > 0 {
		t.loadedAt = time.Now()
		t.failedAt = time.Time{}
		t.lastErr = nil
	}
	t.mu.Unlock()
	for _, topic := range changed {
		t.mu.Lock()
		m := stored{counts[topic], t.limits[topic]}
		t.mu.Unlock()
		err := store.SaveTopicMeta(ctx, t.cfg.Meta, t.cfg.Outbox,
			store.TopicMeta{Topic: topic, Partitions: m.partitions, MaxMessageBytes: m.maxMessageBytes, ReadAt: now})
		if err != nil {
			t.cfg.Log.Warn("outbox: storing a partition count failed", "topic", topic, "partitions", m.partitions, "error", err)
			continue
		}
		t.mu.Lock()
		t.persisted[topic] = m
		t.mu.Unlock()
	}
}

// LastFailure is the last failure to learn a count, or nil.
func (t *Topics) LastFailure() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastErr
}

// failed records a failed Kafka read.
func (t *Topics) failed(err error) {
	t.mu.Lock()
	t.failedAt = time.Now()
	t.lastErr = err
	t.mu.Unlock()
}

// Snapshot returns the counts in memory, by topic.
func (t *Topics) Snapshot() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.counts))
	for topic, c := range t.counts {
		out[topic] = c.n
	}
	return out
}

package topicmeta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// kafkaTopics returns the Kafka topics of the bare topics.
func (t *Topics) kafkaTopics(bare []string) []string {
	out := make([]string, len(bare))
	for i, b := range bare {
		out[i] = t.cfg.KafkaTopic(b)
	}
	return out
}

// fetch reads the partition counts and the max.message.bytes of topics
// (bare, read from their Kafka topics) from Kafka, with cl or, when cl is
// nil, a short-lived client. It returns the counts and the limits it
// learnt, by bare topic, and an error wrapping ErrTopicMetadata, naming
// Kafka topics, when it could not learn every count (a limit it cannot
// read is left out, see readLimits).
func (t *Topics) fetch(ctx context.Context, cl *kgo.Client, bare []string) (counts, limits map[string]int, err error) {
	topics := t.kafkaTopics(bare)
	if cl == nil {
		var err error
		if cl, err = kgo.NewClient(t.cfg.KafkaOptions...); err != nil {
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
		details, err = t.createMissing(ctx, adm, details, topics)
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
	return counts, t.readLimits(ctx, adm, bare), errors.Join(errs...)
}

// createMissing creates the topics of topics that details reports unknown
// to Kafka, when Config.CreatePartitions asks for it, and returns details
// with the created topics' partitions. A topic another replica created
// meanwhile stays unknown in details until the next metadata read. The
// caller wraps errors in ErrTopicMetadata.
func (t *Topics) createMissing(ctx context.Context, adm *kadm.Client, details kadm.TopicDetails, topics []string) (kadm.TopicDetails, error) {
	n := t.cfg.CreatePartitions
	if n <= 0 {
		return details, nil
	}
	var missing []string
	for _, topic := range topics {
		if d, ok := details[topic]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, topic)
		}
	}
	if len(missing) == 0 {
		return details, nil
	}
	res, err := adm.CreateTopics(ctx, n, -1, nil, missing...)
	if err != nil {
		return details, fmt.Errorf("create topics %q: %w", missing, err)
	}
	for _, r := range res.Sorted() {
		switch {
		case r.Err == nil:
			// Metadata may lag behind the creation (kadm caches it, and
			// brokers learn of a new topic asynchronously): the count
			// comes from the creation's answer.
			t.cfg.Log.Info("outbox: created topic (Config.CreateTopicPartitions)", "topic", r.Topic, "partitions", r.NumPartitions)
			parts := kadm.PartitionDetails{}
			for p := range max(r.NumPartitions, 0) {
				parts[p] = kadm.PartitionDetail{Topic: r.Topic, Partition: p}
			}
			details[r.Topic] = kadm.TopicDetail{Topic: r.Topic, ID: r.ID, Partitions: parts}
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			// Created meanwhile by another replica: its count is read at
			// the next metadata read (the details still say unknown, so
			// the caller retries).
		default:
			return details, fmt.Errorf("create topic %q: %w", r.Topic, r.Err)
		}
	}
	return details, nil
}

// readLimits reads the max.message.bytes of topics (bare) with adm: the
// value Kafka applies, the topic's own or the broker's message.max.bytes
// it inherits. Topics whose config cannot be read are left out, and the
// failure is logged when it differs from the last one.
func (t *Topics) readLimits(ctx context.Context, adm *kadm.Client, bare []string) map[string]int {
	limits := map[string]int{}
	rcs, err := adm.DescribeTopicConfigs(ctx, t.kafkaTopics(bare)...)
	if err == nil {
		byName := map[string]kadm.ResourceConfig{}
		for _, rc := range rcs {
			byName[rc.Name] = rc
		}
		var errs []error
		for _, topic := range bare {
			rc, ok := byName[t.cfg.KafkaTopic(topic)]
			if !ok || rc.Err != nil {
				errs = append(errs, fmt.Errorf("%q: %v", topic, cmp.Or(rc.Err, errors.New("not described"))))
				continue
			}
			for _, c := range rc.Configs {
				if c.Key != "max.message.bytes" || c.Value == nil {
					continue
				}
				if n, perr := strconv.Atoi(*c.Value); perr == nil && n > 0 {
					limits[topic] = n
				}
			}
		}
		err = errors.Join(errs...)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	t.mu.Lock()
	report := msg != t.limitErr
	t.limitErr = msg
	t.mu.Unlock()
	if report && msg != "" && ctx.Err() == nil {
		t.cfg.Log.Warn("outbox: cannot read max.message.bytes of publish topics (DescribeConfigs); events are sized against Kafka's default until it can be read",
			"error", err)
	}
	return limits
}

// Refresh reads the counts and limits of the publish topics from Kafka
// with cl, bounded by metadataTimeout, and applies what it learnt (Apply)
// under ctx. It returns the read's error, wrapping ErrTopicMetadata.
func (t *Topics) Refresh(ctx context.Context, cl *kgo.Client) error {
	rctx, cancel := context.WithTimeout(ctx, metadataTimeout)
	counts, limits, err := t.fetch(rctx, cl, t.cfg.Topics)
	cancel()
	t.Apply(ctx, counts, limits)
	return err
}

// Run keeps the partition counts of the publish topics current until ctx
// ends: it loads the persisted counts from MongoDB, then reads Kafka's
// metadata with a client of its own every period (metadataInterval when
// every is 0), persisting counts that changed. After a failed read it
// reloads the counts from MongoDB (another replica may reach Kafka) and
// retries with Config.Backoff. It returns nil when ctx ends, and an error
// only when its Kafka client cannot be made.
func (t *Topics) Run(ctx context.Context, every time.Duration) error {
	cl, err := kgo.NewClient(t.cfg.KafkaOptions...)
	if err != nil {
		return fmt.Errorf("outbox: create the Kafka metadata client: %w", err)
	}
	defer cl.Close()
	// Close ends a metadata read stuck in a connection's initialization
	// (see fetch), so that Run stops at once.
	defer context.AfterFunc(ctx, cl.Close)()
	_ = t.load(ctx)
	rl := itel.NewRateLog(itel.WaitLogEvery) // once, then every few seconds while Kafka is down
	for attempt := 1; ; {
		err := t.Refresh(ctx, cl)
		wait := cmp.Or(every, metadataInterval)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			t.failed(err)
			_ = t.load(ctx)
			if missing := t.Missing(); len(missing) > 0 && errors.Is(err, kerr.UnknownTopicOrPartition) {
				rl.Warn(t.cfg.Log, "outbox: waiting for topics to exist in Kafka: create them, or set Config.CreateTopicPartitions; recording for them fails until then",
					"absent", "topics", missing, "error", err, "attempt", attempt)
			} else if len(missing) > 0 {
				rl.Warn(t.cfg.Log, "outbox: waiting for Kafka: reading topic metadata failed, and these topics have no stored partition count, so recording for them fails until Kafka answers",
					"missing", "topics", missing, "error", err, "attempt", attempt)
			} else {
				rl.Warn(t.cfg.Log, "outbox: reading topic metadata failed; recording uses the stored partition counts",
					"stored", "error", err, "attempt", attempt)
			}
			wait = t.cfg.Backoff.Delay(attempt - 1)
			attempt++
		} else {
			attempt = 1
		}
		if !retry.Sleep(ctx, nil, wait) {
			return nil
		}
	}
}

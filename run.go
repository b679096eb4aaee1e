package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/event-outbox/outbox/internal/retry"
)

// Run publishes recorded events and runs the registered handlers until ctx
// ends, then drains and returns nil. It is meant to live for the whole
// process, next to the HTTP server.
//
// On start it creates the indexes and checks that the inbox collection
// belongs to Config.ConsumerGroup (EnsureIndexes, retried with backoff while
// MongoDB is unreachable; an index conflict, an inbox of another group or
// an outbox a Python event-outbox service still uses ends Run with an error
// wrapping ErrIndexConflict, ErrInboxOwned or ErrEventOutboxNotMigrated). The
// publisher runs when Config.PublishTopics is not empty, together with a
// goroutine that keeps the topics' partition counts current for recording
// (loaded from MongoDB, read from Kafka every minute, persisted; see
// ErrPartitionsUnknown); the consumer runs when handlers are registered.
// MongoDB and Kafka outages are retried with backoff and never end Run.
// While it runs, a goroutine keeps a liveness record of this replica in the
// outbox_meta collection (its groups' member ids, host, pid, last seen;
// refreshed every SessionTimeout/5, between 1 s and 5 s; see
// Admin.Replicas), marked stopped when Run returns. Once at start, the
// doctor checks the deployment's settings (Client.Doctor): each finding
// that breaks a guarantee is logged as a warning with its fix, and the
// report shows in Status.Doctor and the metric outbox.doctor.findings; it
// never stops Run. When ctx ends, the
// consumer finishes the events in hand (at most Config.DrainTimeout), commits their
// offsets and leaves its group; the publisher finishes its batches in
// flight and leaves its group. A fatal error (for example a Kafka client
// that cannot be created from the configuration) stops both and is
// returned. Run may be called once at a time; a second concurrent call
// returns ErrRunning.
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return ErrRunning
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running, c.started, c.startWait = false, false, ""
		c.mu.Unlock()
	}()

	c.setStartWait("MongoDB (creating the indexes)")
	for attempt := 1; ; attempt++ {
		err := c.EnsureIndexes(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrIndexConflict) || errors.Is(err, ErrInboxOwned) || errors.Is(err, ErrEventOutboxNotMigrated) {
			// Retrying cannot fix these: the error says what to change.
			return err
		}
		c.setStartWait("MongoDB (creating the indexes: " + redactSecrets(err.Error()) + ")")
		c.cfg.Logger.WarnContext(ctx, "outbox: waiting for MongoDB: creating the indexes failed; retrying", "err", err, "attempt", attempt)
		if !retry.Sleep(ctx, nil, c.cfg.backoff().Delay(attempt-1)) {
			return nil
		}
	}

	c.mu.Lock()
	c.started, c.startWait = true, ""
	c.mu.Unlock()
	defer context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.started = false
		c.mu.Unlock()
	})()

	// The liveness record (internal/liveness) is kept while the groups run and
	// drain, and marked stopped once both were left.
	stopAlive := c.keepAlive(ctx)
	c.cfg.Logger.InfoContext(ctx, "outbox: running", "outbox.replica", c.cfg.ReplicaID,
		"publish_topics", c.cfg.PublishTopics, "handlers", c.handlerCount(), "consumer_group", c.cfg.ConsumerGroup)
	started := time.Now()

	// The observable gauges report while Run runs.
	defer c.registerGauges()()
	defer c.registerDoctorGauge()()

	// One group of goroutines: the first fatal error cancels the others.
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c.mu.Lock()
	c.stopRun = cancel
	c.mu.Unlock()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := func(fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(gctx); err != nil {
				once.Do(func() { first = err })
				cancel(err)
			}
		})
	}
	// The doctor's check (doctor_run.go) never stops Run.
	wg.Go(func() { c.checkAtStart(gctx) })
	wg.Go(func() { c.tel.ins.Sum.LogSummaries(gctx, c.cfg.LogSummaryInterval, c.cfg.Logger, c.cfg.ReplicaID) })
	if len(c.cfg.PublishTopics) > 0 {
		start(func(ctx context.Context) error { return c.topics.Run(ctx, c.test.metadataEvery) })
		start(c.runPublisher)
	}
	start(c.runConsumer)
	wg.Wait()
	if first == nil && ctx.Err() == nil {
		// Stopped by a fatal group error reported through a hook.
		first = context.Cause(gctx)
	}
	stopAlive(first)
	if first != nil {
		c.cfg.Logger.ErrorContext(ctx, "outbox: stopped on a fatal error", "outbox.replica", c.cfg.ReplicaID, "err", first)
	} else {
		c.cfg.Logger.InfoContext(ctx, "outbox: stopped", "outbox.replica", c.cfg.ReplicaID, "ran_for", time.Since(started).Round(time.Second).String())
	}
	return first
}

func (c *Client) setStartWait(what string) {
	c.mu.Lock()
	c.startWait = what
	c.mu.Unlock()
}

// Ready reports nil when the Client can serve requests: Run runs and is
// past its start (the indexes created, the inbox's owner checked), its
// context has not ended, and the partition count of every topic of
// Config.PublishTopics is known (loaded from MongoDB or read from Kafka),
// so that Record works. Otherwise its error, wrapping ErrNotReady, says
// what the Client waits for. A readiness probe may use it (Server does);
// Kafka being down does not make a started Client unready, since
// recording does not need Kafka once the counts are known.
func (c *Client) Ready() error {
	c.mu.Lock()
	running, started, wait := c.running, c.started, c.startWait
	c.mu.Unlock()
	switch {
	case !running:
		return fmt.Errorf("%w: %s: Run is not running", ErrNotReady, c.cfg.Service)
	case !started && wait != "":
		return fmt.Errorf("%w: %s: waiting for %s", ErrNotReady, c.cfg.Service, wait)
	case !started:
		return fmt.Errorf("%w: %s: starting", ErrNotReady, c.cfg.Service)
	}
	if missing := c.topics.Missing(); len(missing) > 0 {
		why := ""
		err := c.topics.LastFailure()
		if err != nil {
			why = " (last failure: " + redactSecrets(err.Error()) + ")"
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("%w: %s: waiting for topics %s to exist in Kafka: create them, or set Config.CreateTopicPartitions%s",
				ErrNotReady, c.cfg.Service, strings.Join(missing, ", "), why)
		}
		return fmt.Errorf("%w: %s: waiting for Kafka: the partition count of %s is not known yet%s", ErrNotReady, c.cfg.Service,
			strings.Join(missing, ", "), why)
	}
	return nil
}

// handlerCount is the number of registered handlers.
func (c *Client) handlerCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.handlers)
}

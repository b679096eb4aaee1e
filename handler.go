package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/retry"
)

// HandlerFunc handles one event of type T. Its context carries the
// handler's MongoDB transaction: pass it to every MongoDB operation that must
// commit together with the handling (they join the transaction) and to
// Record for the events the handling causes. Returning an error aborts the
// transaction; the event is retried with backoff and parked after
// Config.MaxAttempts attempts (Park parks it at once, Snooze retries it
// later without using an attempt). A panic is treated as an error. ctx
// ends after Config.HandlerTimeout; a run whose transaction cannot commit
// (for example because it outlived the server's transaction lifetime) has
// used an attempt even if the handler returned nil.
//
// A handler may run more than once for the same event (a retried
// transaction, a redelivery before the first run committed, a rolled-back
// batch), but at most one run commits: only the effects written through ctx
// are exactly-once. Consecutive events of a partition may share one
// transaction (Config.HandleBatchSize): a handler sees the writes of the
// handlers before it in the batch, and its error rolls the whole batch back
// before the events are handled one per transaction.
type HandlerFunc[T Event] func(ctx context.Context, event T, meta Metadata) error

// Metadata describes the delivery of an event to a handler.
type Metadata struct {
	Envelope
	// Offset is the Kafka offset of the record.
	Offset int64
	// Attempt numbers this run of the handler for this event, starting at
	// 1. Failed attempts are stored in the inbox, so the count goes on
	// across processes (a partition that moved, a process that crashed);
	// runs of a batch that rolled back (Config.HandleBatchSize) and
	// snoozes within Config.MaxSnoozes do not count.
	Attempt int
}

// handlerKey identifies a handler: one per (topic, content schema).
type handlerKey struct {
	topic, schema string
}

// HandleOption sets a handler's own retry policy, beside the Config's
// defaults (Handle, MustHandle).
type HandleOption func(*handlerPolicy) error

// handlerPolicy is a handler's retry policy; zero fields take the Config's.
type handlerPolicy struct {
	maxAttempts            int
	minBackoff, maxBackoff time.Duration
	timeout                time.Duration
}

// WithMaxAttempts sets how many times the handler runs for a failing event
// before the event is parked, instead of Config.MaxAttempts.
func WithMaxAttempts(n int) HandleOption {
	return func(p *handlerPolicy) error {
		if n < 1 {
			return fmt.Errorf("%w: WithMaxAttempts(%d): must be at least 1", ErrConfig, n)
		}
		p.maxAttempts = n
		return nil
	}
}

// WithRetryBackoff sets the handler's retry delays, instead of
// Config.RetryMinBackoff and RetryMaxBackoff: the first retry waits min,
// each next one twice as long (with jitter), up to max.
func WithRetryBackoff(min, max time.Duration) HandleOption {
	return func(p *handlerPolicy) error {
		if min <= 0 || max < min {
			return fmt.Errorf("%w: WithRetryBackoff(%s, %s): max must be at least min, both positive", ErrConfig, min, max)
		}
		p.minBackoff, p.maxBackoff = min, max
		return nil
	}
}

// WithHandlerTimeout bounds one run of the handler (and its transaction),
// instead of Config.HandlerTimeout.
func WithHandlerTimeout(d time.Duration) HandleOption {
	return func(p *handlerPolicy) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithHandlerTimeout(%s): must be positive", ErrConfig, d)
		}
		p.timeout = d
		return nil
	}
}

// policy is the handler's retry policy, the Config's where it sets none.
func (h *handler) policy(c *Client) consume.Policy {
	p := c.defaultPolicy()
	if h.pol.maxAttempts > 0 {
		p.MaxAttempts = h.pol.maxAttempts
	}
	if h.pol.minBackoff > 0 {
		p.Backoff = retry.Backoff{Min: h.pol.minBackoff, Max: h.pol.maxBackoff}
	}
	return p
}

// timeout bounds one run of the handler.
func (h *handler) timeout(c *Client) time.Duration {
	return cmp.Or(h.pol.timeout, c.cfg.HandlerTimeout)
}

// handler is a registered handler with its type erased.
type handler struct {
	key handlerKey
	pol handlerPolicy
	// decode unmarshals and validates a payload into the handler's type.
	decode func(c *Client, payload []byte) (Event, error)
	// run calls the user's function.
	run func(ctx context.Context, e Event, meta Metadata) error
}

// Handle registers fn as the handler of events of type T (one handler per
// topic and content schema). The consumer subscribes to the topics of all
// registered handlers. Register before Run; registering while Run runs
// returns ErrRunning. A topic that is not a legal Kafka topic with
// Config.TopicPrefix (letters, digits, '.', '_' and '-', at most 249
// bytes, neither "." nor "..") returns an error wrapping ErrInvalidEvent.
func Handle[T Event](c *Client, fn HandlerFunc[T], opts ...HandleOption) error {
	if fn == nil {
		return fmt.Errorf("%w: nil handler function", ErrConfig)
	}
	var pol handlerPolicy
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&pol); err != nil {
			return err
		}
	}
	var sample T
	switch t := reflect.TypeFor[T](); t.Kind() {
	case reflect.Interface:
		return fmt.Errorf("%w: Handle needs a concrete event type, not an interface", ErrConfig)
	case reflect.Pointer:
		// Call Topic and ContentSchema on a non-nil value.
		sample = reflect.New(t.Elem()).Interface().(T)
	}
	key := handlerKey{topic: sample.Topic(), schema: sample.ContentSchema()}
	if err := checkName("topic", key.topic); err != nil {
		return err
	}
	if err := checkName("content schema", key.schema); err != nil {
		return err
	}
	if err := checkKafkaTopic(c.cfg.TopicPrefix + key.topic); err != nil {
		return fmt.Errorf("%w: topic %q: %w", ErrInvalidEvent, key.topic, err)
	}
	h := &handler{
		key: key,
		pol: pol,
		decode: func(c *Client, payload []byte) (Event, error) {
			var v T
			if err := json.Unmarshal(payload, &v); err != nil {
				return nil, fmt.Errorf("%w: decode %s payload: %w", ErrMalformedRecord, key.schema, err)
			}
			if err := c.validateEvent(key.schema, v); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrMalformedRecord, err)
			}
			return v, nil
		},
		run: func(ctx context.Context, e Event, meta Metadata) error {
			return fn(ctx, e.(T), meta)
		},
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return ErrRunning
	}
	if _, dup := c.handlers[key]; dup {
		return fmt.Errorf("%w: topic %q, content schema %q", ErrDuplicateHandler, key.topic, key.schema)
	}
	c.handlers[key] = h
	return nil
}

// MustHandle is Handle that panics on error, for registration at start-up
// where an error is a programming mistake.
func MustHandle[T Event](c *Client, fn HandlerFunc[T], opts ...HandleOption) {
	if err := Handle(c, fn, opts...); err != nil {
		panic(err)
	}
}

// subscribedTopics returns the topics of the registered handlers.
func (c *Client) subscribedTopics() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	var topics []string
	for k := range c.handlers {
		if !seen[k.topic] {
			seen[k.topic] = true
			topics = append(topics, k.topic)
		}
	}
	return topics
}

func (c *Client) handlerFor(topic, schema string) *handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handlers[handlerKey{topic: topic, schema: schema}]
}

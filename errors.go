package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/event-outbox/outbox/internal/inboxhost"
	"github.com/event-outbox/outbox/internal/operator"
	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/topicmeta"
)

// The errors of the package: every sentinel and error type a caller may
// test with errors.Is or errors.As, grouped by where they come from. Errors
// are wrapped with %w, so the cause (a MongoDB or Kafka error, a context's
// cancellation) stays in the chain below the sentinel.

// Configuration and start-up.

// ErrNotReady is wrapped by the error of Client.Ready and Server.Ready:
// the Client or Server is not (yet, or no longer) able to serve.
var ErrNotReady = errors.New("outbox: not ready")

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("outbox: invalid config")

// ErrRunning is returned when a Client is changed or run while Run runs.
var ErrRunning = errors.New("outbox: client is running")

// ErrDuplicateHandler is returned by Handle when a handler for the same
// topic and content schema is already registered.
var ErrDuplicateHandler = errors.New("outbox: a handler is already registered for this topic and content schema")

// ErrIndexConflict is returned by EnsureIndexes (and ends Run) when a
// collection holds an index that cannot be reconciled with one the
// framework needs: an index under the framework's name with another key or
// filter, or an index with the same key and filter whose other options (TTL
// or not, unique, sparse) differ. Retrying cannot fix it: drop or rename the
// index, or point the client at other collections. The error names the
// collection and both definitions.
var ErrIndexConflict = store.ErrIndexConflict

// ErrInboxOwned is returned by EnsureIndexes, and ends Run, when the inbox
// collection belongs to another consumer group. An inbox collection belongs
// to one consumer group: the inbox _id is {topic, content_schema,
// idempotency_key}, so two groups sharing a collection would take each
// other's entries for their own and skip events. The first consuming client
// to start stamps the collection with its Config.ConsumerGroup (in the
// outbox_meta collection); a client of another group is refused. Give each
// service sharing a database its own Config.InboxCollection.
var ErrInboxOwned = errors.New("outbox: inbox collection belongs to another consumer group")

// ErrKafkaGroup wraps a fatal error of a Kafka consumer group.
var ErrKafkaGroup = errors.New("outbox: Kafka group error")

// Recording events.

// ErrNoTransaction is returned by Record when its context does not come
// from Client.Transact or from a handler: an event recorded outside a
// transaction could be published for a change that never commits.
var ErrNoTransaction = errors.New("outbox: Record needs the context of Client.Transact or of a handler")

// ErrForeignTransaction is returned by Client.Transact when its context
// carries the transaction of another Client (from that Client's Transact
// or handler): joining it would record the events into the other Client's
// outbox, under its PublishTopics, not into this one's. The error names
// both Clients. Record the events in a transaction of this Client instead
// (for example after the other one commits).
var ErrForeignTransaction = errors.New("outbox: the context carries the transaction of another Client")

// ErrUnknownTopic is returned by Record for an event whose topic is not in
// Config.PublishTopics: no publisher would ever publish it.
var ErrUnknownTopic = errors.New("outbox: topic is not in Config.PublishTopics")

// ErrInvalidEvent is the sentinel wrapped by every error that refuses an
// event at record time: validation failures, bad envelope fields.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// ValidationError reports an event field that failed validation.
type ValidationError struct {
	// ContentSchema is the event's type name.
	ContentSchema string
	// Field is the struct field's path (for example "OrderCreated.Amount").
	Field string
	// Tag is the failed validation tag (for example "gt").
	Tag string
	// Err is the underlying error.
	Err error
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox: invalid event %s: field %s failed %q", e.ContentSchema, e.Field, e.Tag)
}

// Unwrap returns ErrInvalidEvent and the validator's error.
func (e *ValidationError) Unwrap() []error { return []error{ErrInvalidEvent, e.Err} }

// ErrPayloadNotObject and ErrEnvelopeCollision are wrapped (with
// ErrInvalidEvent) by Record for an event of an event-outbox topic whose
// JSON cannot be laid out flat beside the library's envelope fields.
var (
	ErrPayloadNotObject  = errors.New("outbox: event-outbox format needs a JSON object")
	ErrEnvelopeCollision = errors.New("outbox: event field collides with an event-outbox envelope field")
)

// ErrEventTooLarge is wrapped (with ErrInvalidEvent) by the error Record
// returns for an event whose Kafka record cannot fit in its topic's
// max.message.bytes, even compressed with the publisher's codec, when that
// limit is known (read from Kafka by this service, or by another replica
// and stored in MongoDB). The error is an *EventTooLargeError with the
// sizes. Without a known limit Record accepts the event, and an event
// Kafka refuses is marked failed by the publisher.
var ErrEventTooLarge = errors.New("outbox: event too large for its topic")

// EventTooLargeError reports an event that cannot fit in its topic (see
// ErrEventTooLarge).
type EventTooLargeError struct {
	// Topic and ContentSchema identify the event.
	Topic, ContentSchema string
	// Size is the size of a Kafka record batch holding the event alone,
	// before compression; CompressedSize an estimate of it compressed with
	// the producer's codec.
	Size, CompressedSize int
	// Limit is the topic's max.message.bytes.
	Limit int
}

func (e *EventTooLargeError) Error() string {
	return fmt.Sprintf("outbox: event %s too large for topic %q: %d bytes, about %d compressed, above its max.message.bytes of %d",
		e.ContentSchema, e.Topic, e.Size, e.CompressedSize, e.Limit)
}

// Unwrap returns ErrInvalidEvent and ErrEventTooLarge.
func (e *EventTooLargeError) Unwrap() []error { return []error{ErrInvalidEvent, ErrEventTooLarge} }

// ErrDuplicateEvent is returned (wrapped) when recording an event whose
// topic, content schema and idempotency key are those of an event already in
// the outbox, with Config.UniqueIdempotencyKeys.
var ErrDuplicateEvent = errors.New("outbox: an event with this topic, content schema and idempotency key is already in the outbox")

// ErrPartitionsUnknown is returned by Record for an event whose topic's
// partition count is unknown: never read from Kafka by this service (no
// count persisted in MongoDB) and Kafka unreachable now. The transaction is
// aborted when the caller returns the error; retry once Kafka is reachable.
// It happens only on a service's first-ever start during a Kafka outage
// (or for a topic that does not exist): later starts use the persisted
// counts.
var ErrPartitionsUnknown = topicmeta.ErrPartitionsUnknown

// ErrTopicMetadata wraps failures to learn a topic's partition count from
// Kafka.
var ErrTopicMetadata = topicmeta.ErrTopicMetadata

// Consuming events.

// ErrMalformedRecord wraps every reason a Kafka record cannot be decoded
// into an event envelope. The consumer parks such records at once.
var ErrMalformedRecord = errors.New("outbox: malformed record")

// ErrHandlerPanic wraps the value of a handler's panic; a value that is an
// error stays in the chain (errors.Is and errors.As see it).
var ErrHandlerPanic = errors.New("outbox: handler panicked")

// ErrAttemptsExhausted is the last error of an event parked because its
// attempts ran out without a handler error to show: the processes that ran
// them stopped (or lost the partition) during each of them.
var ErrAttemptsExhausted = errors.New("outbox: attempts exhausted")

// Parked events (Client.Redrive, Admin).

// ErrNotParked is returned by Redrive for an event that is not parked.
var ErrNotParked = operator.ErrNotParked

// ErrNoHandler is returned by Redrive for an event no registered handler
// accepts.
var ErrNoHandler = errors.New("outbox: no handler for the event")

// ErrHeld is returned by Redrive for an event held behind a parked event
// of its key (Config.PoisonPolicy HoldKey): re-drive that one, and the held
// events follow in order.
var ErrHeld = inboxhost.ErrHeld

// ErrRedriveDeferred is wrapped by the error Client.Redrive returns when
// the re-drive could not run for a reason that is not the handler's: the
// handler asked to run later (Snooze), a write met a conflict or a lock, or
// MongoDB failed. Nothing was counted: the event stays parked as it was,
// and an Admin.RequestRedrive request stays pending until it runs. See
// RedriveDeferredError.
var ErrRedriveDeferred = errors.New("outbox: re-drive deferred")

// RedriveDeferredError is the error of a re-drive that did not run for a
// reason that is not the handler's (see ErrRedriveDeferred).
type RedriveDeferredError struct {
	// Reason is "snoozed", "conflict", "locked" or "infra".
	Reason string
	// RetryAfter is when trying again makes sense: the handler's snooze,
	// or a backoff.
	RetryAfter time.Duration
	// Err is what stopped the re-drive.
	Err error
}

func (e *RedriveDeferredError) Error() string {
	return fmt.Sprintf("outbox: re-drive deferred (%s, retry in %s): %v", e.Reason, e.RetryAfter.Round(time.Millisecond), e.Err)
}

// Unwrap returns ErrRedriveDeferred and the cause.
func (e *RedriveDeferredError) Unwrap() []error { return []error{ErrRedriveDeferred, e.Err} }

// ErrNotRedrivable is returned by Admin.RequestRedrive and Client.Redrive
// for a parked record whose envelope could not be read (see
// ParkedEvent.LastError): it has no reliable identity and can never be
// handled. Purge it (Admin.PurgeParked) instead.
var ErrNotRedrivable = operator.ErrNotRedrivable

// ErrPayloadTruncated is returned when a parked event whose payload was too
// large to store whole in the inbox is re-driven: only its first bytes are
// kept, for inspection. Purge it, and replay the record from Kafka if
// needed.
var ErrPayloadTruncated = errors.New("outbox: stored payload is truncated")

// Handler errors: errors a handler returns to steer what happens to its event, in the
// style of river's JobCancel and JobSnooze. Any other error is retried with
// backoff and parks the event after Config.MaxAttempts attempts.

// Park returns an error that parks the event at once, without the
// remaining attempts: a permanent failure (a payload the handler will never
// accept, a business rule that refuses it). The transaction is rolled back
// as for any error; err is stored as the event's last error (nil gives
// "parked by the handler"). Under Config.PoisonPolicy HoldKey the later
// events of its partition key are held behind it.
func Park(err error) error {
	if err == nil {
		err = errors.New("parked by the handler")
	}
	return &ParkError{Err: err}
}

// ParkError is the error Park returns.
type ParkError struct {
	// Err is why the handler parked the event.
	Err error
}

func (e *ParkError) Error() string { return "park: " + e.Err.Error() }
func (e *ParkError) Unwrap() error { return e.Err }

// Snooze returns an error that rolls the transaction back and runs the
// handler again after d without using an attempt: for a dependency that is
// known to be busy, or an event that arrived before the state it needs. The
// partition waits meanwhile (its events are handled in order), so keep d
// short; the first Config.MaxSnoozes snoozes of an event are free, later
// ones count as attempts, so an event that snoozes for ever ends parked. A
// negative d is taken as 0; a snooze is cut short when the partition is
// revoked or the Client stops (the event is redelivered to its next owner).
func Snooze(d time.Duration) error { return &SnoozeError{Duration: max(d, 0)} }

// SnoozeError is the error Snooze returns.
type SnoozeError struct {
	// Duration is how long to wait before the next run.
	Duration time.Duration
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("snooze for %s", e.Duration) }

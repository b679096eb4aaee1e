package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
)

// TopicPartition names one Kafka partition (its bare topic: without
// Config.TopicPrefix).
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic/partition".
func (tp TopicPartition) String() string { return fmt.Sprintf("%s/%d", tp.Topic, tp.Partition) }

// Event is one record of a partition in the consumer's hands, as the host
// decoded it.
type Event struct {
	Offset int64
	Epoch  int32 // leader epoch of the record, for the offset commit
	// Key is the partition key; "" for an event without one (no order to
	// keep: it never holds or is held).
	Key string
	// Bytes counts the record's value, for the queue bound.
	Bytes int
	// Fault, when set, is why the event cannot be handled (a malformed
	// record): it is parked at once, holding its key.
	Fault error
	// NoHandler is set when no handler accepts the event: it is parked
	// with reason "no handler" (holding its key), or skipped with
	// Config.SkipUnknown, even when its key is held (it would be skipped
	// had the key been free, and nothing may wait for it).
	NoHandler bool
	// Policy is the retry policy of the event's handler.
	Policy Policy
	// Data is the host's decoded record; dropped once settled.
	Data any

	// Attempts counts the attempts stored for the event as far as this
	// process knows (those of earlier owners included once read back): the
	// next run is attempt Attempts+1, or Attempts when Counted.
	Attempts int
	// Counted tells that the next run's attempt was counted before it ran
	// (the first events a worker handles after its assignment, which an
	// earlier owner may have been running when it died).
	Counted bool
	// Failures counts the runs whose handler failed, as far as this
	// process knows (stored ones of earlier owners included once read
	// back): what MaxAttempts bounds. Attempts-Failures are the runs that
	// ended without a result (counted before they ran, then the process
	// died or lost the partition): churn, unless it keeps happening.
	Failures int

	// looked is set once the event's inbox state was read before a run.
	looked bool
	// mustCount: its attempt is to be counted before its next run (it was
	// in one of the first units after the assignment, whose count failed).
	mustCount bool
	// Scheduling state, owned by the worker goroutine.
	state   eventState
	readyAt time.Time
	alone   bool
	// Free retries of this process (not attempts).
	snoozes, conflicts, infra int
	// Since when the event waits on failures, and the last one: for Waits.
	failingSince time.Time
	lastFailure  string
}

// Attempt is the attempt number of the event's next run.
func (e *Event) Attempt() int {
	if e.Counted {
		return e.Attempts
	}
	return e.Attempts + 1
}

// Policy is a handler's retry policy.
type Policy struct {
	// MaxAttempts runs of a failing handler before its event is parked.
	MaxAttempts int
	// Backoff spaces the retries of a failing handler.
	Backoff retry.Backoff
	// MaxSnoozes is how many snoozes of an event are free in a process.
	MaxSnoozes int
}

// Head is the state of a held key's sequence: its first event.
type Head struct {
	// ID names the head event (for logs and waits).
	ID string
	// Since is when the head was parked.
	Since time.Time
	// Releasable: the head may be handled now without an operator (it was
	// only waiting behind an event that is gone, or it was parked for want
	// of a handler that this process has).
	Releasable bool
}

// Stored is an event's inbox state read before its transaction.
type Stored struct {
	// Done: the event is handled or parked already.
	Done bool
	// Attempts is the stored attempt count (after the count, with count).
	Attempts int
	// Failures is the stored count of failed runs.
	Failures int
}

// Tally is an event's stored counts after a write: Attempts (every run
// counted, see Event.Attempts) and Failures (the runs whose handler
// failed).
type Tally struct {
	Attempts, Failures int
}

// Kind is the outcome of a handling transaction.
type Kind int

const (
	// Handled: the transaction committed.
	Handled Kind = iota
	// Duplicate: event At is handled or parked already; nothing committed.
	Duplicate
	// Failed: event At's handler returned Err (Park: it asked to park).
	Failed
	// Snoozed: event At's handler asked to run again after Snooze.
	Snoozed
	// Conflict: a write of event At's handler, or the commit of its
	// transaction, met a transient transaction error (write conflict,
	// failover): the first few retries are free.
	Conflict
	// CommitFailed: the handlers returned nil but the transaction did not
	// commit, for another reason than a write conflict (a batch's: any);
	// it counts as an attempt.
	CommitFailed
	// Locked: a write of the framework's own met a document locked by
	// another session's transaction (a replica that died with it open):
	// retried, never counted.
	Locked
	// Infra: the framework's own calls failed before the handlers ran
	// (MongoDB unreachable): retried with backoff, never counted.
	Infra
	// Canceled: the context ended (stop, loss, shutdown).
	Canceled
	// Empty: a release found no sequence for the key (release only).
	Empty
	// HeadParked: a release found the key's head parked for good
	// (release only): it waits for an operator.
	HeadParked
	// Skipped: a release took the key's head off the sequence without
	// running it, because no handler takes it and Config.SkipUnknown
	// (release only): the next event is the head.
	Skipped
)

var kindNames = [...]string{"handled", "duplicate", "failed", "snoozed", "conflict", "commit_failed", "locked", "infra", "canceled", "empty", "head_parked", "skipped"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Result is the outcome of a handling transaction or a release step.
type Result struct {
	Kind Kind
	// At is the index of the event Kind is about, in a run of deliveries.
	At  int
	Err error
	// Park is set with Failed when the handler asked to park its event.
	Park bool
	// Snooze is the delay asked for with Snoozed.
	Snooze time.Duration
}

// Errors of the host's sequence operations.
var (
	// ErrKeyFree: the key holds nothing (Hold).
	ErrKeyFree = errors.New("consume: key not held")
	// ErrDone: the event is handled or parked already.
	ErrDone = errors.New("consume: event handled or parked already")
	// ErrLocked wraps a write that met a document locked by another
	// session's open transaction.
	ErrLocked = errors.New("consume: document locked by another transaction")
)

// Host is what the root package provides: decoding, the inbox and its key
// sequences, handling transactions and offset commits. Every method is
// safe for concurrent use; each of its writes is one MongoDB transaction
// (or one single-document write) whose effect is whole or absent, so a
// crash between two calls leaves nothing to repair.
type Host interface {
	// Decode reads a record (bare topic). It never fails: a record that
	// cannot be handled comes back with Fault or NoHandler set.
	Decode(rec *kgo.Record) *Event
	// Sequences returns the held keys of a partition and their heads.
	Sequences(ctx context.Context, tp TopicPartition) (map[string]Head, error)
	// Head returns the head of key's sequence; ok is false when the key
	// holds nothing.
	Head(ctx context.Context, tp TopicPartition, key string) (h Head, ok bool, err error)
	// Hold adds e at the end of its key's sequence: ErrKeyFree when the key
	// has none, ErrDone when e is handled or parked already.
	Hold(ctx context.Context, tp TopicPartition, e *Event) error
	// Park parks e for cause, with inc more attempts and fails more
	// failures, and returns the stored counts; ErrDone when it is handled
	// or parked already. reason is one of "handler_error",
	// "handler_parked", "malformed", "no_handler", "attempts_exhausted".
	Park(ctx context.Context, tp TopicPartition, e *Event, cause error, inc, fails int, reason string) (Tally, error)
	// NoteFailure stores a failed run of e (not parked), inc more
	// attempts (0 when the run was counted before it ran) and the cause,
	// and returns the stored counts; ErrDone.
	NoteFailure(ctx context.Context, tp TopicPartition, e *Event, cause error, inc int) (Tally, error)
	// Lookup reads the stored state of evs; with count it first counts one
	// attempt of each that is not done.
	Lookup(ctx context.Context, tp TopicPartition, evs []*Event, count bool) ([]Stored, error)
	// Handle runs evs in one transaction: their claims, then their
	// handlers in order.
	Handle(ctx context.Context, tp TopicPartition, evs []*Event) Result
	// Release handles the head of key's sequence when it is releasable, in
	// one transaction that takes it off the sequence. It returns the event
	// it ran or skipped (nil with Empty and HeadParked).
	Release(ctx context.Context, tp TopicPartition, key string) (*Event, Result)
	// NoteReleaseFailure stores a failed attempt of a sequence's head
	// (inc more attempts and failures); with park the head is parked for
	// good (reason as Park). It returns the stored counts.
	NoteReleaseFailure(ctx context.Context, tp TopicPartition, e *Event, cause error, inc int, park bool, reason string) (Tally, error)
	// Commit commits the partition's offset.
	Commit(ctx context.Context, tp TopicPartition, offset int64, epoch int32) error
	// Reap is called when a write met a lock: the host ends the sessions of
	// replicas that died with transactions open (rate-limited by the host).
	Reap()
}

// How an event was settled, for Observer.Settled.
const (
	SettledHandled = "handled"
	SettledSkipped = "skipped"
	SettledParked  = "parked"
	SettledHeld    = "held"
)

// Observer watches the stages: metrics and logs. Calls come from several
// goroutines.
type Observer interface {
	// Settled reports an event settled (how: Settled*; reason says why for
	// skipped and parked events: "duplicate", "no_handler", "handler_error",
	// "handler_parked", "malformed", "attempts_exhausted").
	Settled(tp TopicPartition, e *Event, how, reason string)
	// Retry reports a run that will be retried (reason: "error",
	// "snooze", "conflict", "infra", "locked") after delay.
	Retry(tp TopicPartition, e *Event, reason string, err error, delay time.Duration)
	// Released reports a held event handled by a release step.
	Released(tp TopicPartition, e *Event)
	// Error reports a failure worth the status' last error.
	Error(err error)
}

package inboxhost

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
)

// ID is the _id of an inbox document: the root's outbox.InboxID, which
// converts to and from it (same fields, same order, so the same stored
// document).
type ID struct {
	Topic          string `bson:"topic"`
	ContentSchema  string `bson:"content_schema"`
	IdempotencyKey string `bson:"idempotency_key"`
}

// Doc is an inbox document as the host reads it.
type Doc = store.InboxDoc[ID]

// Delivery is what the host reads of a decoded record: the root's
// consume.Event.Data implements it.
type Delivery interface {
	// InboxID is the event's inbox document _id.
	InboxID() ID
	// At is what the inbox keeps of the delivery at offset.
	At(offset int64) store.Delivery
	// Payload is the handler's payload, or the record's value when the
	// record could not be read.
	Payload() []byte
	// Unreadable reports a record whose envelope could not be read: it is
	// stored so, and can never be re-driven.
	Unreadable() bool
	// Ref is the claim-check reference of an event whose payload is
	// stored out of band, kept with it in the inbox; empty otherwise.
	Ref() string
}

func deliveryOf(e *consume.Event) Delivery { return e.Data.(Delivery) }

// App is the root package's side of the host: the handlers and the
// transactions they record events in. Its methods are safe for concurrent
// use.
type App interface {
	// Begin starts one attempt of a transaction (majority write concern)
	// in a session of its own, recorded for takeover before it starts.
	Begin(ctx context.Context) (*Tx, error)
	// Stored rebuilds the event of a stored inbox document, for a release
	// or a re-drive. The event comes back with an error when it cannot run
	// here: NoHandler set when no handler takes it, Fault set when its
	// payload does not decode.
	Stored(ctx context.Context, d *Doc) (*consume.Event, error)
	// Resolve reads, before their transaction, the payloads of evs that
	// are stored out of band (the claim check; its database may be
	// another deployment's). ok is false when one could not be: res says
	// which and how it fails. actx is bounded by the handlers' timeout.
	Resolve(ctx, actx context.Context, evs []*consume.Event) (res consume.Result, ok bool)
	// Transient reports an error of Stored that is the store failing
	// rather than the event (the claim-check database unreachable): the
	// release is tried again instead of parking the event.
	Transient(err error) bool
	// Timeout bounds one run of e's handler (and its transaction).
	Timeout(e *consume.Event) time.Duration
	// Run runs e's handler under ctx as attempt number attempt, and
	// returns its error and a function that ends the run's span, given the
	// outcome of the transaction (nil, *HandlerError, *CommitError or the
	// framework's own error); start is when the attempt began.
	Run(ctx context.Context, e *consume.Event, attempt int, start time.Time) (end func(error), err error)
	// Steer reads what a handler's error asks for: to park its event at
	// once, or to run it again after snooze without using an attempt.
	Steer(err error) (park bool, snooze time.Duration, snoozed bool)
	// Refused reports an error of the insert of the events the handlers
	// recorded that the handlers caused (an event the outbox refuses).
	Refused(err error) bool
	// Releasable reports whether a head parked for want of a handler may
	// be released here (this process has its handler, or skips events
	// without one).
	Releasable(id ID) bool
}

// Config configures a Host.
type Config struct {
	// Inbox is the inbox collection.
	Inbox *mongo.Collection
	// App is the root's side.
	App App
	// SkipUnknown: an event no handler takes is skipped, also when it
	// heads its key's sequence (Config.SkipUnknownEvents).
	SkipUnknown bool
}

// Host implements the inbox operations of consume.Host: Sequences, Head,
// Hold, Park, NoteFailure, Lookup, Handle, Release and NoteReleaseFailure.
// The root adds Decode, Commit and Reap.
type Host struct {
	inbox       *mongo.Collection
	app         App
	skipUnknown bool
}

// New returns a Host on cfg.Inbox.
func New(cfg Config) *Host {
	return &Host{inbox: cfg.Inbox, app: cfg.App, skipUnknown: cfg.SkipUnknown}
}

// Tx is one attempt of a consumer transaction, begun by App.Begin.
type Tx struct {
	// Sess is the transaction's session.
	Sess *mongo.Session
	// Ctx carries the session and the events the attempt records.
	Ctx context.Context
	// Flush inserts the events the handlers recorded; it runs before the
	// commit, in the transaction.
	Flush func(ctx context.Context) error
	// Committed runs after a commit (it counts the recorded events).
	Committed func(ctx context.Context)
}

// Commit commits the transaction (see store.Commit); its error wraps
// consume.ErrLocked on a write conflict.
func (t *Tx) Commit(ctx context.Context) error { return LockedOr(store.Commit(ctx, t.Sess)) }

// End ends the session, aborting the transaction if it is still open.
func (t *Tx) End(ctx context.Context) { store.End(ctx, t.Sess) }

// txOnce runs fn in one transaction attempt and commits. Its error wraps
// consume.ErrLocked when a write met another transaction's lock.
func (h *Host) txOnce(ctx context.Context, fn func(ctx context.Context) error) error {
	t, err := h.app.Begin(ctx)
	if err != nil {
		return err
	}
	defer t.End(ctx)
	if err := fn(t.Ctx); err != nil {
		return LockedOr(err)
	}
	return t.Commit(ctx)
}

// LockedOr wraps consume.ErrLocked around a write conflict (a document
// another transaction is writing, or wrote after this one's snapshot).
func LockedOr(err error) error {
	if store.IsWriteConflict(err) {
		return fmt.Errorf("%w: %w", consume.ErrLocked, err)
	}
	return err
}

// ErrAlreadyDone reports a claim that met an event handled or parked
// already.
var ErrAlreadyDone = errors.New("outbox: event already handled or parked")

// ErrHeld is wrapped by a re-drive of an event held behind a parked event
// of its key (ReleaseHead with want).
var ErrHeld = errors.New("outbox: event is held behind a parked event of its key")

// HandlerError marks an error that comes from the user's handler (or from
// the events it recorded), as opposed to the framework's own MongoDB calls.
type HandlerError struct{ Err error }

func (e *HandlerError) Error() string { return e.Err.Error() }

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// CommitError marks a transaction that failed after the handler returned
// nil: its commit (or the insert of the events it recorded) failed, for
// example because the attempt outlived its handler's timeout or the
// server's transaction lifetime. It counts as an attempt: retrying it as an
// infrastructure failure would run a handler that always outlives the
// transaction for ever.
type CommitError struct{ Err error }

func (e *CommitError) Error() string {
	return "transaction failed after the handler returned: " + e.Err.Error()
}

// Unwrap returns the commit's error.
func (e *CommitError) Unwrap() error { return e.Err }

package outbox

// Delayed publication: an event recorded with WithPublishAt or WithDelay
// is inserted, in the caller's transaction, into the collection of
// scheduled events (Config.OutboxCollection + "_scheduled"), not into the
// outbox; at its due time the publisher that owns its partition promotes
// it into the outbox in one transaction (internal/schedule), and the
// publisher publishes it as any other event. CancelScheduled deletes it
// before then.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/liveness"
	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/schedule"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// WithPublishAt records the event now, in the transaction, and publishes
// it at t instead of once the transaction commits: it waits in the
// collection of scheduled events (Config.OutboxCollection + "_scheduled")
// until the publisher that owns its partition moves it into the outbox at
// t, usually well within a second after t (docs/guarantees.md, "Delayed
// publication"). It counts as recorded then: per partition key, it is
// published after every event committed before its due time and before
// every event committed after its move. Until then CancelScheduled
// cancels it by its idempotency key. A t that is not after the time of
// Record records the event for immediate publication.
func WithPublishAt(t time.Time) RecordOption {
	return func(o *recordOptions) { o.publishAt = t }
}

// WithDelay is WithPublishAt(time.Now().Add(d)), taken when Record runs.
// A d of zero or less records the event for immediate publication.
func WithDelay(d time.Duration) RecordOption {
	return func(o *recordOptions) { o.publishAt = time.Now().Add(d) }
}

// ErrTooLate is returned by CancelScheduled when the event is no longer
// scheduled: its due time came and it was moved into the outbox, to be
// published (or already published). Cancelling cannot take it back.
var ErrTooLate = errors.New("outbox: too late to cancel: the scheduled event is due and in the outbox")

// ErrNotScheduled is returned by CancelScheduled when no event of the topic
// with the idempotency key is scheduled: never scheduled, already
// cancelled, or moved into the outbox longer ago than
// Config.OutboxRetention (whose record of the move has expired).
var ErrNotScheduled = errors.New("outbox: no scheduled event with this idempotency key")

// scheduledFor returns the publication time opts ask for, when it is
// after now.
func scheduledFor(opts []RecordOption) (time.Time, bool) {
	var o recordOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.publishAt.IsZero() || !o.publishAt.After(time.Now()) {
		return time.Time{}, false
	}
	return o.publishAt.UTC().Truncate(time.Millisecond), true
}

// schedule keeps doc to be inserted as a scheduled event due at due.
func (tx *txState) schedule(doc *outboxDoc, due time.Time) {
	tx.scheduled = append(tx.scheduled, &store.ScheduledDoc{OutboxDoc: *doc, DueAt: due})
}

// flushScheduled inserts the scheduled events of the transaction into
// the scheduled events' collection in one insertMany.
func (tx *txState) flushScheduled(ctx context.Context) error {
	if len(tx.scheduled) == 0 {
		return nil
	}
	c := tx.client
	if err := c.checkNotRecorded(ctx, tx.scheduled); err != nil {
		return err
	}
	if _, err := c.scheduled.InsertMany(ctx, tx.scheduled); err != nil {
		return flushError(len(tx.scheduled), err)
	}
	// Counted as recorded at this commit (telemetry.Recorded), and as
	// promoted by the replica that promotes them.
	if tx.counts == nil {
		tx.counts = map[string]int64{}
	}
	for _, d := range tx.scheduled {
		tx.counts[d.(*store.ScheduledDoc).Topic]++
		tx.countClaim(&d.(*store.ScheduledDoc).OutboxDoc)
	}
	tx.scheduled = tx.scheduled[:0]
	return nil
}

// CancelScheduled cancels, in the transaction of ctx (from Client.Transact
// or a handler, else ErrNoTransaction), the events of topic scheduled with
// WithPublishAt or WithDelay under idempotencyKey that are not due yet:
// they are deleted when the transaction commits, and never published; the
// payload of one stored out of band (Config.ClaimCheck) is marked in the
// same transaction to expire as a published event's does.
// It returns an error wrapping ErrTooLate when such an event was already
// moved into the outbox at its due time (it is or will be published), and
// ErrNotScheduled when there is none (see ErrNotScheduled). A cancellation
// that races the event's move into the outbox is decided by MongoDB: one
// of the two transactions meets the other's write and is retried, and
// then sees the other's outcome.
func CancelScheduled(ctx context.Context, topic, idempotencyKey string) error {
	tx := txFrom(ctx)
	if tx == nil {
		return ErrNoTransaction
	}
	c := tx.client
	if !c.publishTopics[topic] {
		return fmt.Errorf("%w: %q", ErrUnknownTopic, topic)
	}
	// Events scheduled by this transaction are not inserted yet, nor are
	// their chunks.
	before := len(tx.scheduled)
	dropped := map[bson.ObjectID]bool{}
	tx.scheduled = slices.DeleteFunc(tx.scheduled, func(d any) bool {
		s := d.(*store.ScheduledDoc)
		if s.Topic != topic || s.IdempotencyKey != idempotencyKey {
			return false
		}
		if s.PayloadRef != nil {
			dropped[*s.PayloadRef] = true
		}
		return true
	})
	if len(dropped) > 0 {
		tx.chunks = slices.DeleteFunc(tx.chunks, func(ch any) bool { return dropped[ch.(*claimcheck.Chunk).Ref] })
	}
	_, err := cancelStored(ctx, c.scheduled, c.claims, topic, idempotencyKey, len(tx.scheduled) < before, false)
	return err
}

// CancelScheduled cancels the events of topic scheduled under
// idempotencyKey that are not due yet, in a transaction of its own, and
// returns how many it deleted (with dryRun, how many it would delete,
// deleting nothing), with the outcomes of the package's CancelScheduled:
// an error wrapping ErrTooLate when the event was already moved into the
// outbox (it is or will be published), ErrNotScheduled when there is none.
// The payload of a cancelled event stored out of band is marked to expire
// in the same transaction. A cancellation that meets the event's move
// into the outbox is ordered by MongoDB: the move's transaction marks the
// event promoted only while it is not deleted, and the deletion deletes
// it only while it is not promoted, so exactly one of the two takes
// effect, and a cancellation after the move reports ErrTooLate. It is the
// operator's cancellation (the console); a service cancels in its
// business transaction with CancelScheduled.
func (a *Admin) CancelScheduled(ctx context.Context, topic, idempotencyKey string, dryRun bool) (int64, error) {
	if dryRun {
		return cancelStored(ctx, a.scheduled(), nil, topic, idempotencyKey, false, true)
	}
	sess, err := a.outbox.Database().Client().StartSession()
	if err != nil {
		return 0, fmt.Errorf("outbox: cancel scheduled event %s/%s: start session: %w", topic, idempotencyKey, err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	n, err := store.WithTransaction(ctx, sess, func(sctx context.Context) (any, error) {
		return cancelStored(sctx, a.scheduled(), a.claims, topic, idempotencyKey, false, false)
	})
	if err != nil {
		return 0, err
	}
	return n.(int64), nil
}

// cancelStored deletes the stored scheduled events of topic with
// idempotencyKey that are not promoted (with dryRun, counts them) and
// returns their number; cancelled says the caller's transaction cancelled
// such an event before it was inserted. claims, when not nil, is the claim
// check's store: the chunks of the deleted events are marked there to
// expire as a published event's, in the transaction of ctx, so that an
// aborted cancellation leaves them waiting with their event. With nothing
// deleted nor cancelled, it tells ErrTooLate (a promoted event's tombstone
// remains) from ErrNotScheduled.
func cancelStored(ctx context.Context, coll *mongo.Collection, claims *claimcheck.Store, topic, idempotencyKey string, cancelled, dryRun bool) (int64, error) {
	var n int64
	var err error
	if dryRun {
		n, err = coll.CountDocuments(ctx, store.ScheduledKeyFilter(topic, idempotencyKey, true))
	} else {
		n, err = deleteScheduled(ctx, coll, claims, topic, idempotencyKey)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: cancel scheduled event %s/%s: %w", topic, idempotencyKey, err)
	}
	if n > 0 || cancelled {
		return n, nil
	}
	err = coll.FindOne(ctx, store.ScheduledKeyFilter(topic, idempotencyKey, false),
		options.FindOne().SetProjection(bson.D{{Key: store.OutboxID, Value: 1}})).Err()
	switch {
	case err == nil:
		return 0, fmt.Errorf("%w: topic %q, idempotency key %q", ErrTooLate, topic, idempotencyKey)
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, fmt.Errorf("%w: topic %q, idempotency key %q", ErrNotScheduled, topic, idempotencyKey)
	default:
		return 0, fmt.Errorf("outbox: cancel scheduled event %s/%s: %w", topic, idempotencyKey, err)
	}
}

// deleteScheduled deletes the scheduled events of topic under
// idempotencyKey that are not promoted, marks the chunks of those whose
// payload is stored out of band in claims (when not nil), and returns how
// many it deleted.
func deleteScheduled(ctx context.Context, coll *mongo.Collection, claims *claimcheck.Store, topic, idempotencyKey string) (int64, error) {
	var refs []any
	if claims != nil {
		var err error
		if refs, err = scheduledPayloadRefs(ctx, coll, topic, idempotencyKey); err != nil {
			return 0, err
		}
	}
	res, err := coll.DeleteMany(ctx, store.ScheduledKeyFilter(topic, idempotencyKey, true))
	if err != nil {
		return 0, err
	}
	if len(refs) > 0 {
		if err := claims.MarkPublished(ctx, refs, time.Now()); err != nil {
			return 0, fmt.Errorf("mark its payload to expire: %w", err)
		}
	}
	return res.DeletedCount, nil
}

// scheduledPayloadRefs returns the payload_ref of the scheduled events of
// topic under idempotencyKey in coll that are not promoted and whose
// payload is stored out of band, read in the transaction of ctx that
// deletes them.
func scheduledPayloadRefs(ctx context.Context, coll *mongo.Collection, topic, idempotencyKey string) ([]any, error) {
	filter := append(store.ScheduledKeyFilter(topic, idempotencyKey, true),
		bson.E{Key: store.OutboxPayloadRef, Value: bson.D{{Key: "$exists", Value: true}}})
	cur, err := coll.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: store.OutboxPayloadRef, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("read its payload reference: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var refs []any
	for cur.Next(ctx) {
		if ref, ok := cur.Current.Lookup(store.OutboxPayloadRef).ObjectIDOK(); ok {
			refs = append(refs, ref)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read its payload reference: %w", err)
	}
	return refs, nil
}

// sameEvent selects, under Config.UniqueIdempotencyKeys, the documents of
// docs' events: by {topic, schema, idempotency_key}, what the unique
// indexes of the outbox and of the scheduled events hold unique.
func sameEvent(docs []any) bson.D {
	or := make(bson.A, 0, len(docs))
	for _, d := range docs {
		var o *outboxDoc
		switch d := d.(type) {
		case *outboxDoc:
			o = d
		case *store.ScheduledDoc:
			o = &d.OutboxDoc
		}
		or = append(or, bson.D{{Key: store.OutboxTopic, Value: o.Topic}, {Key: store.OutboxSchema, Value: o.Schema},
			{Key: store.OutboxIdempotencyKey, Value: o.IdempotencyKey}})
	}
	return bson.D{{Key: "$or", Value: or}}
}

// checkNotScheduled refuses, under Config.UniqueIdempotencyKeys, immediate
// events whose idempotency key is scheduled (ErrDuplicateEvent): no one
// index spans both collections. Two transactions committing the same key
// at once, one scheduled and one not, both pass; the promotion of the
// scheduled one then meets the outbox's unique index and marks it failed
// (internal/schedule).
func (c *Client) checkNotScheduled(ctx context.Context, docs []any) error {
	return c.checkUnique(ctx, c.scheduled, docs, "scheduled")
}

// checkNotRecorded refuses, under Config.UniqueIdempotencyKeys, scheduled
// events whose idempotency key is in the outbox (ErrDuplicateEvent).
func (c *Client) checkNotRecorded(ctx context.Context, docs []any) error {
	return c.checkUnique(ctx, c.outbox, docs, "in the outbox")
}

func (c *Client) checkUnique(ctx context.Context, coll *mongo.Collection, docs []any, where string) error {
	if !c.cfg.UniqueIdempotencyKeys {
		return nil
	}
	var found store.OutboxDoc
	err := coll.FindOne(ctx, sameEvent(docs)).Decode(&found)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil
	case err != nil:
		return fmt.Errorf("outbox: check idempotency keys: %w", err)
	}
	return fmt.Errorf("%w (Config.UniqueIdempotencyKeys): event %s of topic %q with idempotency key %q is already %s",
		ErrDuplicateEvent, found.Schema, found.Topic, found.IdempotencyKey, where)
}

// scheduledStreamMaxAwait bounds a getMore of the scheduled events'
// change stream, as the outbox's (internal/publish): a lost stream shows
// within it.
const scheduledStreamMaxAwait = 500 * time.Millisecond

// scheduleFollower runs the promotion of scheduled events beside the
// publisher's workers (publish.Follower): a loop per owned partition
// (internal/schedule), told of new scheduled events by a change stream.
type scheduleFollower struct {
	set   *schedule.Set
	watch *schedule.Watch
}

// newScheduleFollower makes the promotion loops of the publisher's
// partitions; promotion errors show in the publisher's LastError (stats).
// A promotion runs in a session recorded in the replica's liveness record,
// and one that meets a lock asks for a reap of the publisher group: a
// process killed in a promotion leaves its transaction open, and the next
// owner of the partition ends it (internal/liveness/takeover.go).
func (c *Client) newScheduleFollower(log *slog.Logger, stats *publish.Stats) *scheduleFollower {
	reapLog := itel.NewRateLog(itel.ErrorRelog)
	set := schedule.NewSet(schedule.Config{
		Store: schedule.Mongo{Client: c.cfg.Mongo, Scheduled: c.scheduled, Outbox: c.outbox,
			Session: c.sessions.Note, Locked: func() { c.reapDeadPromoters(log, reapLog) }},
		Refill: c.test.scheduleRefill,
		Promoted: func(tp schedule.TopicPartition, n int) {
			c.tel.ins.Promoted.Add(context.Background(), int64(n), itel.TopicAttrs(tp.Topic))
		},
		Backoff: c.cfg.backoff(),
		Logger:  log,
		Failed:  func(err error) { stats.SetError(fmt.Errorf("scheduled events: %w", err)) },
	})
	return &scheduleFollower{set: set,
		watch: &schedule.Watch{Coll: c.scheduled, Set: set, Backoff: c.cfg.backoff(), MaxAwait: scheduledStreamMaxAwait, Logger: log}}
}

// reapDeadPromoters ends, in the background, the recorded sessions of the
// publisher group's replicas that died, at most once per a few seconds.
func (c *Client) reapDeadPromoters(log *slog.Logger, rl *itel.RateLog) {
	p := c.pub.Load()
	if p == nil {
		return
	}
	c.sessions.Reap(liveness.Reaper{
		Kafka: kadm.NewClient(p.GroupClient()), Group: c.cfg.PublisherGroup, Publisher: true,
		ConsumerProtocol: c.cfg.GroupProtocol == GroupConsumer,
		Meta:             c.meta, Mongo: c.cfg.Mongo,
		Reaped: c.test.reapedHook,
		Log:    log,
		Warn: func(msg string, args ...any) {
			rl.Warn(log, msg, "reap", args...)
		},
	})
}

// Assign starts the promotion loops of tps.
func (f *scheduleFollower) Assign(tps []publish.TopicPartition) { f.set.Assign(scheduleTPs(tps)) }

// Revoke stops the promotion loops of tps and returns once they stopped.
func (f *scheduleFollower) Revoke(tps []publish.TopicPartition) { f.set.Revoke(scheduleTPs(tps)) }

// Close stops every promotion loop.
func (f *scheduleFollower) Close() { f.set.Close() }

// Run tells the loops of the events scheduled while it runs, until ctx
// ends.
func (f *scheduleFollower) Run(ctx context.Context) { f.watch.Run(ctx) }

// scheduleTPs converts the publisher's partitions into the promoter's.
func scheduleTPs(tps []publish.TopicPartition) []schedule.TopicPartition {
	out := make([]schedule.TopicPartition, len(tps))
	for i, tp := range tps {
		out[i] = schedule.TopicPartition{Topic: tp.Topic, Partition: tp.Partition}
	}
	return out
}

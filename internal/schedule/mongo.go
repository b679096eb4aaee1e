package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/event-outbox/outbox/internal/store"
)

// ErrRaced is returned by Promote when another promoter (or a
// cancellation) changed the events it read: nothing was promoted, and the
// next attempt reads them again.
var ErrRaced = errors.New("scheduled events changed during their promotion")

// Mongo is the Store of the scheduled events' collection.
type Mongo struct {
	Client    *mongo.Client
	Scheduled *mongo.Collection
	Outbox    *mongo.Collection
	// Timeout bounds one promotion transaction. Defaults to 10 s.
	Timeout time.Duration
	// Session, when set, is given the id of each promotion's session
	// before its transaction starts; its error ends the attempt. The
	// takeover records the id (internal/liveness), so that the next owner
	// of the partition can end the transaction should this process die
	// in it: until then its locks would stop every promotion of the
	// events it read, for MongoDB's transaction lifetime.
	Session func(ctx context.Context, lsid bson.Raw) error
	// Locked, when set, is called when a promotion met another
	// transaction's write (a write conflict): it may be a dead owner's
	// promotion left open, which the takeover ends.
	Locked func()
}

// Upcoming implements Store through the index outbox_scheduled_due.
func (m Mongo) Upcoming(ctx context.Context, tp TopicPartition, n int) ([]time.Time, error) {
	cur, err := m.Scheduled.Find(ctx, store.UpcomingFilter(tp.Topic, tp.Partition), options.Find().
		SetSort(store.DueOrder()).SetLimit(int64(n)).SetBatchSize(int32(n)).
		SetProjection(bson.D{{Key: store.OutboxID, Value: 0}, {Key: store.ScheduledDueAt, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find scheduled events: %w", err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var due []time.Time
	for cur.Next(ctx) {
		t, ok := cur.Current.Lookup(store.ScheduledDueAt).TimeOK()
		if !ok {
			continue // not a date: the promotion's query never selects it either
		}
		due = append(due, t)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("read scheduled events: %w", err)
	}
	return due, nil
}

// Promote implements Store: one transaction reads tp's due events in
// promotion order, marks them promoted and inserts their outbox documents
// (new _id in that order, seq left to the server's clock, unpublished).
// It makes one attempt: a write conflict (another promoter, a
// cancellation) returns an error and the loop tries again after a backoff.
//
// An outbox insert refused as a duplicate (Config.UniqueIdempotencyKeys:
// an event with the same key was recorded for immediate publication after
// this one was scheduled) aborts the batch; the events are then promoted
// one per transaction, and the one refused is marked failed with the
// reason, visible to operators and never retried.
func (m Mongo) Promote(ctx context.Context, tp TopicPartition, now time.Time, limit int) (int, error) {
	n, err := m.promote(ctx, tp, now, limit)
	if err == nil || !mongo.IsDuplicateKeyError(err) {
		return n, err
	}
	done := 0
	for done < limit {
		n, err := m.promote(ctx, tp, now, 1)
		if mongo.IsDuplicateKeyError(err) {
			err = m.markDuplicate(ctx, tp, now, err)
			n = 1
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			break
		}
		done += n
	}
	return done, nil
}

func (m Mongo) promote(ctx context.Context, tp TopicPartition, now time.Time, limit int) (n int, err error) {
	defer func() {
		if m.Locked != nil && store.IsWriteConflict(err) {
			m.Locked()
		}
	}()
	timeout := m.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sess, err := m.Client.StartSession()
	if err != nil {
		return 0, fmt.Errorf("start session: %w", err)
	}
	defer store.End(ctx, sess)
	if m.Session != nil {
		if err := m.Session(ctx, sess.ID()); err != nil {
			return 0, fmt.Errorf("record the promotion's session: %w", err)
		}
	}
	if err := sess.StartTransaction(options.Transaction().SetWriteConcern(writeconcern.Majority())); err != nil {
		return 0, fmt.Errorf("start transaction: %w", err)
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	docs, err := m.due(sctx, tp, now, limit)
	if err != nil || len(docs) == 0 {
		return 0, err
	}
	ids := make(bson.A, len(docs))
	out := make([]any, len(docs))
	for i := range docs {
		ids[i] = docs[i].ID
		d := docs[i].OutboxDoc
		// A new _id, made in promotion order: the events of one
		// transaction share their seq and are published in _id order.
		d.ID = bson.NewObjectID()
		d.Seq = bson.Timestamp{} // the server's clock at insert: recorded now
		d.Published, d.PublishedAt = false, nil
		out[i] = &d
	}
	res, err := m.Scheduled.UpdateMany(sctx, bson.D{
		{Key: store.OutboxID, Value: bson.D{{Key: "$in", Value: ids}}},
		{Key: store.ScheduledPromoted, Value: false},
		{Key: store.OutboxFailed, Value: false},
	}, store.PromoteUpdate(now))
	if err != nil {
		return 0, fmt.Errorf("mark scheduled events promoted: %w", err)
	}
	if res.ModifiedCount != int64(len(docs)) {
		return 0, fmt.Errorf("%w: marked %d of %d", ErrRaced, res.ModifiedCount, len(docs))
	}
	if _, err := m.Outbox.InsertMany(sctx, out); err != nil {
		return 0, fmt.Errorf("insert promoted events into the outbox: %w", err)
	}
	if err := store.Commit(ctx, sess); err != nil {
		return 0, fmt.Errorf("commit the promotion: %w", err)
	}
	return len(docs), nil
}

// due reads tp's events due at now, at most limit, in promotion order.
func (m Mongo) due(ctx context.Context, tp TopicPartition, now time.Time, limit int) ([]store.ScheduledDoc, error) {
	cur, err := m.Scheduled.Find(ctx, store.DueFilter(tp.Topic, tp.Partition, now), options.Find().
		SetSort(store.DueOrder()).SetLimit(int64(limit)).SetBatchSize(int32(limit)))
	if err != nil {
		return nil, fmt.Errorf("find due events: %w", err)
	}
	var docs []store.ScheduledDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("read due events: %w", err)
	}
	return docs, nil
}

// markDuplicate marks the first due event of tp failed: its outbox insert
// was refused as a duplicate idempotency key (cause).
func (m Mongo) markDuplicate(ctx context.Context, tp TopicPartition, now time.Time, cause error) error {
	docs, err := m.due(ctx, tp, now, 1)
	if err != nil || len(docs) == 0 {
		return err
	}
	msg := "promotion refused: an event with this idempotency key is already in the outbox (Config.UniqueIdempotencyKeys): " + cause.Error()
	_, err = m.Scheduled.UpdateOne(ctx, bson.D{{Key: store.OutboxID, Value: docs[0].ID}, {Key: store.ScheduledPromoted, Value: false}},
		store.MarkFailedUpdate(msg, now, true))
	if err != nil {
		return fmt.Errorf("mark a duplicate scheduled event failed: %w", err)
	}
	return nil
}

package schedule

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/store"
)

// Watch follows the inserts into the scheduled events' collection and
// tells the Set of each (Set.Notify), so that an event scheduled due
// before a loop's next wake-up is not left to the refill. Only the
// partition and due time of each insert travel (a projection on the
// server).
type Watch struct {
	Coll     *mongo.Collection
	Set      *Set
	Backoff  retry.Backoff
	MaxAwait time.Duration
	Logger   *slog.Logger
	// Opened, when set, is called each time the stream is (re)opened.
	Opened func()
}

// Run follows the stream until ctx ends. Every (re)opening makes every
// loop read its horizon again: inserts while no stream was open were not
// notified.
func (w *Watch) Run(ctx context.Context) {
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}},
		{{Key: "$project", Value: bson.D{
			{Key: "fullDocument." + store.OutboxTopic, Value: 1},
			{Key: "fullDocument." + store.OutboxPartition, Value: 1},
			{Key: "fullDocument." + store.ScheduledDueAt, Value: 1},
		}}},
	}
	failures := 0
	for ctx.Err() == nil {
		opts := options.ChangeStream()
		if w.MaxAwait > 0 {
			opts.SetMaxAwaitTime(w.MaxAwait)
		}
		cs, err := w.Coll.Watch(ctx, pipeline, opts)
		if err == nil {
			w.Set.RefillAll()
			if w.Opened != nil {
				w.Opened()
			}
			// The backoff restarts only once the stream delivered: a
			// stream that opens and then fails at once keeps backing off.
			for cs.Next(ctx) {
				failures = 0
				w.notify(cs.Current)
			}
			err = cs.Err()
			_ = cs.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		if w.Logger != nil && (failures == 1 || failures%20 == 0) {
			w.Logger.Warn("scheduled events: change stream failed; reopening", "error", err, "failures", failures)
		}
		if !retry.Sleep(ctx, nil, w.Backoff.Delay(failures)) {
			return
		}
	}
}

func (w *Watch) notify(ev bson.Raw) {
	doc, ok := ev.Lookup("fullDocument").DocumentOK()
	if !ok {
		return
	}
	topic, ok1 := doc.Lookup(store.OutboxTopic).StringValueOK()
	part, ok2 := doc.Lookup(store.OutboxPartition).Int32OK()
	due, ok3 := doc.Lookup(store.ScheduledDueAt).TimeOK()
	if ok1 && ok2 && ok3 {
		w.Set.Notify(TopicPartition{Topic: topic, Partition: part}, due)
	}
}

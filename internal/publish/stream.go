package publish

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Watcher follows inserts into the outbox with a change stream and wakes
// the worker of each inserted event's partition. The stream only wakes:
// workers read events with their own indexed query, so the stream may lose
// events (history lost, invalidation, network errors) without loss of
// publishing. It is filtered on the server to inserts of owned partitions
// and projected down to the topic and partition, so every replica reads
// only the notifications it needs.
//
// The stream is reopened at the current time after any error and whenever
// the owned set changes (debounced); after every (re)open every owned
// worker is woken, and its scan covers anything inserted before the new
// stream began.
type Watcher struct {
	Coll *mongo.Collection
	Set  *Set
	// TopicField and PartitionField name the document fields.
	TopicField, PartitionField string
	// Debounce delays the reopen after an ownership change.
	Debounce time.Duration
	// MaxAwait bounds one getMore; ownership changes are noticed between
	// getMores.
	MaxAwait time.Duration
	Backoff  Backoff
	Logger   *slog.Logger
	Stats    *Stats
	// Opened, when set, is called after each successful (re)open; for tests.
	Opened func()
}

// Pipeline returns the change stream pipeline for the owned partitions.
func (w *Watcher) Pipeline(owned []TopicPartition) bson.A {
	byTopic := map[string]bson.A{}
	var topics []string
	for _, tp := range owned {
		if _, ok := byTopic[tp.Topic]; !ok {
			topics = append(topics, tp.Topic)
		}
		byTopic[tp.Topic] = append(byTopic[tp.Topic], tp.Partition)
	}
	or := bson.A{}
	for _, t := range topics {
		or = append(or, bson.D{
			{Key: "fullDocument." + w.TopicField, Value: t},
			{Key: "fullDocument." + w.PartitionField, Value: bson.D{{Key: "$in", Value: byTopic[t]}}},
		})
	}
	return bson.A{
		bson.D{{Key: "$match", Value: bson.D{
			{Key: "operationType", Value: "insert"},
			{Key: "$or", Value: or},
		}}},
		bson.D{{Key: "$project", Value: bson.D{
			{Key: "operationType", Value: 1},
			{Key: "fullDocument." + w.TopicField, Value: 1},
			{Key: "fullDocument." + w.PartitionField, Value: 1},
		}}},
	}
}

// Run follows the stream until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	attempt := 0
	for ctx.Err() == nil {
		gen, changed := w.Set.Changed()
		owned := w.Set.Owned()
		if len(owned) == 0 {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return
			}
		}
		opts := options.ChangeStream().SetMaxAwaitTime(w.MaxAwait)
		cs, err := w.Coll.Watch(ctx, w.Pipeline(owned), opts)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.Stats.SetError(err)
			d := w.Backoff.Delay(attempt)
			attempt++
			w.Logger.Warn("outbox publisher: cannot open the outbox change stream; workers rescan", "error", err, "retry_in", d)
			w.Set.WakeAll() // keep latency bounded while the stream is down
			if !sleepCtx(ctx, d) {
				return
			}
			continue
		}
		attempt = 0
		w.Set.WakeAll()
		if w.Opened != nil {
			w.Opened()
		}
		w.follow(ctx, cs, gen, changed)
		_ = cs.Close(context.WithoutCancel(ctx))
	}
}

// follow reads the stream until it fails, closes, or the owned set changes.
func (w *Watcher) follow(ctx context.Context, cs *mongo.ChangeStream, gen uint64, changed <-chan struct{}) {
	var ev struct {
		FullDocument bson.Raw `bson:"fullDocument"`
	}
	for {
		if cs.TryNext(ctx) {
			ev.FullDocument = nil
			if err := cs.Decode(&ev); err == nil && ev.FullDocument != nil {
				topic, ok1 := ev.FullDocument.Lookup(w.TopicField).StringValueOK()
				part, ok2 := ev.FullDocument.Lookup(w.PartitionField).AsInt64OK()
				if ok1 && ok2 {
					w.Set.Wake(TopicPartition{Topic: topic, Partition: int32(part)})
					continue
				}
			}
			// Not what we asked for: wake everyone rather than guess.
			w.Set.WakeAll()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if err := cs.Err(); err != nil {
			w.Stats.SetError(err)
			w.Logger.Warn("outbox publisher: outbox change stream failed; reopening", "error", err)
			return
		}
		if cs.ID() == 0 {
			w.Logger.Info("outbox publisher: outbox change stream closed by the server; reopening")
			return
		}
		select {
		case <-changed:
			// Debounce: let a rebalance settle before reopening.
			if !sleepCtx(ctx, w.Debounce) {
				return
			}
			if g, _ := w.Set.Changed(); g != gen {
				return
			}
		default:
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

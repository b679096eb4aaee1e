package publish

import (
	"context"
	"log/slog"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Watcher follows inserts into the outbox with a change stream, filtered
// on the server to inserts of owned partitions, so every replica reads
// only the events it publishes. It hands each inserted event to its
// partition's worker, which produces it without reading the store once it
// follows the stream (see Worker).
//
// The stream is reopened at the current time after any error and whenever
// the owned set changes (debounced). After every open the workers it
// covers are attached to it (Set.Attach): they scan, which covers anything
// inserted before the stream began, and then follow. When it ends they are
// detached and scan until the next stream covers them, so a lost stream
// (history lost, invalidation, network errors) never loses events.
//
// A stream that fails or closes is reopened after a backoff delay (Backoff,
// with jitter) that grows with every failure in a row. A failure counts as
// a first one again only after a stream delivered an event or stayed open
// HealthyAfter: a stream that opens fine and then fails at once, again and
// again (getMore failing on a replica set in trouble), is reopened less
// and less often instead of thousands of times a second, each time with a
// scan of every owned partition. An ownership change reopens at once.
type Watcher struct {
	Coll *mongo.Collection
	Set  *Set
	// TopicField and PartitionField name the document fields.
	TopicField, PartitionField string
	// Decode builds a worker's item from an inserted document (required).
	// When it fails, the worker of the partition (or every worker, when the
	// partition is unknown) scans instead.
	Decode func(doc bson.Raw) (TopicPartition, Item, error)
	// Debounce delays the reopen after an ownership change.
	Debounce time.Duration
	// MaxAwait bounds one getMore; ownership changes are noticed between
	// getMores.
	MaxAwait time.Duration
	// Linger is the least time between two getMores while events flow:
	// events gather on the server meanwhile, so that one getMore returns
	// many. 0 sends the next getMore at once.
	Linger  time.Duration
	Backoff retry.Backoff
	// HealthyAfter is how long a stream must stay open, without delivering
	// anything, for the backoff to start again from its first delay.
	// Defaults to 10 s.
	HealthyAfter time.Duration
	Logger       *slog.Logger
	Stats        *Stats
	// Opened, when set, is called after each successful (re)open; for tests.
	Opened func()
	// Reopened, when set, is called before each reopen with its reason:
	// "error" (the stream failed, or could not be opened), "closed" (the
	// server ended it) or "ownership" (the owned partitions changed).
	Reopened func(reason string)
}

// Reasons of a reopen (Watcher.Reopened).
const (
	reopenError     = "error"
	reopenClosed    = "closed"
	reopenOwnership = "ownership"
)

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
	}
}

// Run follows the stream until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	healthy := w.HealthyAfter
	if healthy <= 0 {
		healthy = 10 * time.Second
	}
	attempt := 0 // failures in a row
	for ctx.Err() == nil {
		_, changed := w.Set.Changed()
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
			w.Set.WakeAll() // keep latency bounded while the stream is down
			if !w.backOff(ctx, &attempt, reopenError, "cannot open the outbox change stream; workers rescan", err) {
				return
			}
			continue
		}
		opened := time.Now()
		id := w.Set.Attach(owned)
		if w.Opened != nil {
			w.Opened()
		}
		reason, delivered, err := w.follow(ctx, cs, id, changed)
		_ = cs.Close(context.WithoutCancel(ctx))
		w.Set.Detach(id)
		if ctx.Err() != nil {
			return
		}
		if delivered || time.Since(opened) >= healthy {
			attempt = 0
		}
		if reason == reopenOwnership {
			w.reopened(reason)
			continue
		}
		msg := "outbox change stream closed by the server; reopening"
		if err != nil {
			w.Stats.SetError(err)
			msg = "outbox change stream failed; reopening"
		}
		if !w.backOff(ctx, &attempt, reason, msg, err) {
			return
		}
	}
}

// backOff counts and logs a reopen, then waits the backoff delay of
// failure number *attempt. It reports false when ctx ended meanwhile.
func (w *Watcher) backOff(ctx context.Context, attempt *int, reason, msg string, err error) bool {
	d := w.Backoff.Delay(*attempt)
	*attempt++
	w.reopened(reason)
	w.Logger.Warn("outbox publisher: "+msg, "error", err, "failures_in_a_row", *attempt, "retry_in", d)
	return retry.Sleep(ctx, nil, d)
}

func (w *Watcher) reopened(reason string) {
	if w.Reopened != nil {
		w.Reopened(reason)
	}
}

// follow reads the stream until it fails, closes, or the owned set changes,
// and returns why it stopped, whether it delivered any event, and the
// stream's error.
func (w *Watcher) follow(ctx context.Context, cs *mongo.ChangeStream, id uint64, changed <-chan struct{}) (reason string, delivered bool, err error) {
	// When the last getMore that returned events was sent; zero after an
	// empty one.
	var lastRead time.Time
	for {
		// Checked on every event, not only when the stream is idle: under
		// steady traffic newly assigned partitions would starve.
		select {
		case <-changed:
			// Debounce: let a rebalance settle, then reopen for the new
			// owned set.
			retry.Sleep(ctx, nil, w.Debounce)
			return reopenOwnership, delivered, nil
		default:
		}
		fetches := cs.RemainingBatchLength() == 0 // TryNext sends a getMore
		if fetches && w.Linger > 0 && !lastRead.IsZero() {
			// More events are probably on their way: let them gather.
			if d := w.Linger - time.Since(lastRead); d > 0 && !retry.Sleep(ctx, nil, d) {
				return reopenError, delivered, nil
			}
		}
		sent := time.Now()
		if cs.TryNext(ctx) {
			if fetches {
				lastRead = sent
			}
			delivered = true
			w.deliver(id, cs.Current)
			continue
		}
		lastRead = time.Time{}
		if ctx.Err() != nil {
			return reopenError, delivered, nil
		}
		if err := cs.Err(); err != nil {
			return reopenError, delivered, err
		}
		if cs.ID() == 0 {
			return reopenClosed, delivered, nil
		}
	}
}

// deliver hands one change event to its worker.
func (w *Watcher) deliver(id uint64, ev bson.Raw) {
	doc, ok := ev.Lookup("fullDocument").DocumentOK()
	if !ok {
		// Not what we asked for: every worker scans rather than guess.
		w.Logger.Warn("outbox publisher: change event without a document; scanning")
		w.Set.Reset(id, TopicPartition{})
		return
	}
	topic, ok1 := doc.Lookup(w.TopicField).StringValueOK()
	part, ok2 := doc.Lookup(w.PartitionField).AsInt64OK()
	tp := TopicPartition{Topic: topic, Partition: int32(part)}
	if !ok1 || !ok2 {
		tp = TopicPartition{}
	}
	if tp != (TopicPartition{}) {
		if dtp, it, err := w.Decode(doc); err == nil && dtp == tp {
			w.Set.Push(id, tp, it)
			return
		} else if err != nil {
			w.Logger.Warn("outbox publisher: cannot read an inserted event; scanning its partition", "partition", tp.String(), "error", err)
		}
	}
	w.Set.Reset(id, tp)
}

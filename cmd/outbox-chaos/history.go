package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/retry"
)

// inboxChange is one change of an inbox document's state, as the change
// stream reports it: in commit order, the changes of one transaction in
// the order of its writes.
type inboxChange struct {
	ID        outbox.InboxID
	From, To  inboxState
	Key       string // the document's partition key
	Partition int32
	Offset    int64     // the offset of the delivery that created the document
	LastError string    // after the change
	Reason    string    // the park reason after the change (e.g. "no_handler")
	At        time.Time // when committed (the change event's wallTime), else when the stream delivered it
}

// inboxRecorder keeps the history of every inbox document's state, from a
// change stream on the run's database opened before the first replica
// starts: the facts the per-key order, hold and park checks judge (a
// sampled view would miss holds that last a few milliseconds). It resumes
// after errors from its last resume token; if the server lost the history
// it needs, the run fails (lost).
//
// The goroutine of run is owned by runHarness, which cancels its context
// after the final check's reads.
type inboxRecorder struct {
	db   *mongo.Database
	logf func(format string, args ...any)

	mu        sync.Mutex
	docs      map[outbox.InboxID]*inboxFields
	changes   []inboxChange
	token     bson.Raw
	lost      error
	sentinels map[string]bool
	stream    *mongo.ChangeStream
}

func newInboxRecorder(db *mongo.Database, logf func(string, ...any)) *inboxRecorder {
	return &inboxRecorder{db: db, logf: logf, docs: map[outbox.InboxID]*inboxFields{}, sentinels: map[string]bool{}}
}

// open opens the stream: from the last resume token, or from now.
func (r *inboxRecorder) open(ctx context.Context) (*mongo.ChangeStream, error) {
	pipe := mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "ns.coll", Value: bson.D{{Key: "$in", Value: bson.A{"inbox", collSentinel}}}}}}},
		{{Key: "$project", Value: bson.D{{Key: "fullDocument.payload", Value: 0}, {Key: "updateDescription.updatedFields.payload", Value: 0}}}},
	}
	opts := options.ChangeStream()
	r.mu.Lock()
	if r.token != nil {
		opts.SetResumeAfter(r.token)
	}
	r.mu.Unlock()
	return r.db.Watch(ctx, pipe, opts)
}

// start opens the first stream; run follows it.
func (r *inboxRecorder) start(ctx context.Context) error {
	cs, err := r.open(ctx)
	if err != nil {
		return fmt.Errorf("inbox history: open change stream: %w", err)
	}
	r.stream = cs
	return nil
}

// run follows the stream until ctx ends, reopening it after errors with
// backoff.
func (r *inboxRecorder) run(ctx context.Context) {
	cs := r.stream
	backoff := retry.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		if cs == nil {
			var err error
			cs, err = r.open(ctx)
			if err != nil {
				r.failed(err, failures)
				failures++
				retry.Sleep(ctx, nil, backoff.Delay(failures-1))
				continue
			}
		}
		for cs.Next(ctx) {
			failures = 0
			if err := r.apply(cs.Current); err != nil {
				r.logf("inbox history: unreadable change: %v", err)
			}
			r.mu.Lock()
			r.token = cs.ResumeToken()
			r.mu.Unlock()
		}
		if t := cs.ResumeToken(); t != nil {
			r.mu.Lock()
			r.token = t
			r.mu.Unlock()
		}
		err := cs.Err()
		_ = cs.Close(context.WithoutCancel(ctx))
		cs = nil
		if ctx.Err() != nil {
			return
		}
		r.failed(err, failures)
		failures++
		retry.Sleep(ctx, nil, backoff.Delay(failures-1))
	}
}

// failed notes a stream error. An error that says the server no longer
// has the history to resume from is fatal to the check: the stream starts
// again from now, and the run fails.
func (r *inboxRecorder) failed(err error, failures int) {
	var se mongo.ServerError
	if errors.As(err, &se) && (se.HasErrorCode(286) || se.HasErrorCode(136)) { // ChangeStreamHistoryLost, CappedPositionLost
		r.mu.Lock()
		if r.lost == nil {
			r.lost = err
		}
		r.token = nil
		r.mu.Unlock()
	}
	if failures == 0 || failures%20 == 0 {
		r.logf("inbox history: change stream failed (%d in a row): %v", failures+1, err)
	}
}

// streamEvent is the part of a change event the recorder reads.
type streamEvent struct {
	OperationType string `bson:"operationType"`
	// WallTime is when the change was committed (MongoDB 6.0 and the
	// embedded server; absent before 6.0).
	WallTime time.Time `bson:"wallTime"`
	NS       struct {
		Coll string `bson:"coll"`
	} `bson:"ns"`
	DocumentKey struct {
		ID bson.RawValue `bson:"_id"`
	} `bson:"documentKey"`
	FullDocument      bson.Raw `bson:"fullDocument"`
	UpdateDescription struct {
		UpdatedFields bson.Raw `bson:"updatedFields"`
		RemovedFields []string `bson:"removedFields"`
	} `bson:"updateDescription"`
}

// apply folds one change event into the history.
func (r *inboxRecorder) apply(raw bson.Raw) error {
	var ev streamEvent
	if err := bson.Unmarshal(raw, &ev); err != nil {
		return err
	}
	if ev.NS.Coll == collSentinel {
		var id string
		if err := ev.DocumentKey.ID.Unmarshal(&id); err != nil {
			return err
		}
		r.mu.Lock()
		r.sentinels[id] = true
		r.mu.Unlock()
		return nil
	}
	var id outbox.InboxID
	if err := ev.DocumentKey.ID.Unmarshal(&id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.docs[id]
	from := inboxAbsent
	if f != nil {
		from = f.state()
	}
	switch ev.OperationType {
	case "insert", "replace":
		nf := &inboxFields{}
		if err := bson.Unmarshal(ev.FullDocument, nf); err != nil {
			return err
		}
		f = nf
	case "update":
		if f == nil {
			f = &inboxFields{}
		}
		if err := f.apply(ev.UpdateDescription.UpdatedFields, ev.UpdateDescription.RemovedFields); err != nil {
			return err
		}
	default:
		return nil // deletes (the inbox TTL) change no state the checks judge
	}
	f.ID = id
	r.docs[id] = f
	if to := f.state(); to != from {
		// When it was committed, not when the stream delivered it: on a
		// loaded machine the stream runs minutes behind a long run, and
		// the times judged (takeover, retry isolation, deploys) are the
		// framework's, not the recorder's.
		at := ev.WallTime
		if at.IsZero() {
			at = time.Now()
		}
		r.changes = append(r.changes, inboxChange{ID: id, From: from, To: to, Key: f.PartitionKey, Partition: f.Partition,
			Offset: f.Offset, LastError: f.LastError, Reason: f.ParkReason, At: at})
	}
	return nil
}

// catchUp writes a sentinel document and waits until the stream delivered
// it: every inbox change committed before the call is then in the
// history. It gives up when ctx ends.
func (r *inboxRecorder) catchUp(ctx context.Context) error {
	id := fmt.Sprintf("s%d", time.Now().UnixNano())
	if _, err := r.db.Collection(collSentinel).InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		return fmt.Errorf("inbox history: write sentinel: %w", err)
	}
	for {
		r.mu.Lock()
		seen := r.sentinels[id]
		r.mu.Unlock()
		if seen {
			return nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("inbox history: the change stream did not catch up: %w", err)
		}
	}
}

// snapshot returns the history so far and whether it is complete.
func (r *inboxRecorder) snapshot() ([]inboxChange, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]inboxChange(nil), r.changes...), r.lost
}

// snapshotLen returns how many changes the history holds.
func (r *inboxRecorder) snapshotLen() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.changes), r.lost
}

// malformedSettled counts the malformed records' documents parked or
// purged.
func (r *inboxRecorder) malformedSettled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for id, f := range r.docs {
		if s := f.state(); isMalformedID(id) && (s == inboxParked || s == inboxDiscarded) {
			n++
		}
	}
	return n
}

// counts returns how many documents are in each state now, by content
// schema.
func (r *inboxRecorder) counts() map[string]map[inboxState]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[inboxState]int{}
	for id, f := range r.docs {
		m := out[id.ContentSchema]
		if m == nil {
			m = map[inboxState]int{}
			out[id.ContentSchema] = m
		}
		m[f.state()]++
	}
	return out
}

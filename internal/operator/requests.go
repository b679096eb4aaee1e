package operator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// interval is how often Requests looks for re-drive requests by default.
const interval = 5 * time.Second

// claimMargin is how long a claimed request is left to the replica that
// claimed it beyond the re-drive's own bound (its handler's timeout),
// before another replica may serve it.
const claimMargin = time.Minute

// settleTimeout bounds the write that settles a request. It runs after
// the re-drive, whose context may have ended; should it fail, the claim's
// lease ends and the request is served again.
const settleTimeout = 5 * time.Second

// dueBatch caps the requests one round reads; the rest wait for the next.
const dueBatch = 100

// Requests serves the re-drive requests of an inbox (the operator's
// RequestRedrive): every Every, it reads the requests due, claims each one
// this process can serve, has Redrive run it and settles what it left.
type Requests[I ID] struct {
	// Inbox is where the requests are.
	Inbox Inbox[I]
	// Every is the period of the loop; 0 is interval (5 s).
	Every time.Duration
	// Log receives the warnings of the loop.
	Log *slog.Logger
	// Bound says how long the re-drive of d may run (its handler's
	// timeout; 0 when it has no handler and is skipped), and false when
	// this process cannot serve it (no handler, and events without one
	// are not skipped): another replica or version of the service may.
	Bound func(d *store.InboxDoc[I]) (time.Duration, bool)
	// Redrive re-drives the event of a claimed request, under the loop's
	// context, and says what is left of the request.
	Redrive func(ctx context.Context, d *store.InboxDoc[I]) Outcome
	// Failed is told each error of a round that reads or claims requests.
	Failed func(error)
}

// Outcome is what a re-drive served from a request left of the request.
// The zero value is a re-drive that ran (the handler ran to a result, or
// the event was skipped, handled or purged meanwhile, or is held and goes
// with its head): the request is done.
type Outcome struct {
	// Deferred is set when the re-drive could not run for a reason that
	// is not the handler's failure: the request stays, with Why, and is
	// tried again after RetryAfter.
	Deferred   bool
	Why        string
	RetryAfter time.Duration
	// Stopped is set when the serving replica stopped during the
	// re-drive: the request is left to another replica at once.
	Stopped bool
}

// Run serves requests until ctx ends. Re-drives run under ctx too: a
// shutdown cuts one short between two of its transactions, and the
// partition's consumer goes on with it.
func (r *Requests[I]) Run(ctx context.Context) {
	every := r.Every
	if every <= 0 {
		every = interval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.serve(ctx); err != nil && ctx.Err() == nil {
			r.Log.Warn("outbox: reading re-drive requests failed", "err", err)
			r.Failed(err)
		}
	}
}

// serve runs one round: the requests due at its start, oldest parked
// first.
func (r *Requests[I]) serve(ctx context.Context) error {
	now := time.Now().UTC()
	cur, err := r.Inbox.Coll.Find(ctx, append(requested(), due(now)),
		options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}}).SetLimit(dueBatch))
	if err != nil {
		return fmt.Errorf("outbox: find re-drive requests: %w", err)
	}
	var docs []Parked[I]
	if err := cur.All(ctx, &docs); err != nil {
		return fmt.Errorf("outbox: read re-drive requests: %w", err)
	}
	for i := range docs {
		if ctx.Err() != nil {
			return nil
		}
		d, requestedAt := &docs[i].Doc, *docs[i].RedriveRequestedAt
		bound, ok := r.Bound(d)
		if !ok {
			continue
		}
		claimed, err := r.Inbox.Claim(ctx, d.ID, requestedAt, now, claimMargin+bound)
		if err != nil {
			return err
		}
		if !claimed {
			continue // claimed by another replica, or purged meanwhile
		}
		out := r.Redrive(ctx, d)
		if err := r.Inbox.Settle(ctx, d.ID, requestedAt, out); err != nil {
			// The claim's lease ends: the request is served again.
			r.Log.Warn("outbox: updating a re-drive request failed; it is served again when its claim ends",
				"id", d.ID.String(), "err", err)
		}
	}
	return nil
}

// requested selects the parked documents with a re-drive request (served
// by the partial index inbox_parked).
func requested() bson.D {
	return bson.D{
		{Key: store.InboxParked, Value: true},
		{Key: store.InboxRedriveRequestedAt, Value: bson.D{{Key: "$exists", Value: true}}},
	}
}

// due keeps the requests nobody holds a claim on at now, and those whose
// deferral ended.
func due(now time.Time) bson.E {
	return bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: store.InboxRedriveNotBefore, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: store.InboxRedriveNotBefore, Value: bson.D{{Key: "$lte", Value: now}}}},
	}}
}

// Claim takes the request of id made at requestedAt for lease from now,
// with one conditional update: false when it is no longer due at dueAt
// (another replica claimed it), was made again, or the event is no longer
// parked.
func (in Inbox[I]) Claim(ctx context.Context, id I, requestedAt, dueAt time.Time, lease time.Duration) (bool, error) {
	res, err := in.Coll.UpdateOne(ctx,
		bson.D{{Key: store.InboxID, Value: id}, {Key: store.InboxParked, Value: true}, {Key: store.InboxRedriveRequestedAt, Value: requestedAt}, due(dueAt)},
		bson.D{{Key: "$set", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: time.Now().UTC().Add(lease)}}}})
	if err != nil {
		return false, fmt.Errorf("outbox: claim re-drive request: %w", err)
	}
	return res.ModifiedCount > 0, nil
}

// Settle writes what a re-drive served from the request of id made at
// requestedAt left (out): a deferred request stays, with why and the time
// of its next try; a stopped one is left to another replica at once;
// otherwise the request is done. A request made again meanwhile (another
// requestedAt) is left as it is. The write is bounded by settleTimeout
// whether or not ctx ended.
func (in Inbox[I]) Settle(ctx context.Context, id I, requestedAt time.Time, out Outcome) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	filter := bson.D{{Key: store.InboxID, Value: id}, {Key: store.InboxRedriveRequestedAt, Value: requestedAt}}
	var update bson.D
	switch {
	case out.Deferred:
		update = bson.D{{Key: "$set", Value: bson.D{
			{Key: store.InboxRedriveNotBefore, Value: time.Now().UTC().Add(out.RetryAfter)},
			{Key: store.InboxRedriveDeferred, Value: store.Truncate(out.Why, maxWhy)},
		}}}
	case out.Stopped:
		update = bson.D{{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: ""}}}}
	default:
		update = bson.D{{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveRequestedAt, Value: ""},
			{Key: store.InboxRedriveNotBefore, Value: ""}, {Key: store.InboxRedriveDeferred, Value: ""}}}}
	}
	_, err := in.Coll.UpdateOne(wctx, filter, update)
	return err
}

// maxWhy caps the stored reason of a deferral.
const maxWhy = 1024

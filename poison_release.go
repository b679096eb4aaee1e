package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/retry"
)

// Releasing held events (see poison.go).

// heldQuery selects the events held in the chain of anchor.
func heldQuery(anchor InboxID, partition int32) bson.D {
	return bson.D{{Key: "parked", Value: true}, {Key: "_id.topic", Value: anchor.Topic},
		{Key: "partition", Value: partition}, {Key: "held_by", Value: anchor}}
}

// closeChain marks anchor's chain closed (see poison.go).
func closeChain(ctx context.Context, inbox *mongo.Collection, anchor InboxID) error {
	_, err := inbox.UpdateOne(ctx, bson.D{{Key: "_id", Value: anchor}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "released_at", Value: time.Now().UTC()}}}})
	return err
}

// releaseHeld handles the events held in the chain of anchor (whose own
// event is handled or purged), one transaction each, in offset order, and
// closes the chain once it is empty. A held event that fails is retried
// (retryReleased); one that still fails becomes the head of a new chain
// holding the rest. Errors are logged: the events stay
// parked, and re-driving one of them resumes the release (Redrive).
func (c *Client) releaseHeld(ctx context.Context, anchor InboxID, partition int32) {
	log := c.cfg.Logger.With("held_by", anchor.String())
	for ctx.Err() == nil {
		var next *inboxDoc
		var meta Metadata
		err := c.transactWithin(ctx, func(tctx context.Context) error {
			next = nil
			var d inboxDoc
			err := c.inbox.FindOne(tctx, heldQuery(anchor, partition),
				options.FindOne().SetSort(bson.D{{Key: "offset", Value: 1}})).Decode(&d)
			if errors.Is(err, mongo.ErrNoDocuments) {
				return closeChain(tctx, c.inbox, anchor)
			}
			if err != nil {
				return err
			}
			next = &d
			meta = Metadata{Envelope: d.envelope(), Offset: d.Offset, Attempt: int(d.Attempts) + 1}
			h := c.handlerFor(d.ID.Topic, d.ID.ContentSchema)
			if h == nil {
				return &handlerError{fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, d.ID.Topic, d.ID.ContentSchema)}
			}
			evt, err := c.storedEvent(h, &d)
			if err != nil {
				return &handlerError{err}
			}
			res, err := c.inbox.UpdateOne(tctx, bson.D{{Key: "_id", Value: d.ID}, {Key: "parked", Value: true}, {Key: "held_by", Value: anchor}}, unparkUpdate())
			if err != nil {
				return err
			}
			if res.MatchedCount == 0 {
				return errChainClosed // released by another caller meanwhile
			}
			if err := safeRun(tctx, h, evt, meta); err != nil {
				return &handlerError{err}
			}
			return nil
		})
		var herr *handlerError
		switch {
		case err == nil && next == nil:
			return
		case err == nil:
			log.Info("held event released", "id", next.ID.String())
			c.tel.handled.Add(ctx, 1, eventAttrs(&meta.Envelope))
		case errors.Is(err, errChainClosed):
		case errors.As(err, &herr) && next != nil && c.retryReleased(ctx, anchor, next.ID, meta.Attempt, herr.err):
			log.Warn("outbox: held event failed while released; retrying", "id", next.ID.String(), "attempt", meta.Attempt, "err", herr.err)
		case errors.As(err, &herr) && next != nil:
			msg := truncate(herr.err.Error(), 4096)
			if merr := moveChain(context.WithoutCancel(ctx), c.inbox, anchor, partition, next.ID, bson.D{{Key: "last_error", Value: msg}}, 1); merr != nil {
				log.Warn("outbox: moving a chain to its failed event failed; its events stay held", "id", next.ID.String(), "err", merr)
				c.tel.setError(fmt.Errorf("release events held behind %s: %w", anchor, merr))
				return
			}
			log.Warn("outbox: held event failed while released; it now holds its key", "id", next.ID.String(), "err", herr.err)
			c.tel.setError(fmt.Errorf("held event %s failed while released, now parked: %w", next.ID, herr.err))
			c.tel.parked.Add(ctx, 1, eventAttrs(&meta.Envelope, attrReason.String("redrive_failed")))
			return
		default:
			log.Warn("outbox: releasing held events interrupted; re-drive one of them to resume", "err", err)
			c.tel.setError(fmt.Errorf("release events held behind %s: %w", anchor, err))
			return
		}
	}
}

// retryReleased decides whether a held event whose handler failed while
// released (attempt: the run that failed) runs again, as a delivered event
// does: up to Config.MaxAttempts runs, counted in its stored attempts, with
// the handler retry backoff in between. Not for a handler that asked to
// park (Park), for an event no handler accepts or whose payload does not
// decode, or once ctx ends; then the event becomes the head of its key.
func (c *Client) retryReleased(ctx context.Context, anchor, id InboxID, attempt int, cause error) bool {
	var perr *ParkError
	if attempt >= c.cfg.MaxAttempts || errors.As(cause, &perr) || errors.Is(cause, ErrNoHandler) ||
		errors.Is(cause, ErrMalformedRecord) || errors.Is(cause, ErrPayloadTruncated) || ctx.Err() != nil {
		return false
	}
	res, err := c.inbox.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "parked", Value: true}, {Key: "held_by", Value: anchor}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int32(1)}}},
			{Key: "$set", Value: bson.D{{Key: "last_error", Value: truncate(cause.Error(), 4096)}}}})
	if err != nil {
		return false // it becomes the head (moveChain checks again)
	}
	if res.MatchedCount == 0 {
		return true // handled or moved by another releaser meanwhile: go on with the chain
	}
	// Retried even when ctx ends during the wait: the loop then stops with
	// the event still held, and the orphan-chain sweep resumes the release.
	retry.Sleep(ctx, nil, c.cfg.backoff().Delay(attempt-1))
	return true
}

// moveChain makes head (an event held behind anchor) the head of the rest of
// anchor's chain, in one transaction: head is parked on its own with set
// applied and inc more attempts, the other held events are held behind it,
// and anchor's chain is closed.
func moveChain(ctx context.Context, inbox *mongo.Collection, anchor InboxID, partition int32, head InboxID, set bson.D, inc int32) error {
	set = append(set, bson.E{Key: "parked", Value: true}, bson.E{Key: "parked_at", Value: time.Now().UTC()})
	return withTransaction(ctx, inbox, func(tctx context.Context) error {
		if _, err := inbox.UpdateOne(tctx, bson.D{{Key: "_id", Value: head}, {Key: "handled", Value: false}}, bson.D{
			{Key: "$set", Value: set},
			{Key: "$unset", Value: bson.D{{Key: "held_by", Value: ""}}},
			{Key: "$inc", Value: bson.D{{Key: "attempts", Value: inc}}},
		}); err != nil {
			return err
		}
		if _, err := inbox.UpdateMany(tctx, heldQuery(anchor, partition),
			bson.D{{Key: "$set", Value: bson.D{{Key: "held_by", Value: head}, {Key: "last_error", Value: "held behind " + head.String()}}}}); err != nil {
			return err
		}
		return closeChain(tctx, inbox, anchor)
	})
}

// releaseAfterPurge lets the chain of a purged head go on: the first held
// event becomes the head with a re-drive request, so that a running
// consumer handles it and the rest in order; an empty chain is closed.
func releaseAfterPurge(ctx context.Context, inbox *mongo.Collection, anchor InboxID, partition int32) error {
	var next *InboxID
	err := withTransaction(ctx, inbox, func(tctx context.Context) error {
		next = nil
		var d struct {
			ID InboxID `bson:"_id"`
		}
		err := inbox.FindOne(tctx, heldQuery(anchor, partition),
			options.FindOne().SetSort(bson.D{{Key: "offset", Value: 1}}).SetProjection(bson.D{{Key: "_id", Value: 1}})).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			// Closed in the transaction that found the chain empty, so that
			// an event held meanwhile conflicts with it.
			return closeChain(tctx, inbox, anchor)
		}
		if err != nil {
			return err
		}
		next = &d.ID
		return nil
	})
	if err != nil || next == nil {
		return err
	}
	return moveChain(ctx, inbox, anchor, partition, *next, bson.D{
		{Key: "redrive_requested_at", Value: time.Now().UTC()},
		{Key: "last_error", Value: "the event it was held behind (" + anchor.String() + ") was purged; re-drive requested"},
	}, 0)
}

// withTransaction runs fn in a transaction of the collection's client, with
// majority write concern and the driver's retries.
func withTransaction(ctx context.Context, coll *mongo.Collection, fn func(ctx context.Context) error) error {
	sess, err := coll.Database().Client().StartSession()
	if err != nil {
		return fmt.Errorf("outbox: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		return nil, fn(sctx)
	}, txnOptions())
	return err
}

// resumeOrphanChains finishes the releases that were cut short. A chain's
// anchor is handled or purged before its held events are released
// (Redrive, PurgeParked), in separate transactions: a process that dies or
// is stopped in between, or a release interrupted by an error, leaves events
// held behind an anchor that is no longer parked, and nothing else would
// ever release them. Run by the re-drive loop of every running consumer:
// one aggregation over the parked documents (partial index inbox_parked
// holds only those) and one read by _id per chain; a chain is resumed by
// the consumer that subscribes to its topic, in order (releaseHeld; two
// replicas resuming the same chain conflict on each event, and at most one
// handles it).
func (c *Client) resumeOrphanChains(ctx, work context.Context) error {
	cur, err := c.inbox.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "parked", Value: true}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "anchor", Value: "$held_by"}, {Key: "partition", Value: "$partition"}}},
		}}},
		{{Key: "$limit", Value: 1000}},
	})
	if err != nil {
		return fmt.Errorf("outbox: find chains of held events: %w", err)
	}
	var chains []struct {
		ID struct {
			Anchor    InboxID `bson:"anchor"`
			Partition int32   `bson:"partition"`
		} `bson:"_id"`
	}
	if err := cur.All(ctx, &chains); err != nil {
		return fmt.Errorf("outbox: read chains of held events: %w", err)
	}
	subscribed := map[string]bool{}
	for _, t := range c.subscribedTopics() {
		subscribed[t] = true
	}
	for _, ch := range chains {
		anchor, partition := ch.ID.Anchor, ch.ID.Partition
		if ctx.Err() != nil {
			return nil
		}
		if !subscribed[anchor.Topic] {
			continue
		}
		n, err := c.inbox.CountDocuments(ctx, bson.D{{Key: "_id", Value: anchor}, {Key: "parked", Value: true}})
		if err != nil {
			return fmt.Errorf("outbox: read the anchor of held events: %w", err)
		}
		if n > 0 {
			continue // its head is still parked: the key is rightly held
		}
		c.cfg.Logger.Info("outbox: resuming the release of events held behind an event no longer parked", "held_by", anchor.String())
		c.releaseHeld(work, anchor, partition)
	}
	return nil
}

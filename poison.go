package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Poison events and held keys (Config.PoisonPolicy).
//
// Under HoldKey a parked event is the head of a chain: the later events of
// its topic and partition key that reach the consumer are parked behind it
// ("held"), stored in the inbox with parked: true and held_by: the head's
// InboxID, in offset order, while other keys move on. Storage contract
// (tools count held events with {held_by: {$exists: true}}):
//
//   - a head: parked: true, no held_by;
//   - a held event: parked: true, held_by: the chain's anchor, the head
//     that started it (a chain keeps its anchor while it is released);
//   - the anchor gets released_at once its chain is empty or moved to a
//     new head: from then on nothing is added behind it.
//
// Re-driving the head (Client.Redrive, Admin.RequestRedrive) handles it,
// then its held events one transaction each, in order (releaseHeld); a held
// event that fails becomes the new head and the rest are moved behind it.
// Purging the head (Admin.PurgeParked) makes the first held event the head
// and requests its re-drive, so the rest are handled in order.
//
// Cost: each partition worker keeps the held keys of its partition in
// memory (keyHolds), loaded with one indexed query on the parked documents
// of the partition when it handles its first record; an event whose key is
// not held costs nothing more. An event of a held key is added behind the
// chain in a transaction that also writes the anchor, so that it and the
// release closing the chain conflict: either the event lands before the
// close (and the release handles it) or after it (and the worker sees the
// chain closed, forgets the key and handles the event itself). The worker
// never reads the chain otherwise, so chains changed elsewhere (re-driven,
// purged) are noticed at the next event of their key.

// keyHolds is the poison state of one partition worker. Owned by the
// worker goroutine.
type keyHolds struct {
	loaded bool
	// suspect is set until the worker handled its first record: that record
	// gets its attempt counted before it runs (see handleRecord).
	suspect bool
	// anchors maps a held partition key to its chain's anchor.
	anchors map[string]InboxID
}

// holding reports whether events of the partition key are held. Events
// without a partition key are never held (they have no order to keep).
func (kh *keyHolds) holding(key string) bool {
	if kh == nil || key == "" {
		return false
	}
	_, ok := kh.anchors[key]
	return ok
}

// hold records that env, just parked, heads the chain of its key.
func (kh *keyHolds) hold(c *Client, env *Envelope) {
	if kh == nil || env.PartitionKey == "" || c.cfg.PoisonPolicy != HoldKey {
		return
	}
	if kh.anchors == nil {
		kh.anchors = map[string]InboxID{}
	}
	if _, ok := kh.anchors[env.PartitionKey]; !ok {
		kh.anchors[env.PartitionKey] = inboxIDOf(env)
	}
}

// learnHold is called for an event found handled or parked already, which
// the worker skips: a duplicate delivery, or an event parked by an earlier
// owner of the partition after this worker loaded its held keys (a replica
// still retrying it when it lost the partition). If an event of its key is
// parked in the partition, the key is held from then on, so that the later
// events of the key wait behind it. One indexed read, on this path only.
func (c *Client) learnHold(ctx context.Context, stop <-chan struct{}, kh *keyHolds, env *Envelope) error {
	if kh == nil || c.cfg.PoisonPolicy != HoldKey || env.PartitionKey == "" || kh.holding(env.PartitionKey) {
		return nil
	}
	var anchor InboxID
	var found bool
	err := c.retryInfra(ctx, stop, func() (err error) {
		anchor, found, err = c.currentAnchor(ctx, env.Topic, env.Partition, env.PartitionKey)
		return err
	})
	if err != nil || !found {
		return err
	}
	if kh.anchors == nil {
		kh.anchors = map[string]InboxID{}
	}
	kh.anchors[env.PartitionKey] = anchor
	return nil
}

// handleRecord handles rec with the worker's poison state, loading it
// first when needed.
func (w *partitionWorker) handleRecord(rec *kgo.Record) error {
	if err := w.loadHolds(rec.Topic, rec.Partition); err != nil {
		return err
	}
	return w.cons.c.handleRecord(w.cons.work, w.stop, &w.holds, rec)
}

// handleBatch is Client.handleBatch with the worker's poison state. Until
// the worker handled its first record it batches nothing: that record is
// handled alone (see handleRecord).
func (w *partitionWorker) handleBatch(recs []*kgo.Record) (handled, failedAt int) {
	if !w.holds.loaded || w.holds.suspect {
		return 0, 0
	}
	return w.cons.c.handleBatch(w.cons.work, &w.holds, recs)
}

// loadHolds reads the held keys of the partition, once per worker.
func (w *partitionWorker) loadHolds(topic string, partition int32) error {
	kh := &w.holds
	if kh.loaded {
		return nil
	}
	c := w.cons.c
	anchors := map[string]InboxID{}
	if c.cfg.PoisonPolicy == HoldKey {
		err := c.retryInfra(w.cons.work, w.stop, func() error {
			clear(anchors)
			return c.readHeldKeys(w.cons.work, topic, partition, anchors)
		})
		if err != nil {
			return err
		}
	}
	kh.loaded, kh.suspect, kh.anchors = true, true, anchors
	return nil
}

// readHeldKeys fills anchors with the held keys of a partition: one query
// on its parked documents (index inbox_parked_partition).
func (c *Client) readHeldKeys(ctx context.Context, topic string, partition int32, anchors map[string]InboxID) error {
	cur, err := c.inbox.Find(ctx, bson.D{
		{Key: "parked", Value: true}, {Key: "_id.topic", Value: topic}, {Key: "partition", Value: partition},
	}, options.Find().SetProjection(bson.D{{Key: "partition_key", Value: 1}, {Key: "held_by", Value: 1}, {Key: "offset", Value: 1}}).
		SetSort(bson.D{{Key: "offset", Value: 1}}))
	if err != nil {
		return fmt.Errorf("outbox: read held keys of %s/%d: %w", topic, partition, err)
	}
	var docs []struct {
		ID           InboxID  `bson:"_id"`
		PartitionKey string   `bson:"partition_key"`
		HeldBy       *InboxID `bson:"held_by"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return fmt.Errorf("outbox: read held keys of %s/%d: %w", topic, partition, err)
	}
	for _, d := range docs {
		if d.PartitionKey == "" {
			continue
		}
		if _, ok := anchors[d.PartitionKey]; ok {
			continue // the oldest parked event of the key decides
		}
		if d.HeldBy != nil {
			anchors[d.PartitionKey] = *d.HeldBy
		} else {
			anchors[d.PartitionKey] = d.ID
		}
	}
	return nil
}

var (
	// errKeyFree: the key's chain is gone; handle the event.
	errKeyFree = errors.New("outbox: key no longer held")
	// errChainClosed: the anchor's chain takes no more events.
	errChainClosed = errors.New("outbox: chain closed")
	// errRetry: the failed event is to be run again.
	errRetry = errors.New("outbox: retry")
)

// holdRecord parks rec behind the chain of its key. errKeyFree when the key
// turned out not to be held any more (its chain was released): the caller
// handles the event.
func (c *Client) holdRecord(ctx context.Context, stop <-chan struct{}, kh *keyHolds, env *Envelope, rec *kgo.Record, log *slog.Logger) error {
	key := env.PartitionKey
	var anchor InboxID
	found, skipped := true, false
	err := c.retryInfra(ctx, stop, func() error {
		for range 100 { // a chain moves at most a few times meanwhile
			anchor = kh.anchors[key]
			err := c.appendHeld(ctx, anchor, env, rec)
			if errors.Is(err, errAlreadyDone) {
				skipped = true
				return nil
			}
			if !errors.Is(err, errChainClosed) {
				return err
			}
			anchor, found, err = c.currentAnchor(ctx, env.Topic, env.Partition, key)
			if err != nil {
				return err
			}
			if !found {
				delete(kh.anchors, key)
				return nil
			}
			kh.anchors[key] = anchor
		}
		return fmt.Errorf("outbox: chain of key %q keeps moving", key)
	})
	switch {
	case err == nil && skipped:
		log.Debug("duplicate or parked event skipped", "schema", env.ContentSchema, "key", env.IdempotencyKey)
		return nil
	case err != nil:
		return err
	case !found:
		return errKeyFree
	}
	log.Info("event held behind a parked event of its key", "schema", env.ContentSchema, "key", env.IdempotencyKey, "held_by", anchor.String())
	c.tel.parked.Add(ctx, 1, eventAttrs(env, attrReason.String("held")))
	return nil
}

// appendHeld adds the event behind the chain of anchor, in one transaction
// that also writes the anchor (see the comment at the top of the file).
// errChainClosed when the anchor's chain is closed, errAlreadyDone when the
// event is handled or parked already.
func (c *Client) appendHeld(ctx context.Context, anchor InboxID, env *Envelope, rec *kgo.Record) error {
	now := time.Now().UTC()
	stored, note := storedPayload(rec.Value)
	set := bson.D{
		{Key: "parked", Value: true}, {Key: "parked_at", Value: now}, {Key: "held_by", Value: anchor},
		{Key: "payload", Value: stored}, {Key: "last_error", Value: "held behind " + anchor.String()},
	}
	if note != "" {
		set = append(set, bson.E{Key: "payload_truncated", Value: true}, bson.E{Key: "payload_size", Value: len(rec.Value)})
	}
	onInsert := append(deliveryFields(env, rec.Offset, nil, now, false), bson.E{Key: "attempts", Value: int32(0)})
	_, err := c.inTransaction(ctx, func(tctx context.Context) error {
		res, err := c.inbox.UpdateOne(tctx,
			bson.D{{Key: "_id", Value: anchor}, {Key: "released_at", Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "held_tail", Value: rec.Offset}}}})
		if err != nil {
			return err
		}
		if res.MatchedCount == 0 {
			return errChainClosed
		}
		_, err = c.inbox.UpdateOne(tctx,
			bson.D{{Key: "_id", Value: inboxIDOf(env)}, {Key: "handled", Value: false}, {Key: "parked", Value: bson.D{{Key: "$ne", Value: true}}}},
			bson.D{{Key: "$set", Value: set}, {Key: "$setOnInsert", Value: onInsert}},
			options.UpdateOne().SetUpsert(true))
		if mongo.IsDuplicateKeyError(err) {
			return errAlreadyDone
		}
		return err
	}, nil)
	return err
}

// currentAnchor finds the chain of a key in a partition: the anchor of its
// oldest parked event. found is false when no event of the key is parked.
func (c *Client) currentAnchor(ctx context.Context, topic string, partition int32, key string) (anchor InboxID, found bool, err error) {
	var d struct {
		ID     InboxID  `bson:"_id"`
		HeldBy *InboxID `bson:"held_by"`
	}
	err = c.inbox.FindOne(ctx, bson.D{
		{Key: "parked", Value: true}, {Key: "_id.topic", Value: topic}, {Key: "partition", Value: partition}, {Key: "partition_key", Value: key},
	}, options.FindOne().SetSort(bson.D{{Key: "offset", Value: 1}}).SetProjection(bson.D{{Key: "held_by", Value: 1}})).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return InboxID{}, false, nil
	}
	if err != nil {
		return InboxID{}, false, fmt.Errorf("outbox: find the chain of key %q: %w", key, err)
	}
	if d.HeldBy != nil {
		return *d.HeldBy, true, nil
	}
	return d.ID, true, nil
}

// fail notes a failed attempt of rec's event (counted tells that the
// attempt was counted before it ran) and parks the event when its attempts
// are used up, by the stored count, or the handler asked to park. It
// returns errRetry and the stored attempt count when the event is to run
// again; nil once parked or when the event was handled meanwhile;
// errInterrupted.
func (c *Client) fail(ctx context.Context, stop <-chan struct{}, kh *keyHolds, env *Envelope, rec *kgo.Record, cause error, attempt int, counted bool, log *slog.Logger) (int, error) {
	var perr *ParkError
	park := attempt >= c.cfg.MaxAttempts || errors.As(cause, &perr)
	inc := 1
	if counted {
		inc = 0
	}
	var stored int32
	done := false
	err := c.retryInfra(ctx, stop, func() error {
		n, err := c.noteFailure(ctx, env, rec.Offset, rec.Value, cause, park, inc)
		if errors.Is(err, errAlreadyDone) {
			done = true
			return nil
		}
		if err != nil {
			return err
		}
		inc = 0 // counted now, whatever happens next
		stored = n
		if !park && int(n) >= c.cfg.MaxAttempts {
			// Earlier owners of the partition used the other attempts.
			park = true
			_, err = c.noteFailure(ctx, env, rec.Offset, rec.Value, cause, true, 0)
			if errors.Is(err, errAlreadyDone) {
				done = true
				return nil
			}
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	if done {
		return 0, c.learnHold(ctx, stop, kh, env)
	}
	attempt = max(attempt, int(stored))
	log.Warn("handler failed", "schema", env.ContentSchema, "key", env.IdempotencyKey, "attempt", attempt, "parked", park, "err", cause)
	c.tel.setError(fmt.Errorf("handler of %s/%s (key %s, attempt %d): %w", env.Topic, env.ContentSchema, env.IdempotencyKey, attempt, cause))
	if !park {
		return int(stored), errRetry
	}
	kh.hold(c, env)
	reason := "handler_error"
	if perr != nil {
		reason = "handler_parked"
	}
	c.tel.parked.Add(ctx, 1, eventAttrs(env, attrReason.String(reason)))
	return int(stored), nil
}

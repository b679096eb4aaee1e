package inboxhost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
)

// Key sequences (Config.PoisonPolicy HoldKey): the host's operations on
// them. What a sequence is in storage, and why no pointer or flag
// duplicates it, is in internal/store's keyseq.go.
//
// Every operation is one transaction (Tx) that writes the key's current
// head, so two operations on one key always conflict and one of them runs
// again on what the other left:
//
//   - Hold: add a delivered event at the end of its key's sequence;
//   - Park: park a delivered event (it starts its key's sequence, or
//     joins it at its offset);
//   - Release: when the head is releasable (held, so it only waited; or
//     parked for want of a handler that this process has), handle it and
//     take it off the sequence; the next event becomes the head;
//   - NoteReleaseFailure: count a failed attempt of the head, and park it
//     for good when its attempts are used up;
//   - ReleaseHead with want: handle a parked head on an operator's request
//     (the root's Redrive);
//   - the root's PurgeParked: take events off their sequences for good.
//
// The owner of a partition (its consumer worker) releases the releasable
// heads it finds: when it is assigned the partition, and every few seconds
// while some of its keys are held; a re-drive releases inline too. A
// release cut short (a crash, a cancellation) leaves the next head
// releasable, and the owner goes on with it.

// seqFilter selects the sequence of key in a partition.
func seqFilter(tp consume.TopicPartition, key string) bson.D {
	return store.SeqFilter(tp.Topic, tp.Partition, key)
}

// headDoc is a sequence member as the head queries read it.
type headDoc = store.HeadDoc[ID]

// firstInSeq sorts a sequence's members, head first.
var firstInSeq = bson.D{{Key: store.InboxOffset, Value: 1}}

// head is the consume.Head of a sequence's first document. A head is
// releasable when it only waited (held), or was parked for want of a
// handler that this process has or, with Config.SkipUnknown, skips
// (App.Releasable).
func (h *Host) head(d *headDoc) consume.Head {
	return consume.Head{ID: d.ID.String(), Since: d.ParkedAt,
		Releasable: d.Held() || (d.ParkReason == store.ParkReasonNoHandler && h.app.Releasable(d.ID))}
}

// Sequences returns the held keys of a partition: one query on its parked
// documents, sorted by key and offset.
func (h *Host) Sequences(ctx context.Context, tp consume.TopicPartition) (map[string]consume.Head, error) {
	cur, err := h.inbox.Find(ctx, store.PartitionParked(tp.Topic, tp.Partition),
		options.Find().SetSort(store.SeqOrder()).SetProjection(store.HeadProjection()))
	if err != nil {
		return nil, fmt.Errorf("outbox: read held keys of %s: %w", tp, err)
	}
	defer cur.Close(ctx)
	heads := map[string]consume.Head{}
	for cur.Next(ctx) {
		var d headDoc
		if err := cur.Decode(&d); err != nil {
			return nil, fmt.Errorf("outbox: read held keys of %s: %w", tp, err)
		}
		if d.PartitionKey == "" {
			// An event without a key holds nothing; parked for want of a
			// handler that this process has, it is released on its own,
			// under a sequence key of its own (keylessSeq).
			if hd := h.head(&d); hd.Releasable {
				heads[keylessSeq(d.ID)] = hd
			}
			continue
		}
		if _, ok := heads[d.PartitionKey]; !ok {
			heads[d.PartitionKey] = h.head(&d)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("outbox: read held keys of %s: %w", tp, err)
	}
	return heads, nil
}

// firstOf reads the head of key's sequence in the context's transaction
// (or outside one); ok is false when the key holds nothing.
func (h *Host) firstOf(ctx context.Context, tp consume.TopicPartition, key string) (d headDoc, ok bool, err error) {
	err = h.inbox.FindOne(ctx, seqFilter(tp, key),
		options.FindOne().SetSort(firstInSeq).SetProjection(store.HeadProjection())).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("outbox: read the held events of key %q in %s: %w", key, tp, err)
	}
	return d, true, nil
}

// Head returns the head of key's sequence.
func (h *Host) Head(ctx context.Context, tp consume.TopicPartition, key string) (consume.Head, bool, error) {
	d, ok, err := h.firstOf(ctx, tp, key)
	if !ok || err != nil {
		return consume.Head{}, false, err
	}
	return h.head(&d), true, nil
}

// touchHead writes the head of a sequence, so that the transaction
// conflicts with every other one that changes the sequence.
func (h *Host) touchHead(ctx context.Context, head ID, offset int64) error {
	_, err := h.inbox.UpdateOne(ctx, bson.D{{Key: store.InboxID, Value: head}}, store.TouchHeadUpdate(offset))
	return err
}

// Hold adds e at the end of its key's sequence (see the top of the file).
func (h *Host) Hold(ctx context.Context, tp consume.TopicPartition, e *consume.Event) error {
	d := deliveryOf(e)
	now := time.Now().UTC()
	return h.txOnce(ctx, func(tctx context.Context) error {
		head, ok, err := h.firstOf(tctx, tp, e.Key)
		if err != nil {
			return err
		}
		if !ok {
			return consume.ErrKeyFree
		}
		if err := h.touchHead(tctx, head.ID, e.Offset); err != nil {
			return err
		}
		payload := d.Payload()
		stored, note := store.StoredPayload(payload)
		set := bson.D{
			{Key: store.InboxParked, Value: true}, {Key: store.InboxParkedAt, Value: now}, {Key: store.InboxHeldBy, Value: head.ID},
			{Key: store.InboxPayload, Value: stored}, {Key: store.InboxLastError, Value: "held behind " + head.ID.String()},
		}
		if note != "" {
			set = append(set, bson.E{Key: store.InboxPayloadTruncated, Value: true}, bson.E{Key: store.InboxPayloadSize, Value: len(payload)})
		}
		if d.Unreadable() {
			set = append(set, bson.E{Key: store.InboxUnreadable, Value: true})
		}
		if ref := d.Ref(); ref != "" {
			set = append(set, bson.E{Key: store.InboxPayloadRef, Value: ref})
		}
		if e.Fault != nil {
			set = append(set, bson.E{Key: store.InboxFault, Value: store.Truncate(e.Fault.Error(), store.MaxErrorLen)})
		}
		onInsert := append(d.At(e.Offset).Fields(now, nil), bson.E{Key: store.InboxAttempts, Value: int32(0)})
		_, err = h.inbox.UpdateOne(tctx, store.NotDone(d.InboxID()),
			bson.D{{Key: "$set", Value: set}, {Key: "$setOnInsert", Value: onInsert}},
			options.UpdateOne().SetUpsert(true))
		if mongo.IsDuplicateKeyError(err) {
			return consume.ErrDone
		}
		return err
	})
}

// Park parks a delivered event for cause with inc more attempts and fails
// more failures, and returns the stored counts.
func (h *Host) Park(ctx context.Context, tp consume.TopicPartition, e *consume.Event, cause error, inc, fails int, reason string) (consume.Tally, error) {
	d := deliveryOf(e)
	extra := bson.D{{Key: store.InboxParked, Value: true}, {Key: store.InboxParkedAt, Value: time.Now().UTC()}, {Key: store.InboxParkReason, Value: reason}}
	if d.Unreadable() {
		extra = append(extra, bson.E{Key: store.InboxUnreadable, Value: true})
	}
	return h.noteDelivery(ctx, d, e.Offset, cause, inc, fails, extra)
}

// NoteFailure stores a failed run of a delivered event (not parked).
func (h *Host) NoteFailure(ctx context.Context, tp consume.TopicPartition, e *consume.Event, cause error, inc int) (consume.Tally, error) {
	return h.noteDelivery(ctx, deliveryOf(e), e.Offset, cause, inc, 1, nil)
}

// noteDelivery writes a delivered event's failure in one transaction: inc
// more attempts, fails more failures, the cause, the payload (for
// inspection and re-drive) and the extra fields; the document is inserted
// when absent. It returns the stored counts (earlier processes' included),
// or consume.ErrDone when the event is handled or parked.
func (h *Host) noteDelivery(ctx context.Context, d Delivery, offset int64, cause error, inc, fails int, extra bson.D) (consume.Tally, error) {
	now := time.Now().UTC()
	msg := store.Truncate(cause.Error(), store.MaxErrorLen)
	payload := d.Payload()
	stored, note := store.StoredPayload(payload)
	if note != "" {
		msg += " (" + note + ")"
	}
	set := append(bson.D{{Key: store.InboxLastError, Value: msg}, {Key: store.InboxPayload, Value: stored}}, extra...)
	if note != "" {
		set = append(set, bson.E{Key: store.InboxPayloadTruncated, Value: true}, bson.E{Key: store.InboxPayloadSize, Value: len(payload)})
	}
	if ref := d.Ref(); ref != "" {
		set = append(set, bson.E{Key: store.InboxPayloadRef, Value: ref})
	}
	onInsert := d.At(offset).Fields(now, nil)
	if len(extra) == 0 {
		onInsert = append(onInsert, bson.E{Key: store.InboxParked, Value: false})
	}
	id := d.InboxID()
	var got store.Tally
	err := h.txOnce(ctx, func(tctx context.Context) error {
		err := h.inbox.FindOneAndUpdate(tctx, store.NotDone(id),
			bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: store.InboxAttempts, Value: int32(inc)}, {Key: store.InboxFailures, Value: int32(fails)}}},
				{Key: "$setOnInsert", Value: onInsert}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After).
				SetProjection(store.TallyProjection())).Decode(&got)
		if mongo.IsDuplicateKeyError(err) {
			return consume.ErrDone
		}
		return err
	})
	if err != nil {
		if errors.Is(err, consume.ErrDone) || errors.Is(err, consume.ErrLocked) {
			return consume.Tally{}, err
		}
		return consume.Tally{}, fmt.Errorf("outbox: note failure of %s: %w", id, err)
	}
	return tallyOf(got), nil
}

// tallyOf converts the stored counts of runs.
func tallyOf(t store.Tally) consume.Tally {
	return consume.Tally{Attempts: int(t.Attempts), Failures: int(t.Failures)}
}

// Lookup reads the inbox state of evs; with count it also counts one
// attempt of each event not done, in the same transaction.
func (h *Host) Lookup(ctx context.Context, tp consume.TopicPartition, evs []*consume.Event, count bool) ([]consume.Stored, error) {
	ids := make(bson.A, len(evs))
	for i, e := range evs {
		ids[i] = deliveryOf(e).InboxID()
	}
	out := make([]consume.Stored, len(evs))
	read := func(ctx context.Context) error {
		cur, err := h.inbox.Find(ctx, bson.D{{Key: store.InboxID, Value: bson.D{{Key: "$in", Value: ids}}}},
			options.Find().SetProjection(append(bson.D{{Key: store.InboxHandled, Value: 1}, {Key: store.InboxParked, Value: 1}}, store.TallyProjection()...)))
		if err != nil {
			return err
		}
		var docs []Doc
		if err := cur.All(ctx, &docs); err != nil {
			return err
		}
		byID := make(map[ID]int, len(docs))
		for i, d := range docs {
			byID[d.ID] = i
		}
		for i, e := range evs {
			if j, ok := byID[deliveryOf(e).InboxID()]; ok {
				out[i] = consume.Stored{Done: docs[j].Handled || docs[j].Parked, Attempts: int(docs[j].Attempts), Failures: int(docs[j].Failures)}
			}
		}
		return nil
	}
	if !count {
		if err := read(ctx); err != nil {
			return nil, fmt.Errorf("outbox: look up events in the inbox: %w", err)
		}
		return out, nil
	}
	err := h.txOnce(ctx, func(tctx context.Context) error {
		if err := read(tctx); err != nil {
			return err
		}
		var models []mongo.WriteModel
		now := time.Now().UTC()
		for i, e := range evs {
			if out[i].Done {
				continue
			}
			out[i].Attempts++
			d := deliveryOf(e)
			models = append(models, mongo.NewUpdateOneModel().
				SetFilter(store.NotDone(d.InboxID())).
				SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: store.InboxAttempts, Value: int32(1)}}},
					{Key: "$setOnInsert", Value: append(d.At(e.Offset).Fields(now, nil), bson.E{Key: store.InboxParked, Value: false})}}).
				SetUpsert(true))
		}
		if len(models) == 0 {
			return nil
		}
		_, err := h.inbox.BulkWrite(tctx, models, options.BulkWrite().SetOrdered(true))
		return err
	})
	if err != nil {
		if errors.Is(err, consume.ErrLocked) {
			return nil, err
		}
		return nil, fmt.Errorf("outbox: count attempts in the inbox: %w", err)
	}
	return out, nil
}

// Release handles the head of key's sequence when it is releasable, in one
// transaction that also takes it off the sequence. A head that can never
// be handled here (unreadable, its payload refused, no handler) is parked
// for good instead, in the same transaction: HeadParked. A key made by
// keylessSeq releases that event without a key.
func (h *Host) Release(ctx context.Context, tp consume.TopicPartition, key string) (*consume.Event, consume.Result) {
	if id, ok := keylessID(key); ok {
		return h.ReleaseHead(ctx, tp, "", &id)
	}
	return h.ReleaseHead(ctx, tp, key, nil)
}

// keylessSeqPrefix starts the sequence key of an event without a partition
// key (no partition key starts with a NUL byte: the wire formats carry
// text keys).
const keylessSeqPrefix = "\x00id:"

// keylessSeq is the sequence key of a parked event without a partition
// key: a sequence of its own.
func keylessSeq(id ID) string { return keylessSeqPrefix + id.String() }

// keylessID reads the id of keylessSeq's key.
func keylessID(key string) (ID, bool) {
	s, ok := strings.CutPrefix(key, keylessSeqPrefix)
	if !ok {
		return ID{}, false
	}
	id, err := ParseID(s)
	return id, err == nil
}

// ReleaseHead is Release. With want (an operator's re-drive of a parked
// event), the event handled is want, even when it is parked for good, and
// only when it is the head of its key (else the result's Err wraps
// ErrHeld); an event without a key is handled on its own.
func (h *Host) ReleaseHead(ctx context.Context, tp consume.TopicPartition, key string, want *ID) (*consume.Event, consume.Result) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	t, err := h.app.Begin(actx)
	if err != nil {
		return nil, infraResult(ctx, err)
	}
	defer t.End(actx)
	var d Doc
	if want != nil && key == "" {
		err = h.inbox.FindOne(t.Ctx, parkedOne(*want)).Decode(&d)
	} else {
		err = h.inbox.FindOne(t.Ctx, seqFilter(tp, key), options.FindOne().SetSort(firstInSeq)).Decode(&d)
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, consume.Result{Kind: consume.Empty}
	}
	if err != nil {
		return nil, infraResult(ctx, LockedOr(err))
	}
	if want != nil && d.ID != *want {
		return nil, consume.Result{Kind: consume.HeadParked, Err: fmt.Errorf("%w: %s is held behind %s", ErrHeld, *want, d.ID)}
	}
	held := d.HeldBy != nil
	if !held && want == nil && !(d.ParkReason == store.ParkReasonNoHandler && h.app.Releasable(d.ID)) {
		return nil, consume.Result{Kind: consume.HeadParked}
	}
	e, err := h.app.Stored(t.Ctx, &d)
	if err != nil && h.app.Transient(err) {
		// The store the event's payload lives in failing is not the
		// event's fault: the release is tried again.
		return e, infraResult(ctx, err)
	}
	if err != nil && e.NoHandler && h.skipUnknown {
		// No replica of the service takes it: it is skipped, as it would
		// have been had it met a free key, and the key moves on.
		if _, err := h.inbox.UpdateOne(t.Ctx, parkedOne(d.ID), store.SkipUpdate(store.ParkReasonNoHandler, time.Now().UTC())); err != nil {
			return nil, infraResult(ctx, LockedOr(err))
		}
		if err := t.Commit(actx); err != nil {
			return nil, infraResult(ctx, err)
		}
		return e, consume.Result{Kind: consume.Skipped}
	}
	if err != nil && want != nil {
		return e, consume.Result{Kind: consume.HeadParked, Err: err}
	}
	if err != nil {
		// It can never run here: it becomes the head for good, saying why.
		reason, why := store.ParkReasonMalformed, err.Error()
		if d.Fault != "" {
			why = d.Fault
		}
		if e.NoHandler {
			reason = store.ParkReasonNoHandler
		}
		if held || d.ParkReason != reason {
			if err := h.parkHead(t.Ctx, &d, why, 0, reason); err != nil {
				return nil, infraResult(ctx, LockedOr(err))
			}
			if err := t.Commit(actx); err != nil {
				return nil, infraResult(ctx, err)
			}
		}
		return nil, consume.Result{Kind: consume.HeadParked}
	}
	hctx, hcancel := context.WithTimeout(t.Ctx, h.app.Timeout(e))
	defer hcancel()
	res, err := h.inbox.UpdateOne(t.Ctx, parkedNotHandled(d.ID), store.UnparkUpdate(time.Now().UTC()))
	if err != nil {
		return e, infraResult(ctx, LockedOr(err))
	}
	if res.MatchedCount == 0 {
		return e, consume.Result{Kind: consume.Empty}
	}
	end, err := h.app.Run(hctx, e, int(d.Attempts)+1, time.Now())
	if err != nil {
		end(&HandlerError{err})
		return e, h.handlerResult(ctx, err)
	}
	if err := t.Flush(hctx); err != nil {
		res := h.flushResult(ctx, hctx, err)
		if res.Kind == consume.Failed {
			end(&HandlerError{err})
		} else {
			end(err)
		}
		return e, res
	}
	if err := t.Commit(hctx); err != nil {
		end(&CommitError{err})
		if ctx.Err() != nil {
			return e, consume.Result{Kind: consume.Canceled, Err: err}
		}
		return e, consume.Result{Kind: consume.CommitFailed, Err: &CommitError{err}}
	}
	end(nil)
	t.Committed(ctx)
	return e, consume.Result{Kind: consume.Handled}
}

// parkHead parks a sequence's head for good in the context's transaction:
// it holds its key until an operator acts.
func (h *Host) parkHead(ctx context.Context, d *Doc, why string, inc int, reason string) error {
	_, err := h.inbox.UpdateOne(ctx, parkedOne(d.ID), store.ParkHeadUpdate(why, inc, reason, d.Unreadable, time.Now().UTC()))
	return err
}

// parkedOne selects the inbox document of id while it is parked.
func parkedOne(id ID) bson.D {
	return bson.D{{Key: store.InboxID, Value: id}, {Key: store.InboxParked, Value: true}}
}

// parkedNotHandled selects the inbox document of id while it is parked and
// not handled.
func parkedNotHandled(id ID) bson.D {
	return append(parkedOne(id), bson.E{Key: store.InboxHandled, Value: false})
}

// NoteReleaseFailure stores a failed attempt of a sequence's head, and
// parks it for good with park.
func (h *Host) NoteReleaseFailure(ctx context.Context, tp consume.TopicPartition, e *consume.Event, cause error, inc int, park bool, reason string) (consume.Tally, error) {
	id := deliveryOf(e).InboxID()
	update := bson.D{{Key: "$set", Value: bson.D{{Key: store.InboxLastError, Value: store.Truncate(cause.Error(), store.MaxErrorLen)}}},
		{Key: "$inc", Value: bson.D{{Key: store.InboxAttempts, Value: int32(inc)}, {Key: store.InboxFailures, Value: int32(inc)}}}}
	if park {
		update = store.ParkHeadUpdate(cause.Error(), inc, reason, false, time.Now().UTC())
	}
	var got store.Tally
	err := h.txOnce(ctx, func(tctx context.Context) error {
		return h.inbox.FindOneAndUpdate(tctx, parkedNotHandled(id), update,
			options.FindOneAndUpdate().SetReturnDocument(options.After).SetProjection(store.TallyProjection())).Decode(&got)
	})
	if errors.Is(err, mongo.ErrNoDocuments) {
		return consume.Tally{}, consume.ErrDone
	}
	if err != nil {
		return consume.Tally{}, fmt.Errorf("outbox: note failure of %s: %w", id, err)
	}
	return tallyOf(got), nil
}

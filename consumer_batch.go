package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/trace"
)

// batchItem is one decoded record of a batch.
type batchItem struct {
	h    *handler
	evt  Event
	meta Metadata
}

// handleBatch handles the longest prefix of recs (at most
// Config.HandleBatchSize records, at least two) whose records decode and have
// a handler, in one transaction: one bulk update claiming every event, the
// handlers in order, one insertMany of the events they recorded, one commit. It returns how many
// records it handled (0 when it did not commit) and, when it did not, the
// index of the record the caller must handle on its own before trying a batch
// again: the one that failed the batch, or 0 when no batch was possible. The
// events of an aborted batch are rolled back; handling them one by one
// (handleRecord) gives each its retries, parking and duplicate skipping.
//
// A record whose partition key is held (kh) ends the batch: it is held by
// handleRecord. The transaction runs within Config.HandlerTimeout.
func (c *Client) handleBatch(ctx context.Context, kh *keyHolds, recs []*kgo.Record) (handled, failedAt int) {
	limit := min(len(recs), c.cfg.HandleBatchSize)
	items := make([]batchItem, 0, limit)
	for _, rec := range recs[:limit] {
		env, payload, err := decodeRecord(rec)
		if err != nil {
			break
		}
		h := c.handlerFor(env.Topic, env.ContentSchema)
		if h == nil || kh.holding(env.PartitionKey) {
			break
		}
		evt, err := h.decode(c, payload)
		if err != nil {
			break
		}
		items = append(items, batchItem{h: h, evt: evt, meta: Metadata{Envelope: env, Offset: rec.Offset, Attempt: 1}})
	}
	if len(items) < 2 {
		return 0, 0
	}

	start := time.Now()
	type spanned struct {
		ctx  context.Context
		span trace.Span
	}
	var spans []spanned
	endAborted := func() {
		for _, s := range spans {
			if s.span.IsRecording() {
				s.span.SetAttributes(attrOutcome.String("batch_aborted"))
			}
			s.span.End()
		}
		spans = nil
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	last, err := c.inTransaction(actx, func(tctx context.Context) error {
		endAborted() // spans of an earlier attempt of this transaction
		// All claims in one command (an ordered bulk of upserts): a handled
		// or parked event stops it with a duplicate key error at its index.
		now := time.Now().UTC()
		models := make([]mongo.WriteModel, len(items))
		for i := range items {
			filter, update := claimUpdate(&items[i].meta.Envelope, items[i].meta.Offset, nil, now)
			models[i] = mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(true)
		}
		failedAt = 0
		if _, err := c.inbox.BulkWrite(tctx, models, options.BulkWrite().SetOrdered(true)); err != nil {
			var bwe mongo.BulkWriteException
			if errors.As(err, &bwe) && len(bwe.WriteErrors) > 0 {
				failedAt = bwe.WriteErrors[0].Index
			}
			if mongo.IsDuplicateKeyError(err) {
				return errAlreadyDone
			}
			return err
		}
		for i := range items {
			it := &items[i]
			failedAt = i
			ectx, span := c.tel.startHandle(tctx, &it.meta)
			spans = append(spans, spanned{ectx, span})
			if err := safeRun(ectx, it.h, it.evt, it.meta); err != nil {
				return &handlerError{err}
			}
		}
		failedAt = len(items) - 1 // the insert of recorded events, or the commit
		return nil
	}, wrapHandlerError)
	if err != nil {
		endAborted()
		c.cfg.Logger.Debug("batch rolled back; handling its events one by one", "events", len(items), "failed_at", failedAt, "err", err)
		return 0, failedAt
	}
	c.tel.committed(ctx, last)
	for i, s := range spans {
		c.tel.endHandle(s.ctx, s.span, &items[i].meta.Envelope, start, nil)
	}
	return len(items), 0
}

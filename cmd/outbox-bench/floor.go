package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// The floor phase is the relay's own MongoDB work with Kafka taken away:
// the least time any relay that reads its events from this outbox and
// marks them published can take. Raw produce (the other baseline) is a
// broker that does no I/O; relay / raw says little, relay / floor says how
// much the publisher adds to the database work it cannot avoid.
//
// It copies what the framework's publisher does on a backlog
// (internal/publish/worker.go scanning, publisher.go outboxStore): one
// worker per partition; each round flushes the ids acknowledged so far with
// one updateMany {_id: {$in: ids}} → {published: true, published_at} (the
// Marker is shared by every partition, so one flush writes the ids of all
// of them), then reads the next PublishBatchSize (500) pending events of
// its partition with the same filter, sort, limit and batch size (the
// partial index outbox_pending), decodes them into the outbox document
// shape, builds the Kafka records in the native wire format and
// acknowledges them at once instead of producing them. The clock runs from
// the first find to the last update (the command monitor, as for the
// relay).

// floorSink keeps the built records from being optimised away.
var floorSink atomic.Int64

// floorBatch is the framework's default Config.PublishBatchSize.
const floorBatch = 500

// floorDoc is the framework's outbox document, so decoding costs what the
// publisher's decoding costs.
type floorDoc = store.OutboxDoc

// floorMarker is the publisher's Marker reduced to what a backlog uses:
// acknowledged ids wait in one queue for every partition, and a flush
// writes all of them.
type floorMarker struct {
	coll    *mongo.Collection
	flushMu sync.Mutex
	mu      sync.Mutex
	queue   []any
}

func (m *floorMarker) add(ids []any) {
	m.mu.Lock()
	m.queue = append(m.queue, ids...)
	m.mu.Unlock()
}

func (m *floorMarker) flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	m.mu.Lock()
	ids := m.queue
	m.queue = nil
	m.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	_, err := m.coll.UpdateMany(ctx,
		bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: "published", Value: true},
			{Key: "published_at", Value: time.Now().UTC()},
		}}})
	if err != nil {
		return fmt.Errorf("mark %d events published: %w", len(ids), err)
	}
	return nil
}

// runFloor records a backlog of n events and relays it with the
// publisher's MongoDB work and no Kafka.
func runFloor(ctx context.Context, e *env, n int) (baselineResult, error) {
	coll, err := fillBaseline(ctx, e, "floor", topics.floor, n, func(i int) outbox.Event {
		return floorEvent{newPayload(i, e.opts.eventSize)}
	})
	if err != nil {
		return baselineResult{}, err
	}
	m := &floorMarker{coll: coll}
	e.pubCount.reset()
	var wg sync.WaitGroup
	errs := make(chan error, e.opts.partitions)
	for p := range e.opts.partitions {
		wg.Go(func() {
			if err := floorWorker(ctx, coll, m, topics.floor, int32(p)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return baselineResult{}, err
	}
	if err := m.flush(ctx); err != nil {
		return baselineResult{}, err
	}
	if got := e.pubCount.marked.Load(); got != int64(n) {
		return baselineResult{}, fmt.Errorf("floor relay marked %d events, want %d", got, n)
	}
	first, last := e.pubCount.firstFind.Load(), e.pubCount.lastMark.Load()
	secs := time.Duration(last - first).Seconds()
	return baselineResult{Events: n, Seconds: secs, Rate: float64(n) / secs,
		MongoPerEvent: float64(e.pubCount.total.Load()) / float64(n)}, nil
}

// floorWorker relays one partition until a read finds it empty.
func floorWorker(ctx context.Context, coll *mongo.Collection, m *floorMarker, topic string, partition int32) error {
	filter := bson.D{
		{Key: "published", Value: false},
		{Key: "topic", Value: topic},
		{Key: "partition", Value: partition},
		{Key: "failed", Value: false},
	}
	opts := options.Find().
		SetSort(bson.D{{Key: "seq", Value: 1}, {Key: "_id", Value: 1}}).
		SetLimit(floorBatch).
		SetBatchSize(floorBatch)
	for {
		// As the worker does: marks still waiting would make the scan
		// return their events again.
		if err := m.flush(ctx); err != nil {
			return err
		}
		cur, err := coll.Find(ctx, filter, opts)
		if err != nil {
			return fmt.Errorf("find pending events: %w", err)
		}
		var docs []floorDoc
		if err := cur.All(ctx, &docs); err != nil {
			return fmt.Errorf("read pending events: %w", err)
		}
		if len(docs) == 0 {
			return nil
		}
		recs := make([]*kgo.Record, len(docs))
		ids := make([]any, len(docs))
		for i := range docs {
			d := &docs[i]
			recs[i] = record(d.Topic, d.Partition, d.Key, d.Schema, d.IdempotencyKey, d.OccurredAt, []byte(d.Payload))
			ids[i] = d.ID
		}
		// Kafka acknowledges every record at once.
		floorSink.Add(int64(len(recs)))
		m.add(ids)
		if len(docs) < floorBatch {
			return nil
		}
	}
}

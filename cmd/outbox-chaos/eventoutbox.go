package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// A service on the Python event-outbox library (v0.4.0) producing into the
// same topic (issue 20's fourth and fifth defects): during the load, the
// harness produces step events in the library's flat JSON body, without
// any header, straight to Kafka, as the library does. The body's topic is
// the Kafka topic the library produced to, prefix included (-topic-prefix);
// half the records carry a Kafka key, half carry none and name their key
// in the body's integer partition_key (the library's partitioning). Each
// event takes its place in its key's sequence (a ledger entry marked
// external, written before the record is produced), on keys of their own
// (eventOutboxKeys), so that the library's producer, which the outbox does
// not order, keeps each key's order by producing one record at a time.
// The step handler handles them like every step event: every check judges
// them (lost, double effects, per-key order, chains), but for the outbox,
// where they never were.

// eventOutboxKeyed and eventOutboxKeyless are the keys of the library's
// records: with a Kafka key, and named by partition_key alone (integers).
var (
	eventOutboxKeyed   = []string{"py0", "py1", "py2", "py3", "py4", "py5"}
	eventOutboxKeyless = []string{"9000", "9001", "9002", "9003", "9004", "9005"}
)

// eventOutboxKeys are the keys prepare creates documents for.
func eventOutboxKeys() []string {
	return append(append([]string(nil), eventOutboxKeyed...), eventOutboxKeyless...)
}

// eventOutboxEvery is the pace of the library's records during the load.
const eventOutboxEvery = 250 * time.Millisecond

// runEventOutbox produces the library's records until ctx ends, keyed and
// key-less in turns. Its goroutine belongs to the load's WaitGroup.
func (h *harness) runEventOutbox(ctx context.Context) {
	t := time.NewTicker(eventOutboxEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keyed := i%2 == 0
		keys := eventOutboxKeyless
		if keyed {
			keys = eventOutboxKeyed
		}
		key := keys[(i/2)%len(keys)]
		if i%20 == 3 || i%20 == 4 {
			// Two records in twenty have no idempotency_key, one key-less
			// and one keyed, early in each round, after one of each kind
			// with one: a loaded run may get only a few records out (each
			// is retried until produced). Parked as malformed, it must
			// hold its key (from the Kafka key, or the body's
			// partition_key) until the operator purges it.
			if err := h.produceEventOutboxWithoutID(ctx, key, keyed); err != nil && ctx.Err() == nil {
				h.logf("event-outbox record of key %s without idempotency_key: %v", key, err)
			}
			continue
		}
		if err := h.produceEventOutbox(ctx, key, keyed); err != nil && ctx.Err() == nil {
			h.logf("event-outbox record of key %s: %v", key, err)
		}
	}
}

// produceEventOutbox commits one event of key to the ledger, then produces
// it in the library's format until Kafka acknowledges it. A record whose
// ledger entry committed is always produced (past the load's end if need
// be): the ledger says it must be handled.
func (h *harness) produceEventOutbox(ctx context.Context, key string, keyed bool) error {
	id := h.work.newID()
	var entry ledgerEntry
	for attempt := 1; ; attempt++ {
		var err error
		entry, err = h.ledgerExternal(ctx, id, key)
		if err == nil {
			break
		}
		if attempt == 20 || ctx.Err() != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return nil
		}
	}
	rec := eventOutboxRecord(&entry, keyed, h.cfg.partitions, h.inj.partitionOf)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for {
		r := h.inj.raw.ProduceSync(pctx, rec)
		err := r.FirstErr()
		pos := recordPosID{recordPos{chaosTopic(), rec.Partition, rec.Offset}, id}
		if err == nil {
			h.klog.noteRogue([]recordPosID{pos}, nil)
			h.mu.Lock()
			if keyed {
				h.eventOutboxKeyed++
			} else {
				h.eventOutboxKeyless++
			}
			h.mu.Unlock()
			return nil
		}
		h.klog.noteRogue(nil, []recordPosID{pos}) // may be in the topic all the same
		if pctx.Err() != nil {
			return fmt.Errorf("produce %s: %w (its ledger entry committed: it will be reported lost)", id, err)
		}
		rec = eventOutboxRecord(&entry, keyed, h.cfg.partitions, h.inj.partitionOf)
		_ = sleepCtx(pctx, 100*time.Millisecond)
	}
}

// produceEventOutboxWithoutID produces a record of key in the library's
// format without idempotency_key: a malformed record (counted as one).
func (h *harness) produceEventOutboxWithoutID(ctx context.Context, key string, keyed bool) error {
	e := ledgerEntry{ID: "x", Topic: chaosTopic(), Key: key, Seq: 1, Kind: kindStep}
	rec := eventOutboxRecord(&e, keyed, h.cfg.partitions, h.inj.partitionOf)
	var body map[string]any
	if err := json.Unmarshal(rec.Value, &body); err != nil {
		return err
	}
	delete(body, "idempotency_key")
	body["id"] = "malformed-eo"
	rec.Value, _ = json.Marshal(body) // it decoded from JSON
	if err := h.inj.produceMalformed(ctx, rec); err != nil {
		return err
	}
	h.mu.Lock()
	h.eventOutboxNoID++
	h.mu.Unlock()
	return nil
}

// ledgerExternal takes the next seq and place of key and writes the
// event's ledger entry, in one transaction on the harness's connection. A
// retry after a commit of unknown outcome finds the entry already there.
func (h *harness) ledgerExternal(ctx context.Context, id, key string) (ledgerEntry, error) {
	var e ledgerEntry
	ledger := h.db.Collection(collLedger)
	if err := ledger.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&e); err == nil {
		return e, nil
	} else if !errors.Is(err, mongo.ErrNoDocuments) {
		return e, err
	}
	sess, err := h.admin.StartSession()
	if err != nil {
		return e, err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		var c struct {
			Seq   int64 `bson:"seq"`
			Place int64 `bson:"place"`
		}
		err := h.db.Collection(collCounters).FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: key}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}, {Key: "place", Value: int64(1)}}}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
		if err != nil {
			return nil, err
		}
		e = ledgerEntry{ID: id, Topic: chaosTopic(), Key: key, Seq: c.Seq, Place: c.Place, Kind: kindStep, External: true}
		_, err = ledger.InsertOne(ctx, e)
		return nil, err
	})
	return e, err
}

// eventOutboxRecord is the record the Python library would produce for a
// step event: the flat body (envelope fields, then the event's), no
// header; keyed, the Kafka key is the partition key, else the body's
// integer partition_key names it and chooses the partition, as the
// library's partitioning does.
func eventOutboxRecord(e *ledgerEntry, keyed bool, partitions int, partitionOf func(string) int32) *kgo.Record {
	body := map[string]any{
		"topic":           kafkaTopic(e.Topic), // the library writes the topic it produced to
		"content_schema":  schemaStep,
		"idempotency_key": e.ID,
		"occurred_at":     time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
		"key":             e.Key,
		"seq":             e.Seq,
		"id":              e.ID,
	}
	rec := &kgo.Record{Topic: kafkaTopic(e.Topic)}
	if keyed {
		rec.Key = []byte(e.Key)
		rec.Partition = partitionOf(e.Key)
		body["partition_key"] = 0 // the library's default; a Kafka key wins
	} else {
		n, _ := strconv.Atoi(e.Key)
		body["partition_key"] = n
		rec.Partition = int32(n % partitions)
	}
	rec.Value, _ = json.Marshal(body) // a map of strings and numbers always encodes
	return rec
}

// recordKey is a record's partition key as the harness judges it: its
// Kafka key, or for a record of the Python library without one, the
// body's integer partition_key (the library's key).
func recordKey(r *kgo.Record) string {
	if r.Key != nil || headerValue(r, outbox.HeaderVersion) != "" {
		return string(r.Key)
	}
	var body struct {
		PartitionKey *int64 `json:"partition_key"`
	}
	if json.Unmarshal(r.Value, &body) != nil || body.PartitionKey == nil {
		return ""
	}
	return strconv.FormatInt(*body.PartitionKey, 10)
}

// bodyIdentity reads the idempotency key and content schema of a record
// without the framework's headers from its event-outbox body ("" when it
// has none).
func bodyIdentity(r *kgo.Record) (id, schema string) {
	if headerValue(r, outbox.HeaderVersion) != "" {
		return "", ""
	}
	var body struct {
		ID     string `json:"idempotency_key"`
		Schema string `json:"content_schema"`
	}
	if json.Unmarshal(r.Value, &body) != nil {
		return "", ""
	}
	return body.ID, body.Schema
}

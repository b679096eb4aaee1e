package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.opentelemetry.io/otel/propagation"

	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/store"
)

// outboxDoc is the stored form of a recorded event (see store.OutboxDoc).
type outboxDoc = store.OutboxDoc

// outboxEnvelope rebuilds the envelope of a recorded event.
func outboxEnvelope(d *outboxDoc) Envelope {
	return Envelope{
		Topic:          d.Topic,
		ContentSchema:  d.Schema,
		IdempotencyKey: d.IdempotencyKey,
		PartitionKey:   d.Key,
		Partition:      d.Partition,
		OccurredAt:     d.OccurredAt,
		TraceParent:    d.TraceParent,
		TraceState:     d.TraceState,
		Format:         formatOfStored(d.Format),
		Source:         d.Source,
	}
}

// txKey is the context key of the transaction state.
type txKey struct{}

// txState collects the events recorded during one attempt of a transaction.
// A new one is made for every attempt, so a retried callback never
// publishes the events of an aborted attempt.
type txState struct {
	client *Client
	docs   []any
	chunks []any            // payload chunks of docs stored out of band (claimcheck.go)
	counts map[string]int64 // events inserted by flush, by topic (metrics)
	claims map[string]int64 // of which with their payload out of band
	// scheduled are the events recorded with a publication time, inserted
	// by flush into the scheduled events' collection (schedule.go).
	scheduled []any
}

// describe names c in errors: its service and outbox collection.
func (c *Client) describe() string {
	return fmt.Sprintf("the Client of service %q (outbox %s.%s)", c.cfg.Service, c.outbox.Database().Name(), c.outbox.Name())
}

func txFrom(ctx context.Context) *txState {
	tx, _ := ctx.Value(txKey{}).(*txState)
	return tx
}

// Transact runs fn in a MongoDB transaction. Business writes that use the
// context fn receives join the transaction; events recorded with Record are
// inserted into the outbox (one insertMany) just before the commit, so both
// commit or neither does.
//
// fn may run more than once: the driver retries the whole transaction on
// TransientTransactionError and the commit on UnknownTransactionCommitResult
// (see mongo.Session.WithTransaction). Events recorded by an attempt that
// did not commit are discarded. fn must return the errors of the operations
// it runs; a non-nil error aborts the transaction and is returned as is.
//
// Called with the context of a handler or of another Transact of the same
// Client, it joins that transaction instead of starting one. Called with
// the context of another Client's handler or Transact, it returns an error
// wrapping ErrForeignTransaction and runs nothing: Record writes through
// the Client that opened the transaction of its context, so joining would
// put this Client's events into the other's outbox. Two Clients may share
// one mongo.Client; each records in transactions of its own.
//
// Transact never calls Kafka inside the transaction. Before starting it, it
// makes sure the partition counts of Config.PublishTopics are known: from
// memory, else from MongoDB (persisted by earlier reads), else, on a
// service's first-ever start, from Kafka with a bound of a few seconds.
// When none of these works (first start while Kafka is down), Record fails
// at once with ErrPartitionsUnknown.
func (c *Client) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	if tx := txFrom(ctx); tx != nil {
		if tx.client != c {
			return fmt.Errorf("%w: Transact of %s called with a transaction of %s",
				ErrForeignTransaction, c.describe(), tx.client.describe())
		}
		return fn(ctx)
	}
	last, err := c.inTransaction(ctx, fn, nil)
	if err == nil && last != nil {
		c.tel.ins.Committed(ctx, last.counts, last.claims)
	}
	return err
}

// inTransaction runs fn in a new session's transaction with the driver's
// retries. Every attempt gets a fresh txState in its context, and the events
// the attempt recorded are inserted just before the commit; wrapFlush, when
// not nil, wraps an error of that insert. It returns the state of the last
// attempt, the one that committed when the error is nil.
func (c *Client) inTransaction(ctx context.Context, fn func(ctx context.Context) error, wrapFlush func(error) error) (*txState, error) {
	// Partition counts are learnt now, never inside the transaction:
	// Record only reads them from memory (internal/topicmeta).
	c.topics.Prepare(ctx)
	if err := c.ensureUniqueIndex(ctx); err != nil {
		return nil, err
	}
	sess, err := c.cfg.Mongo.StartSession()
	if err != nil {
		return nil, fmt.Errorf("outbox: start session: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	var last *txState
	_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		// The driver retries TransientTransactionError for up to 120 s and
		// ignores cancellation between attempts (an operation cut short by
		// the cancellation is itself labelled transient): stop here instead,
		// or a shutdown waits two minutes per transaction in hand.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		tx := &txState{client: c}
		last = tx
		tctx := context.WithValue(sctx, txKey{}, tx)
		if err := fn(tctx); err != nil {
			abortSoon(ctx, sess)
			return nil, err
		}
		if err := tx.flush(tctx); err != nil {
			if wrapFlush != nil {
				err = wrapFlush(err)
			}
			abortSoon(ctx, sess)
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			// The driver would abort it on a background context too.
			abortSoon(ctx, sess)
			return nil, err
		}
		return nil, nil
	}, txnOptions())
	return last, err
}

// abortTimeout is the least time the abort of a failed transaction gets.
const abortTimeout = 2 * time.Second

// abortSoon aborts sess's failed transaction by the caller's deadline (at
// least abortTimeout from now; abortTimeout once ctx ended). The driver
// would abort it itself, but on a background context: while MongoDB is
// down (a write failed on a closed connection, or the caller's deadline
// passed) that waits for its server selection timeout, 30 s by default,
// long after the caller's deadline (a request answering 503) and a
// shutdown's grace. The driver then finds no transaction to abort. A caller
// without a deadline gets the driver's wait. An abort that fails leaves the
// transaction to the server, which aborts it at
// transactionLifetimeLimitSeconds (meanwhile its writes' locks hold): a
// caller's deadline, not a shorter bound, decides when to give up on it.
func abortSoon(ctx context.Context, sess *mongo.Session) {
	actx := context.WithoutCancel(ctx)
	d, hasDeadline := ctx.Deadline()
	switch {
	case ctx.Err() != nil:
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, abortTimeout)
		defer cancel()
	case hasDeadline:
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, max(time.Until(d), abortTimeout))
		defer cancel()
	}
	_ = sess.AbortTransaction(actx)
}

func txnOptions() *options.TransactionOptionsBuilder {
	return options.Transaction().SetWriteConcern(writeconcern.Majority())
}

// flush inserts the recorded events into the outbox in one insertMany,
// the scheduled ones into their collection, and the chunks of the
// payloads of both stored out of band.
func (tx *txState) flush(ctx context.Context) error {
	if err := tx.flushScheduled(ctx); err != nil {
		return err
	}
	if len(tx.docs) > 0 {
		if err := tx.client.checkNotScheduled(ctx, tx.docs); err != nil {
			return err
		}
	}
	if err := tx.client.claims.Insert(ctx, tx.chunks); err != nil {
		return err
	}
	tx.chunks = tx.chunks[:0]
	if len(tx.docs) == 0 {
		return nil
	}
	if _, err := tx.client.outbox.InsertMany(ctx, tx.docs); err != nil {
		return flushError(len(tx.docs), err)
	}
	if tx.counts == nil {
		tx.counts = map[string]int64{}
	}
	for _, d := range tx.docs {
		od := d.(*outboxDoc)
		tx.counts[od.Topic]++
		tx.countClaim(od)
	}
	tx.docs = tx.docs[:0]
	return nil
}

// countClaim counts d in tx.claims when its payload is stored out of band.
func (tx *txState) countClaim(d *outboxDoc) {
	if d.PayloadRef == nil {
		return
	}
	if tx.claims == nil {
		tx.claims = map[string]int64{}
	}
	tx.claims[d.Topic]++
}

var traceContext = propagation.TraceContext{}

// Record records an event in the transaction of ctx, which must come from
// Client.Transact or from a handler (else ErrNoTransaction). The event goes
// into the outbox of the Client whose Transact or handler made ctx, and
// must be one of that Client's Config.PublishTopics (Client.Transact
// refuses to join another Client's transaction, see ErrForeignTransaction). The event is
// validated now: an invalid event returns an error that wraps
// ErrInvalidEvent (a *ValidationError names the field), and the caller
// returning it aborts the transaction. The trace context of ctx, if any, is
// captured now and travels with the event. Record does no I/O: the event's
// partition comes from the partition count learnt before the transaction
// (an error wrapping ErrPartitionsUnknown when there is none, see
// Client.Transact).
func Record(ctx context.Context, e Event, opts ...RecordOption) error {
	tx := txFrom(ctx)
	if tx == nil {
		return ErrNoTransaction
	}
	doc, chunks, err := tx.client.newOutboxDoc(ctx, e, opts...)
	if err != nil {
		return err
	}
	// A scheduled event's chunks are inserted now too, keyed by its
	// payload_ref, which its promotion copies into the outbox document.
	tx.chunks = append(tx.chunks, chunks...)
	if due, ok := scheduledFor(opts); ok {
		tx.schedule(doc, due)
		return nil
	}
	tx.docs = append(tx.docs, doc)
	return nil
}

// isNil reports whether e is nil or holds a nil pointer, map, slice,
// func, channel or interface: its methods (Topic, ContentSchema) would
// dereference it, and its JSON is null, never an event.
func isNil(e Event) bool {
	if e == nil {
		return true
	}
	switch v := reflect.ValueOf(e); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// newOutboxDoc builds the outbox document of e and, when its payload goes
// out of band (Config.ClaimCheck), the chunks to insert with it.
func (c *Client) newOutboxDoc(ctx context.Context, e Event, opts ...RecordOption) (*outboxDoc, []any, error) {
	if isNil(e) {
		return nil, nil, fmt.Errorf("%w: nil event", ErrInvalidEvent)
	}
	var o recordOptions
	for _, opt := range opts {
		opt(&o)
	}
	topic, schema, key := e.Topic(), e.ContentSchema(), e.PartitionKey()
	if err := checkName("topic", topic); err != nil {
		return nil, nil, err
	}
	if err := checkName("content schema", schema); err != nil {
		return nil, nil, err
	}
	if len(key) > maxKeyLen {
		return nil, nil, fmt.Errorf("%w: %s: partition key longer than %d bytes", ErrInvalidEvent, schema, maxKeyLen)
	}
	if !c.publishTopics[topic] {
		return nil, nil, fmt.Errorf("%w: %q (event %s)", ErrUnknownTopic, topic, schema)
	}
	if err := c.validateEvent(schema, e); err != nil {
		return nil, nil, err
	}
	if o.idempotencyKey == "" {
		o.idempotencyKey = NewIdempotencyKey()
	} else if len(o.idempotencyKey) > maxKeyLen {
		return nil, nil, fmt.Errorf("%w: %s: idempotency key longer than %d bytes", ErrInvalidEvent, schema, maxKeyLen)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	if o.occurredAt.IsZero() {
		o.occurredAt = now
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: encode JSON: %w", ErrInvalidEvent, schema, err)
	}
	partitions, err := c.topics.Get(topic)
	if err != nil {
		return nil, nil, err
	}
	wire, err := c.wireFields(e, topic, schema, key, o.idempotencyKey, payload, partitions)
	if err != nil {
		return nil, nil, err
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	doc := &outboxDoc{
		ID:             bson.NewObjectID(),
		Topic:          topic,
		Partition:      wire.partition,
		Key:            key,
		Schema:         schema,
		IdempotencyKey: o.idempotencyKey,
		OccurredAt:     o.occurredAt.UTC().Truncate(time.Millisecond),
		Payload:        string(wire.payload),
		Format:         wire.format,
		Source:         wire.source,
		TraceParent:    carrier.Get(HeaderTraceParent),
		TraceState:     carrier.Get(HeaderTraceState),
		CreatedAt:      now,
	}
	chunks, err := c.claimCheck(doc)
	if err != nil {
		return nil, nil, err
	}
	return doc, chunks, nil
}

// checkSize refuses an event whose record cannot fit in its topic's
// max.message.bytes, when that is known (ErrEventTooLarge). The record is
// built and compressed only for an event near or above the limit.
func (c *Client) checkSize(d *outboxDoc) error {
	limit, ok := c.topics.MaxMessageBytes(d.Topic)
	if !ok || len(d.Payload)+len(d.Key)+sizeSlack < limit {
		return nil
	}
	rec := outboxItem(d, c.cfg.TopicPrefix).Record
	size := publish.RecordBatchBytes(rec)
	if size <= limit {
		return nil
	}
	compressed := c.compressedSize(rec)
	if compressed <= limit {
		return nil // the publisher sends it alone, compressed (internal/publish/producer.go)
	}
	return &EventTooLargeError{Topic: d.Topic, ContentSchema: d.Schema, Size: size, CompressedSize: compressed, Limit: limit}
}

// sizeSlack bounds what a record adds to its payload and key (headers,
// framing): an event this far below its topic's limit fits.
const sizeSlack = 16 << 10

// compressedSize estimates the size of a batch holding rec alone,
// compressed with the codec of the publisher's producer (Config.Compression,
// gzip by default, unless Config.KafkaOptions set a codec after it): its
// header and its record's bytes compressed.
func (c *Client) compressedSize(rec *kgo.Record) int {
	comp := c.compressor()
	raw := publish.RecordBatchBytes(rec)
	if comp == nil {
		return raw
	}
	src := make([]byte, 0, raw)
	src = append(src, rec.Key...)
	src = append(src, rec.Value...)
	for _, h := range rec.Headers {
		src = append(append(src, h.Key...), h.Value...)
	}
	var buf bytes.Buffer
	out, _ := comp.Compress(&buf, src)
	return min(raw, raw-len(src)+len(out))
}

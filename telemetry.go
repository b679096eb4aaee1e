package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/publish"
)

// Telemetry.
//
// The framework reports through the OpenTelemetry API only (no SDK, no
// exporter): Config.MeterProvider and Config.TracerProvider, the global
// providers by default, so a service that installs an SDK gets everything
// and one that does not pays next to nothing.
//
// Metrics (instrumentation scope "github.com/event-outbox/outbox"):
//
//	outbox.events.recorded      counter    events committed to the outbox {topic}
//	outbox.events.published     counter    events acknowledged by Kafka {topic}
//	outbox.events.publish_failed counter   events marked failed in the outbox {topic, reason: refused (by Kafka, for good)|unreadable (document)}
//	outbox.change_stream.reopens counter   reopens of the publisher's outbox change stream {reason: error|closed|ownership}
//	outbox.events.handled       counter    events whose handling committed {topic, schema}
//	outbox.events.skipped       counter    deliveries skipped {topic, schema, reason: duplicate|no_handler}
//	outbox.events.retried       counter    handler failures that will be retried {topic, schema, reason: snooze when snoozed}
//	outbox.events.parked        counter    events parked {topic, schema, reason: handler_error|handler_parked|malformed|held|redrive_failed}
//	outbox.publish.duration     histogram  s, one Kafka batch from first send to last ack {topic}
//	outbox.handle.duration      histogram  s, one handling attempt (transaction included) {topic, schema, outcome}
//	outbox.rebalances           counter    partition assignment changes {role: publisher|consumer, change: assigned|revoked|lost}
//	outbox.pending              gauge      unpublished, not failed outbox events {topic}
//	outbox.pending.oldest_age   gauge      s, age of the oldest pending event {topic}
//	outbox.failed               gauge      outbox events Kafka refused for good {topic}
//	outbox.held_keys            gauge      keys with a failed outbox event, holding their later events (HoldKey) {topic}
//	outbox.held_events          gauge      pending outbox events waiting behind a failed event of their key (HoldKey) {topic}
//	outbox.parked               gauge      parked inbox events (held ones included)
//	outbox.held                 gauge      parked inbox events held behind an earlier one of their key
//	outbox.partitions.owned     gauge      partitions this process publishes or handles {role}
//	outbox.consumer.lag         gauge      records between the committed offset (log start when none) and the high watermark {topic, partition}
//	outbox.consumer.in_flight   gauge      events of a handled partition in running transactions {topic, partition}
//	outbox.consumer.waiting     gauge      events waiting longer than a few seconds {topic, partition, wait: retry|snooze|conflict|infra|locked|running|release|fetch}
//	outbox.consumer.fetch_restarts counter restarts of a partition's fetching that its Kafka client had stopped (internal/kafkawatch) {topic, partition, reason: set_offsets|resubscribe}
//	outbox.consumer.waiting.oldest_age gauge s, age of a partition's oldest wait {topic, partition}
//	outbox.doctor.findings      gauge      findings of the doctor's check at Run's start {severity: breaks|risk|note}
//
// The gauges are observed while Run runs. The storage gauges (pending,
// oldest age, failed, parked) come from one aggregation over the outbox's
// unpublished documents (served by the partial index outbox_pending) and one
// count on the inbox's parked documents (partial index inbox_parked),
// cached for backlogCacheTTL: a scrape never costs more than that per
// interval, whatever the scrape rate. Consumer lag uses the high watermarks
// that the consumer's lag poller (internal/kafkawatch) lists every few
// seconds, raised by newer ones seen in fetches, and the committed offsets:
// no Kafka request per scrape, and a partition that is not fetched
// (stalled, paused) still shows its lag growing.
//
// Traces: the trace context of the context passed to Record is stored with
// the event and sent as the W3C traceparent/tracestate headers. The handler
// runs in a span "<topic> process" (kind consumer) whose parent is that
// remote context, so a request's trace continues into every handler it
// caused, and into the events those handlers record. Each published batch
// is a span "<topic> publish" (kind producer) linked to the trace of every
// event in it (at most maxBatchLinks).

const (
	instrumentationName = "github.com/event-outbox/outbox"
	backlogCacheTTL     = 5 * time.Second
	backlogQueryTimeout = 5 * time.Second
	maxBatchLinks       = 128
)

// Attribute keys. Topic and partition follow the OpenTelemetry messaging
// semantic conventions.
const (
	attrTopic     = attribute.Key("messaging.destination.name")
	attrPartition = attribute.Key("messaging.destination.partition.id")
	attrSchema    = attribute.Key("outbox.content_schema")
	attrReason    = attribute.Key("outbox.reason")
	attrOutcome   = attribute.Key("outbox.outcome")
	attrRole      = attribute.Key("outbox.role")
	attrChange    = attribute.Key("outbox.change")
	attrWait      = attribute.Key("outbox.wait")
)

// telemetry holds a Client's instruments and the runtime state that the
// status and the gauges report.
type telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter

	recorded, published, publishFailed metric.Int64Counter
	handled, skipped, retried, parked  metric.Int64Counter
	rebalances, streamReopens          metric.Int64Counter
	fetchRestarts                      metric.Int64Counter
	publishDuration, handleDuration    metric.Float64Histogram
	pendingG, failedG, parkedG, ownedG metric.Int64ObservableGauge
	heldKeysG, heldEventsG, heldG      metric.Int64ObservableGauge
	lagG                               metric.Int64ObservableGauge
	inFlightG, waitingG                metric.Int64ObservableGauge
	waitAgeG                           metric.Float64ObservableGauge
	oldestG                            metric.Float64ObservableGauge
	instrumentErr                      error
	cons                               atomic.Pointer[consumer] // the running consumer
	hwmMu                              sync.Mutex
	hwm                                map[topicPartition]int64 // high watermarks listed or fetched by the consumer
	lwm                                map[topicPartition]int64 // log start offsets listed by the consumer
	lagEvery                           time.Duration            // period of the consumer's lag poller (0: internal/kafkawatch's default); tests shorten it
	lagListedAt                        atomic.Int64             // unix ns of the lag poller's last listing of every partition (0: none)
	errMu                              sync.Mutex
	lastErr                            string
	lastErrAt                          time.Time
	backlogMu                          sync.Mutex // serialises backlog queries
	backlog                            *StoreStatus
	latencyBounds                      []float64
	sum                                summary // counts of Run's periodic log line (logsummary.go)
}

func newTelemetry(cfg *Config) *telemetry {
	t := &telemetry{
		tracer: cfg.TracerProvider.Tracer(instrumentationName),
		meter:  cfg.MeterProvider.Meter(instrumentationName),
		hwm:    map[topicPartition]int64{},
		lwm:    map[topicPartition]int64{},
		latencyBounds: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
			30, 60},
	}
	var errs []error
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := t.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := t.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(t.latencyBounds...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := t.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	t.recorded = summed(counter("outbox.events.recorded", "{event}", "Events committed to the outbox."), &t.sum.recorded)
	t.published = summed(counter("outbox.events.published", "{event}", "Events acknowledged by Kafka."), &t.sum.published)
	t.publishFailed = summed(counter("outbox.events.publish_failed", "{event}", "Events marked failed in the outbox: refused for good by Kafka, or unreadable documents."), &t.sum.failed)
	t.streamReopens = counter("outbox.change_stream.reopens", "{reopen}", "Reopens of the publisher's outbox change stream, by reason.")
	t.handled = summed(counter("outbox.events.handled", "{event}", "Events whose handling transaction committed."), &t.sum.handled)
	t.skipped = counter("outbox.events.skipped", "{event}", "Deliveries skipped: already handled or parked, or no handler.")
	t.retried = counter("outbox.events.retried", "{event}", "Handler failures that are retried.")
	t.parked = summed(counter("outbox.events.parked", "{event}", "Events parked after their last attempt, or malformed."), &t.sum.parked)
	t.rebalances = counter("outbox.rebalances", "{change}", "Partition assignment changes of the framework's Kafka groups.")
	t.fetchRestarts = counter("outbox.consumer.fetch_restarts", "{restart}", "Restarts of a handled partition's fetching that its Kafka client had stopped while the broker had records.")
	t.publishDuration = hist("outbox.publish.duration", "Duration of one Kafka batch, from the first send to the last acknowledgement.")
	t.handleDuration = hist("outbox.handle.duration", "Duration of one handling attempt, transaction included.")
	t.pendingG = gauge("outbox.pending", "{event}", "Outbox events not yet published (failed ones excluded).")
	t.failedG = gauge("outbox.failed", "{event}", "Outbox events Kafka refused for good.")
	t.heldKeysG = gauge("outbox.held_keys", "{key}", "Partition keys with a failed outbox event, holding their later events (PoisonPolicy HoldKey).")
	t.heldEventsG = gauge("outbox.held_events", "{event}", "Pending outbox events waiting behind a failed event of their key (PoisonPolicy HoldKey).")
	t.parkedG = gauge("outbox.parked", "{event}", "Parked inbox events.")
	t.heldG = gauge("outbox.held", "{event}", "Parked inbox events held behind an earlier parked event of their key.")
	t.ownedG = gauge("outbox.partitions.owned", "{partition}", "Partitions this process publishes (role publisher) or handles (role consumer).")
	t.lagG = gauge("outbox.consumer.lag", "{record}", "Records between the committed offset and the high watermark of a handled partition.")
	t.inFlightG = gauge("outbox.consumer.in_flight", "{event}", "Events of a handled partition in running transactions.")
	t.waitingG = gauge("outbox.consumer.waiting", "{event}", "Events of a handled partition that have waited longer than a few seconds, by what they wait on (retry, infra, locked, running, release...).")
	t.waitAgeG, err = t.meter.Float64ObservableGauge("outbox.consumer.waiting.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest wait of a handled partition."))
	errs = append(errs, err)
	t.oldestG, err = t.meter.Float64ObservableGauge("outbox.pending.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox event not yet published."))
	errs = append(errs, err)
	t.instrumentErr = errors.Join(errs...)
	return t
}

// setError remembers err as the last error, for Status.
func (t *telemetry) setError(err error) {
	if err == nil {
		return
	}
	t.errMu.Lock()
	t.lastErr = redactSecrets(err.Error())
	t.lastErrAt = time.Now().UTC()
	t.errMu.Unlock()
}

func (t *telemetry) lastError() (string, time.Time) {
	t.errMu.Lock()
	defer t.errMu.Unlock()
	return t.lastErr, t.lastErrAt
}

// Measurement options are cached by attribute values: building an
// attribute set sorts and allocates, and the same few combinations recur
// for every event. The cache is capped, so that arbitrary names (the
// schema of a malformed record) cannot grow it without bound.
var (
	attrCache     sync.Map // string -> metric.MeasurementOption
	attrCacheSize atomic.Int64
)

const attrCacheMax = 4096

// attrKey identifies a cached attribute set: topic, optional schema, at
// most one more string attribute.
type attrKey struct {
	topic, schema string
	hasSchema     bool
	extra         attribute.Key
	extraValue    string
}

func cachedAttrs(k attrKey) metric.MeasurementOption {
	if o, ok := attrCache.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{attrTopic.String(k.topic)}
	if k.hasSchema {
		kvs = append(kvs, attrSchema.String(k.schema))
	}
	if k.extra != "" {
		kvs = append(kvs, k.extra.String(k.extraValue))
	}
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	if attrCacheSize.Load() < attrCacheMax {
		if _, loaded := attrCache.LoadOrStore(k, o); !loaded {
			attrCacheSize.Add(1)
		}
	}
	return o
}

func topicAttrs(topic string) metric.MeasurementOption {
	return cachedAttrs(attrKey{topic: topic})
}

// eventAttrs returns the attributes topic, schema and extra, a string
// attribute or none.
func eventAttrs(env *Envelope, extra ...attribute.KeyValue) metric.MeasurementOption {
	k := attrKey{topic: env.Topic, schema: env.ContentSchema, hasSchema: true}
	if len(extra) > 0 {
		k.extra, k.extraValue = extra[0].Key, extra[0].Value.AsString()
	}
	return cachedAttrs(k)
}

// committed counts the events of a committed transaction.
func (t *telemetry) committed(ctx context.Context, tx *txState) {
	if tx == nil {
		return
	}
	for topic, n := range tx.counts {
		t.recorded.Add(ctx, n, topicAttrs(topic))
	}
}

// rebalance counts one non-empty assignment change.
func (t *telemetry) rebalance(role, change string, parts map[string][]int32) {
	n := 0
	for _, ps := range parts {
		n += len(ps)
	}
	if n == 0 {
		return
	}
	t.rebalances.Add(context.Background(), 1, metric.WithAttributes(attrRole.String(role), attrChange.String(change)))
}

// noteHighWatermark remembers the high watermark of a fetched partition,
// for the lag gauge. A fetch only raises it: its watermark may be older than
// the lag poller's last listing.
func (t *telemetry) noteHighWatermark(topic string, partition int32, hwm int64) {
	if hwm < 0 {
		return
	}
	tp := topicPartition{topic, partition}
	t.hwmMu.Lock()
	if hwm > t.hwm[tp] {
		t.hwm[tp] = hwm
	}
	t.hwmMu.Unlock()
}

// setHighWatermark records a partition's high watermark as listed by the lag
// poller, the authority (it may also lower it, after a truncation).
// setLogStart sets a partition's log start offset, listed by the lag
// poller.
func (t *telemetry) setLogStart(topic string, partition int32, lwm int64) {
	t.hwmMu.Lock()
	t.lwm[topicPartition{topic, partition}] = lwm
	t.hwmMu.Unlock()
}

// fetchRestarted counts a restart of a partition's fetching, by how
// (set_offsets, resubscribe).
func (t *telemetry) fetchRestarted(tp consume.TopicPartition, how string) {
	t.fetchRestarts.Add(context.Background(), 1, metric.WithAttributes(attrTopic.String(tp.Topic),
		attrPartition.String(strconv.Itoa(int(tp.Partition))), attrReason.String(how)))
}

// partitionEnds returns a handled partition's high watermark (listed or
// fetched) and log start offset (listed; 0 when not listed yet); ok is
// false when no watermark is known.
func (t *telemetry) partitionEnds(topic string, partition int32) (hwm, logStart int64, ok bool) {
	t.hwmMu.Lock()
	defer t.hwmMu.Unlock()
	tp := topicPartition{topic, partition}
	hwm, ok = t.hwm[tp]
	return hwm, t.lwm[tp], ok
}

func (t *telemetry) setHighWatermark(topic string, partition int32, hwm int64) {
	if hwm < 0 {
		return
	}
	t.hwmMu.Lock()
	t.hwm[topicPartition{topic, partition}] = hwm
	t.hwmMu.Unlock()
}

// startHandle starts the span of one handling attempt. Its parent is the
// trace context recorded with the event (a remote parent), or the span in
// ctx when the event carries none.
func (t *telemetry) startHandle(ctx context.Context, meta *Metadata) (context.Context, trace.Span) {
	if meta.TraceParent != "" {
		ctx = traceContext.Extract(ctx, propagation.MapCarrier{
			HeaderTraceParent: meta.TraceParent,
			HeaderTraceState:  meta.TraceState,
		})
	}
	ctx, span := t.tracer.Start(ctx, meta.Topic+" process", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attrTopic.String(meta.Topic),
			attrPartition.String(strconv.Itoa(int(meta.Partition))),
			attribute.Int64("messaging.kafka.offset", meta.Offset),
			attribute.String("messaging.kafka.message.key", meta.PartitionKey),
			attribute.String("messaging.message.id", meta.IdempotencyKey),
			attrSchema.String(meta.ContentSchema),
			attribute.Int("outbox.attempt", meta.Attempt),
		)
	}
	return ctx, span
}

// endHandle ends a handling attempt's span and records its duration and
// outcome (the events' counters are the consumer's, see consumeHost).
func (t *telemetry) endHandle(ctx context.Context, span trace.Span, env *Envelope, start time.Time, err error) {
	var herr *handlerError
	outcome := "handled"
	switch {
	case err == nil:
	case errors.Is(err, errAlreadyDone):
		outcome = "duplicate"
	case errors.As(err, &herr):
		outcome = "handler_error"
		span.RecordError(herr.err)
		span.SetStatus(codes.Error, herr.err.Error())
	default:
		outcome = "infrastructure_error"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		t.setError(fmt.Errorf("handle %s/%s: %w", env.Topic, env.ContentSchema, err))
	}
	if span.IsRecording() {
		span.SetAttributes(attrOutcome.String(outcome))
	}
	span.End()
	t.handleDuration.Record(ctx, time.Since(start).Seconds(), eventAttrs(env, attrOutcome.String(outcome)))
}

// batchLinks returns links to the recorded traces of a batch's events (at
// most maxBatchLinks).
func batchLinks(items []publish.Item) []trace.Link {
	var links []trace.Link
	for _, it := range items {
		if len(links) == maxBatchLinks {
			break
		}
		carrier := propagation.MapCarrier{}
		for _, h := range it.Record.Headers {
			if h.Key == HeaderTraceParent || h.Key == HeaderTraceState {
				carrier[h.Key] = string(h.Value)
			}
		}
		if len(carrier) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// publishHooks adds the publish metrics and span to the test hooks.
func (t *telemetry) publishHooks(h publish.Hooks) publish.Hooks {
	nextFailed := h.Failed
	h.Failed = func(tp publish.TopicPartition, it publish.Item, cause error) {
		reason := "refused"
		if it.Err != nil {
			reason = "unreadable"
		}
		t.publishFailed.Add(context.Background(), 1, cachedAttrs(attrKey{topic: tp.Topic, extra: attrReason, extraValue: reason}))
		if nextFailed != nil {
			nextFailed(tp, it, cause)
		}
	}
	next := h.Produced
	h.Produced = func(tp publish.TopicPartition, items []publish.Item, start, end time.Time, acked int) {
		ctx := context.Background()
		links := batchLinks(items)
		_, span := t.tracer.Start(ctx, tp.Topic+" publish",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithTimestamp(start),
			trace.WithLinks(links...),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.type", "send"),
				attrTopic.String(tp.Topic),
				attrPartition.String(strconv.Itoa(int(tp.Partition))),
				attribute.Int("messaging.batch.message_count", acked),
			))
		span.End(trace.WithTimestamp(end))
		if acked > 0 {
			t.published.Add(ctx, int64(acked), topicAttrs(tp.Topic))
		}
		t.publishDuration.Record(ctx, end.Sub(start).Seconds(), topicAttrs(tp.Topic))
		if next != nil {
			next(tp, items, start, end, acked)
		}
	}
	return h
}

// storeStatus returns the storage status, at most maxAge old.
func (c *Client) storeStatus(ctx context.Context, maxAge time.Duration) (StoreStatus, error) {
	t := c.tel
	t.backlogMu.Lock()
	defer t.backlogMu.Unlock()
	if b := t.backlog; b != nil && time.Since(b.CheckedAt) < maxAge {
		return *b, nil
	}
	ctx, cancel := context.WithTimeout(ctx, backlogQueryTimeout)
	defer cancel()
	st, err := c.Admin().StoreStatus(ctx)
	if err != nil {
		return StoreStatus{}, err
	}
	if c.cfg.PoisonPolicy == SkipEvent {
		// Failed events hold nothing under SkipEvent.
		st.OutboxHeldKeys, st.OutboxHeldEvents = 0, 0
		for i := range st.Topics {
			st.Topics[i].HeldKeys, st.Topics[i].HeldEvents = 0, 0
		}
	}
	t.backlog = &st
	return st, nil
}

// registerGauges registers the callback of the observable gauges, for as
// long as Run runs.
func (c *Client) registerGauges() (unregister func()) {
	t := c.tel
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, role := range []string{"publisher", "consumer"} {
			n := 0
			if role == "publisher" {
				if p := c.pub.Load(); p != nil {
					n = len(p.set.Owned())
				}
			} else if cons := t.cons.Load(); cons != nil {
				n = len(cons.set.Owned())
			}
			o.ObserveInt64(t.ownedG, int64(n), metric.WithAttributes(attrRole.String(role)))
		}
		for tp, lag := range t.consumerLag() {
			o.ObserveInt64(t.lagG, lag, metric.WithAttributes(attrTopic.String(tp.topic),
				attrPartition.String(strconv.Itoa(int(tp.partition)))))
		}
		if cons := t.cons.Load(); cons != nil {
			t.observeConsumer(o, cons)
		}
		st, err := c.storeStatus(ctx, backlogCacheTTL)
		if err != nil {
			return fmt.Errorf("outbox: backlog gauges: %s", redactSecrets(err.Error()))
		}
		seen := make(map[string]bool, len(st.Topics))
		for _, b := range st.Topics {
			seen[b.Topic] = true
			o.ObserveInt64(t.pendingG, b.Pending, topicAttrs(b.Topic))
			o.ObserveInt64(t.failedG, b.Failed, topicAttrs(b.Topic))
			o.ObserveInt64(t.heldKeysG, b.HeldKeys, topicAttrs(b.Topic))
			o.ObserveInt64(t.heldEventsG, b.HeldEvents, topicAttrs(b.Topic))
			o.ObserveFloat64(t.oldestG, b.OldestPendingAge.Seconds(), topicAttrs(b.Topic))
		}
		// Topics with nothing waiting read 0 rather than vanishing, so that
		// dashboards and absence alerts see a steady series.
		for _, topic := range c.cfg.PublishTopics {
			if !seen[topic] {
				o.ObserveInt64(t.pendingG, 0, topicAttrs(topic))
				o.ObserveInt64(t.failedG, 0, topicAttrs(topic))
				o.ObserveInt64(t.heldKeysG, 0, topicAttrs(topic))
				o.ObserveInt64(t.heldEventsG, 0, topicAttrs(topic))
				o.ObserveFloat64(t.oldestG, 0, topicAttrs(topic))
			}
		}
		o.ObserveInt64(t.parkedG, st.Parked)
		o.ObserveInt64(t.heldG, st.Held)
		return nil
	}, t.pendingG, t.failedG, t.parkedG, t.heldG, t.ownedG, t.lagG, t.oldestG, t.heldKeysG, t.heldEventsG,
		t.inFlightG, t.waitingG, t.waitAgeG)
	if err != nil {
		c.cfg.Logger.Warn("outbox: cannot register metric gauges", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// observeConsumer observes the consumer's partitions: events in flight,
// and what they wait on.
func (t *telemetry) observeConsumer(o metric.Observer, cons *consumer) {
	for tp, st := range cons.set.Stats() {
		o.ObserveInt64(t.inFlightG, int64(st.InFlight), metric.WithAttributes(attrTopic.String(tp.Topic),
			attrPartition.String(strconv.Itoa(int(tp.Partition)))))
	}
	type waitKey struct {
		tp   consume.TopicPartition
		what string
	}
	counts := map[waitKey]int64{}
	oldest := map[consume.TopicPartition]time.Time{}
	for _, w := range cons.set.Waits() {
		counts[waitKey{w.Partition, w.What}]++
		if o, ok := oldest[w.Partition]; !ok || w.Since.Before(o) {
			oldest[w.Partition] = w.Since
		}
	}
	for k, n := range counts {
		o.ObserveInt64(t.waitingG, n, metric.WithAttributes(attrTopic.String(k.tp.Topic),
			attrPartition.String(strconv.Itoa(int(k.tp.Partition))), attrWait.String(k.what)))
	}
	for tp, since := range oldest {
		o.ObserveFloat64(t.waitAgeG, time.Since(since).Seconds(), metric.WithAttributes(attrTopic.String(tp.Topic),
			attrPartition.String(strconv.Itoa(int(tp.Partition)))))
	}
}

// consumerLag returns, per handled partition, the high watermark (listed
// or fetched) minus the committed offset, or minus the log start offset
// when the group committed nothing for the partition yet (a new group
// stalled on its first record shows its lag too); partitions without a
// listed or fetched watermark are left out.
func (t *telemetry) consumerLag() map[topicPartition]int64 {
	cons := t.cons.Load()
	if cons == nil || cons.cl == nil {
		return nil
	}
	committed := cons.cl.CommittedOffsets()
	out := map[topicPartition]int64{}
	t.hwmMu.Lock()
	defer t.hwmMu.Unlock()
	for _, ctp := range cons.set.Owned() {
		tp := topicPartition{ctp.Topic, ctp.Partition}
		hwm, ok := t.hwm[tp]
		if !ok {
			continue
		}
		from := t.lwm[tp]
		if co, ok := committed[cons.c.cfg.kafkaTopic(tp.topic)][tp.partition]; ok && co.Offset >= 0 {
			from = co.Offset
		}
		out[tp] = max(hwm-from, 0)
	}
	return out
}

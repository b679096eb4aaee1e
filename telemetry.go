package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/publish"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// Telemetry.
//
// The framework reports through the OpenTelemetry API only (no SDK, no
// exporter): Config.MeterProvider and Config.TracerProvider, the global
// providers by default, so a service that installs an SDK gets everything
// and one that does not pays next to nothing.
//
// Metrics (instrumentation scope "github.com/event-outbox/outbox"): the
// list of names, kinds, units and attributes is internal/telemetry's
// (metrics.go), pinned by its TestMetricNames; docs/operations.md lists
// them for users.
//
// The gauges are observed while Run runs. The storage gauges (pending,
// oldest age, failed, parked) come from one aggregation over the outbox's
// unpublished documents (served by the partial index outbox_pending) and one
// count on the inbox's parked documents (partial index inbox_parked),
// cached for backlogCacheTTL: a scrape never costs more than that per
// interval, whatever the scrape rate. Consumer lag uses the high watermarks
// that the consumer's lag poller (internal/kafkawatch) lists every few seconds, raised by
// newer ones seen in fetches, and the committed offsets: no Kafka request
// per scrape, and a partition that is not fetched (stalled, paused) still
// shows its lag growing.
//
// Traces: the trace context of the context passed to Record is stored with
// the event and sent as the W3C traceparent/tracestate headers. The handler
// runs in a span "<topic> process" (kind consumer) whose parent is that
// remote context, so a request's trace continues into every handler it
// caused, and into the events those handlers record. Each published batch
// is a span "<topic> publish" (kind producer) linked to the trace of every
// event in it (at most maxBatchLinks).

const (
	backlogCacheTTL     = 5 * time.Second
	backlogQueryTimeout = 5 * time.Second
)

// Attribute keys, internal/telemetry's under the names the root's files
// use.
const (
	attrTopic     = itel.AttrTopic
	attrPartition = itel.AttrPartition
	attrReason    = itel.AttrReason
	attrRole      = itel.AttrRole
	attrChange    = itel.AttrChange
	attrWait      = itel.AttrWait
	attrOutcome   = itel.AttrOutcome
	attrSeverity  = itel.AttrSeverity
)

// telemetry holds a Client's instruments (internal/telemetry) and the
// runtime state that the status and the gauges report.
type telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter
	ins    *itel.Instruments
	// The counters the root's files add to, ins's under short names.
	recorded, published, handled, skipped, retried, parked, streamReopens metric.Int64Counter
	instrumentErr                                                         error
	cons                                                                  atomic.Pointer[consumer] // the running consumer
	marks                                                                 itel.Watermarks          // of the handled partitions, for the lag gauge and the fetch watch
	lagEvery                                                              time.Duration            // period of the consumer's lag poller (0: internal/kafkawatch's default); tests shorten it
	lagListedAt                                                           atomic.Int64             // unix ns of the lag poller's last listing of every partition (0: none)
	errMu                                                                 sync.Mutex
	lastErr                                                               string
	lastErrAt                                                             time.Time
	backlogMu                                                             sync.Mutex // serialises backlog queries
	backlog                                                               *StoreStatus
}

func newTelemetry(cfg *Config) *telemetry {
	t := &telemetry{
		tracer: cfg.TracerProvider.Tracer(itel.InstrumentationName),
		meter:  cfg.MeterProvider.Meter(itel.InstrumentationName),
	}
	t.ins, t.instrumentErr = itel.New(t.meter)
	t.recorded, t.published, t.handled = t.ins.Recorded, t.ins.Published, t.ins.Handled
	t.skipped, t.retried, t.parked, t.streamReopens = t.ins.Skipped, t.ins.Retried, t.ins.Parked, t.ins.StreamReopens
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

func topicAttrs(topic string) metric.MeasurementOption { return itel.TopicAttrs(topic) }

// eventAttrs returns the attributes topic, schema and extra, a string
// attribute or none.
func eventAttrs(env *Envelope, extra ...attribute.KeyValue) metric.MeasurementOption {
	k := itel.AttrKey{Topic: env.Topic, Schema: env.ContentSchema, HasSchema: true}
	if len(extra) > 0 {
		k.Extra, k.ExtraValue = extra[0].Key, extra[0].Value.AsString()
	}
	return itel.CachedAttrs(k)
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
	t.ins.Rebalances.Add(context.Background(), 1, metric.WithAttributes(attrRole.String(role), attrChange.String(change)))
}

// noteHighWatermark raises a fetched partition's high watermark (see
// itel.Watermarks.Fetched).
func (t *telemetry) noteHighWatermark(topic string, partition int32, hwm int64) {
	t.marks.Fetched(itel.Partition{Topic: topic, Partition: partition}, hwm)
}

// setHighWatermark records a partition's high watermark as listed by the
// lag poller, the authority.
func (t *telemetry) setHighWatermark(topic string, partition int32, hwm int64) {
	t.marks.Listed(itel.Partition{Topic: topic, Partition: partition}, hwm)
}

// setLogStart sets a partition's log start offset, listed by the lag
// poller.
func (t *telemetry) setLogStart(topic string, partition int32, lwm int64) {
	t.marks.SetLogStart(itel.Partition{Topic: topic, Partition: partition}, lwm)
}

// partitionEnds returns a handled partition's high watermark and log
// start offset (see itel.Watermarks.Ends).
func (t *telemetry) partitionEnds(topic string, partition int32) (hwm, logStart int64, ok bool) {
	return t.marks.Ends(itel.Partition{Topic: topic, Partition: partition})
}

// fetchRestarted counts a restart of a partition's fetching, by how
// (set_offsets, resubscribe).
func (t *telemetry) fetchRestarted(tp consume.TopicPartition, how string) {
	t.ins.FetchRestarts.Add(context.Background(), 1, itel.PartitionAttrs(tp.Topic, tp.Partition, attrReason.String(how)))
}

// startHandle starts the span of one handling attempt. Its parent is the
// trace context recorded with the event (a remote parent), or the span in
// ctx when the event carries none.
func (t *telemetry) startHandle(ctx context.Context, meta *Metadata) (context.Context, trace.Span) {
	return itel.StartHandle(ctx, t.tracer, itel.HandleSpan{TraceParent: meta.TraceParent, TraceState: meta.TraceState,
		Topic: meta.Topic, Partition: meta.Partition, Offset: meta.Offset, PartitionKey: meta.PartitionKey,
		IdempotencyKey: meta.IdempotencyKey, ContentSchema: meta.ContentSchema, Attempt: meta.Attempt})
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
	t.ins.HandleDuration.Record(ctx, time.Since(start).Seconds(), eventAttrs(env, attrOutcome.String(outcome)))
}

// publishHooks adds the publish metrics and span to the test hooks.
func (t *telemetry) publishHooks(h publish.Hooks) publish.Hooks {
	return t.ins.PublishHooks(t.tracer, h)
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
			o.ObserveInt64(t.ins.Owned, int64(n), metric.WithAttributes(attrRole.String(role)))
		}
		for tp, lag := range t.consumerLag() {
			o.ObserveInt64(t.ins.Lag, lag, itel.PartitionAttrs(tp.Topic, tp.Partition))
		}
		if cons := t.cons.Load(); cons != nil {
			t.ins.ObserveConsumer(o, cons.set.Stats(), cons.set.Waits())
		}
		st, err := c.storeStatus(ctx, backlogCacheTTL)
		if err != nil {
			return fmt.Errorf("outbox: backlog gauges: %s", redactSecrets(err.Error()))
		}
		seen := make(map[string]bool, len(st.Topics))
		for _, b := range st.Topics {
			seen[b.Topic] = true
			o.ObserveInt64(t.ins.Pending, b.Pending, topicAttrs(b.Topic))
			o.ObserveInt64(t.ins.Failed, b.Failed, topicAttrs(b.Topic))
			o.ObserveInt64(t.ins.HeldKeys, b.HeldKeys, topicAttrs(b.Topic))
			o.ObserveInt64(t.ins.HeldEvents, b.HeldEvents, topicAttrs(b.Topic))
			o.ObserveFloat64(t.ins.OldestPending, b.OldestPendingAge.Seconds(), topicAttrs(b.Topic))
			o.ObserveInt64(t.ins.Scheduled, b.Scheduled, topicAttrs(b.Topic))
			if !b.NextDue.IsZero() {
				o.ObserveFloat64(t.ins.NextDue, time.Until(b.NextDue).Seconds(), topicAttrs(b.Topic))
			}
		}
		// Topics with nothing waiting read 0 rather than vanishing, so that
		// dashboards and absence alerts see a steady series.
		for _, topic := range c.cfg.PublishTopics {
			if !seen[topic] {
				o.ObserveInt64(t.ins.Pending, 0, topicAttrs(topic))
				o.ObserveInt64(t.ins.Failed, 0, topicAttrs(topic))
				o.ObserveInt64(t.ins.HeldKeys, 0, topicAttrs(topic))
				o.ObserveInt64(t.ins.HeldEvents, 0, topicAttrs(topic))
				o.ObserveFloat64(t.ins.OldestPending, 0, topicAttrs(topic))
				o.ObserveInt64(t.ins.Scheduled, 0, topicAttrs(topic))
			}
		}
		o.ObserveInt64(t.ins.ParkedNow, st.Parked)
		o.ObserveInt64(t.ins.Held, st.Held)
		return nil
	}, t.ins.Pending, t.ins.Failed, t.ins.ParkedNow, t.ins.Held, t.ins.Owned, t.ins.Lag, t.ins.OldestPending, t.ins.HeldKeys, t.ins.HeldEvents,
		t.ins.Scheduled, t.ins.NextDue, t.ins.InFlight, t.ins.Waiting, t.ins.WaitAge)
	if err != nil {
		c.cfg.Logger.Warn("outbox: cannot register metric gauges", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// consumerLag returns the lag of each handled partition (see
// itel.Watermarks.Lag), measured from the group's committed offsets.
func (t *telemetry) consumerLag() map[itel.Partition]int64 {
	cons := t.cons.Load()
	if cons == nil || cons.cl == nil {
		return nil
	}
	committed := cons.cl.CommittedOffsets()
	owned := cons.set.Owned()
	ps := make([]itel.Partition, len(owned))
	for i, tp := range owned {
		ps[i] = itel.Partition{Topic: tp.Topic, Partition: tp.Partition}
	}
	return t.marks.Lag(ps, func(p itel.Partition) (int64, bool) {
		co, ok := committed[cons.c.cfg.kafkaTopic(p.Topic)][p.Partition]
		return co.Offset, ok
	})
}

// Rate-limited logs: internal/telemetry's RateLog under the names the
// root's loops call.
const (
	errorRelog   = itel.ErrorRelog
	waitLogEvery = itel.WaitLogEvery
)

// rateLog logs each kind of repeated message once, then at most once per
// period (see itel.RateLog).
type rateLog struct{ *itel.RateLog }

func newRateLog(every time.Duration) *rateLog { return &rateLog{itel.NewRateLog(every)} }

// warn logs msg under kind unless kind was logged less than a period ago.
func (r *rateLog) warn(log *slog.Logger, msg, kind string, args ...any) {
	r.Warn(log, msg, kind, args...)
}

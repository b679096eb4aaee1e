package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/inboxhost"
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

// telemetry holds a Client's instruments (internal/telemetry) and the
// runtime state that the status and the gauges report.
type telemetry struct {
	tracer        trace.Tracer
	meter         metric.Meter
	ins           *itel.Instruments
	instrumentErr error
	cons          atomic.Pointer[consumer] // the running consumer
	marks         itel.Watermarks          // of the handled partitions, for the lag gauge and the fetch watch
	lagEvery      time.Duration            // period of the consumer's lag poller (0: internal/kafkawatch's default); tests shorten it
	lagListedAt   atomic.Int64             // unix ns of the lag poller's last listing of every partition (0: none)
	errMu         sync.Mutex
	lastErr       string
	lastErrAt     time.Time
	backlogMu     sync.Mutex // serialises backlog queries
	backlog       *StoreStatus
}

func newTelemetry(cfg *Config) *telemetry {
	t := &telemetry{
		tracer: cfg.TracerProvider.Tracer(itel.InstrumentationName),
		meter:  cfg.MeterProvider.Meter(itel.InstrumentationName),
	}
	t.ins, t.instrumentErr = itel.New(t.meter)
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

// eventAttrs returns the attributes topic, schema and extra, a string
// attribute or none.
func eventAttrs(env *Envelope, extra ...attribute.KeyValue) metric.MeasurementOption {
	k := itel.AttrKey{Topic: env.Topic, Schema: env.ContentSchema, HasSchema: true}
	if len(extra) > 0 {
		k.Extra, k.ExtraValue = extra[0].Key, extra[0].Value.AsString()
	}
	return itel.CachedAttrs(k)
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
	var herr *inboxhost.HandlerError
	outcome := "handled"
	switch {
	case err == nil:
	case errors.Is(err, inboxhost.ErrAlreadyDone):
		outcome = "duplicate"
	case errors.As(err, &herr):
		outcome = "handler_error"
		span.RecordError(herr.Err)
		span.SetStatus(codes.Error, herr.Err.Error())
	default:
		outcome = "infrastructure_error"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		t.setError(fmt.Errorf("handle %s/%s: %w", env.Topic, env.ContentSchema, err))
	}
	if span.IsRecording() {
		span.SetAttributes(itel.AttrOutcome.String(outcome))
	}
	span.End()
	t.ins.HandleDuration.Record(ctx, time.Since(start).Seconds(), eventAttrs(env, itel.AttrOutcome.String(outcome)))
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
	reg, err := t.ins.RegisterGauges(t.meter, itel.Gauges{
		Owned: func(role string) int {
			if role == "publisher" {
				if p := c.pub.Load(); p != nil {
					return len(p.Owned())
				}
			} else if cons := t.cons.Load(); cons != nil {
				return len(cons.set.Owned())
			}
			return 0
		},
		Lag: t.consumerLag,
		Consumer: func() (map[consume.TopicPartition]consume.Stats, []consume.Wait, bool) {
			if cons := t.cons.Load(); cons != nil {
				return cons.set.Stats(), cons.set.Waits(), true
			}
			return nil, nil, false
		},
		Storage: func(ctx context.Context) (itel.Storage, error) {
			st, err := c.storeStatus(ctx, backlogCacheTTL)
			if err != nil {
				return itel.Storage{}, fmt.Errorf("outbox: backlog gauges: %s", redactSecrets(err.Error()))
			}
			out := itel.Storage{Parked: st.Parked, Held: st.Held, Topics: make([]itel.Backlog, len(st.Topics))}
			for i, b := range st.Topics {
				out.Topics[i] = itel.Backlog{Topic: b.Topic, Pending: b.Pending, Failed: b.Failed,
					HeldKeys: b.HeldKeys, HeldEvents: b.HeldEvents, OldestPending: b.OldestPendingAge,
					Scheduled: b.Scheduled, NextDue: b.NextDue}
			}
			return out, nil
		},
		PublishTopics: c.cfg.PublishTopics,
	})
	if err != nil {
		c.cfg.Logger.Warn("outbox: cannot register metric gauges", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// consumerLag returns the lag of each handled partition (see
// itel.Watermarks.ConsumerLag).
func (t *telemetry) consumerLag() map[itel.Partition]int64 {
	cons := t.cons.Load()
	if cons == nil || cons.cl == nil {
		return nil
	}
	return t.marks.ConsumerLag(cons.set.Owned(), cons.cl.CommittedOffsets(), cons.c.cfg.kafkaTopic)
}

package telemetry

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/internal/wire"
)

// MaxBatchLinks bounds the links of a publish span: a batch may hold
// thousands of events.
const MaxBatchLinks = 128

// traceContext reads the W3C trace context headers.
var traceContext = propagation.TraceContext{}

// HandleSpan describes the handling attempt a span covers.
type HandleSpan struct {
	TraceParent, TraceState string // recorded with the event; "" when none
	Topic                   string
	Partition               int32
	Offset                  int64
	PartitionKey            string
	IdempotencyKey          string
	ContentSchema           string
	Attempt                 int
}

// StartHandle starts the span of one handling attempt: "<topic> process",
// kind consumer. Its parent is the trace context recorded with the event (a
// remote parent), or the span in ctx when the event carries none, so a
// request's trace continues into every handler it caused.
func StartHandle(ctx context.Context, tracer trace.Tracer, h HandleSpan) (context.Context, trace.Span) {
	if h.TraceParent != "" {
		ctx = traceContext.Extract(ctx, propagation.MapCarrier{
			wire.HeaderTraceParent: h.TraceParent,
			wire.HeaderTraceState:  h.TraceState,
		})
	}
	ctx, span := tracer.Start(ctx, h.Topic+" process", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			AttrTopic.String(h.Topic),
			AttrPartition.String(strconv.Itoa(int(h.Partition))),
			attribute.Int64("messaging.kafka.offset", h.Offset),
			attribute.String("messaging.kafka.message.key", h.PartitionKey),
			attribute.String("messaging.message.id", h.IdempotencyKey),
			AttrSchema.String(h.ContentSchema),
			attribute.Int("outbox.attempt", h.Attempt),
		)
	}
	return ctx, span
}

// batchLinks returns links to the recorded traces of a batch's events (at
// most MaxBatchLinks).
func batchLinks(items []publish.Item) []trace.Link {
	var links []trace.Link
	for _, it := range items {
		if len(links) == MaxBatchLinks {
			break
		}
		carrier := propagation.MapCarrier{}
		for _, h := range it.Record.Headers {
			if h.Key == wire.HeaderTraceParent || h.Key == wire.HeaderTraceState {
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

// PublishHooks adds the publish metrics and spans to h: a span
// "<topic> publish" (kind producer) per batch, linked to the trace of every
// event in it, and the published, failed and duration metrics. The hooks
// h already had run after them.
func (ins *Instruments) PublishHooks(tracer trace.Tracer, h publish.Hooks) publish.Hooks {
	nextFailed := h.Failed
	h.Failed = func(tp publish.TopicPartition, it publish.Item, cause error) {
		reason := "refused"
		if it.Err != nil {
			reason = "unreadable"
		}
		ins.PublishFailed.Add(context.Background(), 1, CachedAttrs(AttrKey{Topic: tp.Topic, Extra: AttrReason, ExtraValue: reason}))
		if nextFailed != nil {
			nextFailed(tp, it, cause)
		}
	}
	next := h.Produced
	h.Produced = func(tp publish.TopicPartition, items []publish.Item, start, end time.Time, acked int) {
		ctx := context.Background()
		links := batchLinks(items)
		_, span := tracer.Start(ctx, tp.Topic+" publish",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithTimestamp(start),
			trace.WithLinks(links...),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.operation.type", "send"),
				AttrTopic.String(tp.Topic),
				AttrPartition.String(strconv.Itoa(int(tp.Partition))),
				attribute.Int("messaging.batch.message_count", acked),
			))
		span.End(trace.WithTimestamp(end))
		if acked > 0 {
			ins.Published.Add(ctx, int64(acked), TopicAttrs(tp.Topic))
		}
		ins.PublishDuration.Record(ctx, end.Sub(start).Seconds(), TopicAttrs(tp.Topic))
		if next != nil {
			next(tp, items, start, end, acked)
		}
	}
	return h
}

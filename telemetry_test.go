package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// otelBundle wires in-memory OpenTelemetry SDK providers into a config.
type otelBundle struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newOtel(t *testing.T, cfg *Config) *otelBundle {
	t.Helper()
	o := &otelBundle{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	o.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	t.Cleanup(func() {
		_ = o.tp.Shutdown(context.Background())
		_ = o.mp.Shutdown(context.Background())
	})
	cfg.TracerProvider, cfg.MeterProvider = o.tp, o.mp
	return o
}

// collect returns the metrics of the framework's scope by name.
func (o *otelBundle) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, o.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != itel.InstrumentationName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sumOf adds up the data points of a counter or gauge whose attributes
// include every one of want.
func sumOf(data metricdata.Aggregation, want ...attribute.KeyValue) float64 {
	match := func(set attribute.Set) bool {
		for _, kv := range want {
			v, ok := set.Value(kv.Key)
			if !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var total float64
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				total += float64(p.Value)
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				total += float64(p.Value)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				total += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				total += float64(p.Count)
			}
		}
	}
	return total
}

func (o *otelBundle) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func TestTraceFromRecordToHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("trace")
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	handled := make(chan trace.SpanContext, 1)
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		// The handler's context carries its span; events it records carry
		// it on.
		if err := Record(ctx, paymentDone{Run: b.run, OrderID: e.OrderID}); err != nil {
			return err
		}
		select {
		case handled <- trace.SpanContextFromContext(ctx):
		default:
		}
		return nil
	})
	start(t, c)

	// A request span, as an HTTP middleware would start it.
	ctx, req := o.tp.Tracer("test").Start(context.Background(), "POST /orders")
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1", Amount: 1})
	}))
	req.End()
	reqSC := req.SpanContext()

	var handlerSC trace.SpanContext
	eventually(t, "handled", func() bool {
		select {
		case handlerSC = <-handled:
			return true
		default:
			return false
		}
	})
	require.Equal(t, reqSC.TraceID(), handlerSC.TraceID(), "the handler continues the recording request's trace")

	eventually(t, "process span ended", func() bool { return len(o.ended("orders process")) == 1 })
	proc := o.ended("orders process")[0]
	require.Equal(t, reqSC.TraceID(), proc.SpanContext().TraceID())
	require.Equal(t, reqSC.SpanID(), proc.Parent().SpanID(), "remote parent is the span active at Record")
	require.True(t, proc.Parent().IsRemote())
	require.Equal(t, trace.SpanKindConsumer, proc.SpanKind())
	require.Equal(t, handlerSC.SpanID(), proc.SpanContext().SpanID())

	// The publish span of the orders batch links to the request's trace.
	eventually(t, "publish span with a link to the request", func() bool {
		for _, s := range o.ended("orders publish") {
			for _, l := range s.Links() {
				if l.SpanContext.SpanID() == reqSC.SpanID() {
					return true
				}
			}
		}
		return false
	})

	// The payment recorded by the handler is a child of the handler's span.
	var doc outboxDoc
	eventually(t, "payment recorded", func() bool {
		return c.outbox.FindOne(context.Background(), bson.D{{Key: "topic", Value: paymentsTopic}}).Decode(&doc) == nil
	})
	require.Contains(t, doc.TraceParent, reqSC.TraceID().String())
	require.Contains(t, doc.TraceParent, proc.SpanContext().SpanID().String())
}

func TestMetricsCountTheFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("metrics")
	cfg.MaxAttempts = 2
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		calls.Add(1)
		if e.OrderID == "poison" {
			return errors.New("cannot handle poison")
		}
		return nil
	})
	start(t, c)

	for _, id := range []string{"o-1", "o-2", "poison"} {
		require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: id, Amount: 1})
		}))
	}
	topic := itel.AttrTopic.String(ordersTopic)
	eventually(t, "two handled, one parked", func() bool {
		m := o.collect(t)
		return sumOf(m["outbox.events.handled"], topic) == 2 && sumOf(m["outbox.events.parked"], topic) == 1
	})
	m := o.collect(t)
	require.EqualValues(t, 3, sumOf(m["outbox.events.recorded"], topic))
	require.GreaterOrEqual(t, sumOf(m["outbox.events.published"], topic), 3.0) // duplicates possible, never fewer
	require.EqualValues(t, 1, sumOf(m["outbox.events.retried"], topic))
	require.EqualValues(t, 1, sumOf(m["outbox.events.parked"], topic, itel.AttrReason.String("handler_error")))
	require.GreaterOrEqual(t, sumOf(m["outbox.handle.duration"], topic), 4.0) // 2 handled + 2 failed attempts
	require.GreaterOrEqual(t, sumOf(m["outbox.publish.duration"], topic), 1.0)
	// Both groups assigned this replica their partitions (3 per topic).
	require.EqualValues(t, 6, sumOf(m["outbox.partitions.owned"], itel.AttrRole.String("publisher")))
	require.EqualValues(t, 3, sumOf(m["outbox.partitions.owned"], itel.AttrRole.String("consumer")))
	require.GreaterOrEqual(t, sumOf(m["outbox.rebalances"], itel.AttrRole.String("consumer"), itel.AttrChange.String("assigned")), 1.0)
	// The storage gauges are cached for a few seconds.
	eventually(t, "parked gauge", func() bool { return sumOf(o.collect(t)["outbox.parked"]) == 1 })
	eventually(t, "consumer lag reported and caught up", func() bool {
		m := o.collect(t)
		lag, ok := m["outbox.consumer.lag"].(metricdata.Gauge[int64])
		return ok && len(lag.DataPoints) > 0 && sumOf(lag) == 0
	})
}

func TestBacklogGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A recorder that never runs leaves its orders pending...
	recCfg := b.config("backlog")
	recCfg.PublishTopics = []string{ordersTopic}
	rec := b.client(t, recCfg)
	for i := range 3 {
		require.NoError(t, rec.Transact(context.Background(), func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: itoa(i), Amount: 1})
		}))
	}
	// Two scheduled for an hour from now wait outside the backlog.
	for i := range 2 {
		require.NoError(t, rec.Transact(context.Background(), func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: itoa(i), Amount: 1}, WithDelay(time.Hour))
		}))
	}
	// ...and a client of the same collections that publishes only payments
	// reports them.
	cfg := b.config("backlog")
	cfg.PublishTopics = []string{paymentsTopic}
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	start(t, c)
	eventually(t, "pending orders reported", func() bool {
		m := o.collect(t)
		return sumOf(m["outbox.pending"], itel.AttrTopic.String(ordersTopic)) == 3
	})
	m := o.collect(t)
	require.Greater(t, sumOf(m["outbox.pending.oldest_age"], itel.AttrTopic.String(ordersTopic)), 0.0)
	require.Zero(t, sumOf(m["outbox.failed"]))
	require.Equal(t, 2.0, sumOf(m["outbox.scheduled"], itel.AttrTopic.String(ordersTopic)))
	require.Greater(t, sumOf(m["outbox.scheduled.next_due"], itel.AttrTopic.String(ordersTopic)), 3000.0)
	// The topic this client publishes has nothing waiting: it reads 0
	// instead of missing.
	pending, ok := m["outbox.pending"].(metricdata.Gauge[int64])
	require.True(t, ok)
	var sawPayments bool
	for _, p := range pending.DataPoints {
		if v, ok := p.Attributes.Value(itel.AttrTopic); ok && v.AsString() == paymentsTopic {
			sawPayments = true
			require.Zero(t, p.Value)
		}
	}
	require.True(t, sawPayments, "a zero series for %s", paymentsTopic)
}

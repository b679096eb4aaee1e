package telemetry

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// TestMetricNames pins the metrics' names, kinds and units: dashboards and
// alerts know them, so a rename or a changed unit must fail here first,
// and be announced in the changelog.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	want := []string{
		"outbox.events.recorded counter {event}",
		"outbox.events.published counter {event}",
		"outbox.events.publish_failed counter {event}",
		"outbox.change_stream.reopens counter {reopen}",
		"outbox.events.handled counter {event}",
		"outbox.events.skipped counter {event}",
		"outbox.events.retried counter {event}",
		"outbox.events.parked counter {event}",
		"outbox.rebalances counter {change}",
		"outbox.consumer.fetch_restarts counter {restart}",
		"outbox.claimcheck.stored counter {event}",
		"outbox.claimcheck.unresolved counter {attempt}",
		"outbox.scheduled.promoted counter {event}",
		"outbox.publish.duration histogram s",
		"outbox.handle.duration histogram s",
		"outbox.pending gauge {event}",
		"outbox.failed gauge {event}",
		"outbox.held_keys gauge {key}",
		"outbox.held_events gauge {event}",
		"outbox.parked gauge {event}",
		"outbox.held gauge {event}",
		"outbox.partitions.owned gauge {partition}",
		"outbox.consumer.lag gauge {record}",
		"outbox.consumer.in_flight gauge {event}",
		"outbox.consumer.waiting gauge {event}",
		"outbox.consumer.waiting.oldest_age float gauge s",
		"outbox.pending.oldest_age float gauge s",
		"outbox.scheduled gauge {event}",
		"outbox.scheduled.next_due float gauge s",
		"outbox.doctor.findings gauge {finding}",
	}
	var got []string
	for _, m := range Metrics() {
		require.NotEmpty(t, m.Description, m.Name)
		got = append(got, m.Name+" "+string(m.Kind)+" "+m.Unit)
	}
	require.Equal(t, want, got)

	// New creates each of them (but the doctor's gauge, which the check at
	// Run's start creates) as the kind and unit listed.
	rec := &recordingMeter{created: map[string]string{}}
	_, err := New(rec)
	require.NoError(t, err)
	dm, err := Int64Gauge(rec, DoctorFindings)
	require.NoError(t, err)
	require.NotNil(t, dm)
	require.Len(t, rec.created, len(want))
	for _, m := range Metrics() {
		require.Equal(t, string(m.Kind)+" "+m.Unit, rec.created[m.Name], m.Name)
	}
}

// recordingMeter records the name, kind and unit of each instrument
// created on it.
type recordingMeter struct {
	noop.Meter
	created map[string]string
}

func (m *recordingMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.created[name] = string(Counter) + " " + metric.NewInt64CounterConfig(opts...).Unit()
	return m.Meter.Int64Counter(name, opts...)
}

func (m *recordingMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.created[name] = string(Histogram) + " " + metric.NewFloat64HistogramConfig(opts...).Unit()
	return m.Meter.Float64Histogram(name, opts...)
}

func (m *recordingMeter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	m.created[name] = string(Gauge) + " " + metric.NewInt64ObservableGaugeConfig(opts...).Unit()
	return m.Meter.Int64ObservableGauge(name, opts...)
}

func (m *recordingMeter) Float64ObservableGauge(name string, opts ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	m.created[name] = string(FloatGauge) + " " + metric.NewFloat64ObservableGaugeConfig(opts...).Unit()
	return m.Meter.Float64ObservableGauge(name, opts...)
}

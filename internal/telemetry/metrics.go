package telemetry

import (
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/event-outbox/outbox/internal/consume"
)

// InstrumentationName is the instrumentation scope of every meter and
// tracer the framework uses.
const InstrumentationName = "github.com/event-outbox/outbox"

// Kind is the kind of instrument a metric is.
type Kind string

// Instrument kinds.
const (
	Counter    Kind = "counter"     // Int64Counter
	Histogram  Kind = "histogram"   // Float64Histogram with LatencyBounds, in seconds
	Gauge      Kind = "gauge"       // Int64ObservableGauge
	FloatGauge Kind = "float gauge" // Float64ObservableGauge
)

// Metric is one metric as dashboards and alerts know it. Its name, kind
// and unit are a contract with the users' dashboards: a change breaks
// them, so TestMetricNames lists every one.
type Metric struct {
	Name        string
	Kind        Kind
	Unit        string
	Description string
}

// The framework's metrics, with the attributes each carries:
//
//	outbox.events.recorded      counter    events recorded by committed transactions, scheduled ones included {topic}
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
//	outbox.consumer.fetch_restarts counter restarts of a partition's fetching that its Kafka client had stopped (the fetch watch) {topic, partition, reason: set_offsets|resubscribe}
//	outbox.consumer.waiting.oldest_age gauge s, age of a partition's oldest wait {topic, partition}
//	outbox.claimcheck.stored    counter    events committed with their payload out of band (claim check) {topic}
//	outbox.claimcheck.unresolved counter   attempts whose payload stored out of band could not be read {topic, reason: unavailable|not_configured|malformed}
//	outbox.scheduled.promoted   counter    scheduled events moved into the outbox at their due time {topic}
//	outbox.scheduled            gauge      scheduled events waiting for their due time {topic}
//	outbox.scheduled.next_due   gauge      s, until the earliest due time of a topic's scheduled events (negative: overdue) {topic}
//	outbox.doctor.findings      gauge      findings of the doctor's check at Run's start {severity: breaks|risk|note}
var (
	// Recorded counts each event once, when the transaction that recorded
	// it commits, in the process that recorded it: a scheduled event
	// (WithPublishAt, WithDelay) then too, not when it is promoted (the
	// owner of its partition, maybe another process, counts that in
	// Promoted), so that a cancelled one counts as recorded and none
	// counts twice.
	Recorded      = Metric{"outbox.events.recorded", Counter, "{event}", "Events recorded by committed transactions, scheduled ones included (counted at their commit, not at their promotion)."}
	Published     = Metric{"outbox.events.published", Counter, "{event}", "Events acknowledged by Kafka."}
	PublishFailed = Metric{"outbox.events.publish_failed", Counter, "{event}", "Events marked failed in the outbox: refused for good by Kafka, or unreadable documents."}
	StreamReopens = Metric{"outbox.change_stream.reopens", Counter, "{reopen}", "Reopens of the publisher's outbox change stream, by reason."}
	Handled       = Metric{"outbox.events.handled", Counter, "{event}", "Events whose handling transaction committed."}
	Skipped       = Metric{"outbox.events.skipped", Counter, "{event}", "Deliveries skipped: already handled or parked, or no handler."}
	Retried       = Metric{"outbox.events.retried", Counter, "{event}", "Handler failures that are retried."}
	Parked        = Metric{"outbox.events.parked", Counter, "{event}", "Events parked after their last attempt, or malformed."}
	Rebalances    = Metric{"outbox.rebalances", Counter, "{change}", "Partition assignment changes of the framework's Kafka groups."}
	ClaimStored   = Metric{"outbox.claimcheck.stored", Counter, "{event}", "Events committed with their payload stored out of band (claim check)."}
	Unresolved    = Metric{"outbox.claimcheck.unresolved", Counter, "{attempt}", "Handling attempts whose payload, stored out of band, could not be read, by reason."}
	FetchRestarts = Metric{"outbox.consumer.fetch_restarts", Counter, "{restart}", "Restarts of a handled partition's fetching that its Kafka client had stopped while the broker had records."}
	Promoted      = Metric{"outbox.scheduled.promoted", Counter, "{event}", "Scheduled events moved into the outbox at their due time, counted by the replica that promoted them."}

	PublishDuration = Metric{"outbox.publish.duration", Histogram, "s", "Duration of one Kafka batch, from the first send to the last acknowledgement."}
	HandleDuration  = Metric{"outbox.handle.duration", Histogram, "s", "Duration of one handling attempt, transaction included."}

	Pending       = Metric{"outbox.pending", Gauge, "{event}", "Outbox events not yet published (failed ones excluded)."}
	Failed        = Metric{"outbox.failed", Gauge, "{event}", "Outbox events Kafka refused for good."}
	HeldKeys      = Metric{"outbox.held_keys", Gauge, "{key}", "Partition keys with a failed outbox event, holding their later events (PoisonPolicy HoldKey)."}
	HeldEvents    = Metric{"outbox.held_events", Gauge, "{event}", "Pending outbox events waiting behind a failed event of their key (PoisonPolicy HoldKey)."}
	ParkedNow     = Metric{"outbox.parked", Gauge, "{event}", "Parked inbox events."}
	Held          = Metric{"outbox.held", Gauge, "{event}", "Parked inbox events held behind an earlier parked event of their key."}
	Owned         = Metric{"outbox.partitions.owned", Gauge, "{partition}", "Partitions this process publishes (role publisher) or handles (role consumer)."}
	Lag           = Metric{"outbox.consumer.lag", Gauge, "{record}", "Records between the committed offset and the high watermark of a handled partition."}
	InFlight      = Metric{"outbox.consumer.in_flight", Gauge, "{event}", "Events of a handled partition in running transactions."}
	Waiting       = Metric{"outbox.consumer.waiting", Gauge, "{event}", "Events of a handled partition that have waited longer than a few seconds, by what they wait on (retry, infra, locked, running, release...)."}
	WaitAge       = Metric{"outbox.consumer.waiting.oldest_age", FloatGauge, "s", "Age of the oldest wait of a handled partition."}
	OldestPending = Metric{"outbox.pending.oldest_age", FloatGauge, "s", "Age of the oldest outbox event not yet published."}
	Scheduled     = Metric{"outbox.scheduled", Gauge, "{event}", "Scheduled events (WithPublishAt, WithDelay) waiting for their due time."}
	NextDue       = Metric{"outbox.scheduled.next_due", FloatGauge, "s", "Time until the earliest due time of a topic's scheduled events; negative when overdue (not promoted)."}

	// DoctorFindings is created by the check at Run's start, not by New:
	// it is observed only while Run runs.
	DoctorFindings = Metric{"outbox.doctor.findings", Gauge, "{finding}", "Findings of the doctor's check at start, by severity (breaks: a setting breaks a guarantee)."}
)

// Metrics lists every metric the framework reports.
func Metrics() []Metric {
	return []Metric{Recorded, Published, PublishFailed, StreamReopens, Handled, Skipped, Retried, Parked,
		Rebalances, FetchRestarts, ClaimStored, Unresolved, Promoted, PublishDuration, HandleDuration, Pending, Failed, HeldKeys, HeldEvents,
		ParkedNow, Held, Owned, Lag, InFlight, Waiting, WaitAge, OldestPending, Scheduled, NextDue, DoctorFindings}
}

// LatencyBounds are the histograms' bucket boundaries, in seconds: from a
// millisecond (a batch to a local broker) to a minute (a handler near its
// timeout).
var LatencyBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Instruments are a Client's metric instruments. The counted ones
// (Recorded, Published, PublishFailed, Handled, Parked) also add to Sum,
// the counts of the periodic summary line.
type Instruments struct {
	Recorded, Published, PublishFailed metric.Int64Counter
	Handled, Skipped, Retried, Parked  metric.Int64Counter
	Rebalances, StreamReopens          metric.Int64Counter
	FetchRestarts                      metric.Int64Counter
	ClaimStored, Unresolved, Promoted  metric.Int64Counter
	PublishDuration, HandleDuration    metric.Float64Histogram
	Pending, Failed, ParkedNow, Owned  metric.Int64ObservableGauge
	HeldKeys, HeldEvents, Held         metric.Int64ObservableGauge
	Lag                                metric.Int64ObservableGauge
	InFlight, Waiting                  metric.Int64ObservableGauge
	WaitAge, OldestPending             metric.Float64ObservableGauge
	Scheduled                          metric.Int64ObservableGauge
	NextDue                            metric.Float64ObservableGauge
	Sum                                Summary
}

// New creates the instruments on meter. An instrument that cannot be
// created is left as the meter returned it and its error is joined into
// err: the others work, and the caller logs err once.
func New(meter metric.Meter) (ins *Instruments, err error) {
	ins = &Instruments{}
	var errs []error
	counter := func(m Metric) metric.Int64Counter {
		c, err := meter.Int64Counter(m.Name, metric.WithUnit(m.Unit), metric.WithDescription(m.Description))
		errs = append(errs, err)
		return c
	}
	hist := func(m Metric) metric.Float64Histogram {
		h, err := meter.Float64Histogram(m.Name, metric.WithUnit(m.Unit), metric.WithDescription(m.Description),
			metric.WithExplicitBucketBoundaries(LatencyBounds...))
		errs = append(errs, err)
		return h
	}
	gauge := func(m Metric) metric.Int64ObservableGauge {
		g, err := Int64Gauge(meter, m)
		errs = append(errs, err)
		return g
	}
	floatGauge := func(m Metric) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(m.Name, metric.WithUnit(m.Unit), metric.WithDescription(m.Description))
		errs = append(errs, err)
		return g
	}
	s := &ins.Sum
	ins.Recorded = summed(counter(Recorded), &s.recorded)
	ins.Published = summed(counter(Published), &s.published)
	ins.PublishFailed = summed(counter(PublishFailed), &s.failed)
	ins.StreamReopens = counter(StreamReopens)
	ins.Handled = summed(counter(Handled), &s.handled)
	ins.Skipped = counter(Skipped)
	ins.Retried = counter(Retried)
	ins.Parked = summed(counter(Parked), &s.parked)
	ins.Rebalances = counter(Rebalances)
	ins.FetchRestarts = counter(FetchRestarts)
	ins.ClaimStored = counter(ClaimStored)
	ins.Unresolved = counter(Unresolved)
	ins.Promoted = counter(Promoted)
	ins.PublishDuration = hist(PublishDuration)
	ins.HandleDuration = hist(HandleDuration)
	ins.Pending = gauge(Pending)
	ins.Failed = gauge(Failed)
	ins.HeldKeys = gauge(HeldKeys)
	ins.HeldEvents = gauge(HeldEvents)
	ins.ParkedNow = gauge(ParkedNow)
	ins.Held = gauge(Held)
	ins.Owned = gauge(Owned)
	ins.Lag = gauge(Lag)
	ins.InFlight = gauge(InFlight)
	ins.Waiting = gauge(Waiting)
	ins.WaitAge = floatGauge(WaitAge)
	ins.OldestPending = floatGauge(OldestPending)
	ins.Scheduled = gauge(Scheduled)
	ins.NextDue = floatGauge(NextDue)
	return ins, errors.Join(errs...)
}

// Int64Gauge creates the observable gauge of m on meter.
func Int64Gauge(meter metric.Meter, m Metric) (metric.Int64ObservableGauge, error) {
	return meter.Int64ObservableGauge(m.Name, metric.WithUnit(m.Unit), metric.WithDescription(m.Description))
}

// ObserveConsumer observes the consumer's partitions: events in flight
// per partition, the events that wait by what they wait on, and the age of
// each partition's oldest wait.
func (ins *Instruments) ObserveConsumer(o metric.Observer, stats map[consume.TopicPartition]consume.Stats, waits []consume.Wait) {
	for tp, st := range stats {
		o.ObserveInt64(ins.InFlight, int64(st.InFlight), PartitionAttrs(tp.Topic, tp.Partition))
	}
	type waitKey struct {
		tp   consume.TopicPartition
		what string
	}
	counts := map[waitKey]int64{}
	oldest := map[consume.TopicPartition]time.Time{}
	for _, w := range waits {
		counts[waitKey{w.Partition, w.What}]++
		if o, ok := oldest[w.Partition]; !ok || w.Since.Before(o) {
			oldest[w.Partition] = w.Since
		}
	}
	for k, n := range counts {
		o.ObserveInt64(ins.Waiting, n, PartitionAttrs(k.tp.Topic, k.tp.Partition, AttrWait.String(k.what)))
	}
	for tp, since := range oldest {
		o.ObserveFloat64(ins.WaitAge, time.Since(since).Seconds(), PartitionAttrs(tp.Topic, tp.Partition))
	}
}

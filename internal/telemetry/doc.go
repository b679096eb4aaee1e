// Package telemetry holds the framework's metric instruments, the spans of
// handling and publishing, the periodic summary line and rate-limited
// logs. It reports through the OpenTelemetry API only (no SDK, no
// exporter): the caller gives it a meter and a tracer.
//
// # What it owns
//
//   - The metrics' contract: every metric's name, kind, unit and
//     description (Metrics), pinned by TestMetricNames, and the attribute
//     keys they carry. Instruments creates them; measurement options are
//     cached per attribute set (bounded).
//   - Spans: StartHandle ("<topic> process", parent: the trace context
//     recorded with the event) and the publish hooks ("<topic> publish",
//     linked to the traces of the batch's events).
//   - The gauges' callback (Instruments.RegisterGauges): what each
//     observable gauge reports, read through functions the caller gives
//     (the partitions owned, the storage status, the consumer's stats).
//   - Watermarks: the ends of the handled partitions, read by the lag
//     gauge (ConsumerLag, against the group's committed offsets) and the
//     consumer's fetch watch.
//   - Summary: the counts behind the periodic "outbox: events" line.
//   - RateLog: a warning per kind of repeated message, then one per period
//     with the number of repeats.
//
// The root package keeps what the gauges observe (the publisher and the
// consumer, the cached storage status) and registers the callback for as
// long as Run runs.
//
// # Goroutines
//
// One, owned by the caller: Summary.LogSummaries runs until its context
// ends, then logs the last partial interval and returns. Nothing else here
// starts a goroutine.
package telemetry

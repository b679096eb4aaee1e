package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"

	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// The doctor at Run's start.
//
// Run runs the doctor once, in a goroutine of its own beside the publisher
// and the consumer (owned by Run, ended by Run's context and bounded by
// doctorTimeout), after the indexes are in place. Each finding that breaks
// a guarantee is logged once as a warning with its fix; one info line sums
// the report up. The report is kept for Status (Status.Doctor) and the
// metric outbox.doctor.findings {outbox.severity}. Findings never stop
// Run: the deployment may be about to be fixed, and refusing to start
// would turn a risk into an outage.

// checkAtStart runs the doctor once and reports its findings.
func (c *Client) checkAtStart(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	log := c.cfg.Logger
	r, err := c.Doctor(ctx)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			log.Warn("outbox: doctor: the deployment's settings could not be checked at start (outboxctl doctor checks them by hand)",
				"err", redactSecrets(err.Error()))
		}
		return
	}
	for _, f := range r.Breaking() {
		log.Warn("outbox: doctor: a setting breaks a guarantee: "+f.Problem,
			"check", f.Check, "subject", f.Subject, "read", f.Read, "guarantee", f.Guarantee, "fix", f.Fix)
	}
	log.Info("outbox: " + r.Summary())
	// Stored last: once Status shows the report, its log lines are written.
	c.doctor.Store(&r)
}

// registerDoctorGauge reports the counts of the start check's findings by
// severity while Run runs (nothing until the check finished).
func (c *Client) registerDoctorGauge() (unregister func()) {
	t := c.tel
	g, err := itel.Int64Gauge(t.meter, itel.DoctorFindings)
	if err != nil {
		c.cfg.Logger.Warn("outbox: the doctor's metric could not be created", "err", err)
		return func() {}
	}
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		r := c.doctor.Load()
		if r == nil {
			return nil
		}
		for _, s := range []Severity{SeverityBreaks, SeverityRisk, SeverityNote} {
			o.ObserveInt64(g, int64(r.Count(s)), metric.WithAttributes(itel.AttrSeverity.String(s.String())))
		}
		return nil
	}, g)
	if err != nil {
		c.cfg.Logger.Warn("outbox: the doctor's metric could not be registered", "err", fmt.Errorf("%w", err))
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

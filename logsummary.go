package outbox

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// The periodic summary: one info line per Config.LogSummaryInterval with
// the events recorded, published, failed, handled and parked meanwhile,
// only when there were some, so that an operator sees events flow without
// a line per event. The counts come from the same calls that feed the
// metrics: each counted instrument (summedCounter) adds to a summary
// counter too.

// summary holds the counts of the current interval.
type summary struct {
	recorded, published, failed, handled, parked atomic.Int64
}

// summedCounter is a metric counter that also adds to a summary count.
type summedCounter struct {
	metric.Int64Counter
	n *atomic.Int64
}

// Add adds to the metric and to the summary.
func (c summedCounter) Add(ctx context.Context, incr int64, opts ...metric.AddOption) {
	c.Int64Counter.Add(ctx, incr, opts...)
	c.n.Add(incr)
}

// summed makes c add to n too.
func summed(c metric.Int64Counter, n *atomic.Int64) metric.Int64Counter {
	if c == nil {
		return nil
	}
	return summedCounter{Int64Counter: c, n: n}
}

// logSummaries logs the summary every Config.LogSummaryInterval until ctx
// ends, then once more for the last, partial, interval. Run owns the
// goroutine that calls it.
func (c *Client) logSummaries(ctx context.Context) {
	every := c.cfg.LogSummaryInterval
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			c.logSummary(time.Since(last))
			return
		case now := <-t.C:
			c.logSummary(now.Sub(last))
			last = now
		}
	}
}

// logSummary logs and resets the counts of an interval of length d, when
// any is not zero.
func (c *Client) logSummary(d time.Duration) {
	s := &c.tel.sum
	rec, pub, fail := s.recorded.Swap(0), s.published.Swap(0), s.failed.Swap(0)
	hand, park := s.handled.Swap(0), s.parked.Swap(0)
	if rec == 0 && pub == 0 && fail == 0 && hand == 0 && park == 0 {
		return
	}
	attrs := []any{slog.String("outbox.replica", c.cfg.ReplicaID), slog.String("interval", d.Round(time.Second).String())}
	for _, a := range []struct {
		name string
		n    int64
	}{{"recorded", rec}, {"published", pub}, {"failed", fail}, {"handled", hand}, {"parked", park}} {
		if a.n != 0 {
			attrs = append(attrs, slog.Int64(a.name, a.n))
		}
	}
	c.cfg.Logger.Info("outbox: events", attrs...)
}

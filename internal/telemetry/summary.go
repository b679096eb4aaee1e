package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// The periodic summary: one info line per interval with the events
// recorded, published, failed, handled and parked meanwhile, only when
// there were some, so that an operator sees events flow without a line per
// event. The counts come from the same calls that feed the metrics: each
// counted instrument (summedCounter) adds to a summary count too.

// Summary holds the counts of the current interval.
type Summary struct {
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

// LogSummaries logs the summary every interval until ctx ends, then once
// more for the last, partial, interval. It returns at once when every is
// not positive. The caller owns the goroutine that runs it; it stops when
// ctx ends.
func (s *Summary) LogSummaries(ctx context.Context, every time.Duration, log *slog.Logger, replica string) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			s.Log(log, replica, time.Since(last))
			return
		case now := <-t.C:
			s.Log(log, replica, now.Sub(last))
			last = now
		}
	}
}

// Log logs and resets the counts of an interval of length d, when any is
// not zero.
func (s *Summary) Log(log *slog.Logger, replica string, d time.Duration) {
	rec, pub, fail := s.recorded.Swap(0), s.published.Swap(0), s.failed.Swap(0)
	hand, park := s.handled.Swap(0), s.parked.Swap(0)
	if rec == 0 && pub == 0 && fail == 0 && hand == 0 && park == 0 {
		return
	}
	attrs := []any{slog.String("outbox.replica", replica), slog.String("interval", d.Round(time.Second).String())}
	for _, a := range []struct {
		name string
		n    int64
	}{{"recorded", rec}, {"published", pub}, {"failed", fail}, {"handled", hand}, {"parked", park}} {
		if a.n != 0 {
			attrs = append(attrs, slog.Int64(a.name, a.n))
		}
	}
	log.Info("outbox: events", attrs...)
}

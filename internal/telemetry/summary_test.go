package telemetry

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/event-outbox/outbox/internal/testkit"
)

// The periodic summary sums up what the counted instruments saw in the
// interval, names only the non-zero counts, and says nothing for an idle
// interval; the loop logs the last partial interval when its context ends.
func TestLogSummary(t *testing.T) {
	t.Parallel()
	var logs testkit.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ins, err := New(noop.NewMeterProvider().Meter(InstrumentationName))
	require.NoError(t, err)
	ctx := context.Background()

	ins.Sum.Log(log, "orders-1", time.Minute)
	require.Empty(t, logs.String(), "nothing for an idle interval")

	ins.Recorded.Add(ctx, 3)
	ins.Published.Add(ctx, 2)
	ins.Parked.Add(ctx, 1)
	ins.Skipped.Add(ctx, 7) // not a summed count
	ins.Sum.Log(log, "orders-1", time.Minute)
	line := logs.String()
	require.Contains(t, line, `msg="outbox: events"`)
	require.Contains(t, line, "outbox.replica=orders-1")
	require.Contains(t, line, "interval=1m0s recorded=3 published=2 parked=1")
	require.NotContains(t, line, "handled=", "zero counts are left out")

	ins.Sum.Log(log, "orders-1", time.Minute)
	require.Equal(t, 1, strings.Count(logs.String(), "outbox: events"), "the counts were reset")

	// The loop: the last, partial, interval is logged when ctx ends.
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ins.Sum.LogSummaries(lctx, time.Hour, log, "orders-1") }()
	ins.Handled.Add(ctx, 5)
	cancel()
	<-done
	require.Contains(t, logs.String(), "handled=5")
}

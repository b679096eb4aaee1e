package outbox

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/event-outbox/outbox/internal/testkit"
)

// The periodic summary sums up what the counted instruments saw in the
// interval, names only the non-zero counts, and says nothing for an idle
// interval; the loop logs the last partial interval when Run stops.
func TestLogSummary(t *testing.T) {
	t.Parallel()
	var logs testkit.Buffer
	cfg := validConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.ReplicaID = "orders-1"
	c, err := New(cfg)
	require.NoError(t, err)
	ctx := context.Background()

	c.logSummary(time.Minute)
	require.Empty(t, logs.String(), "nothing for an idle interval")

	c.tel.recorded.Add(ctx, 3)
	c.tel.published.Add(ctx, 2)
	c.tel.parked.Add(ctx, 1)
	c.logSummary(time.Minute)
	line := logs.String()
	require.Contains(t, line, `msg="outbox: events"`)
	require.Contains(t, line, "outbox.replica=orders-1")
	require.Contains(t, line, "interval=1m0s recorded=3 published=2 parked=1")
	require.NotContains(t, line, "handled=", "zero counts are left out")

	c.logSummary(time.Minute)
	require.Equal(t, 1, strings.Count(logs.String(), "outbox: events"), "the counts were reset")

	// The loop: the last, partial, interval is logged when ctx ends.
	c.cfg.LogSummaryInterval = time.Hour
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.logSummaries(lctx) }()
	c.tel.handled.Add(ctx, 5)
	cancel()
	<-done
	require.Contains(t, logs.String(), "handled=5")
}

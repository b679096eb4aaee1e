package main

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// scrape GETs /metrics and returns the Prometheus text.
func (r *runningReplica) scrape(t *testing.T) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.url+"/metrics", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", raw)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"), "Content-Type %q", resp.Header.Get("Content-Type"))
	return string(raw)
}

// hasSeries reports whether the Prometheus text has a sample of the metric
// name whose labels include every one of labels (`key="value"`).
func hasSeries(text, name string, labels ...string) bool {
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		all := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				all = false
			}
		}
		if all {
			return true
		}
	}
	return false
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]

	// One order all the way through: both contexts record, publish and
	// handle an event.
	id := r.createOrder(t, "ada", 42)
	require.Equal(t, StatusPaid, r.waitSettled(t, id)["status"])
	r.waitDrained(t)

	text := r.scrape(t)
	orders, payments := `otel_scope_service="orders"`, `otel_scope_service="payments"`
	topicOrders, topicPayments := `messaging_destination_name="orders"`, `messaging_destination_name="payments"`
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"outbox_events_recorded_total", []string{orders, topicOrders}},
		{"outbox_events_recorded_total", []string{payments, topicPayments}},
		{"outbox_events_published_total", []string{orders, topicOrders}},
		{"outbox_events_published_total", []string{payments, topicPayments}},
		{"outbox_events_handled_total", []string{payments, topicOrders}},
		{"outbox_events_handled_total", []string{orders, topicPayments}},
		{"outbox_publish_duration_seconds_bucket", []string{orders, topicOrders}},
		{"outbox_handle_duration_seconds_bucket", []string{payments, topicOrders}},
		{"outbox_partitions_owned", []string{orders, `outbox_role="publisher"`}},
		{"outbox_partitions_owned", []string{payments, `outbox_role="consumer"`}},
		{"outbox_parked", []string{orders}},
		{"outbox_parked", []string{payments}},
		{"outbox_rebalances_total", []string{orders}},
		{"go_goroutines", nil},
	} {
		require.True(t, hasSeries(text, c.name, c.labels...), "no %s%v in:\n%s", c.name, c.labels, text)
	}

	// The pending gauges show while events wait: hold Kafka's produce
	// requests (the connection is closed, the publisher retries), record an
	// order, and scrape until the storage gauges (read at most every few
	// seconds) show it.
	var hold atomic.Bool
	hold.Store(true)
	kc := s.stack.kfake
	kc.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !hold.Load() {
			kc.DropControl()
			return nil, nil, false
		}
		kc.KeepControl()
		return nil, errors.New("produce held by the test"), true
	})
	held := r.createOrder(t, "bob", 7)
	deadline := time.Now().Add(settleTimeout)
	for {
		text = r.scrape(t)
		if hasSeries(text, "outbox_pending", orders, topicOrders) &&
			hasSeries(text, "outbox_pending_oldest_age_seconds", orders, topicOrders) &&
			hasSeries(text, "outbox_failed", orders, topicOrders) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending gauges after %v while an event waits:\n%s", settleTimeout, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
	hold.Store(false)
	require.Equal(t, StatusPaid, r.waitSettled(t, held)["status"])
}

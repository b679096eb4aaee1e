package main

import (
	"context"
	"testing"
	"time"

	outbox "github.com/event-outbox/outbox"
)

// benchEnv starts embedded servers for a Go benchmark.
func benchEnv(b *testing.B) *env {
	b.Helper()
	e, err := newEnv(context.Background(), options_{duration: time.Second, eventSize: 1024, partitions: 6,
		replicas: 1, rate: 1000, servers: "inproc"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.close)
	return e
}

// BenchmarkRelay publishes a backlog of committed events (b.N, at least
// 10,000: one round includes joining the group) through the framework's
// publisher on the embedded servers; the figure to read is events/s. Run
// with go test -run '^$' -bench . ./cmd/outbox-bench.
func BenchmarkRelay(b *testing.B) {
	e := benchEnv(b)
	b.ResetTimer()
	r, err := runRelay(context.Background(), e, max(b.N, 10000), topics.relay, "relay", func(i int) outbox.Event {
		return relayEvent{newPayload(i, e.opts.eventSize)}
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.Rate, "events/s")
	b.ReportMetric(r.MongoPerEvent, "mongo-cmds/event")
}

// BenchmarkConsume handles records (b.N, at least 10,000) with a handler
// that does nothing; the figure to read is events/s.
func BenchmarkConsume(b *testing.B) {
	e := benchEnv(b)
	b.ResetTimer()
	r, err := runConsume(context.Background(), e, max(b.N, 10000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.Rate, "events/s")
	b.ReportMetric(r.MongoPerEvent, "mongo-cmds/event")
}

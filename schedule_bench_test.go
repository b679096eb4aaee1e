package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// benchBundle is setup for a benchmark: the test's own database and Kafka
// topics (3 partitions), the classic group protocol.
func benchBundle(tb testing.TB) *bundle {
	tb.Helper()
	m := mongotest.Start(tb)
	run := kafkatest.UniqueName(tb)
	prefix := run + "."
	k := kafkatest.Start(tb, kafkatest.SeedTopics(3, prefix+ordersTopic, prefix+paymentsTopic))
	return &bundle{mongo: m, kafka: k, db: m.DB(tb), run: run, prefix: prefix}
}

// benchPublisher runs c's publisher until the benchmark ends.
func benchPublisher(b *testing.B, c *Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.runPublisherWith(ctx, publisherOptions{}) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
}

// lateness reads want records of the orders topic from the start and
// returns, for each, its Kafka timestamp (set when the publisher produced
// it) minus the time in milliseconds its event carries in Seq.
func lateness(b *testing.B, cl *kgo.Client, want int) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out []time.Duration
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			b.Fatalf("read %d of %d records", len(out), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			_, payload, err := decodeRecord(r)
			if err != nil {
				b.Fatal(err)
			}
			var e orderPlaced
			if err := json.Unmarshal(payload, &e); err != nil {
				b.Fatal(err)
			}
			out = append(out, r.Timestamp.Sub(time.UnixMilli(int64(e.Seq))))
		})
	}
	return out
}

// reportMemory reports the live heap after a collection and the process's
// resident set (now and at its peak, from /proc/self/status where there is
// one). With OUTBOX_TEST_MONGODB_URI naming a server in another process,
// they are the client's alone; with the embedded server they include the
// server's documents.
func reportMemory(b *testing.B) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap_MB")
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return
	}
	for line := range strings.Lines(string(status)) {
		for field, unit := range map[string]string{"VmRSS:": "rss_MB", "VmHWM:": "rss_peak_MB"} {
			if rest, ok := strings.CutPrefix(line, field); ok {
				kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
				if err == nil {
					b.ReportMetric(float64(kb)/1024, unit)
				}
			}
		}
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

func reportMS(b *testing.B, ds []time.Duration, what string) {
	b.ReportMetric(float64(quantile(ds, 0.5).Microseconds())/1000, what+"_p50_ms")
	b.ReportMetric(float64(quantile(ds, 0.99).Microseconds())/1000, what+"_p99_ms")
	b.ReportMetric(float64(slices.Max(ds).Microseconds())/1000, what+"_max_ms")
}

// BenchmarkScheduledPrecision measures how long after its due time a
// scheduled event reaches Kafka (the record's timestamp minus the due
// time): per round, 200 events in transactions of 10, due over one second
// starting 0.5 s after they are recorded, on 3 partitions.
func BenchmarkScheduledPrecision(b *testing.B) {
	bb := benchBundle(b)
	cfg := pubConfig(bb)
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.EnsureIndexes(context.Background()); err != nil {
		b.Fatal(err)
	}
	benchPublisher(b, c)
	cl := bb.kafka.Client(b, kgo.ConsumeTopics(bb.kafkaTopic(ordersTopic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	const n = 200
	var all []time.Duration
	b.ResetTimer()
	for round := range b.N {
		start := time.Now().Add(500 * time.Millisecond)
		for tx := range n / 10 {
			err := c.Transact(context.Background(), func(ctx context.Context) error {
				for i := range 10 {
					k := tx*10 + i
					due := start.Add(time.Duration(k) * time.Second / n).Truncate(time.Millisecond)
					e := orderPlaced{Run: bb.run, OrderID: fmt.Sprintf("k%d", k%17), Amount: 1, Seq: int(due.UnixMilli())}
					if err := Record(ctx, e, WithIdempotencyKey(fmt.Sprintf("r%d-%d", round, k)), WithPublishAt(due)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		all = append(all, lateness(b, cl, n)...)
	}
	b.StopTimer()
	if m := slices.Min(all); m < 0 {
		b.Fatalf("an event reached Kafka %v before its due time", -m)
	}
	reportMS(b, all, "late")
}

// benchScheduledWaiting is how many scheduled events wait (due in a day)
// in BenchmarkImmediateWithScheduled's second case:
// OUTBOX_BENCH_SCHEDULED, 1,000,000 by default.
func benchScheduledWaiting() int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_BENCH_SCHEDULED")); err == nil {
		return n
	}
	return 1_000_000
}

// BenchmarkImmediateWithScheduled measures immediate publishing (events
// per second from the first commit to the last record's Kafka timestamp,
// and the latency from Record to the record's Kafka timestamp) with no scheduled event, then with
// benchScheduledWaiting events scheduled for tomorrow on the same
// partitions: per round, 3,000 events in transactions of 50. A third case
// stores as many documents in a collection the Client never reads: what it
// costs is the MongoDB server's (a larger data set to hold and, for the
// embedded server, to scan in garbage collection), not the promotion's.
// It reports the live heap and resident set after the rounds
// (reportMemory): with OUTBOX_TEST_MONGODB_URI naming a server in another
// process, they are the Client's and must not grow with the scheduled
// count (a partition keeps at most 256 due times in memory).
func BenchmarkImmediateWithScheduled(b *testing.B) {
	waiting := benchScheduledWaiting()
	for _, bc := range []struct {
		name string
		docs int
		coll func(c *Client) *mongo.Collection
	}{
		{"scheduled=0", 0, nil},
		{fmt.Sprintf("scheduled=%d", waiting), waiting, func(c *Client) *mongo.Collection { return c.scheduled }},
		{fmt.Sprintf("unrelated=%d", waiting), waiting, func(c *Client) *mongo.Collection { return c.outbox.Database().Collection("unrelated") }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bb := benchBundle(b)
			cfg := pubConfig(bb)
			cfg.Logger = slog.New(slog.DiscardHandler)
			c, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := c.EnsureIndexes(ctx); err != nil {
				b.Fatal(err)
			}
			seeded := time.Now()
			due := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Millisecond)
			batch := make([]any, 0, 10_000)
			for i := range bc.docs {
				d := &store.ScheduledDoc{DueAt: due.Add(time.Duration(i) * time.Millisecond)}
				d.ID, d.Topic, d.Partition, d.Key = bson.NewObjectID(), ordersTopic, int32(i%3), fmt.Sprintf("s%d", i)
				d.Schema, d.IdempotencyKey, d.Payload, d.CreatedAt = "OrderPlaced.v1", fmt.Sprintf("s%d", i), `{"run":"x","order_id":"s","amount":1}`, time.Now()
				batch = append(batch, d)
				if len(batch) == cap(batch) || i == bc.docs-1 {
					if _, err := bc.coll(c).InsertMany(ctx, batch); err != nil {
						b.Fatal(err)
					}
					batch = batch[:0]
				}
			}
			if bc.docs > 0 {
				b.Logf("seeded %d documents in %s", bc.docs, time.Since(seeded).Round(time.Millisecond))
			}
			benchPublisher(b, c)
			cl := bb.kafka.Client(b, kgo.ConsumeTopics(bb.kafkaTopic(ordersTopic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			const n, per = 3000, 50
			// relay records n events in transactions of per and returns
			// their latencies and the time until the last reached Kafka.
			relay := func(round int) ([]time.Duration, time.Duration) {
				first := time.Now()
				for tx := range n / per {
					err := c.Transact(ctx, func(ctx context.Context) error {
						at := int(time.Now().UnixMilli())
						for i := range per {
							e := orderPlaced{Run: bb.run, OrderID: fmt.Sprintf("k%d", i), Amount: 1, Seq: at}
							if err := Record(ctx, e, WithIdempotencyKey(fmt.Sprintf("i%d-%d-%d", round, tx, i))); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				return lateness(b, cl, n), time.Since(first)
			}
			// The first round runs as the publisher starts, while each
			// promotion loop reads its first horizon: reported apart
			// (first_*), the rounds after it are the steady state.
			warm, warmFor := relay(0)
			var lat []time.Duration
			var elapsed time.Duration
			rounds := 0
			// b.Loop runs this function once, not once per b.N tried: the
			// seeding above is done once.
			for b.Loop() {
				rounds++
				got, took := relay(rounds)
				lat = append(lat, got...)
				elapsed += took
			}
			b.StopTimer()
			// Reported after the loop: b.Loop's start deletes the metrics
			// reported before it.
			b.ReportMetric(float64(n)/warmFor.Seconds(), "first_events/s")
			b.ReportMetric(float64(quantile(warm, 0.99).Microseconds())/1000, "first_p99_ms")
			b.ReportMetric(float64(n*rounds)/elapsed.Seconds(), "events/s")
			reportMS(b, lat, "record_to_kafka")
			reportMemory(b)
			if bc.docs > 0 {
				left, err := bc.coll(c).EstimatedDocumentCount(ctx)
				if err != nil || int(left) != bc.docs {
					b.Fatalf("documents waiting: %d (%v), want %d", left, err, bc.docs)
				}
			}
		})
	}
}

package cloudeventstest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const topic = "orders"

type orderPlaced struct {
	OrderID string `json:"order_id" validate:"required"`
	Amount  int    `json:"amount"`
}

func (orderPlaced) Topic() string          { return topic }
func (orderPlaced) ContentSchema() string  { return "OrderPlaced.v1" }
func (e orderPlaced) PartitionKey() string { return e.OrderID }

type stack struct {
	mongo *mongotest.Env
	kafka *kafkatest.Env
	db    string
}

func setup(t *testing.T) *stack {
	t.Helper()
	m := mongotest.Start(t)
	k := kafkatest.Start(t, kafkatest.SeedTopics(3, topic))
	if k.Real {
		t.Skip("needs a fresh Kafka cluster; unset OUTBOX_TEST_KAFKA_BROKERS to run on kfake")
	}
	return &stack{mongo: m, kafka: k, db: m.DB(t).Name()}
}

func (s *stack) client(t *testing.T, service string, publish bool) *outbox.Client {
	t.Helper()
	cfg := outbox.Config{
		Mongo: s.mongo.Client, Database: s.db, Brokers: s.kafka.Seeds, Service: service,
		OutboxCollection: service + "-outbox", InboxCollection: service + "-inbox",
		RetryMinBackoff: 10 * time.Millisecond, RetryMaxBackoff: 100 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, FenceMargin: 2 * time.Second,
	}
	if publish {
		cfg.PublishTopics = []string{topic}
		cfg.WireFormats = map[string]outbox.Format{topic: outbox.FormatCloudEvents}
		cfg.CloudEventsSource = "https://example.com/orders"
	}
	c, err := outbox.New(cfg)
	require.NoError(t, err)
	return c
}

// run runs c until the test ends.
func run(t *testing.T, c *outbox.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Error("Run did not return within 60s of cancel")
		}
	})
}

// saramaMessage is the record as the Sarama client hands it to the SDK's
// Kafka binding.
func saramaMessage(r *kgo.Record) *sarama.ConsumerMessage {
	cm := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return cm
}

// TestSDKReadsOurRecords: the official SDK's Kafka binding (kafka_sarama,
// NewMessageFromConsumerMessage) and binding.ToEvent decode the records our
// publisher writes for a CloudEvents topic into valid events with our id,
// type, source, time, data, partition key and trace context.
func TestSDKReadsOurRecords(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client(t, "orders", true)
	traceID := trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31}, TraceFlags: trace.FlagsSampled, Remote: true}))
	occurred := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		return outbox.Record(ctx, orderPlaced{OrderID: "o-1", Amount: 3}, outbox.WithIdempotencyKey("evt-1"), outbox.WithOccurredAt(occurred))
	}))
	run(t, c)

	cl := s.kafka.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rec *kgo.Record
	for rec == nil {
		fs := cl.PollFetches(pctx)
		require.NoError(t, pctx.Err())
		fs.EachRecord(func(r *kgo.Record) { rec = r })
	}

	msg := kafka_sarama.NewMessageFromConsumerMessage(saramaMessage(rec))
	require.Equal(t, binding.EncodingBinary, msg.ReadEncoding())
	ev, err := binding.ToEvent(context.Background(), msg)
	require.NoError(t, err)
	require.NoError(t, ev.Validate())
	require.Equal(t, "1.0", ev.SpecVersion())
	require.Equal(t, "evt-1", ev.ID())
	require.Equal(t, "OrderPlaced.v1", ev.Type())
	require.Equal(t, "https://example.com/orders", ev.Source())
	require.True(t, occurred.Equal(ev.Time()), "time %v", ev.Time())
	require.Equal(t, "application/json", ev.DataContentType())
	require.JSONEq(t, `{"order_id":"o-1","amount":3}`, string(ev.Data()))
	var data orderPlaced
	require.NoError(t, ev.DataAs(&data))
	require.Equal(t, orderPlaced{OrderID: "o-1", Amount: 3}, data)
	exts := ev.Extensions()
	require.Equal(t, "o-1", exts["partitionkey"])
	require.Equal(t, "o-1", string(rec.Key))
	tp, _ := exts["traceparent"].(string)
	require.True(t, strings.HasPrefix(tp, "00-"+traceID.String()+"-"), "traceparent %q", tp)
}

// TestConsumerHandlesSDKWrittenRecords: records written through the SDK's
// Kafka binding (WriteProducerMessage), in binary and in structured mode,
// are handled by our consumer, once each however often delivered.
func TestConsumerHandlesSDKWrittenRecords(t *testing.T) {
	t.Parallel()
	s := setup(t)
	c := s.client(t, "payments", false)
	var mu sync.Mutex
	handled := map[string]int{}
	metas := map[string]outbox.Metadata{}
	outbox.MustHandle(c, func(ctx context.Context, e orderPlaced, m outbox.Metadata) error {
		mu.Lock()
		defer mu.Unlock()
		handled[m.IdempotencyKey]++
		metas[m.IdempotencyKey] = m
		if e.OrderID == "" || e.Amount != 7 {
			t.Errorf("event %s: payload %+v", m.IdempotencyKey, e)
		}
		return nil
	})

	write := func(ctx context.Context, id string) *kgo.Record {
		ev := event.New()
		ev.SetID(id)
		ev.SetType("OrderPlaced.v1")
		ev.SetSource("https://example.com/sdk")
		ev.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		ev.SetExtension("partitionkey", "o-"+id)
		require.NoError(t, ev.SetData(event.ApplicationJSON, orderPlaced{OrderID: "o-" + id, Amount: 7}))
		var pm sarama.ProducerMessage
		require.NoError(t, kafka_sarama.WriteProducerMessage(ctx, binding.ToMessage(&ev), &pm))
		value, err := pm.Value.Encode()
		require.NoError(t, err)
		rec := &kgo.Record{Topic: topic, Partition: 0, Value: value}
		if pm.Key != nil {
			rec.Key, err = pm.Key.Encode()
			require.NoError(t, err)
		}
		for _, h := range pm.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: string(h.Key), Value: h.Value})
		}
		return rec
	}
	binary := write(binding.WithForceBinary(context.Background()), "bin-1")
	structured := write(binding.WithForceStructured(context.Background()), "str-1")
	ct := ""
	for _, h := range structured.Headers {
		if h.Key == "content-type" {
			ct = string(h.Value)
		}
	}
	require.Equal(t, "application/cloudevents+json", ct, "the SDK wrote structured mode")

	producer := s.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for range 2 {
		require.NoError(t, producer.ProduceSync(context.Background(), binary, structured).FirstErr())
		binary, structured = cloneRecord(binary), cloneRecord(structured)
	}
	run(t, c)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["bin-1"] == 1 && handled["str-1"] == 1
	}, 30*time.Second, 20*time.Millisecond)
	// Redeliveries are skipped by the inbox: wait until all four records
	// were consumed (committed), then check nothing ran twice.
	require.Eventually(t, func() bool {
		offs, err := s.kafka.Admin().FetchOffsets(context.Background(), "payments")
		if err != nil {
			return false
		}
		o, ok := offs.Lookup(topic, 0)
		return ok && o.At == 4
	}, 30*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"bin-1": 1, "str-1": 1}, handled)
	for id, m := range metas {
		require.Equal(t, outbox.FormatCloudEvents, m.Format, id)
		require.Equal(t, "https://example.com/sdk", m.Source, id)
		require.Equal(t, "o-"+id, m.PartitionKey, id)
		require.True(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Equal(m.OccurredAt), id)
	}
}

func cloneRecord(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

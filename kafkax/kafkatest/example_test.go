package kafkatest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// A test producing to and consuming from a throwaway topic. The body of
// the function given to exampleTest is what goes in a TestXxx function.
func Example() {
	exampleTest(func(t testing.TB) {
		env := kafkatest.Start(t) // embedded kfake unless OUTBOX_TEST_KAFKA_BROKERS is set
		topic := env.Topic(t, 3)  // unique name, deleted in t.Cleanup
		cl := env.Client(t, kgo.DefaultProduceTopic(topic), kgo.ConsumeTopics(topic))

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, kgo.StringRecord("hello")).FirstErr(); err != nil {
			t.Fatal(err)
		}
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) { fmt.Println(string(r.Value)) })
	})
	// Output: hello
}

// exampleTest runs fn with a minimal testing.TB so that the example can run
// outside a test function. Real tests pass their own *testing.T instead.
func exampleTest(fn func(t testing.TB)) {
	tb := &exampleTB{}
	defer tb.cleanup()
	fn(tb)
}

type exampleTB struct {
	testing.TB // only the methods below are used
	cleanups   []func()
}

func (*exampleTB) Helper()                        {}
func (*exampleTB) Name() string                   { return "Example" }
func (*exampleTB) Logf(format string, a ...any)   { fmt.Printf(format+"\n", a...) }
func (*exampleTB) Fatal(a ...any)                 { panic(fmt.Sprint(a...)) }
func (*exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (tb *exampleTB) Cleanup(f func())            { tb.cleanups = append(tb.cleanups, f) }
func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

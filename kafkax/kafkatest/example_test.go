package kafkatest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// In a test, Start gives a cluster (embedded kfake unless
// OUTBOX_TEST_KAFKA_BROKERS is set) and Topic a throwaway topic.
func ExampleStart() {
	t := &testing.T{} // in a real test, use the test's *testing.T
	_ = t
	// Example functions have no *testing.T; see the test in this package for
	// the full form. The shape of a test:
	//
	//	env := kafkatest.Start(t)
	//	topic := env.Topic(t, 3)
	//	cl := env.Client(t, kgo.DefaultProduceTopic(topic))
	fmt.Println("see TestStartProduceConsume")
	// Output: see TestStartProduceConsume
}

var _ = kgo.SeedBrokers
var _ = context.Background
var _ = kafkatest.Start

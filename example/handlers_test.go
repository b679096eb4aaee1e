package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// TestPaymentsHandler tests one handler on its own, the way the README
// suggests testing yours: embedded MongoDB and Kafka (or real ones from
// OUTBOX_TEST_MONGODB_URI and OUTBOX_TEST_KAFKA_BROKERS), the handler's
// Client running, and a second Client standing in for the service that
// records the events it handles.
func TestPaymentsHandler(t *testing.T) {
	t.Parallel()
	menv := mongotest.Start(t)
	kenv := kafkatest.Start(t, kafkatest.SeedTopics(3, ordersTopic, paymentsTopic))
	db := menv.DB(t) // unique to this test, dropped at the end

	prefix := kafkatest.UniqueName(t)
	paymentsGroup := prefix + "-payments" // ConsumerGroup defaults to Service
	newClient := func(service string, publish ...string) *outbox.Client {
		c, err := outbox.New(outbox.Config{
			Mongo:         menv.Client,
			Database:      db.Name(),
			Brokers:       kenv.Seeds,
			Service:       prefix + "-" + service,
			PublishTopics: publish,
			// Separate collections: both clients share the test database.
			OutboxCollection:  service + "_outbox",
			InboxCollection:   service + "_inbox",
			SessionTimeout:    6 * time.Second, // Kafka's minimum
			HeartbeatInterval: 500 * time.Millisecond,
			FenceMargin:       2 * time.Second,
		})
		require.NoError(t, err)
		return c
	}
	// The client under test, with the handler registered as in the service.
	payments := newClient("payments", paymentsTopic)
	svc := newPaymentsService(payments, db)
	// A client that records OrderCreated, as the orders service would.
	orders := newClient("orders", ordersTopic)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for _, c := range []*outbox.Client{payments, orders} {
		go func() { done <- c.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range 2 {
			require.NoError(t, <-done)
		}
	})

	// Order ids unique to the test: against real brokers the topics are
	// shared with other runs, whose events this fresh group also receives.
	id1, id2 := kafkatest.UniqueName(t)+"-1", kafkatest.UniqueName(t)+"-2"
	// The same event recorded twice (a client retry, say) with one
	// idempotency key is handled once.
	event := OrderCreated{OrderID: id1, Customer: "ada", Amount: 42}
	for range 2 {
		require.NoError(t, orders.Transact(t.Context(), func(ctx context.Context) error {
			return outbox.Record(ctx, event, outbox.WithIdempotencyKey("create-"+id1))
		}))
	}
	// A declined one.
	require.NoError(t, orders.Transact(t.Context(), func(ctx context.Context) error {
		return outbox.Record(ctx, OrderCreated{OrderID: id2, Customer: "bob", Amount: 5000})
	}))

	// Wait until the three events are published, then until the payments
	// group has committed past them: all three deliveries were handled (or
	// skipped as duplicates).
	waitFor(t, func() bool {
		n, err := db.Collection("orders_outbox").CountDocuments(t.Context(), bson.D{{Key: "published", Value: true}})
		require.NoError(t, err)
		return n == 3
	})
	adm := kenv.Admin()
	ends, err := adm.ListEndOffsets(t.Context(), ordersTopic)
	require.NoError(t, err)
	waitFor(t, func() bool {
		committed, err := adm.FetchOffsetsForTopics(t.Context(), paymentsGroup, ordersTopic)
		if err != nil {
			return false // the group may not exist yet
		}
		caughtUp := true
		ends.Each(func(end kadm.ListedOffset) {
			c, ok := committed.Lookup(end.Topic, end.Partition)
			if end.Offset > 0 && (!ok || c.Err != nil || c.At < end.Offset) {
				caughtUp = false
			}
		})
		return caughtUp
	})

	var got []Payment
	cur, err := svc.payments.Find(t.Context(), bson.D{{Key: "order_id", Value: bson.D{{Key: "$in", Value: bson.A{id1, id2}}}}})
	require.NoError(t, err)
	require.NoError(t, cur.All(t.Context(), &got))
	status := map[string]string{}
	for _, p := range got {
		status[p.OrderID] += p.Status
	}
	require.Equal(t, map[string]string{id1: "COMPLETED", id2: "DECLINED"}, status)

	// The handler's events were recorded in its transaction.
	n, err := db.Collection("payments_outbox").CountDocuments(t.Context(),
		bson.D{{Key: "key", Value: bson.D{{Key: "$in", Value: bson.A{id1, id2}}}}})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

// waitFor polls cond until it holds, failing the test after settleTimeout.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, settleTimeout, "the condition", cond)
}

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

func TestMigrateEventOutbox(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	lib := c.db.Collection("transactional-outbox")
	_, err := lib.InsertOne(ctx, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "payload", Value: bson.D{
		{Key: "topic", Value: "payments"}, {Key: "content_schema", Value: "PaymentRequested"}, {Key: "partition_key", Value: int32(4)},
		{Key: "idempotency_key", Value: "k1"}, {Key: "occurred_at", Value: "2026-01-02T03:04:05Z"}, {Key: "order_id", Value: "o-1"}}},
		{Key: "published", Value: false}})
	require.NoError(t, err)
	k := kafkatest.Start(t, kafkatest.SeedTopics(3, "pre.payments", "pre.orders"))
	args := []string{"-outbox", "transactional-outbox", "-inbox", "transactional-inbox", "migrate", "event-outbox"}

	code, _, stderr := c.run(append(args, "-partitions", "payments=3")...)
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "set -brokers or KAFKA_BROKERS", "the counts must be checked against Kafka")
	args = append(args, "-brokers", strings.Join(k.Seeds, ","), "-topic-prefix", "pre.")
	code, _, stderr = c.run(append(args, "-partitions", "payments")...)
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "want topic=N")
	code, _, stderr = c.run(append(args, "-partitions", "orders=3")...)
	require.Equal(t, exitFailure, code)
	require.Contains(t, stderr, "no partition count for topic(s) [payments]")

	// Issue 27, item 9: an operator's count that is not Kafka's is refused
	// before anything changes.
	code, _, stderr = c.run(append(args, "-partitions", "payments=12")...)
	require.Equal(t, exitFailure, code, stderr)
	require.Contains(t, stderr, `-partitions payments=12: Kafka topic "pre.payments" has 3 partitions`)
	code, _, stderr = c.run(append(args, "-partitions", "payments=3,refunds=2")...)
	require.Equal(t, exitFailure, code, stderr)
	require.Contains(t, stderr, `Kafka has no topic "pre.refunds"`)
	require.EqualValues(t, 0, c.count("transactional-outbox", bson.D{{Key: "topic", Value: "payments"}}))

	code, stdout, stderr := c.run(append(args, "-partitions", "payments=3", "-dry-run")...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "dry run: would convert 1 unpublished event-outbox document(s)")
	require.EqualValues(t, 0, c.count("transactional-outbox", bson.D{{Key: "topic", Value: "payments"}}))

	code, stdout, stderr = c.run(append(args, "-partitions", "payments=3")...)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "converted 1 unpublished event-outbox document(s)")
	require.EqualValues(t, 1, c.count("transactional-outbox", bson.D{{Key: "topic", Value: "payments"}, {Key: "partition", Value: int32(1)},
		{Key: "key", Value: "4"}, {Key: "format", Value: "event-outbox"}, {Key: "payload", Value: `{"order_id":"o-1"}`}}))
}

package outbox

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestStatusReportsOwnershipAndBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("status")
	cfg.ReplicaID = "status-r7"
	c := b.client(t, cfg)
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error { return nil })

	// Before Run: nothing owned, the backlog readable.
	require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: b.run, OrderID: "o-1", Amount: 1})
	}))
	st, err := c.Status(context.Background())
	require.NoError(t, err)
	require.False(t, st.Running)
	require.Empty(t, st.Publishing)
	require.EqualValues(t, 1, st.Store.Pending)
	require.Positive(t, st.Store.OldestPendingAge)
	require.Len(t, st.Store.Topics, 1)
	require.Equal(t, ordersTopic, st.Store.Topics[0].Topic)

	start(t, c)
	eventually(t, "partitions owned and the backlog published", func() bool {
		st, err = c.Status(context.Background())
		return err == nil && st.Running && len(st.Publishing) == 6 && len(st.Handling) == 3 && st.Store.Pending == 0
	})
	require.True(t, st.PublisherLeaseValid)
	require.Equal(t, TopicPartition{Topic: ordersTopic, Partition: 0}, st.Handling[0])

	srv := httptest.NewServer(c.StatusHandler())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, cfg.Service, body["service"])
	require.Equal(t, "status-r7", body["replica"], "Config.ReplicaID names the process in the status")
	require.Equal(t, true, body["running"])
	require.Equal(t, []any{0.0, 1.0, 2.0}, body["handling"].(map[string]any)[ordersTopic])
	require.Len(t, body["publishing"].(map[string]any), 2)
	for _, k := range []string{"pending", "oldest_pending_age_seconds", "failed", "parked", "redrive_requested", "topics", "checked_at"} {
		require.Contains(t, body, k)
	}

	post, err := http.Post(srv.URL, "application/json", nil)
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)
}

func TestStatusHandlerUnavailableStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("status-down"))
	// The request's context is gone: the collections cannot be read.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	c.StatusHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/outbox/status", nil).WithContext(ctx))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Contains(t, body["error"], "context canceled")
	require.Equal(t, false, body["running"])
}

func TestStatusCountsFailedAndParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("status-counts"))
	ctx := context.Background()
	_, err := c.outbox.InsertOne(ctx, outboxDoc{ID: bson.NewObjectID(), Topic: ordersTopic, Schema: "X.v1", Key: "k-1",
		IdempotencyKey: "f-1", Failed: true, Error: "MESSAGE_TOO_LARGE"})
	require.NoError(t, err)
	_, err = c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: InboxID{ordersTopic, "X.v1", "p-1"}},
		{Key: "handled", Value: false}, {Key: "parked", Value: true}})
	require.NoError(t, err)
	st, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 0, st.Pending)
	require.Zero(t, st.OldestPendingAge)
	require.EqualValues(t, 1, st.Failed)
	require.EqualValues(t, 1, st.Parked)
	// The failed event holds its key (nothing waits behind it).
	require.EqualValues(t, 1, st.OutboxHeldKeys)
	require.Zero(t, st.OutboxHeldEvents)
	require.EqualValues(t, []TopicBacklog{{Topic: ordersTopic, Failed: 1, HeldKeys: 1}}, st.Topics)

	failed, err := c.Admin().FailedEvents(ctx, FailedFilter{Topic: ordersTopic})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, "MESSAGE_TOO_LARGE", failed[0].Error)

	n, err := c.Admin().RetryFailed(ctx, FailedFilter{}, []string{failed[0].ID}, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{{Key: "failed", Value: true}}), "dry run changes nothing")
	n, err = c.Admin().RetryFailed(ctx, FailedFilter{}, []string{failed[0].ID}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	st, err = c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Pending)
	require.EqualValues(t, 0, st.Failed)
	_, err = c.Admin().RetryFailed(ctx, FailedFilter{}, []string{"nope"}, false)
	require.ErrorContains(t, err, `"nope"`)
}

// A failed keyless event holds nothing (keyless events promise no order), so
// the keyless events pending beside it are not counted as held.
func TestStatusKeylessFailedEventHoldsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, b.config("status-keyless"))
	ctx := context.Background()
	for i, failed := range []bool{true, false, false} {
		_, err := c.outbox.InsertOne(ctx, outboxDoc{ID: bson.NewObjectID(), Topic: ordersTopic, Partition: 1, Schema: "X.v1",
			IdempotencyKey: "f-" + itoa(i), Failed: failed, CreatedAt: time.Now()})
		require.NoError(t, err)
	}
	st, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Failed)
	require.EqualValues(t, 2, st.Pending)
	require.Zero(t, st.OutboxHeldKeys)
	require.Zero(t, st.OutboxHeldEvents)
}

func TestRedactSecrets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"dial mongodb://app:s3cr%40t@db:27017/x failed":              "dial mongodb://app:xxxxx@db:27017/x failed",
		"mongodb+srv://u:p@cluster0.example.net/?authSource=admin":   "mongodb+srv://u:xxxxx@cluster0.example.net/?authSource=admin",
		"no secret in mongodb://db:27017 or mongodb://user@db:27017": "no secret in mongodb://db:27017 or mongodb://user@db:27017",
		"a:b@c is not a URL": "a:b@c is not a URL",
	} {
		require.Equal(t, want, redactSecrets(in))
	}
}

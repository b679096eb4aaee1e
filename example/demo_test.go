package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// doWith sends a request with extra headers and decodes the JSON answer.
func doWith(t *testing.T, method, url, body string, header map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, resp.Header, out
}

// POST /orders with an Idempotency-Key: a client retrying the request (a
// replica died before it answered, a timeout) gets the order it created,
// charged once; the same key for another order is refused.
func TestIdempotencyKeyMakesRetriesSafe(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]
	key := map[string]string{"Idempotency-Key": "retry-me-1"}
	code, _, first := doWith(t, http.MethodPost, r.url+"/orders", `{"customer": "ada", "amount": 42}`, key)
	require.Equal(t, http.StatusCreated, code, "%v", first)
	code, h, again := doWith(t, http.MethodPost, r.url+"/orders", `{"customer": "ada", "amount": 42}`, key)
	require.Equal(t, http.StatusOK, code, "%v", again)
	require.Equal(t, "true", h.Get("Idempotent-Replayed"))
	require.Equal(t, first["id"], again["id"])
	id := first["id"].(string)
	require.Equal(t, StatusPaid, r.waitSettled(t, id)["status"])
	r.waitDrained(t)
	require.EqualValues(t, 1, s.paymentsOf(t, id), "charged once")
	require.EqualValues(t, 2, s.outboxEventsOf(t, id), "one OrderCreated, one PaymentCompleted")
	var doc struct {
		IdempotencyKey string `bson:"idempotency_key"`
	}
	require.NoError(t, s.stack.mongo.Database(ordersDB).Collection("outbox").
		FindOne(t.Context(), bson.D{{Key: "key", Value: id}}).Decode(&doc))
	require.Equal(t, "retry-me-1", doc.IdempotencyKey, "OrderCreated carries the request's key (outbox.WithIdempotencyKey)")

	code, _, body := doWith(t, http.MethodPost, r.url+"/orders", `{"customer": "bob", "amount": 7}`, key)
	require.Equal(t, http.StatusUnprocessableEntity, code, "%v", body)
	require.Contains(t, body["error"], "already used for another order")
}

// The example can make the events its tools show (README, "See the
// operator's tools at work"): POST /orders?poison=1 parks OrderCreated in
// the payments context; POST /orders?too_large=1 makes Kafka refuse it,
// failed in the orders context's outbox until retried.
func TestPoisonAndRefusedEventsOnDemand(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]

	code, body := do(t, http.MethodPost, r.url+"/orders?poison=1", `{"customer": "mallory", "amount": 5}`)
	require.Equal(t, http.StatusCreated, code, "%v", body)
	poison := body["id"].(string)
	payments := r.payments.client.Admin()
	require.Eventually(t, func() bool {
		evs, err := payments.ParkedEvents(t.Context(), outbox.ParkedFilter{})
		require.NoError(t, err)
		return len(evs) == 1 && evs[0].PartitionKey == poison && strings.Contains(evs[0].LastError, "poison on purpose")
	}, settleTimeout, 20*time.Millisecond, "the poison order's event parked")

	code, body = do(t, http.MethodPost, r.url+"/orders?too_large=1", `{"customer": "trudy", "amount": 6}`)
	require.Equal(t, http.StatusCreated, code, "%v", body)
	failedID, _ := body["failed_event_id"].(string)
	require.NotEmpty(t, failedID, "%v", body)
	order := body["order"].(map[string]any)["id"].(string)
	orders := r.orders.client.Admin()
	evs, err := orders.FailedEvents(t.Context(), outbox.FailedFilter{})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, order, evs[0].PartitionKey)

	// The limit is back: an ordinary order goes through, and the failed
	// event, retried, is published and its order charged.
	ok := r.createOrder(t, "ada", 42)
	require.Equal(t, StatusPaid, r.waitSettled(t, ok)["status"])
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	n, err := orders.RetryFailed(ctx, outbox.FailedFilter{}, []string{failedID}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, StatusPaid, r.waitSettled(t, order)["status"])
}

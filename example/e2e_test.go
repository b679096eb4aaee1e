package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// settleTimeout bounds how long an order may take to go from PENDING to its
// final status: two publishes, two handlings, and on start the consumer
// groups' first joins.
const settleTimeout = 60 * time.Second

// fastFailover shortens the group timings so a stopped replica's partitions
// move quickly; a graceful stop hands them over at once anyway.
func fastFailover(c *outbox.Config) {
	c.SessionTimeout = 6 * time.Second // Kafka's minimum (group.min.session.timeout.ms)
	c.HeartbeatInterval = 500 * time.Millisecond
	c.FenceMargin = 2 * time.Second
	c.RetryMinBackoff = 20 * time.Millisecond
	c.RetryMaxBackoff = time.Second
}

// shop is the example on the embedded stack, with replicas started and
// stopped by the test.
type shop struct {
	t        *testing.T
	stack    *stack
	replicas []*runningReplica
}

type runningReplica struct {
	*replica
	url  string
	stop func() // cancels the replica and waits for run to return; idempotent
	// lateStopOK accepts a shutdown cut short by the shutdown timeout
	// (an outage test: MongoDB down, the clients cannot stop cleanly).
	lateStopOK bool
}

// setup starts the embedded servers and n replicas on random ports. Everything
// stops in t.Cleanup.
func setup(t *testing.T, n int) *shop {
	t.Helper()
	return setupFormat(t, n, outbox.FormatNative)
}

// setupFormat is setup with the payments context publishing in format.
func setupFormat(t *testing.T, n int, format outbox.Format) *shop {
	t.Helper()
	return setupWith(t, n, format, nil)
}

// setupWith is setupFormat with adjust applied to each replica before it
// runs.
func setupWith(t *testing.T, n int, format outbox.Format, adjust func(*runningReplica)) *shop {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := startEmbedded(t.Context(), log)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	st.paymentsFormat = format
	s := &shop{t: t, stack: st}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		r, err := newReplica(fmt.Sprintf("test-r%d", i+1), st, ln, log, fastFailover)
		require.NoError(t, err)
		rr := &runningReplica{replica: r, url: "http://" + r.Addr()}
		if adjust != nil {
			adjust(rr)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.run(ctx) }()
		var once sync.Once
		rr.stop = func() {
			once.Do(func() {
				cancel()
				select {
				case err := <-done:
					if rr.lateStopOK && errors.Is(err, context.DeadlineExceeded) {
						t.Logf("replica %s: %v", r.name, err)
						return
					}
					require.NoError(t, err, "replica %s", r.name)
				case <-time.After(time.Minute):
					t.Errorf("replica %s did not stop within a minute", r.name)
				}
			})
		}
		t.Cleanup(rr.stop) // runs before st.Close (cleanups are LIFO)
		s.replicas = append(s.replicas, rr)
	}
	return s
}

// do sends a request and decodes the JSON answer.
func do(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "body: %s", raw)
	var out map[string]any
	require.NoError(t, json.NewDecoder(bytes.NewReader(raw)).Decode(&out), "body: %s", raw)
	return resp.StatusCode, out
}

// createOrder posts an order and returns its id.
func (r *runningReplica) createOrder(t *testing.T, customer string, amount int) string {
	t.Helper()
	code, body := do(t, http.MethodPost, r.url+"/orders", fmt.Sprintf(`{"customer": %q, "amount": %d}`, customer, amount))
	require.Equal(t, http.StatusCreated, code, "body: %v", body)
	require.Equal(t, StatusPending, body["status"])
	id, _ := body["id"].(string)
	require.NotEmpty(t, id)
	return id
}

// waitSettled polls GET /orders/{id} on r until the order leaves PENDING,
// and returns it.
func (r *runningReplica) waitSettled(t *testing.T, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for {
		code, body := do(t, http.MethodGet, r.url+"/orders/"+id, "")
		require.Equal(t, http.StatusOK, code, "body: %v", body)
		if body["status"] != StatusPending {
			return body
		}
		if time.Now().After(deadline) {
			status, _ := r.status(t.Context())
			t.Fatalf("order %s still PENDING after %v; outbox status: %+v", id, settleTimeout, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// paymentsOf counts the payment documents of an order.
func (s *shop) paymentsOf(t *testing.T, orderID string) int64 {
	t.Helper()
	n, err := s.stack.mongo.Database(paymentsDB).Collection("payments").
		CountDocuments(t.Context(), bson.D{{Key: "order_id", Value: orderID}})
	require.NoError(t, err)
	return n
}

// outboxEventsOf counts the outbox documents recorded for an order (the
// order id is the partition key of every event about it).
func (s *shop) outboxEventsOf(t *testing.T, orderID string) int64 {
	t.Helper()
	var total int64
	for _, db := range []string{ordersDB, paymentsDB} {
		n, err := s.stack.mongo.Database(db).Collection("outbox").
			CountDocuments(t.Context(), bson.D{{Key: "key", Value: orderID}})
		require.NoError(t, err)
		total += n
	}
	return total
}

// waitDrained polls GET /outbox/status until nothing is pending, and checks
// that nothing failed or was parked.
func (r *runningReplica) waitDrained(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for {
		code, body := do(t, http.MethodGet, r.url+"/outbox/status", "")
		require.Equal(t, http.StatusOK, code, "body: %v", body)
		ctxs, _ := body["contexts"].(map[string]any)
		require.Len(t, ctxs, 2, "body: %v", body)
		pending := 0.0
		for name, v := range ctxs {
			c, _ := v.(map[string]any)
			require.Zero(t, c["failed"], "%s: %v", name, c)
			require.Zero(t, c["parked"], "%s: %v", name, c)
			pending += c["pending"].(float64)
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not drained after %v: %v", settleTimeout, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOrderIsPaidOrFailed(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]

	paid := r.createOrder(t, "ada", 42)
	declined := r.createOrder(t, "bob", creditLimit+1)

	o := r.waitSettled(t, paid)
	require.Equal(t, StatusPaid, o["status"], "order: %v", o)
	require.NotEmpty(t, o["payment_id"])
	o = r.waitSettled(t, declined)
	require.Equal(t, StatusFailed, o["status"], "order: %v", o)
	require.Contains(t, o["reason"], "credit limit")

	require.EqualValues(t, 1, s.paymentsOf(t, paid))
	require.EqualValues(t, 1, s.paymentsOf(t, declined))
	r.waitDrained(t)

	// Each context's Client.StatusHandler is mounted too.
	for _, name := range []string{"orders", "payments"} {
		code, body := do(t, http.MethodGet, r.url+"/outbox/status/"+name, "")
		require.Equal(t, http.StatusOK, code, "body: %v", body)
		require.Equal(t, name, body["service"], "body: %v", body)
		require.Equal(t, true, body["running"], "body: %v", body)
	}
}

// TestOrderFlowInEachPaymentsFormat runs the orders/payments flow with the
// payments context publishing in each wire format (-payments-format), and
// checks the payments records on Kafka are in that format.
func TestOrderFlowInEachPaymentsFormat(t *testing.T) {
	t.Parallel()
	for _, format := range []outbox.Format{outbox.FormatNative, outbox.FormatEventOutbox, outbox.FormatCloudEvents} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			s := setupFormat(t, 1, format)
			r := s.replicas[0]
			paid := r.createOrder(t, "ada", 42)
			declined := r.createOrder(t, "bob", creditLimit+1)
			require.Equal(t, StatusPaid, r.waitSettled(t, paid)["status"])
			require.Equal(t, StatusFailed, r.waitSettled(t, declined)["status"])
			r.waitDrained(t)

			cl, err := kgo.NewClient(kgo.SeedBrokers(s.stack.brokers...), kgo.ConsumeTopics(paymentsTopic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			require.NoError(t, err)
			defer cl.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var recs []*kgo.Record
			for len(recs) < 2 {
				fs := cl.PollFetches(ctx)
				require.NoError(t, ctx.Err(), "read %d of 2 payments records", len(recs))
				fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
			}
			for _, rec := range recs {
				headers := map[string]string{}
				for _, h := range rec.Headers {
					headers[h.Key] = string(h.Value)
				}
				var body map[string]any
				require.NoError(t, json.Unmarshal(rec.Value, &body))
				switch format {
				case outbox.FormatNative:
					require.Equal(t, "1", headers["outbox-version"])
					require.NotContains(t, body, "content_schema")
				case outbox.FormatEventOutbox:
					require.Equal(t, "event-outbox", headers["outbox-format"])
					require.Equal(t, paymentsTopic, body["topic"])
					require.Contains(t, []any{"PaymentCompleted.v1", "PaymentFailed.v1"}, body["content_schema"])
					require.NotEmpty(t, body["idempotency_key"])
				case outbox.FormatCloudEvents:
					require.Equal(t, "1.0", headers["ce_specversion"])
					require.Equal(t, "/payments", headers["ce_source"])
					require.Contains(t, []string{"PaymentCompleted.v1", "PaymentFailed.v1"}, headers["ce_type"])
				}
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]
	for _, tc := range []struct {
		name, body string
		code       int
		msg        string
	}{
		{"empty body", "", http.StatusBadRequest, "empty body"},
		{"not JSON", "{", http.StatusBadRequest, "invalid JSON"},
		{"unknown field", `{"customer": "ada", "amount": 1, "x": 1}`, http.StatusBadRequest, `unknown field "x"`},
		{"no customer", `{"amount": 1}`, http.StatusBadRequest, "customer is required"},
		{"no amount", `{"customer": "ada"}`, http.StatusBadRequest, "amount is required"},
		{"zero amount", `{"customer": "ada", "amount": 0}`, http.StatusBadRequest, "positive"},
		{"fractional amount", `{"customer": "ada", "amount": 1.5}`, http.StatusBadRequest, "amount must be a whole number, got 1.5"},
		{"amount as a string", `{"customer": "ada", "amount": "42"}`, http.StatusBadRequest, "amount must be a number, got a string"},
		{"huge amount", `{"customer": "ada", "amount": 1e30}`, http.StatusBadRequest, "amount is out of range"},
		{"customer as a number", `{"customer": 7, "amount": 1}`, http.StatusBadRequest, "customer must be a string, got a number"},
		{"array body", `[1]`, http.StatusBadRequest, "the body must be a JSON object, got an array"},
		{"two values", `{"customer": "ada", "amount": 1} {}`, http.StatusBadRequest, "more than one value"},
	} {
		code, body := do(t, http.MethodPost, r.url+"/orders", tc.body)
		require.Equal(t, tc.code, code, "%s: %v", tc.name, body)
		require.Contains(t, body["error"], tc.msg, tc.name)
		// Messages speak JSON, not Go.
		for _, internal := range []string{"Go struct", "Go value", "int64", "createOrderRequest", "main."} {
			require.NotContains(t, body["error"], internal, tc.name)
		}
	}

	// JSON has one number type: 1e3 and 1000.0 are the integer 1000.
	for _, amount := range []string{"1e3", "1000.0", "1E+3"} {
		code, body := do(t, http.MethodPost, r.url+"/orders", `{"customer": "ada", "amount": `+amount+`}`)
		require.Equal(t, http.StatusCreated, code, "amount %s: %v", amount, body)
		require.Equal(t, float64(1000), body["amount"], "amount %s", amount)
	}

	// Unknown paths and wrong methods answer JSON too (do checks the
	// content type).
	code, body := do(t, http.MethodGet, r.url+"/no/such/path", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["error"], "no such endpoint: GET /no/such/path")
	code, body = do(t, http.MethodDelete, r.url+"/orders/x", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Contains(t, body["error"], "method DELETE not allowed on /orders/x")
	code, body = do(t, http.MethodGet, r.url+"/orders", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Contains(t, body["error"], "allowed: POST")
	code, body = do(t, http.MethodPost, r.url+"/orders?fail_after_write=maybe", `{"customer": "ada", "amount": 1}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body["error"], "fail_after_write")

	code, body = do(t, http.MethodGet, r.url+"/orders/nope", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["error"], "not found")
}

func TestAbortedTransactionLeavesNothing(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]

	code, body := do(t, http.MethodPost, r.url+"/orders?fail_after_write=1", `{"customer": "eve", "amount": 7}`)
	require.Equal(t, http.StatusInternalServerError, code, "body: %v", body)
	aborted, _ := body["order_id"].(string)
	require.NotEmpty(t, aborted)

	code, _ = do(t, http.MethodGet, r.url+"/orders/"+aborted, "")
	require.Equal(t, http.StatusNotFound, code)
	require.Zero(t, s.outboxEventsOf(t, aborted), "an aborted transaction left an outbox event")

	// An order created afterwards goes all the way through: by then anything
	// the aborted attempt might have leaked would have been processed too.
	ok := r.createOrder(t, "eve", 7)
	require.Equal(t, StatusPaid, r.waitSettled(t, ok)["status"])
	r.waitDrained(t)
	require.Zero(t, s.paymentsOf(t, aborted), "the payments context saw an order that was never committed")
	require.Zero(t, s.outboxEventsOf(t, aborted))
	require.EqualValues(t, 2, s.outboxEventsOf(t, ok)) // OrderCreated + PaymentCompleted
}

// waitSplit waits until each of the four Kafka groups (consumer and
// publisher group of both contexts) has n members that share all
// partitions, each member owning at least one.
func (s *shop) waitSplit(t *testing.T, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.stack.brokers...))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	groups := map[string]string{ // group -> topic it is assigned
		"orders": paymentsTopic, "payments": ordersTopic,
		"orders.outbox-publisher": ordersTopic, "payments.outbox-publisher": paymentsTopic,
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		described, err := adm.DescribeGroups(t.Context(), slices.Collect(maps.Keys(groups))...)
		require.NoError(t, err)
		split, state := true, ""
		for name, topic := range groups {
			g := described[name]
			covered := len(g.AssignedPartitions()[topic])
			state += fmt.Sprintf("%s: %s, %d members, %d partitions; ", name, g.State, len(g.Members), covered)
			if g.Err != nil || g.State != "Stable" || len(g.Members) != n || covered != defaultPartitions {
				split = false
				continue
			}
			for _, m := range g.Members {
				if a, ok := m.Assigned.AsConsumer(); !ok || len(a.Topics) == 0 {
					split = false
				}
			}
		}
		if split {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups not split over %d members after %v: %s", n, settleTimeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReplicasSplitWorkAndSurviveAStop(t *testing.T) {
	t.Parallel()
	s := setup(t, 3)
	s.waitSplit(t, 3)
	s.requireStatusCoversPartitions(t, s.replicas)
	const perPhase = 12
	var ids []string
	amount := func(i int) int { return 100 + i*97 } // some over the credit limit
	create := func(reps []*runningReplica, from int) {
		for i := range perPhase {
			n := from + i
			ids = append(ids, reps[n%len(reps)].createOrder(t, fmt.Sprintf("customer-%d", n), amount(n)))
		}
	}

	create(s.replicas, 0)
	// Stop replica 2 while the first orders are in flight; the other two take
	// over its partitions, in both groups of both contexts.
	s.replicas[1].stop()
	if resp, err := http.Get(s.replicas[1].url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("replica 2 still serves HTTP after its stop")
	}
	alive := []*runningReplica{s.replicas[0], s.replicas[2]}
	create(alive, perPhase)

	for i, id := range ids {
		o := alive[i%2].waitSettled(t, id)
		want := StatusPaid
		if amount(i) > creditLimit {
			want = StatusFailed
		}
		require.Equal(t, want, o["status"], "order %d: %v", i, o)
		require.EqualValues(t, 1, s.paymentsOf(t, id), "order %d was charged more or less than once", i)
	}
	alive[0].waitDrained(t)
	s.waitSplit(t, 2)
	s.requireStatusCoversPartitions(t, alive)
}

// requireStatusCoversPartitions checks that the replicas' GET /outbox/status
// together list every partition exactly once, for publishing and handling
// in both contexts, and that every replica owns some of each. Each replica
// reports its own view of the groups, which follows the coordinator's a
// moment behind, so it polls until the views agree.
func (s *shop) requireStatusCoversPartitions(t *testing.T, reps []*runningReplica) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for {
		seen, problem := s.statusCoverage(t, reps)
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s; partitions listed: %v", settleTimeout, problem, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusCoverage reads the replicas' GET /outbox/status once and says what
// keeps them from listing every partition exactly once ("" when nothing).
func (s *shop) statusCoverage(t *testing.T, reps []*runningReplica) (map[string]int, string) {
	t.Helper()
	seen := map[string]int{} // "context/kind/topic/partition" -> count
	problem := ""
	for _, r := range reps {
		code, body := do(t, http.MethodGet, r.url+"/outbox/status", "")
		require.Equal(t, http.StatusOK, code, "body: %v", body)
		require.Equal(t, r.name, body["replica"], "body: %v", body)
		for _, total := range []string{"pending", "failed", "parked", "oldest_pending_age_seconds"} {
			require.Contains(t, body, total, "body: %v", body)
		}
		ctxs, _ := body["contexts"].(map[string]any)
		require.Len(t, ctxs, 2, "body: %v", body)
		for name, v := range ctxs {
			c := v.(map[string]any)
			require.Equal(t, name, c["service"], "body: %v", body)
			require.Equal(t, true, c["running"], "body: %v", body)
			for _, kind := range []string{"publishing", "handling"} {
				byTopic, _ := c[kind].(map[string]any)
				if len(byTopic) == 0 {
					problem = fmt.Sprintf("replica %s owns nothing for %s %s", r.name, name, kind)
				}
				for topic, ps := range byTopic {
					for _, p := range ps.([]any) {
						seen[fmt.Sprintf("%s/%s/%s/%v", name, kind, topic, p)]++
					}
				}
			}
		}
	}
	if problem == "" && len(seen) != 4*defaultPartitions {
		problem = fmt.Sprintf("%d partitions listed, want %d", len(seen), 4*defaultPartitions)
	}
	for k, n := range seen {
		if problem == "" && n != 1 {
			problem = fmt.Sprintf("%s listed by %d replicas", k, n)
		}
	}
	return seen, problem
}

func TestPaymentsFormatFlag(t *testing.T) {
	t.Parallel()
	noenv := func(string) string { return "" }
	err := run(t.Context(), []string{"-payments-format", "avro"}, noenv, io.Discard)
	require.ErrorContains(t, err, `unknown wire format "avro"`)
	env := func(k string) string {
		if k == envPaymentsFormat {
			return "xml"
		}
		return ""
	}
	require.ErrorContains(t, run(t.Context(), nil, env, io.Discard), `unknown wire format "xml"`)
}

package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	ordersTopic   = "orders"
	paymentsTopic = "payments" // the browser test's service publishes it only
	refundsTopic  = "refunds"  // the browser test's service handles it only
)

// refundIssued is an event of refundsTopic.
type refundIssued struct {
	OrderID string `json:"order_id"`
}

func (refundIssued) Topic() string          { return refundsTopic }
func (refundIssued) ContentSchema() string  { return "RefundIssued.v1" }
func (e refundIssued) PartitionKey() string { return e.OrderID }

// orderPlaced is the test event. A handler fails while failing is set.
type orderPlaced struct {
	OrderID string `json:"order_id" validate:"required"`
	Amount  int    `json:"amount"`
}

func (orderPlaced) Topic() string          { return ordersTopic }
func (orderPlaced) ContentSchema() string  { return "OrderPlaced.v1" }
func (e orderPlaced) PartitionKey() string { return e.OrderID }

// bundle is what a console test needs.
type bundle struct {
	mongo   *mongotest.Env
	kafka   *kafkatest.Env
	db      *mongo.Database
	cfg     outbox.Config
	client  *outbox.Client
	console *Console
	srv     *httptest.Server
	handled sync.Map    // order id -> *atomic.Int64, times handled
	heal    atomic.Bool // poison orders are handled once set
}

// timesHandled is how often the handler succeeded for an order.
func (b *bundle) timesHandled(orderID string) int64 {
	n, ok := b.handled.Load(orderID)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// testPassword is the operator password of a console with actions.
const testPassword = "correct horse battery staple"

// setup starts MongoDB and Kafka, a framework Client for service "shop"
// (not running; see run) with a handler of orderPlaced, and a console on
// an httptest server mounted at /outbox/ui/. configure may change the
// Client's configuration before it is created.
func setup(t testing.TB, actions bool, configure ...func(*outbox.Config)) *bundle {
	t.Helper()
	m := mongotest.Start(t)
	// Every test has its own database, Kafka topics (Config.TopicPrefix)
	// and groups, so that the tests share real brokers
	// (OUTBOX_TEST_KAFKA_BROKERS) as well as they run on a kfake cluster
	// each; the service keeps the name the pages show.
	run := kafkatest.UniqueName(t)
	prefix := run + "."
	k := kafkatest.Start(t, kafkatest.SeedTopics(3, prefix+ordersTopic))
	b := &bundle{mongo: m, kafka: k, db: m.DB(t)}
	b.cfg = outbox.Config{
		Mongo: m.Client, Database: b.db.Name(), Brokers: k.Seeds, Service: "shop",
		TopicPrefix: prefix, ConsumerGroup: run, PublisherGroup: run + ".outbox-publisher",
		PublishTopics: []string{ordersTopic}, RetryMinBackoff: 10 * time.Millisecond, RetryMaxBackoff: 50 * time.Millisecond,
		MaxAttempts: 2, SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, FenceMargin: 2 * time.Second,
	}
	for _, f := range configure {
		f(&b.cfg)
	}
	c, err := outbox.New(b.cfg)
	require.NoError(t, err)
	b.client = c
	require.NoError(t, outbox.Handle(c, func(ctx context.Context, e orderPlaced, _ outbox.Metadata) error {
		if strings.HasPrefix(e.OrderID, "poison") && !b.heal.Load() {
			return fmt.Errorf("cannot charge order %s: card declined", e.OrderID)
		}
		n, _ := b.handled.LoadOrStore(e.OrderID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return nil
	}))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	opts := Options{Services: []Service{ServiceOf(b.cfg)}, Kafka: k.Admin(), EnableActions: actions}
	if actions {
		opts.OperatorPassword = testPassword
	}
	b.console, err = New(opts)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/ui/", http.StripPrefix("/outbox/ui", b.console))
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

// run runs the client until the test ends.
func (b *bundle) run(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(60 * time.Second):
			t.Error("Run did not return within 60s")
		}
	})
}

// kafkaTopic is the test's Kafka topic of the bare topic t.
func (b *bundle) kafkaTopic(t string) string { return b.cfg.TopicPrefix + t }

func (b *bundle) url(path string) string { return b.srv.URL + "/outbox/ui/" + path }

func (b *bundle) inbox() *mongo.Collection  { return b.db.Collection("inbox") }
func (b *bundle) outbox() *mongo.Collection { return b.db.Collection("outbox") }

// parkDoc is a parked inbox document as the consumer writes it; heldBy
// makes it a held event.
func parkDoc(key, partitionKey string, at time.Time, heldBy *outbox.InboxID) bson.D {
	d := bson.D{
		{Key: "_id", Value: outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: key}},
		{Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "parked_at", Value: at},
		{Key: "attempts", Value: int32(2)}, {Key: "last_error", Value: "cannot charge order " + partitionKey + ": card declined"},
		{Key: "partition", Value: int32(1)}, {Key: "offset", Value: int64(7)}, {Key: "partition_key", Value: partitionKey},
		{Key: "received_at", Value: at}, {Key: "traceparent", Value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{Key: "payload", Value: fmt.Sprintf(`{"order_id":%q,"amount":42}`, partitionKey)},
	}
	if heldBy != nil {
		d = append(d, bson.E{Key: "held_by", Value: *heldBy})
	}
	return d
}

func handledDoc(key string, at time.Time) bson.D {
	return bson.D{
		{Key: "_id", Value: outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: key}},
		{Key: "handled", Value: true}, {Key: "handled_at", Value: at}, {Key: "parked", Value: false},
		{Key: "attempts", Value: int32(0)}, {Key: "partition", Value: int32(0)}, {Key: "offset", Value: int64(1)},
		{Key: "partition_key", Value: "o-" + key}, {Key: "received_at", Value: at},
	}
}

func outboxDocOf(key string, created time.Time, published, failed bool) bson.D {
	d := bson.D{
		{Key: "_id", Value: bson.NewObjectID()}, {Key: "topic", Value: ordersTopic}, {Key: "partition", Value: int32(2)},
		{Key: "key", Value: "o-" + key}, {Key: "schema", Value: "OrderPlaced.v1"}, {Key: "idempotency_key", Value: key},
		{Key: "occurred_at", Value: created}, {Key: "payload", Value: `{"order_id":"o-` + key + `","amount":1}`},
		{Key: "seq", Value: bson.Timestamp{}}, {Key: "created_at", Value: created}, {Key: "published", Value: published},
		{Key: "failed", Value: failed},
	}
	if published {
		d = append(d, bson.E{Key: "published_at", Value: created.Add(time.Second)})
	}
	if failed {
		d = append(d, bson.E{Key: "failed_at", Value: created.Add(time.Second)},
			bson.E{Key: "error", Value: "MESSAGE_TOO_LARGE"}, bson.E{Key: "attempts", Value: int32(1)})
	}
	return d
}

func insert(t testing.TB, coll *mongo.Collection, docs ...bson.D) {
	t.Helper()
	anys := make([]any, len(docs))
	for i := range docs {
		anys[i] = docs[i]
	}
	_, err := coll.InsertMany(context.Background(), anys)
	require.NoError(t, err)
}

func count(t testing.TB, coll *mongo.Collection, filter bson.D) int64 {
	t.Helper()
	n, err := coll.CountDocuments(context.Background(), filter)
	require.NoError(t, err)
	return n
}

// get fetches a page and returns its status and body.
func get(t testing.TB, cl *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := cl.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// post submits a form with the given headers.
func post(t *testing.T, cl *http.Client, u string, form url.Values, hdr map[string]string) (int, string) {
	t.Helper()
	resp, body := send(t, cl, http.MethodPost, u, "", form, hdr)
	return resp.StatusCode, body
}

// send makes a request with a form (nil for none), a Host header ("" for
// the URL's) and headers, and returns the response and its body.
func send(t *testing.T, cl *http.Client, method, u, host string, form url.Values, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := cl.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

var statRe = regexp.MustCompile(`data-stat="([^"]+)">(?:<a [^>]*>)?([^<]*)<`)

// stats reads the numbers a page marks with data-stat.
func stats(body string) map[string]string {
	out := map[string]string{}
	for _, m := range statRe.FindAllStringSubmatch(body, -1) {
		out[m[1]] = strings.TrimSpace(m[2])
	}
	return out
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// signIn signs cl in as the operator and returns a CSRF token of its
// cookie.
func (b *bundle) signIn(t *testing.T, cl *http.Client) string {
	t.Helper()
	code, page := get(t, cl, b.url("login"))
	require.Equal(t, http.StatusOK, code, page)
	code, page = post(t, cl, b.url("login"), url.Values{"csrf": {csrfOf(t, page)}, "password": {testPassword}},
		map[string]string{"Origin": b.srv.URL})
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, "actions enabled", "signed in")
	return csrfOf(t, page)
}

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF token in the page")
	return m[1]
}

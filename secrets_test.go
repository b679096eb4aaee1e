package outbox

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// secretsSeen collects everything a user or operator could see: errors,
// logs, the status and its HTTP endpoint.
type secretsSeen struct {
	logs *logCapture
	text []string
}

func (s *secretsSeen) err(err error) {
	if err != nil {
		s.text = append(s.text, err.Error())
	}
}

func (s *secretsSeen) status(t *testing.T, c *Client) {
	t.Helper()
	st, err := c.Status(context.Background())
	s.err(err)
	s.text = append(s.text, st.LastError)
	rec := httptest.NewRecorder()
	c.StatusHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
	s.text = append(s.text, rec.Body.String())
}

func (s *secretsSeen) requireAbsent(t *testing.T, secret string) {
	t.Helper()
	all := strings.Join(append(s.text, s.logs.String()), "\n")
	require.NotEmpty(t, strings.TrimSpace(all), "nothing was captured: the test exercised no error path")
	require.NotContains(t, all, secret)
}

// runBriefly runs c until cond holds (or 20 s), then stops it and returns
// Run's error.
func runBriefly(t *testing.T, c *Client, cond func() bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		select {
		case err := <-done:
			cancel()
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		return err
	case <-time.After(90 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// A password in the MongoDB connection string never shows in errors, logs
// or the status, even when authentication fails everywhere.
func TestMongoPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const secret = "MongoS3cretPw"
	m := mongotest.StartEmbedded(t)
	run := kafkatest.UniqueName(t)
	k := kafkatest.Start(t, kafkatest.SeedTopics(3, run+"."+ordersTopic))
	u, err := url.Parse(m.URI)
	require.NoError(t, err)
	u.User = url.UserPassword("svcuser", secret)
	mc, err := mongo.Connect(options.Client().ApplyURI(u.String()).SetServerSelectionTimeout(300 * time.Millisecond))
	require.NoError(t, err)
	defer func() { _ = mc.Disconnect(context.Background()) }()

	seen := &secretsSeen{logs: &logCapture{}}
	c, err := New(Config{Mongo: mc, Database: "secrets", Brokers: k.Seeds, Service: "secrets-" + run,
		PublishTopics: []string{ordersTopic}, TopicPrefix: run + ".", Logger: seen.logs.logger(),
		RetryMinBackoff: 10 * time.Millisecond, RetryMaxBackoff: 50 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, FenceMargin: 2 * time.Second})
	require.NoError(t, err)
	MustHandle(c, func(context.Context, orderPlaced, Metadata) error { return nil })

	seen.err(c.Transact(context.Background(), func(ctx context.Context) error {
		return Record(ctx, orderPlaced{Run: "r", OrderID: "o1"})
	}))
	seen.err(c.EnsureIndexes(context.Background()))
	_, err = c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	seen.err(err)
	seen.err(runBriefly(t, c, func() bool { return strings.Contains(seen.logs.String(), "ensure indexes failed") }))
	seen.status(t, c)
	require.Contains(t, strings.Join(seen.text, "\n"), "auth", "the errors should be authentication failures")
	seen.requireAbsent(t, secret)
}

// SASL credentials given in Config.KafkaOptions never show in errors, logs
// or the status, with a wrong password (fatal authentication error) or a
// right one.
func TestKafkaSASLPasswordNeverShown(t *testing.T) {
	t.Parallel()
	const good, wrong = "KafkaGoodS3cret", "KafkaWrongS3cret"
	m := mongotest.Start(t)
	k := kafkatest.Start(t, kafkatest.ClusterOptions(kfake.SeedTopics(3, ordersTopic),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", good)))
	if k.Cluster == nil {
		t.Skip("needs the embedded kfake cluster with SASL PLAIN and a superuser: the real test broker has no SASL listener")
	}
	db := m.DB(t)
	for i, pass := range []string{wrong, good} {
		seen := &secretsSeen{logs: &logCapture{}}
		c, err := New(Config{Mongo: m.Client, Database: db.Name(), Brokers: k.Seeds,
			KafkaOptions:  []kgo.Opt{kgo.SASL(plain.Auth{User: "admin", Pass: pass}.AsMechanism())},
			Service:       fmt.Sprintf("sasl-%d", i),
			PublishTopics: []string{ordersTopic}, Logger: seen.logs.logger(),
			RetryMinBackoff: 10 * time.Millisecond, RetryMaxBackoff: 50 * time.Millisecond,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, FenceMargin: 2 * time.Second})
		require.NoError(t, err)
		MustHandle(c, func(context.Context, orderPlaced, Metadata) error { return nil })
		seen.err(c.Transact(context.Background(), func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: "r", OrderID: "o1"})
		}))
		if pass == wrong {
			// kfake closes the connection on a failed authentication (kgo
			// sees EOF), so Run keeps retrying rather than failing fast;
			// run until the failure has been logged.
			seen.err(runBriefly(t, c, func() bool { return strings.Contains(seen.logs.String(), "level=WARN") }))
		} else {
			// Force errors with the right credentials: the broker fails
			// produce requests for a while.
			k.Cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: 3})
			seen.err(runBriefly(t, c, func() bool {
				st, _ := c.Status(context.Background())
				return st.Store.Pending == 0 && st.Running
			}))
		}
		seen.status(t, c)
		seen.requireAbsent(t, pass)
	}
}

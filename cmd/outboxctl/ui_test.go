package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

func TestUIServesTheConsoleUntilCancelled(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	k := kafkatest.Start(t, kafkatest.SeedTopics(1, "orders"))
	line, stop := startUI(t, []string{"-uri", c.uri, "-db", c.db.Name(), "-service", "shop", "-brokers", strings.Join(k.Seeds, ","),
		"-find-indexes", "ui", "-addr", "127.0.0.1:0"}, c.getenv)
	m := regexp.MustCompile(`\(read-only\) on (http://\S+/)`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	cl := &http.Client{Timeout: 30 * time.Second}
	for path, want := range map[string]string{"": `data-stat="shop/pending">2<`, "parked": `data-stat="matching">2<`,
		"failed": `data-stat="matching">1<`, "partitions": "Consumer group <code>shop</code>", "find?q=k-1": `data-stat="shop/inbox">1<`} {
		resp, err := cl.Get(m[1] + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(body), want, path)
		require.NotContains(t, string(body), c.uri, path)
	}
	resp, err := cl.Post(m[1]+"purge", "application/x-www-form-urlencoded", strings.NewReader("scope=all&confirm=yes"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only without -actions")
	// DNS rebinding: a name the console was not told to serve.
	req, err := http.NewRequest(http.MethodGet, m[1]+"parked", nil)
	require.NoError(t, err)
	req.Host = "attacker.example"
	resp, err = cl.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	stop()
}

func TestUIUsage(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	code, _, errOut := c.run("-service", "a,b", "ui")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "-service names 2 services but -db lists 1 databases")
}

// -actions needs an operator password: reaching the console on loopback is
// not authentication. With one, actions wait for a sign-in; -allowed-hosts
// adds the names the console answers to.
func TestUIActionsNeedAPassword(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	code, _, errOut := c.run("ui", "-actions", "-addr", "127.0.0.1:0")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "OUTBOX_CONSOLE_PASSWORD")

	env := func(k string) string {
		if k == "OUTBOX_CONSOLE_PASSWORD" {
			return "operator-secret"
		}
		return ""
	}
	line, stop := startUI(t, []string{"-uri", c.uri, "-db", c.db.Name(), "ui", "-actions", "-allowed-hosts", "console.test", "-addr", "127.0.0.1:0"}, env)
	m := regexp.MustCompile(`\(actions enabled for signed-in operators\) on (http://\S+/)`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	cl := &http.Client{Timeout: 30 * time.Second}
	for host, want := range map[string]int{"console.test": http.StatusOK, "console.test:8443": http.StatusOK, "other.test": http.StatusMisdirectedRequest} {
		req, err := http.NewRequest(http.MethodGet, m[1]+"parked", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := cl.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, want, resp.StatusCode, host)
		if want == http.StatusOK {
			require.Contains(t, string(body), "sign in to act", host)
		}
	}
	resp, err := cl.Post(m[1]+"purge", "application/x-www-form-urlencoded", strings.NewReader("scope=all&confirm=yes"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF cookie, no operator")
	require.EqualValues(t, 2, c.count("inbox", bson.D{{Key: "parked", Value: true}}))
	stop()
}

// Slow or idle clients cannot hold the ui server's connections: every
// phase of a request is bounded.
func TestUIServerBoundsRequests(t *testing.T) {
	t.Parallel()
	srv := newUIServer(http.NotFoundHandler())
	require.Positive(t, srv.ReadHeaderTimeout)
	require.Positive(t, srv.ReadTimeout)
	require.Positive(t, srv.WriteTimeout)
	require.Positive(t, srv.IdleTimeout)
}

// startUI runs outboxctl with args (a ui command) until the test ends, and
// returns the first line it prints and a stop function that cancels it and
// checks that it exits 0.
func startUI(t *testing.T, args []string, getenv func(string) string) (line string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var stderr strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, pw, &stderr, getenv)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err, stderr.String())
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			require.Equal(t, exitOK, code, stderr.String())
		case <-time.After(30 * time.Second):
			t.Fatal("outboxctl ui did not stop after its context ended")
		}
	}
	t.Cleanup(stop)
	return line, stop
}

// The event page of an outbox event whose payload is stored out of band
// reads the payload's chunks in the claim-check database -claim-check-db
// names, by default the service's own; -claim-check-db lists one database
// per -db database, or one for all.
func TestUIClaimCheckDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCtl(t)
	other := c.db.Client().Database(c.db.Name() + "_cc")
	t.Cleanup(func() { _ = other.Drop(context.Background()) })
	ref := bson.NewObjectID()
	payload := []byte(`{"big":"` + strings.Repeat("x", 100) + `"}`)
	_, err := c.db.Collection("outbox").InsertOne(ctx, bson.D{{Key: "_id", Value: ref}, {Key: "topic", Value: "orders"},
		{Key: "partition", Value: int32(0)}, {Key: "schema", Value: "OrderPlaced.v1"}, {Key: "payload", Value: ""},
		{Key: "payload_ref", Value: ref}, {Key: "payload_size", Value: int64(len(payload))},
		{Key: "created_at", Value: time.Now().UTC()}, {Key: "published", Value: false}, {Key: "failed", Value: false}})
	require.NoError(t, err)
	get := func(args ...string) string {
		t.Helper()
		line, stop := startUI(t, append([]string{"-uri", c.uri, "-db", c.db.Name()}, append(args, "ui", "-addr", "127.0.0.1:0")...), c.getenv)
		defer stop()
		m := regexp.MustCompile(`on (http://\S+/)`).FindStringSubmatch(line)
		require.NotNil(t, m, line)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(m[1] + "outbox-event?id=" + ref.Hex())
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body)
	}
	want := func(db string) string { return "bytes in 1 chunk(s) in " + db + ".outbox_payloads" }

	_, err = other.Collection("outbox_payloads").InsertMany(ctx, claimcheck.Chunks(ref, payload))
	require.NoError(t, err)
	require.Contains(t, get("-claim-check-db", other.Name()), want(other.Name()))
	require.Contains(t, get(), "not found in "+c.db.Name()+".outbox_payloads", "defaults to the service's database")
	_, err = c.db.Collection("outbox_payloads").InsertMany(ctx, claimcheck.Chunks(ref, payload))
	require.NoError(t, err)
	require.Contains(t, get(), want(c.db.Name()))

	code, _, errOut := c.run("-claim-check-db", "a,b", "ui")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "-claim-check-db lists 2 databases but -db lists 1")
}

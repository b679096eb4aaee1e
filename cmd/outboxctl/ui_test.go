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

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

func TestUIServesTheConsoleUntilCancelled(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	k := kafkatest.Start(t, kafkatest.SeedTopics(1, "orders"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var stderr strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-uri", c.uri, "-db", c.db.Name(), "-service", "shop", "-brokers", strings.Join(k.Seeds, ","),
			"-find-indexes", "ui", "-addr", "127.0.0.1:0"}, pw, &stderr, c.getenv)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err, stderr.String())
	go func() { _, _ = io.Copy(io.Discard, pr) }()
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
	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("outboxctl ui did not stop after its context ended")
	}
}

func TestUIUsage(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	code, _, errOut := c.run("-service", "a,b", "ui")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "-service names 2 services but -db lists 1 databases")
}

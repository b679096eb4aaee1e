package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The example mounts the console at /outbox/ui/ and answers whether each
// order was charged once at /outbox/charges.
func TestConsoleAndChargesEndpoint(t *testing.T) {
	t.Parallel()
	s := setup(t, 1)
	r := s.replicas[0]
	paid := r.createOrder(t, "ada", 42)
	declined := r.createOrder(t, "bob", creditLimit+1)
	r.waitSettled(t, paid)
	r.waitSettled(t, declined)
	r.waitDrained(t)
	// A payment whose order does not exist says nothing about the orders:
	// /outbox/charges used to count it.
	_, err := r.payments.payments.InsertOne(t.Context(), Payment{ID: "stray", OrderID: "no-such-order", Amount: 1, Status: "COMPLETED"})
	require.NoError(t, err)

	code, body := do(t, http.MethodGet, r.url+"/outbox/charges", "")
	require.Equal(t, http.StatusOK, code, "body: %v", body)
	require.EqualValues(t, 2, body["orders"])
	require.EqualValues(t, 2, body["charged_once"])
	require.EqualValues(t, 0, body["not_charged_yet"])
	require.Empty(t, body["charged_more_than_once"])

	for path, want := range map[string]string{
		"":           `data-stat="orders/pending">0<`,
		"partitions": "Consumer group <code>payments</code>",
		"parked":     `data-stat="matching">0<`,
	} {
		resp, err := http.Get(r.url + "/outbox/ui/" + path)
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(page), want, path)
		require.Contains(t, string(page), "read-only", "no OUTBOX_CONSOLE_PASSWORD: read-only, even on loopback")
		require.NotContains(t, string(page), "sign in", path)
	}

	// The find page works out of the box: the example creates its indexes
	// at start (in the background, so the test polls).
	var page string
	require.Eventually(t, func() bool {
		resp, err := http.Get(r.url + "/outbox/ui/find?by=partition&q=" + paid)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		page = string(b)
		return !strings.Contains(page, "missing")
	}, time.Minute, 50*time.Millisecond, "the find page still misses indexes after a minute")
	require.Contains(t, page, `data-stat="orders/outbox">1<`, page)
	require.Contains(t, page, `data-stat="payments/inbox">1<`, page)
}

// Issue 28 item 6 and issue 30: the example's console used to enable
// actions because it listened on loopback, with no login. It is read-only
// unless OUTBOX_CONSOLE_PASSWORD is set; then operators sign in first.
// Names other than localhost, IP addresses and OUTBOX_CONSOLE_HOSTS get
// 421.
func TestConsoleActionsNeedTheOperatorPassword(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := startEmbedded(t.Context(), log)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	env := map[string]string{envConsolePassword: "example-operator", envConsoleHosts: "shop.test, ops.test"}
	st.console = consoleAccessFrom(func(k string) string { return env[k] })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	r, err := newReplica("console-test", st, ln, log, nil)
	require.NoError(t, err)
	defer r.close()
	srv := httptest.NewServer(r.server.Handler)
	defer srv.Close()

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	cl := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	get := func(u, host string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := cl.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	code, page := get(srv.URL+"/outbox/ui/parked", host)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "sign in to act")
	for h, want := range map[string]int{"shop.test": 200, "ops.test:8080": 200, "attacker.test": http.StatusMisdirectedRequest} {
		code, _ := get(srv.URL+"/outbox/ui/", h)
		require.Equal(t, want, code, h)
	}

	_, page = get(srv.URL+"/outbox/ui/login", host)
	token := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	require.NotNil(t, token)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/outbox/ui/login",
		strings.NewReader(url.Values{"csrf": {token[1]}, "password": {"example-operator"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	resp, err := cl.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), "actions enabled")

	env[envConsolePassword] = "short"
	st.console = consoleAccessFrom(func(k string) string { return env[k] })
	_, err = newReplica("console-test-2", st, ln, log, nil)
	require.ErrorContains(t, err, "at least 8 characters")
}

package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

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
		require.True(t, strings.Contains(string(page), "actions enabled"), "loopback listener: actions on")
	}
}

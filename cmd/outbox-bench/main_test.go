package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every phase briefly and checks that the output is
// complete. It asserts nothing about speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole benchmark briefly")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-duration", "300ms", "-events", "600", "-backlog", "1000", "-rate", "200", "-partitions", "3"}, &out, &errs)
	require.NoError(t, err, errs.String())
	for _, want := range []string{"raw franz-go produce", "outbox relay (backlog)", "naive relay", "polling relay",
		"outbox consumer", "bare one-document", "latency commit", "memory, backlog of 1000", "target"} {
		require.Contains(t, out.String(), want)
	}
}

func TestJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs part of the benchmark")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-json", "-events", "300", "-partitions", "2", "-phases", "raw,relay"}, &out, &errs)
	require.NoError(t, err, errs.String())
	var r results
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	require.NotNil(t, r.Raw)
	require.NotNil(t, r.Relay)
	require.Equal(t, 300, r.Relay.Events)
	require.Nil(t, r.Consume)
	require.NotEmpty(t, r.Targets)
}

func TestBadFlags(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"-phases", "relay,nope"}, &out, &errs)
	require.ErrorContains(t, err, `unknown phase "nope"`)
	err = run(context.Background(), []string{"-partitions", "0"}, &out, &errs)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "must be positive"))
}

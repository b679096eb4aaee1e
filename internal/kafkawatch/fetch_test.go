package kafkawatch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/internal/consume"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestJudgeFetch(t *testing.T) {
	tp := consume.TopicPartition{Topic: "orders", Partition: 3}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	quiet := now.Add(-20 * time.Second)
	for _, tc := range []struct {
		name    string
		pr      fetchProbe
		st      fetchState
		wait    string // a part of the wait's detail; "" for no wait
		restart bool
		clean   bool
	}{
		{name: "records the client does not fetch: restart", pr: fetchProbe{first: 10, lso: 20, hwm: 20},
			wait: "the broker has records from offset 10; this replica's Kafka client fetched none for 20s; fetching restarted 1 times", restart: true},
		{name: "restarted a moment ago: wait, no second restart", pr: fetchProbe{first: 10, lso: 20, hwm: 20},
			st:   fetchState{restarts: 1, lastRestartAt: now.Add(-time.Second)},
			wait: "fetching restarted 1 times"},
		{name: "restarted long ago: restart again", pr: fetchProbe{first: 10, lso: 20, hwm: 20},
			st:   fetchState{restarts: 1, lastRestartAt: now.Add(-fetchRestartEvery)},
			wait: "fetching restarted 2 times", restart: true},
		{name: "records past a marker", pr: fetchProbe{first: 11, lso: 20, hwm: 20},
			wait: "records from offset 11", restart: true},
		{name: "an open transaction holds the partition", pr: fetchProbe{first: -1, lso: 10, hwm: 15},
			wait: "an open Kafka transaction: committed records end at offset 10, the high watermark is 15"},
		{name: "markers only: nothing to fetch", pr: fetchProbe{first: -1, lso: 12, hwm: 12}, clean: true},
		{name: "the leader cannot be asked", pr: fetchProbe{err: errors.New("broker down"), first: -1, lso: -1, hwm: -1},
			wait: "asking the partition's leader failed: broker down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			v := judgeFetch(tp, 10, quiet, tc.pr, &st, fetchRestartEvery, now)
			require.Equal(t, tc.restart, v.restart)
			require.Equal(t, tc.clean, v.clean)
			if tc.wait == "" {
				require.Nil(t, v.wait)
				return
			}
			require.NotNil(t, v.wait)
			require.Equal(t, "fetch", v.wait.What)
			require.Equal(t, int64(10), v.wait.Offset)
			require.Equal(t, quiet, v.wait.Since)
			require.True(t, strings.Contains(v.wait.Detail, tc.wait), v.wait.Detail)
		})
	}
}

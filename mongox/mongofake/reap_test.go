package mongofake

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// The reaper must not wait for a session a command holds: the command may
// be waiting for the state lock the reaper holds (found by outbox-bench as
// a server-wide deadlock).
func TestReapSkipsSessionInUse(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	d := srv.data
	busy := d.session(bson.D{{Key: "id", Value: "busy"}})
	idle := d.session(bson.D{{Key: "id", Value: "idle"}})
	busy.mu.Lock() // a command in progress
	done := make(chan struct{})
	go func() {
		d.reap(time.Now().Add(2 * sessionIdleTimeout))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reap waited for a session in use")
	}
	busy.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Contains(t, d.sessions, busy.key)
	require.NotContains(t, d.sessions, idle.key)
}

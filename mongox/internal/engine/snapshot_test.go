package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestSnapshotKeepsHistory: a pinned snapshot reads the state at its
// timestamp after later writes; once it is closed and a write prunes the
// history, the timestamp is refused with SnapshotTooOld instead of
// answering with newer data.
func TestSnapshotKeepsHistory(t *testing.T) {
	e := setup(t)
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "x", Value: 1}}))
	snap, ts, err := e.OpenSnapshot(bson.Timestamp{})
	require.NoError(t, err)
	require.NoError(t, set(t, e, nil, 1, "x", 2))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 2}}))

	var got []bson.D
	require.NoError(t, snap.Read(context.Background(), func(v *View) error {
		var err error
		got, err = v.Find(ns, Query{})
		return err
	}))
	require.Equal(t, []bson.D{{{Key: "_id", Value: 1}, {Key: "x", Value: 1}}}, got)

	again, _, err := e.OpenSnapshot(ts)
	require.NoError(t, err, "a second reader at the same time is fine while history is kept")
	again.Close()
	snap.Close()
	require.NoError(t, set(t, e, nil, 1, "x", 3)) // prunes: nothing pins ts any more
	_, _, err = e.OpenSnapshot(ts)
	ee, ok := AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, CodeSnapshotTooOld, int(ee.Code))

	_, _, err = e.OpenSnapshot(bson.Timestamp{T: ts.T + 1000})
	require.Error(t, err, "a future timestamp is refused")
}

// TestHistoryWindow: without any snapshot open, a timestamp within the
// history window is still readable after later writes (mongod's
// minSnapshotHistoryWindowInSeconds); once the window has passed and a
// write pruned the history, it is refused with SnapshotTooOld.
func TestHistoryWindow(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	e := setup(t, func(o *Options) { o.Now = clock; o.HistoryWindow = 10 * time.Second })
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "x", Value: 1}}))
	ts := e.ClusterTime()
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	require.NoError(t, set(t, e, nil, 1, "x", 2))
	require.NoError(t, set(t, e, nil, 1, "x", 3))

	snap, _, err := e.OpenSnapshot(ts)
	require.NoError(t, err, "a moment ago is within the window")
	var got []bson.D
	require.NoError(t, snap.Read(context.Background(), func(v *View) error {
		var err error
		got, err = v.Find(ns, Query{})
		return err
	}))
	snap.Close()
	require.Equal(t, []bson.D{{{Key: "_id", Value: 1}, {Key: "x", Value: 1}}}, got, "the read sees the state at its timestamp")

	mu.Lock()
	now = now.Add(20 * time.Second)
	mu.Unlock()
	require.NoError(t, set(t, e, nil, 1, "x", 4)) // prunes what the window no longer keeps
	_, _, err = e.OpenSnapshot(ts)
	ee, ok := AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, CodeSnapshotTooOld, int(ee.Code), "beyond the window the read is refused")
}

package engine

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// SnapshotWindow is how long a pinned read snapshot keeps the history it
// needs, as mongod's minSnapshotHistoryWindowInSeconds (300 s) does.
const SnapshotWindow = 5 * time.Minute

// CodeSnapshotTooOld is returned for a read at a timestamp whose history is
// gone.
const CodeSnapshotTooOld = 239

// Snapshot is a pinned point-in-time read view: reads through it see the
// committed state at its timestamp, and the versions they need are kept
// until Close or until SnapshotWindow has passed since it was opened.
type Snapshot struct {
	t *Txn
}

// OpenSnapshot pins a read snapshot at ts, or at the latest committed state
// when ts is zero, and returns it with its timestamp. A timestamp older
// than the retained history fails with 239 SnapshotTooOld, one newer than
// the cluster time with 72 InvalidOptions.
func (e *Engine) OpenSnapshot(ts bson.Timestamp) (*Snapshot, bson.Timestamp, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case ts.IsZero():
		ts = e.last
	case bsonkit.CompareTimestamps(ts, e.last) > 0:
		return nil, ts, &Error{Code: CodeInvalidOptions, CodeName: "InvalidOptions",
			Msg: fmt.Sprintf("readConcern atClusterTime value %v is greater than the current cluster time %v", ts, e.last)}
	case bsonkit.CompareTimestamps(ts, e.historyFloor) < 0:
		return nil, ts, errSnapshotTooOld(ts)
	}
	t := e.newTxnLocked(false)
	t.pin = true
	t.snapshot, t.hasSnap = ts, true
	return &Snapshot{t: t}, ts, nil
}

func errSnapshotTooOld(ts bson.Timestamp) error {
	return &Error{Code: CodeSnapshotTooOld, CodeName: "SnapshotTooOld",
		Msg: fmt.Sprintf("Read timestamp %v is older than the oldest available timestamp", ts)}
}

// Timestamp returns the snapshot's timestamp.
func (s *Snapshot) Timestamp() bson.Timestamp { return s.t.snapshot }

// Read runs fn with a read-only view of the snapshot. After the snapshot
// expired it fails with 239 SnapshotTooOld.
func (s *Snapshot) Read(ctx context.Context, fn func(v *View) error) error {
	return s.t.e.Read(ctx, s.t, fn)
}

// Txn returns the read-only transaction behind the snapshot, for callers
// that read through Engine.Read; writing through it is a programming error.
func (s *Snapshot) Txn() *Txn { return s.t }

// Close releases the snapshot's history. Closing twice does nothing.
func (s *Snapshot) Close() {
	s.t.Abort()
}

// lifetime is how long a transaction may stay open.
func (e *Engine) lifetime(t *Txn) time.Duration {
	if t.pin {
		return SnapshotWindow
	}
	return t.lifetime
}

// advanceFloorLocked records that versions older than a prune's bound are
// gone: reads below the floor are refused.
func (e *Engine) advanceFloorLocked(minTS bson.Timestamp, bounded bool) {
	if !bounded {
		minTS = e.last
	}
	if bsonkit.CompareTimestamps(minTS, e.historyFloor) > 0 {
		e.historyFloor = minTS
	}
}

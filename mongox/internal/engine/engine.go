// Package engine is the storage core of the embedded MongoDB server: the
// catalog of databases, collections and indexes, versioned documents for
// snapshot reads and write-conflict detection, transactions, the bounded
// oplog that feeds change streams, the TTL monitor, and the one logical
// clock every timestamp comes from. Only the engine holds locks; the
// packages it uses (bsonkit, query) are pure.
//
// # Model
//
// One mutex guards all state. Every document key (the bsonkit.Key of its
// _id) has a version chain: committed versions with their commit timestamps
// (a deleted document is a tombstone version). A reader at snapshot ts sees
// the newest version whose timestamp is ≤ ts. Versions no open snapshot can
// see are pruned.
//
// All data access goes through a View, obtained with Engine.Read or
// Engine.Write. A View belongs either to a transaction (Txn: snapshot taken
// at its first operation, writes buffered until Commit) or to one
// auto-committed statement (snapshot = latest, committed when the callback
// returns nil).
//
// # Conflicts
//
// A transaction writing a document (or a unique index key) that another
// open transaction has written, or that was committed after its snapshot,
// gets a WriteConflict error and is aborted (first writer wins). An
// auto-committed statement that meets a document held by an open
// transaction waits until that transaction ends and then runs again from
// the start (the Write callback may therefore run more than once), bounded
// by its context (maxTimeMS).
//
// # Ownership of documents
//
// Documents passed to Insert and Update become the engine's and must not be
// modified afterwards; documents returned by the engine are shared and must
// not be modified either (copy them first).
package engine

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Options configure an Engine. Zero values take the documented defaults.
type Options struct {
	// OplogSize bounds the number of oplog entries kept for change streams.
	// Defaults to 100000.
	OplogSize int
	// TTLInterval is how often the TTL monitor runs. Defaults to 60 s, as in mongod.
	TTLInterval time.Duration
	// TransactionLifetime is how long a transaction may stay open before it
	// is aborted. Defaults to 60 s, as mongod's transactionLifetimeLimitSeconds.
	TransactionLifetime time.Duration
	// HistoryWindow is how long committed versions stay readable by a
	// snapshot read at a past timestamp (readConcern atClusterTime), as
	// mongod's minSnapshotHistoryWindowInSeconds: reads older than the
	// retained history fail with 239 SnapshotTooOld. Zero or negative keeps
	// only what open snapshots need. Defaults to DefaultHistoryWindow.
	HistoryWindow time.Duration
	// Now returns the wall clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives background events (TTL passes, expired transactions).
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// NS is a namespace: a database and a collection name.
type NS struct {
	DB   string
	Coll string
}

// String returns "db.coll".
func (n NS) String() string { return n.DB + "." + n.Coll }

// Engine is the storage core. It is safe for concurrent use.
type Engine struct {
	opts Options

	mu      sync.Mutex
	dbs     map[string]*database
	last    bson.Timestamp // newest timestamp issued
	nextRID uint64
	txns    map[*Txn]struct{} // open transactions
	nextTxn uint64
	dirty   map[*chain]struct{} // chains holding prunable history
	// oldest open snapshot at the last full prune sweep
	pruneMin bson.Timestamp
	// historyFloor is the oldest timestamp whose versions are all still
	// kept: snapshot reads below it are refused.
	historyFloor bson.Timestamp
	pruneBounded bool
	oplog        oplog
	// gone records when namespaces lost their collection (drop, rename
	// away), for the transactions whose snapshot is older; see goneLocked.
	gone map[NS]bson.Timestamp

	// wake tells the monitor that its intervals changed.
	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// DefaultHistoryWindow is the default Options.HistoryWindow. mongod keeps
// 300 s; the embedded server keeps less so that write-heavy tests do not
// hold minutes of document versions in memory, and refuses older reads
// with SnapshotTooOld as mongod does beyond its window.
const DefaultHistoryWindow = 10 * time.Second

// TTLInterval returns how often the TTL monitor runs.
func (e *Engine) TTLInterval() time.Duration { return e.setting(&e.opts.TTLInterval) }

// SetTTLInterval changes how often the TTL monitor runs (mongod's
// ttlMonitorSleepSecs); the next pass is due one new interval from now.
// d must be positive.
func (e *Engine) SetTTLInterval(d time.Duration) { e.set(&e.opts.TTLInterval, d) }

// TransactionLifetime returns the lifetime of new transactions.
func (e *Engine) TransactionLifetime() time.Duration { return e.setting(&e.opts.TransactionLifetime) }

// SetTransactionLifetime changes the lifetime of the transactions started
// from now on (mongod's transactionLifetimeLimitSeconds: a transaction's
// expiry is fixed when it starts). d must be positive.
func (e *Engine) SetTransactionLifetime(d time.Duration) { e.set(&e.opts.TransactionLifetime, d) }

// HistoryWindow returns how long committed versions stay readable.
func (e *Engine) HistoryWindow() time.Duration { return e.setting(&e.opts.HistoryWindow) }

// SetHistoryWindow changes how long committed versions stay readable by
// snapshot reads at a past timestamp (mongod's
// minSnapshotHistoryWindowInSeconds). Lengthening it cannot bring back
// versions already pruned.
func (e *Engine) SetHistoryWindow(d time.Duration) { e.set(&e.opts.HistoryWindow, d) }

// setting reads one of e.opts' run-time settings.
func (e *Engine) setting(p *time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return *p
}

// set changes one of e.opts' run-time settings and wakes the monitor to
// re-arm its timers.
func (e *Engine) set(p *time.Duration, d time.Duration) {
	e.mu.Lock()
	*p = d
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// New starts an engine (and its TTL monitor). Close stops it.
func New(opts Options) *Engine {
	if opts.OplogSize <= 0 {
		opts.OplogSize = 100000
	}
	if opts.TTLInterval <= 0 {
		opts.TTLInterval = 60 * time.Second
	}
	if opts.TransactionLifetime <= 0 {
		opts.TransactionLifetime = 60 * time.Second
	}
	if opts.HistoryWindow == 0 {
		opts.HistoryWindow = DefaultHistoryWindow
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e := &Engine{
		opts:  opts,
		wake:  make(chan struct{}, 1),
		dbs:   map[string]*database{},
		txns:  map[*Txn]struct{}{},
		dirty: map[*chain]struct{}{},
		stop:  make(chan struct{}),
	}
	e.oplog.init(opts.OplogSize)
	e.oplog.initiated = opts.Now()
	e.wg.Add(1)
	go e.monitor()
	return e
}

// Close stops the engine's background goroutines and waits for them. Open
// transactions are aborted.
func (e *Engine) Close() {
	select {
	case <-e.stop:
		return
	default:
	}
	close(e.stop)
	e.wg.Wait()
	e.mu.Lock()
	for t := range e.txns {
		e.abortLocked(t, "engine closed")
	}
	e.mu.Unlock()
}

// ClusterTime returns the newest timestamp the logical clock has issued.
func (e *Engine) ClusterTime() bson.Timestamp {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

// Now returns the engine's wall clock.
func (e *Engine) Now() time.Time { return e.opts.Now() }

// tick issues the next timestamp: seconds of the wall clock, and a counter
// within the second. Strictly increasing. Caller holds e.mu.
func (e *Engine) tick() bson.Timestamp {
	s := uint32(e.opts.Now().Unix())
	if s > e.last.T {
		e.last = bson.Timestamp{T: s, I: 1}
	} else {
		e.last.I++
		if e.last.I == 0 { // counter overflow: borrow the next second
			e.last.T++
			e.last.I = 1
		}
	}
	return e.last
}

// monitor runs the TTL passes and aborts expired transactions. It is
// started by New and stops when Close closes e.stop; a change of interval
// (poke) re-arms its timers at once.
func (e *Engine) monitor() {
	defer e.wg.Done()
	ttl := time.NewTimer(e.TTLInterval())
	defer ttl.Stop()
	reap := time.NewTimer(e.reapEvery())
	defer reap.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-e.wake:
			ttl.Reset(e.TTLInterval())
			reap.Reset(e.reapEvery())
		case <-ttl.C:
			n := e.RunTTL()
			if n > 0 {
				e.opts.Logger.Debug("ttl pass", "deleted", n)
			}
			ttl.Reset(e.TTLInterval())
		case <-reap.C:
			e.reapExpired()
			reap.Reset(e.reapEvery())
		}
	}
}

// reapEvery is how often expired transactions are looked for: a quarter of
// the shortest lifetime, within [10 ms, 1 s].
func (e *Engine) reapEvery() time.Duration {
	e.mu.Lock()
	shortest := e.opts.TransactionLifetime
	for t := range e.txns {
		if !t.auto && !t.pin && t.lifetime < shortest {
			shortest = t.lifetime
		}
	}
	e.mu.Unlock()
	return max(min(shortest/4, time.Second), 10*time.Millisecond)
}

// reapExpired aborts transactions older than the transaction lifetime.
func (e *Engine) reapExpired() {
	now := e.opts.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for t := range e.txns {
		if now.Sub(t.started) > e.lifetime(t) {
			e.opts.Logger.Info("aborting expired transaction", "txn", t.id)
			e.abortLocked(t, "transaction exceeded its lifetime")
		}
	}
}

// waitCtx waits for ch to close or ctx to end; it maps a deadline to
// MaxTimeMSExpired.
func waitCtx(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		if ctx.Err() == context.DeadlineExceeded {
			return errMaxTime()
		}
		return &Error{Code: 11601, CodeName: "Interrupted", Msg: "operation was interrupted: " + ctx.Err().Error()}
	}
}

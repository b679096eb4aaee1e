// Package engine is the storage core of the embedded MongoDB server: the
// catalog of databases, collections and indexes, versioned documents for
// snapshot reads and write-conflict detection, transactions, the bounded
// oplog that feeds change streams, the TTL monitor, and the one logical
// clock every timestamp comes from. Only the engine holds locks; the
// packages it uses (bsonkit, query, update) are pure.
package engine

import (
	"log/slog"
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
	// Now returns the wall clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives background events (TTL passes, expired transactions).
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// Engine is the storage core. It is safe for concurrent use.
type Engine struct {
	opts Options
	// TODO(engine helper): catalog, versions, oplog, clock, TTL monitor.
}

// New starts an engine (and its TTL monitor). Close stops it.
func New(opts Options) *Engine {
	return &Engine{opts: opts}
}

// Close stops the engine's background goroutines and waits for them.
func (e *Engine) Close() {}

// ClusterTime returns the newest timestamp the logical clock has issued.
func (e *Engine) ClusterTime() bson.Timestamp { return bson.Timestamp{} }

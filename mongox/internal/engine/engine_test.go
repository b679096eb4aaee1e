package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ns = NS{DB: "db", Coll: "c"}

// setup starts an engine; unless opts say otherwise it keeps no history
// window, so that versions go as soon as no snapshot needs them.
func setup(t testing.TB, opts ...func(*Options)) *Engine {
	t.Helper()
	o := Options{HistoryWindow: -1}
	for _, f := range opts {
		f(&o)
	}
	e := New(o)
	t.Cleanup(e.Close)
	return e
}

func insert(t testing.TB, e *Engine, txn *Txn, doc bson.D) error {
	t.Helper()
	return e.Write(context.Background(), txn, func(v *View) error { return v.Insert(ns, doc) })
}

func all(t testing.TB, e *Engine, txn *Txn) []bson.D {
	t.Helper()
	var out []bson.D
	require.NoError(t, e.Read(context.Background(), txn, func(v *View) error {
		var err error
		out, err = v.Find(ns, Query{})
		return err
	}))
	return out
}

func ids(docs []bson.D) []any {
	out := []any{}
	for _, d := range docs {
		id, _ := bsonkit.Get(d, "_id")
		out = append(out, id)
	}
	return out
}

func set(t testing.TB, e *Engine, txn *Txn, id any, field string, val any) error {
	t.Helper()
	return e.Write(context.Background(), txn, func(v *View) error {
		d := v.FindID(ns, id)
		if d == nil {
			return fmt.Errorf("no doc %v", id)
		}
		nd := bsonkit.Set(bsonkit.CopyDoc(d), field, val)
		return v.Update(ns, nd, &UpdateDescription{UpdatedFields: bson.D{{Key: field, Value: val}}})
	})
}

func code(err error) int32 {
	if e, ok := AsError(err); ok {
		return e.Code
	}
	return -1
}

func TestClockStrictlyIncreasing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	prev := e.ClusterTime()
	for i := range 100 {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: i}}))
		ct := e.ClusterTime()
		require.Equal(t, 1, bsonkit.CompareTimestamps(ct, prev))
		prev = ct
	}
}

func TestNaturalOrderAndSnapshotIsolation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 3 {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: int32(i)}, {Key: "v", Value: int32(0)}}))
	}
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	require.Equal(t, []any{int32(0), int32(1), int32(2)}, ids(all(t, e, txn))) // snapshot taken here
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: int32(3)}}))
	require.NoError(t, set(t, e, nil, int32(1), "v", int32(9)))
	// The transaction still sees its snapshot.
	docs := all(t, e, txn)
	require.Equal(t, []any{int32(0), int32(1), int32(2)}, ids(docs))
	v, _ := bsonkit.Get(docs[1], "v")
	require.Equal(t, int32(0), v)
	// Own writes are visible to the transaction, not to others.
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: int32(10)}}))
	require.Equal(t, []any{int32(0), int32(1), int32(2), int32(10)}, ids(all(t, e, txn)))
	require.Equal(t, []any{int32(0), int32(1), int32(2), int32(3)}, ids(all(t, e, nil)))
	require.NoError(t, txn.Commit())
	require.Equal(t, []any{int32(0), int32(1), int32(2), int32(3), int32(10)}, ids(all(t, e, nil)))
	require.NoError(t, txn.Commit(), "commit is idempotent")
}

func TestDeleteAndReinsertGoesLast(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 3 {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: int32(i)}}))
	}
	require.NoError(t, e.Write(context.Background(), nil, func(v *View) error {
		_, err := v.Delete(ns, int32(0))
		return err
	}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: int32(0)}}))
	require.Equal(t, []any{int32(1), int32(2), int32(0)}, ids(all(t, e, nil)))
}

func TestWriteConflictFirstWriterWins(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: 0}}))
	a := e.Begin(TxnMeta{TxnNumber: 1})
	b := e.Begin(TxnMeta{TxnNumber: 2})
	require.NoError(t, set(t, e, a, 1, "v", 1))
	err := set(t, e, b, 1, "v", 2)
	require.Equal(t, int32(CodeWriteConflict), code(err))
	ee, _ := AsError(err)
	require.Contains(t, ee.Labels, LabelTransient)
	require.Equal(t, TxnAborted, b.State())
	err = b.Commit()
	require.Equal(t, int32(CodeNoSuchTransaction), code(err))
	require.Equal(t, "Transaction with { txnNumber: 2 } has been aborted. Reason: WriteConflict: Write conflict during plan execution and yielding is disabled. :: Please retry your operation or multi-document transaction.",
		err.(*Error).Msg, "the abort reason names the error that aborted the transaction")
	require.NoError(t, a.Commit())

	// Committed after my snapshot -> conflict.
	c := e.Begin(TxnMeta{TxnNumber: 3})
	_ = all(t, e, c)
	require.NoError(t, set(t, e, nil, 1, "v", 5))
	require.Equal(t, int32(CodeWriteConflict), code(set(t, e, c, 1, "v", 6)))
}

func TestNonTxnWriteBlocksUntilCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: int32(0)}}))
	a := e.Begin(TxnMeta{TxnNumber: 1})
	require.NoError(t, set(t, e, a, 1, "v", int32(1)))

	// Reads do not block and see the committed state.
	v, _ := bsonkit.Get(all(t, e, nil)[0], "v")
	require.Equal(t, int32(0), v)

	// Bounded by the context: MaxTimeMSExpired.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := e.Write(ctx, nil, func(v *View) error { _, err := v.Delete(ns, 1); return err })
	cancel()
	require.Equal(t, int32(CodeMaxTimeMSExpired), code(err))

	done := make(chan error, 1)
	go func() {
		done <- e.Write(context.Background(), nil, func(v *View) error {
			d := v.FindID(ns, 1)
			x, _ := bsonkit.Get(d, "v")
			return v.Update(ns, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: x.(int32) + 10}}, nil)
		})
	}()
	select {
	case <-done:
		t.Fatal("write did not block")
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, a.Commit())
	require.NoError(t, <-done)
	v, _ = bsonkit.Get(all(t, e, nil)[0], "v")
	require.Equal(t, int32(11), v, "the blocked write ran on the committed state")
}

func TestUniqueIndex(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	created, before, after, err := e.CreateIndexes(ctx, ns, []IndexSpec{{Key: bson.D{{Key: "a", Value: int32(1)}}, Unique: true}})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 1, before)
	require.Equal(t, 2, after)
	_, _, after, err = e.CreateIndexes(ctx, ns, []IndexSpec{{Key: bson.D{{Key: "a", Value: int32(1)}}, Unique: true}})
	require.NoError(t, err)
	require.Equal(t, 2, after)
	_, _, _, err = e.CreateIndexes(ctx, ns, []IndexSpec{{Name: "a_1", Key: bson.D{{Key: "b", Value: int32(1)}}}})
	require.Equal(t, int32(CodeIndexKeySpecsConflict), code(err))
	_, _, _, err = e.CreateIndexes(ctx, ns, []IndexSpec{{Name: "other", Key: bson.D{{Key: "a", Value: int32(1)}}}})
	require.Equal(t, int32(CodeIndexOptionsConflict), code(err))

	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: int32(1)}}))
	err = insert(t, e, nil, bson.D{{Key: "_id", Value: 2}, {Key: "a", Value: 1.0}})
	require.Equal(t, int32(CodeDuplicateKey), code(err))
	require.Contains(t, err.Error(), "E11000 duplicate key error collection: db.c index: a_1 dup key: { a: 1.0 }")
	ee, _ := AsError(err)
	require.Equal(t, bson.D{{Key: "keyPattern", Value: bson.D{{Key: "a", Value: int32(1)}}}, {Key: "keyValue", Value: bson.D{{Key: "a", Value: 1.0}}}}, ee.Extra)
	err = insert(t, e, nil, bson.D{{Key: "_id", Value: 1}})
	require.Contains(t, err.Error(), "index: _id_ dup key: { _id: 1 }")

	// Two open transactions inserting the same unique key: second conflicts.
	a := e.Begin(TxnMeta{TxnNumber: 1})
	b := e.Begin(TxnMeta{TxnNumber: 2})
	require.NoError(t, insert(t, e, a, bson.D{{Key: "_id", Value: 10}, {Key: "a", Value: int32(5)}}))
	require.Equal(t, int32(CodeWriteConflict), code(insert(t, e, b, bson.D{{Key: "_id", Value: 11}, {Key: "a", Value: int32(5)}})))
	// Own duplicate inside a transaction: DuplicateKey, and the transaction aborts.
	require.Equal(t, int32(CodeDuplicateKey), code(insert(t, e, a, bson.D{{Key: "_id", Value: 12}, {Key: "a", Value: int32(5)}})))
	require.Equal(t, TxnAborted, a.State())
	// After the abort the key is free again.
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 13}, {Key: "a", Value: int32(5)}}))

	// Lookup through the unique index.
	require.NoError(t, e.Read(ctx, nil, func(v *View) error {
		docs, err := v.Find(ns, Query{Filter: bson.D{{Key: "a", Value: int32(5)}}, Match: func(d bson.D) bool {
			x, _ := bsonkit.Get(d, "a")
			return bsonkit.Equal(x, int32(5))
		}})
		require.Equal(t, []any{13}, ids(docs))
		return err
	}))

	// Index build over duplicates fails.
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 20}, {Key: "a", Value: 20}, {Key: "b", Value: "x"}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 21}, {Key: "a", Value: 21}, {Key: "b", Value: "x"}}))
	_, _, _, err = e.CreateIndexes(ctx, ns, []IndexSpec{{Key: bson.D{{Key: "b", Value: int32(1)}}, Unique: true}})
	require.Equal(t, int32(CodeDuplicateKey), code(err))
}

func TestPartialUniqueIndex(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, _, _, err := e.CreateIndexes(context.Background(), ns, []IndexSpec{{
		Key: bson.D{{Key: "k", Value: int32(1)}}, Unique: true,
		PartialFilter: bson.D{{Key: "live", Value: true}},
	}})
	require.NoError(t, err)
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "k", Value: "x"}, {Key: "live", Value: false}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 2}, {Key: "k", Value: "x"}, {Key: "live", Value: true}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 3}, {Key: "k", Value: "x"}, {Key: "live", Value: false}}))
	require.Equal(t, int32(CodeDuplicateKey), code(insert(t, e, nil, bson.D{{Key: "_id", Value: 4}, {Key: "k", Value: "x"}, {Key: "live", Value: true}})))
	require.Equal(t, int32(CodeDuplicateKey), code(set(t, e, nil, 1, "live", true)))
}

func TestTTL(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	e := setup(t, func(o *Options) {
		o.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	ttl := int64(60)
	_, _, _, err := e.CreateIndexes(context.Background(), ns, []IndexSpec{{
		Key: bson.D{{Key: "at", Value: int32(1)}}, ExpireAfterSeconds: &ttl,
		PartialFilter: bson.D{{Key: "done", Value: true}},
	}})
	require.NoError(t, err)
	old := bson.NewDateTimeFromTime(now.Add(-2 * time.Minute))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "at", Value: old}, {Key: "done", Value: true}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 2}, {Key: "at", Value: old}, {Key: "done", Value: false}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 3}, {Key: "at", Value: bson.NewDateTimeFromTime(now)}, {Key: "done", Value: true}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 4}, {Key: "at", Value: bson.A{bson.NewDateTimeFromTime(now), old}}, {Key: "done", Value: true}}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 5}, {Key: "at", Value: "not a date"}, {Key: "done", Value: true}}))
	pos := Position{TS: e.ClusterTime(), Index: 1 << 30}
	require.Equal(t, 2, e.RunTTL())
	require.Equal(t, []any{2, 3, 5}, ids(all(t, e, nil)))
	entries, _, _, err := e.ReadOplog(pos, 0)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, OpDelete, entries[0].Op)

	// collMod shortens the TTL.
	prev, err := e.SetIndexTTL(context.Background(), ns, "at_1", nil, 0)
	require.NoError(t, err)
	require.NotNil(t, prev)
	require.Equal(t, int64(60), *prev)
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	require.Equal(t, 1, e.RunTTL())
	require.Equal(t, []any{2, 5}, ids(all(t, e, nil)))
}

func TestOplogTransactionAndBound(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.OplogSize = 5 })
	require.NoError(t, e.CreateCollection(context.Background(), ns))
	entries, _, _, err := e.ReadOplog(e.OplogStart(), 0)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, OpCreate, entries[0].Op, "an explicit create is in the oplog")
	start := Position{TS: entries[0].TS, Index: 0}
	txn := e.Begin(TxnMeta{LSID: bson.D{{Key: "id", Value: "s"}}, TxnNumber: 7})
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: 2}}))
	entries, signal, _, err := e.ReadOplog(start, 0)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing before commit")
	require.NoError(t, txn.Commit())
	<-signal
	entries, _, _, err = e.ReadOplog(start, 0)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, entries[0].TS, entries[1].TS)
	require.Equal(t, int32(0), entries[0].TxnOpIndex)
	require.Equal(t, int32(1), entries[1].TxnOpIndex)
	require.Equal(t, int64(7), *entries[1].TxnNumber)
	require.Equal(t, txn.CommitTimestamp(), entries[0].TS)
	for i := range 10 {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 100 + i}}))
	}
	_, _, _, err = e.ReadOplog(start, 0)
	require.ErrorIs(t, err, ErrHistoryLost)
	entries, _, _, err = e.ReadOplog(e.OplogStart(), 0)
	require.NoError(t, err)
	require.Len(t, entries, 5)
}

// TestOplogBoundAcrossChunks: the bounded oplog keeps exactly its newest
// entries, in order, while entries arrive one by one and in transactions
// that straddle its storage chunks, and readers resume anywhere in it.
func TestOplogBoundAcrossChunks(t *testing.T) {
	t.Parallel()
	const bound = 3*oplogChunk + 17
	e := setup(t, func(o *Options) { o.OplogSize = bound })
	require.NoError(t, e.CreateCollection(context.Background(), ns))
	next := 0
	for round := range 120 {
		if round%3 == 0 {
			txn := e.Begin(TxnMeta{LSID: bson.D{{Key: "id", Value: "s"}}, TxnNumber: int64(round)})
			for range 37 {
				require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: next}}))
				next++
			}
			require.NoError(t, txn.Commit())
		} else {
			for range 29 {
				require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: next}}))
				next++
			}
		}
		entries, _, _, err := e.ReadOplog(e.OplogStart(), 0)
		require.NoError(t, err)
		want := min(next+1, bound) // +1: the create entry
		require.Len(t, entries, want)
		for i, en := range entries {
			id := next - want + i
			if id < 0 {
				require.Equal(t, OpCreate, en.Op)
				continue
			}
			require.Equal(t, bson.D{{Key: "_id", Value: id}}, en.DocKey, "round %d entry %d", round, i)
		}
		// Resume from the middle: everything after that entry, then a capped read.
		mid := entries[len(entries)/2]
		after, _, _, err := e.ReadOplog(Position{TS: mid.TS, Index: int64(mid.TxnOpIndex)}, 0)
		require.NoError(t, err)
		require.Equal(t, entries[len(entries)/2+1:], after)
		capped, _, _, err := e.ReadOplog(e.OplogStart(), 5)
		require.NoError(t, err)
		require.Equal(t, entries[:5], capped)
	}
	require.Greater(t, next, 4*bound, "the bound was passed many times")
	_, _, _, err := e.ReadOplog(Position{}, 0)
	require.ErrorIs(t, err, ErrHistoryLost)
}

func TestEmptyTimestampFilledBeforeCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := e.ClusterTime()
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: 1}, {Key: "ts", Value: bson.Timestamp{}}}))
	require.NoError(t, txn.Commit())
	d := all(t, e, nil)[0]
	ts := d[1].Value.(bson.Timestamp)
	require.Equal(t, 1, bsonkit.CompareTimestamps(ts, before))
	require.Equal(t, -1, bsonkit.CompareTimestamps(ts, txn.CommitTimestamp()))
}

func TestTransactionLifetime(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.TransactionLifetime = 20 * time.Millisecond })
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}}))
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	require.NoError(t, set(t, e, txn, 1, "v", 1))
	// The reaper aborts it, which releases the document.
	require.NoError(t, set(t, e, nil, 1, "v", 2))
	require.Equal(t, TxnAborted, txn.State())
	require.Equal(t, int32(CodeNoSuchTransaction), code(set(t, e, txn, 1, "v", 3)))
}

func TestDropCollectionAndDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}}))
	require.Equal(t, int32(CodeNamespaceExists), code(e.CreateCollection(ctx, ns)))
	ok, err := e.DropCollection(ctx, ns)
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, all(t, e, nil))
	require.Empty(t, e.ListDatabases())
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, e.RenameCollection(ctx, ns, NS{DB: "db", Coll: "d"}, false))
	require.Equal(t, []CollectionInfo{{Name: "d"}}, func() []CollectionInfo {
		l := e.ListCollections("db")
		l[0].UUID = bson.Binary{}
		return l
	}())
	ok, err = e.DropDatabase(ctx, "db")
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, e.ListDatabases())
}

func TestVersionsArePruned(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: 0}}))
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	_ = all(t, e, txn)
	for i := range 10 {
		require.NoError(t, set(t, e, nil, 1, "v", i))
	}
	e.mu.Lock()
	require.Len(t, e.collLocked(ns).chains[bsonkit.Key(1)].versions, 11)
	e.mu.Unlock()
	txn.Abort()
	e.mu.Lock()
	require.Len(t, e.collLocked(ns).chains[bsonkit.Key(1)].versions, 1)
	e.mu.Unlock()
	for i := range 200 {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: 1000 + i}}))
		require.NoError(t, e.Write(context.Background(), nil, func(v *View) error { _, err := v.Delete(ns, 1000+i); return err }))
	}
	e.mu.Lock()
	c := e.collLocked(ns)
	require.Len(t, c.chains, 1)
	require.Less(t, len(c.order), 200)
	e.mu.Unlock()
}

// TestConcurrentTransfers moves money between accounts in concurrent
// transactions with retries; the total never changes and every snapshot
// read sees a consistent total.
func TestConcurrentTransfers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const accounts, workers, rounds = 5, 8, 200
	for i := range accounts {
		require.NoError(t, insert(t, e, nil, bson.D{{Key: "_id", Value: i}, {Key: "bal", Value: int64(100)}}))
	}
	var wg sync.WaitGroup
	var conflicts atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				from, to := (w+r)%accounts, (w+2*r+1)%accounts
				if from == to {
					continue
				}
				for {
					txn := e.Begin(TxnMeta{TxnNumber: int64(r)})
					move := func(id int, delta int64) error {
						return e.Write(context.Background(), txn, func(v *View) error {
							d := v.FindID(ns, id)
							b, _ := bsonkit.Get(d, "bal")
							return v.Update(ns, bson.D{{Key: "_id", Value: id}, {Key: "bal", Value: b.(int64) + delta}}, nil)
						})
					}
					err := move(from, -1)
					if err == nil {
						err = move(to, 1)
					}
					if err == nil {
						err = txn.Commit()
					}
					if err == nil {
						break
					}
					if code(err) != CodeWriteConflict {
						t.Errorf("unexpected error: %v", err)
						return
					}
					conflicts.Add(1)
				}
				// A snapshot read sees a consistent total.
				txn := e.Begin(TxnMeta{})
				var total int64
				for _, d := range all(t, e, txn) {
					b, _ := bsonkit.Get(d, "bal")
					total += b.(int64)
				}
				txn.Abort()
				if total != accounts*100 {
					t.Errorf("inconsistent total %d", total)
					return
				}
			}
		}()
	}
	wg.Wait()
	var total int64
	for _, d := range all(t, e, nil) {
		b, _ := bsonkit.Get(d, "bal")
		total += b.(int64)
	}
	require.Equal(t, int64(accounts*100), total)
	t.Logf("conflicts: %d", conflicts.Load())
}

func BenchmarkInsert(b *testing.B) {
	e := setup(b)
	var n atomic.Int64
	b.SetParallelism(1)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if err := insert(b, e, nil, bson.D{{Key: "_id", Value: i}, {Key: "v", Value: "x"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkTxn(b *testing.B) {
	e := setup(b)
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			txn := e.Begin(TxnMeta{TxnNumber: i})
			if err := insert(b, e, txn, bson.D{{Key: "_id", Value: i}}); err != nil {
				b.Fatal(err)
			}
			if err := insert(b, e, txn, bson.D{{Key: "_id", Value: -i}}); err != nil {
				b.Fatal(err)
			}
			if err := txn.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestAbortRemovesImplicitCollection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: 1}}))
	require.Empty(t, e.ListCollections("db"), "hidden until commit")
	txn.Abort()
	require.Empty(t, e.ListCollections("db"))
	require.Empty(t, e.ListDatabases())
}

func TestCommitPublishesImplicitCollection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	txn := e.Begin(TxnMeta{TxnNumber: 1})
	require.NoError(t, insert(t, e, txn, bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, txn.Commit())
	require.Len(t, e.ListCollections("db"), 1)
}

// TestStoredIDFirst: whatever field order a caller hands the engine, the
// stored document (and the oplog's post-image) has _id first, as MongoDB
// stores every document.
func TestStoredIDFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	start := e.OplogStart()
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "parked", Value: true}, {Key: "_id", Value: 1}, {Key: "a", Value: 2}}))
	require.NoError(t, e.Write(context.Background(), nil, func(v *View) error {
		return v.Update(ns, bson.D{{Key: "b", Value: 3}, {Key: "_id", Value: 1}}, nil)
	}))
	require.NoError(t, insert(t, e, nil, bson.D{{Key: "x", Value: 1}, {Key: "_id", Value: 2}}))
	got := all(t, e, nil)
	require.Equal(t, []bson.D{
		{{Key: "_id", Value: 1}, {Key: "b", Value: 3}},
		{{Key: "_id", Value: 2}, {Key: "x", Value: 1}},
	}, got)
	entries, _, _, err := e.ReadOplog(start, 0)
	require.NoError(t, err)
	var posts []bson.D
	for _, en := range entries {
		if en.Doc != nil {
			posts = append(posts, en.Doc)
		}
	}
	require.Equal(t, []bson.D{
		{{Key: "_id", Value: 1}, {Key: "parked", Value: true}, {Key: "a", Value: 2}},
		{{Key: "_id", Value: 1}, {Key: "b", Value: 3}},
		{{Key: "_id", Value: 2}, {Key: "x", Value: 1}},
	}, posts)
}

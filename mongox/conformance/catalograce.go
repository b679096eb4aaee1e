package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Manual pages of the catalog cases.
const (
	// manualTxnCreate: collections created in a transaction (implicitly by
	// a write, or with create) join the catalog at commit; when two
	// transactions create the same collection, the second to commit fails
	// with a WriteConflict, a TransientTransactionError.
	manualTxnCreate = "https://www.mongodb.com/docs/v7.0/core/transactions/#create-collections-and-indexes-in-a-transaction"
	// manualTxnDDL: a catalog operation waits for the transactions using its
	// collection, and new transactions that would use it meanwhile abort
	// after maxTransactionLockRequestTimeoutMillis; a transaction whose
	// snapshot predates a catalog change of a collection cannot write it.
	manualTxnDDL = "https://www.mongodb.com/docs/v7.0/core/transactions-production-consideration/#pending-ddl-operations-and-transactions"
)

func catalogRaceCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"ParallelImplicitCreate", testParallelImplicitCreate},
		{"CreateInsideAndOutsideTransaction", testCreateInsideAndOutside},
		{"WriteAfterIndexBuildPastSnapshot", testWriteAfterIndexBuild},
		{"CatalogOperationWaitsForTransaction", testDDLWaitsForTxn},
		{"NoOpCreateIndexesDoesNotWait", testNoOpCreateIndexes},
	})
}

// requireCommitConflict asserts a commit failing with WriteConflict (112)
// labelled TransientTransactionError, which WithTransaction retries.
func requireCommitConflict(t *testing.T, err error, what string) {
	t.Helper()
	requireTransient(t, err, 112, what+" ("+manualTxnCreate+")")
}

func testParallelImplicitCreate(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	fresh := db.Collection("fresh")
	s1, c1 := startTxn(t, ctx, e.Client)
	s2, c2 := startTxn(t, ctx, e.Client)
	_, err := fresh.InsertOne(c1, D(`{"_id":1}`))
	require.NoError(t, err, "the first transaction creates the collection by its insert")
	_, err = fresh.InsertOne(c2, D(`{"_id":2}`))
	require.NoError(t, err, "the second cannot see the first's uncommitted collection and creates its own")
	require.NoError(t, s1.CommitTransaction(ctx))
	requireCommitConflict(t, s2.CommitTransaction(ctx), "the second transaction to commit the same new collection")
	require.Equal(t, idList(1), ids(t, ctx, fresh, bson.D{}), "only the first transaction's collection and document exist")

	// WithTransaction retries the conflict and succeeds on the committed
	// collection.
	fresh2 := db.Collection("fresh2")
	blocker, bctx := startTxn(t, ctx, e.Client)
	_, err = fresh2.InsertOne(bctx, D(`{"_id":"blocker"}`))
	require.NoError(t, err)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	attempts := 0
	_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		attempts++
		_, err := fresh2.InsertOne(sctx, bson.D{{Key: "_id", Value: attempts}})
		if attempts == 1 {
			require.NoError(t, blocker.CommitTransaction(ctx), "the other transaction commits first")
		}
		return nil, err
	})
	require.NoError(t, err, "WithTransaction retries the commit's TransientTransactionError")
	require.Equal(t, 2, attempts, "one conflicting attempt, one retry")
	n, err := fresh2.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
}

func testCreateInsideAndOutside(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := db.Collection("c")
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	_, err = coll.InsertOne(ctx, D(`{"_id":2}`))
	require.NoError(t, err, "outside the transaction the collection does not exist yet: the insert creates it")
	requireCommitConflict(t, sess.CommitTransaction(ctx), "a transaction creating a collection created meanwhile outside it")
	require.Equal(t, idList(2), ids(t, ctx, coll, bson.D{}))
}

func testWriteAfterIndexBuild(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	other := createColl(t, ctx, db, "other")
	insert(t, ctx, coll, `[{"_id":1}]`)
	insert(t, ctx, other, `[{"_id":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	requireDocs(t, `[{"_id":1}]`, find(t, sctx, other, bson.D{}), "the first read fixes the transaction's snapshot")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"x":1}`)})
	require.NoError(t, err, "the transaction has not used c: the index build does not wait for it")
	_, err = coll.InsertOne(sctx, D(`{"_id":2,"x":1}`))
	requireTransient(t, err, 246, "a transaction writing a collection indexed after its snapshot: SnapshotUnavailable ("+manualTxnDDL+")")
	requireCode(t, sess.CommitTransaction(ctx), 251, "the failed write aborted the transaction")
	require.Equal(t, idList(1), ids(t, ctx, coll, bson.D{}))

	sess2, sctx2 := startTxn(t, ctx, e.Client)
	_, err = coll.InsertOne(sctx2, D(`{"_id":3,"x":1}`))
	require.NoError(t, err, "a transaction started after the index build writes normally")
	require.NoError(t, sess2.CommitTransaction(ctx))
}

func testDDLWaitsForTxn(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	holder, hctx := startTxn(t, ctx, e.Client)
	requireDocs(t, `[{"_id":1}]`, find(t, hctx, coll, bson.D{}), "the transaction uses c")

	built := make(chan error, 1)
	go func() {
		_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"x":1}`)})
		built <- err
	}()
	// While the index build waits for the holder, a transaction that has not
	// used c yet cannot start using it.
	var lockErr error
	eventually(t, 20*time.Second, "a new transaction on c fails with LockTimeout while the index build waits", func() bool {
		s, sctx := startTxn(t, ctx, e.Client)
		defer func() { _ = s.AbortTransaction(ctx) }()
		_, err := coll.InsertOne(sctx, D(`{"_id":"probe"}`))
		var se mongo.ServerError
		if errors.As(err, &se) && se.HasErrorCode(24) {
			lockErr = err
			return true
		}
		return false
	})
	requireTransient(t, lockErr, 24, "a transaction meeting a pending catalog operation ("+manualTxnDDL+")")
	select {
	case err := <-built:
		t.Fatalf("the index build must wait for the transaction that uses the collection; it returned %v", err)
	default:
	}
	_, err := coll.InsertOne(hctx, D(`{"_id":2}`))
	require.NoError(t, err, "the transaction holding the collection goes on")
	require.NoError(t, holder.CommitTransaction(ctx))
	select {
	case err := <-built:
		require.NoError(t, err, "the index build runs once the transaction ended")
	case <-time.After(20 * time.Second):
		t.Fatal("the index build did not finish after the transaction committed")
	}
	require.Equal(t, idList(1, 2), ids(t, ctx, coll, bson.D{}))
}

// testNoOpCreateIndexes: createIndexes of indexes that all exist, or with a
// conflicting spec, answers at once while a transaction uses the
// collection; only a new index waits for it. A service creating its indexes
// at every start-up relies on this.
func testNoOpCreateIndexes(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)
	holder, hctx := startTxn(t, ctx, e.Client)
	_, err = coll.InsertOne(hctx, D(`{"_id":1,"a":1}`))
	require.NoError(t, err)

	raw, err := db.RunCommand(ctx, D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"a_1"}],"maxTimeMS":5000}`)).Raw()
	require.NoError(t, err, "an index that exists does not wait for the transaction ("+manualTxnDDL+")")
	require.Equal(t, num(raw.Lookup("numIndexesBefore")), num(raw.Lookup("numIndexesAfter")), "reply: %s", raw)
	err = db.RunCommand(ctx, D(`{"createIndexes":"c","indexes":[{"key":{"a":1},"name":"other"}],"maxTimeMS":5000}`)).Err()
	requireCode(t, err, 85, "a conflicting spec fails at once")
	err = db.RunCommand(ctx, D(`{"createIndexes":"c","indexes":[{"key":{"b":1},"name":"b_1"}],"maxTimeMS":300}`)).Err()
	requireCode(t, err, 50, "a new index waits for the transaction, here until maxTimeMS")
	_, err = coll.InsertOne(hctx, D(`{"_id":2,"a":2}`))
	require.NoError(t, err, "the transaction is not disturbed")
	require.NoError(t, holder.CommitTransaction(ctx))
}

package conformance

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func txnCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"CommitIsAtomic", testTxnCommit},
		{"AbortDiscards", testTxnAbort},
		{"SnapshotIsolation", testTxnSnapshot},
		{"WriteConflict", testTxnWriteConflict},
		{"WithTransactionRetries", testWithTransactionRetries},
		{"CommitRetriedAfterSuccess", testCommitTwice},
		{"DuplicateKeyAbortsTxn", testTxnDuplicateKey},
		{"NonTxnWriteWaitsForTxn", testNonTxnWriteWaits},
		{"TransactionLifetimeLimit", testTxnLifetime},
		{"RetryableWriteAppliedOnce", testRetryableWrite},
		{"ImplicitCollectionCreation", testTxnImplicitCreate},
		{"CreateIndexInTransaction", testTxnCreateIndex},
	})
}

// startTxn starts a session with a transaction and returns a context
// carrying it. The session ends in t.Cleanup.
func startTxn(t *testing.T, ctx context.Context, cl *mongo.Client) (*mongo.Session, context.Context) {
	t.Helper()
	sess, err := cl.StartSession()
	require.NoError(t, err)
	t.Cleanup(func() { sess.EndSession(context.Background()) })
	require.NoError(t, sess.StartTransaction())
	return sess, mongo.NewSessionContext(ctx, sess)
}

// createColl creates a collection explicitly (some servers refuse to create
// collections inside transactions).
func createColl(t *testing.T, ctx context.Context, db *mongo.Database, name string) *mongo.Collection {
	t.Helper()
	require.NoError(t, db.CreateCollection(ctx, name))
	return db.Collection(name)
}

func testTxnCommit(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a, b := createColl(t, ctx, db, "a"), createColl(t, ctx, db, "b")
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := a.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	_, err = b.InsertMany(sctx, Ds(`[{"_id":1},{"_id":2}]`))
	require.NoError(t, err)
	_, err = a.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$set":{"x":1}}`))
	require.NoError(t, err)
	n, err := b.CountDocuments(sctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "a transaction reads its own writes")

	n, err = b.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(0), n, "uncommitted writes are invisible outside the transaction")
	require.NoError(t, sess.CommitTransaction(ctx))

	requireDocs(t, `[{"_id":1,"x":1}]`, find(t, ctx, a, bson.D{}))
	require.Equal(t, idList(1, 2), ids(t, ctx, b, bson.D{}), "every write of the transaction is visible after commit")
}

func testTxnAbort(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := a.InsertOne(sctx, D(`{"_id":2}`))
	require.NoError(t, err)
	_, err = a.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$set":{"v":2}}`))
	require.NoError(t, err)
	_, err = a.DeleteOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	require.NoError(t, sess.AbortTransaction(ctx))
	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, ctx, a, bson.D{}), "abort discards every write")
}

func testTxnSnapshot(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, sctx, a, bson.D{}), "first read fixes the snapshot")

	_, err := a.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"v":2}}`))
	require.NoError(t, err, "a write outside the transaction to a document it only read does not conflict")
	_, err = a.InsertOne(ctx, D(`{"_id":2,"v":1}`))
	require.NoError(t, err)

	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, sctx, a, bson.D{}), "the transaction does not see writes committed after its snapshot")
	n, err := a.CountDocuments(sctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.NoError(t, sess.CommitTransaction(ctx))
	requireDocs(t, `[{"_id":1,"v":2},{"_id":2,"v":1}]`, find(t, ctx, a, bson.D{}))
}

// requireTransient asserts a write conflict error (112) labelled
// TransientTransactionError.
func requireTransient(t *testing.T, err error, code int, what string) {
	t.Helper()
	se := serverError(t, err)
	require.True(t, se.HasErrorCode(code), "%s: want code %d, got %v: %v", what, code, se.ErrorCodes(), err)
	require.True(t, se.HasErrorLabel("TransientTransactionError"), "%s: want label TransientTransactionError: %v", what, err)
}

func testTxnWriteConflict(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":0}]`)
	s1, c1 := startTxn(t, ctx, e.Client)
	s2, c2 := startTxn(t, ctx, e.Client)
	_, err := a.UpdateOne(c1, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)
	_, err = a.UpdateOne(c2, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
	requireTransient(t, err, 112, "second transaction writing the same document")
	var ce mongo.CommandError
	var we mongo.WriteException
	require.True(t, errors.As(err, &ce) || errors.As(err, &we), "a CommandError or WriteException, got %T", err)
	_ = s2.AbortTransaction(ctx)
	require.NoError(t, s1.CommitTransaction(ctx))
	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, ctx, a, bson.D{}))

	// A transaction whose snapshot predates a concurrent commit of the same
	// document conflicts as well.
	s3, c3 := startTxn(t, ctx, e.Client)
	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, c3, a, bson.D{}))
	_, err = a.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)
	_, err = a.UpdateOne(c3, D(`{"_id":1}`), D(`{"$inc":{"v":100}}`))
	requireTransient(t, err, 112, "transaction writing a document changed after its snapshot")
	_ = s3.AbortTransaction(ctx)
	requireDocs(t, `[{"_id":1,"v":2}]`, find(t, ctx, a, bson.D{}))
}

func testWithTransactionRetries(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":0}]`)

	blocker, bctx := startTxn(t, ctx, e.Client)
	_, err := a.UpdateOne(bctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)

	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	var attempts atomic.Int32
	_, err = sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		n := attempts.Add(1)
		_, err := a.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
		if n == 1 {
			// The first attempt conflicts with the blocker; let it commit
			// so that the retry succeeds.
			require.NoError(t, blocker.CommitTransaction(ctx))
		}
		return nil, err
	})
	require.NoError(t, err, "WithTransaction retries a TransientTransactionError")
	require.Equal(t, int32(2), attempts.Load(), "one conflicting attempt, one successful retry")
	requireDocs(t, `[{"_id":1,"v":11}]`, find(t, ctx, a, bson.D{}))
}

func testCommitTwice(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	cl, log := monitoredClient(t, e)
	sess, sctx := startTxn(t, ctx, cl)
	_, err := cl.Database(db.Name()).Collection("a").InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	require.NoError(t, sess.CommitTransaction(ctx))
	require.NoError(t, sess.CommitTransaction(ctx), "committing a committed transaction again succeeds")
	require.Equal(t, 2, log.count("commitTransaction"), "the second commit is sent to the server")
	require.Equal(t, idList(1), ids(t, ctx, a, bson.D{}))
}

func testTxnDuplicateKey(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := a.InsertOne(sctx, D(`{"_id":2}`))
	require.NoError(t, err)
	_, err = a.InsertOne(sctx, D(`{"_id":1}`))
	require.True(t, mongo.IsDuplicateKeyError(err), "got %v", err)
	_, err = a.InsertOne(sctx, D(`{"_id":3}`))
	requireCode(t, err, 251, "after a failed statement the server has aborted the transaction: NoSuchTransaction")
	err = sess.CommitTransaction(ctx)
	requireCode(t, err, 251, "commit of an aborted transaction")
	require.Equal(t, idList(1), ids(t, ctx, a, bson.D{}), "nothing of the aborted transaction is visible")
}

func testNonTxnWriteWaits(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":0}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := a.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := a.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a non-transactional write to a document held by an open transaction must wait for it; it returned %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, sess.CommitTransaction(ctx))
	select {
	case err := <-done:
		require.NoError(t, err, "the waiting write applies after the commit")
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting write did not finish after the transaction committed")
	}
	requireDocs(t, `[{"_id":1,"v":11}]`, find(t, ctx, a, bson.D{}))
}

func testTxnLifetime(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env, mongotest.ServerOptions(mongofake.TransactionLifetime(300*time.Millisecond)))
	embeddedOnly(t, e, "the real transactionLifetimeLimitSeconds is 60 s and changing it needs setParameter")
	a := createColl(t, ctx, db, "a")
	insert(t, ctx, a, `[{"_id":1,"v":0}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := a.UpdateOne(sctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)

	// The expired transaction releases its document: an outside write
	// waits at most until then.
	_, err = a.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
	require.NoError(t, err)
	err = sess.CommitTransaction(ctx)
	requireCode(t, err, 251, "committing a transaction aborted for exceeding its lifetime: NoSuchTransaction")
	requireDocs(t, `[{"_id":1,"v":10}]`, find(t, ctx, a, bson.D{}))
}

func testRetryableWrite(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"n":0}]`)
	appName := mongotest.UniqueName(t)
	cl, log := monitoredClient(t, e, options.Client().SetAppName(appName).SetRetryWrites(true))
	mc := cl.Database(db.Name()).Collection("c")

	variants := []struct {
		name string
		data string
	}{
		{"writeConcernErrorAfterWrite", `{"failCommands":["update"],"appName":"` + appName + `","writeConcernError":{"code":91,"errmsg":"Replication is being shut down","errorLabels":["RetryableWriteError"]}}`},
		{"errorCode91BeforeWrite", `{"failCommands":["update"],"appName":"` + appName + `","errorCode":91,"errorLabels":["RetryableWriteError"]}`},
		{"closeConnection", `{"failCommands":["update"],"appName":"` + appName + `","closeConnection":true}`},
	}
	for i, v := range variants {
		before := log.count("update")
		setFailPoint(t, ctx, e, `{"times":1}`, v.data)
		res, err := mc.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"n":1}}`))
		require.NoError(t, err, "%s: the driver retries once and succeeds", v.name)
		require.Equal(t, int64(1), res.ModifiedCount, v.name)
		require.Equal(t, 2, log.count("update")-before, "%s: one failed attempt, one retry", v.name)
		var d bson.D
		require.NoError(t, coll.FindOne(ctx, D(`{"_id":1}`)).Decode(&d))
		requireDoc(t, `{"_id":1,"n":`+string(rune('1'+i))+`}`, d, "%s: the write is applied exactly once", v.name)
	}
}

// testTxnCreateIndex: MongoDB 4.4+ creates indexes inside a transaction on
// a collection the transaction creates; they appear at commit. On an
// existing collection the transaction is refused.
func testTxnCreateIndex(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := db.Collection("fresh").Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"x":1}`), Options: options.Index().SetName("x_1")})
	require.NoError(t, err, "createIndexes on a collection the transaction creates")
	names, err := db.ListCollectionNames(ctx, D(`{"name":"fresh"}`))
	require.NoError(t, err)
	require.Empty(t, names, "not visible before commit")
	early, err := db.Collection("fresh").Indexes().ListSpecifications(ctx)
	require.NoError(t, err, "the driver reports a missing collection as no indexes")
	require.Empty(t, early, "listIndexes outside the transaction does not see the index")
	require.NoError(t, sess.CommitTransaction(ctx))
	specs, err := db.Collection("fresh").Indexes().ListSpecifications(ctx)
	require.NoError(t, err)
	require.Len(t, specs, 2, "the index exists after commit")

	insert(t, ctx, db.Collection("old"), `[{"_id":1}]`)
	_, sctx = startTxn(t, ctx, e.Client)
	_, err = db.Collection("old").Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"y":1}`)})
	requireCode(t, err, 263, "not on an existing collection")
}

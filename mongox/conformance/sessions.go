package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// manualKillSessions: killSessions kills the sessions' operations in
// progress, aborts their transactions and closes their cursors.
const manualKillSessions = "https://www.mongodb.com/docs/v7.0/reference/command/killSessions/"

func sessionCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"KillSessionsAbortsTransaction", testKillAbortsTxn},
		{"KillSessionsReleasesWaiters", testKillReleasesWaiter},
		{"KillSessionsInterruptsWaitingWrite", testKillInterruptsWaiter},
		{"KilledSessionLaterCommands", testKilledSessionLater},
	})
}

// killSessions runs killSessions for sess from a connection of its own.
func killSessions(ctx context.Context, cl *mongo.Client, sess ...*mongo.Session) error {
	ids := bson.A{}
	for _, s := range sess {
		ids = append(ids, s.ID())
	}
	return cl.Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: ids}}).Err()
}

// holdDocument creates collection c with document {_id: 1, v: 0} and
// returns it with a session whose open transaction has incremented v, so
// that the document is locked.
func holdDocument(t *testing.T, ctx context.Context, cl *mongo.Client, db *mongo.Database) (*mongo.Collection, *mongo.Session) {
	t.Helper()
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"v":0}]`)
	holder, hctx := startTxn(t, ctx, cl)
	_, err := coll.UpdateOne(hctx, D(`{"_id":1}`), D(`{"$inc":{"v":1}}`))
	require.NoError(t, err)
	return coll, holder
}

func testKillAbortsTxn(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	require.NoError(t, killSessions(ctx, e.Client, sess), manualKillSessions)
	requireCode(t, sess.CommitTransaction(ctx), 251, "the killed session's transaction was aborted: NoSuchTransaction")
	require.Equal(t, idList(), ids(t, ctx, coll, bson.D{}), "nothing of it is visible")
}

// testKillReleasesWaiter: a write outside transactions waits for the open
// transaction that holds its document; killing the holder's session (a
// replica that died with the transaction open) lets the write through at
// once, without the transaction lifetime running out.
func testKillReleasesWaiter(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll, holder := holdDocument(t, ctx, e.Client, db)

	done := make(chan error, 1)
	go func() {
		_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
		done <- err
	}()
	require.NoError(t, killSessions(ctx, e.Client, holder), manualKillSessions)
	select {
	case err := <-done:
		require.NoError(t, err, "the waiting write applies once the holder's session is killed")
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting write was not released by killing the session that held its document")
	}
	requireDocs(t, `[{"_id":1,"v":10}]`, find(t, ctx, coll, bson.D{}), "only the waiting write applied")
	requireCode(t, holder.CommitTransaction(ctx), 251, "the holder's transaction was aborted")
}

// testKillInterruptsWaiter: killing the session of a write that waits on a
// locked document interrupts it (11601 Interrupted) without waiting for
// the lock, and the write does not apply.
func testKillInterruptsWaiter(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll, holder := holdDocument(t, ctx, e.Client, db)

	waiter, err := e.Client.StartSession()
	require.NoError(t, err)
	defer waiter.EndSession(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := coll.UpdateOne(mongo.NewSessionContext(ctx, waiter), D(`{"_id":1}`), D(`{"$inc":{"v":10}}`))
		done <- err
	}()
	// Kill until the waiting write is interrupted: a kill that lands before
	// the write started waiting finds nothing to interrupt.
	var werr error
	eventually(t, 20*time.Second, "killSessions interrupts the session's waiting write", func() bool {
		kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := killSessions(kctx, e.Client, waiter); err != nil {
			return false
		}
		select {
		case werr = <-done:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	})
	var se mongo.ServerError
	require.True(t, errors.As(werr, &se) && se.HasErrorCode(11601), "the interrupted write fails with 11601 Interrupted (%s): %v", manualKillSessions, werr)
	require.NoError(t, holder.CommitTransaction(ctx), "the holder is not affected")
	requireDocs(t, `[{"_id":1,"v":1}]`, find(t, ctx, coll, bson.D{}), "the interrupted write did not apply")
}

func testKilledSessionLater(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1},{"_id":2},{"_id":3}]`)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(context.Background())
	sctx := mongo.NewSessionContext(ctx, sess)
	cur, err := coll.Find(sctx, bson.D{}, options.Find().SetBatchSize(1))
	require.NoError(t, err)
	require.True(t, cur.Next(sctx))
	require.NoError(t, sess.StartTransaction())
	_, err = coll.InsertOne(sctx, D(`{"_id":4}`))
	require.NoError(t, err)

	require.NoError(t, killSessions(ctx, e.Client, sess))
	_, err = coll.InsertOne(sctx, D(`{"_id":5}`))
	requireCode(t, err, 251, "a statement of the killed transaction: NoSuchTransaction")
	_ = sess.AbortTransaction(ctx)
	for cur.Next(sctx) {
	}
	requireCode(t, cur.Err(), 43, "the killed session's cursor is gone: CursorNotFound")

	require.NoError(t, sess.StartTransaction())
	_, err = coll.InsertOne(sctx, D(`{"_id":6}`))
	require.NoError(t, err, "the session itself goes on with a new transaction")
	require.NoError(t, sess.CommitTransaction(ctx))
	require.Equal(t, idList(1, 2, 3, 6), ids(t, ctx, coll, bson.D{}))
}

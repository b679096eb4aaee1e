package mongofake

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestCrashRefusesTheCrashPointAndEverythingAfter(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	ctx := testCtx(t)
	dead := connect(t, srv.URI(), options.Client().SetAppName("dying"))
	alive := connect(t, srv.URI(), options.Client().SetAppName("alive"))
	cr, err := srv.Crash(Crash{AppName: "dying", Commands: []string{"insert", "update"}, At: 2})
	require.NoError(t, err)

	coll := dead.Database("test").Collection("c")
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err, "the first counted command runs")
	// Uncounted commands run before the crash point.
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Err())
	select {
	case <-cr.Fired():
		t.Fatal("fired before the crash point")
	default:
	}
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	requireServerCode(t, err, 11601)
	var ce mongo.ServerError
	require.ErrorAs(t, err, &ce)
	require.False(t, ce.HasErrorLabel("RetryableWriteError"), "no driver retries it")
	<-cr.Fired()
	require.Equal(t, 2, cr.Seen())

	// Every later command fails, counted or not; the handshake still works.
	requireServerCode(t, coll.FindOne(ctx, bson.D{}).Err(), 11601)
	_, err = runCmd(t, dead.Database("admin"), bson.D{{Key: "ping", Value: 1}})
	requireServerCode(t, err, 11601)
	_, err = runCmd(t, dead.Database("admin"), bson.D{{Key: "hello", Value: 1}})
	require.NoError(t, err)

	// Other clients are untouched, and see that the crash point did not run.
	n, err := alive.Database("test").Collection("c").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	cr.Disarm()
	cr.Disarm()
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 3}})
	require.NoError(t, err, "disarmed: the client runs again")
}

func TestCrashAfterRunKeepsTheEffectAndLosesTheReply(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	ctx := testCtx(t)
	dead := connect(t, srv.URI(), options.Client().SetAppName("dying"))
	alive := connect(t, srv.URI())
	_, err := srv.Crash(Crash{AppName: "dying", Commands: []string{"commitTransaction"}, At: 1, AfterRun: true})
	require.NoError(t, err)

	sess, err := dead.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = dead.Database("test").Collection("c").InsertOne(sctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	requireServerCode(t, sess.CommitTransaction(sctx), 11601)

	n, err := alive.Database("test").Collection("c").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the commit ran before the client died")
}

// A dead client's open transaction keeps its locks until its session is
// killed by another client (what a takeover does), as on mongod.
func TestCrashLeavesTransactionsOpen(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	ctx := testCtx(t)
	dead := connect(t, srv.URI(), options.Client().SetAppName("dying"))
	alive := connect(t, srv.URI())
	_, err := alive.Database("test").Collection("c").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}})
	require.NoError(t, err)
	_, err = srv.Crash(Crash{AppName: "dying", Commands: []string{"update", "commitTransaction", "abortTransaction"}, At: 2})
	require.NoError(t, err)

	sess, err := dead.StartSession()
	require.NoError(t, err)
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = dead.Database("test").Collection("c").UpdateOne(sctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}})
	require.NoError(t, err)
	requireServerCode(t, sess.CommitTransaction(sctx), 11601)
	sess.EndSession(ctx) // its abort fails too: the transaction stays open
	lsid := sess.ID()

	update := func() error {
		s, err := alive.StartSession()
		require.NoError(t, err)
		defer s.EndSession(ctx)
		require.NoError(t, s.StartTransaction())
		sc := mongo.NewSessionContext(ctx, s)
		if _, err := alive.Database("test").Collection("c").UpdateOne(sc, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 2}}}}); err != nil {
			return err
		}
		return s.CommitTransaction(sc)
	}
	requireServerCode(t, update(), 112) // WriteConflict: the dead transaction holds the document
	_, err = runCmd(t, alive.Database("admin"), bson.D{{Key: "killSessions", Value: bson.A{lsid}}})
	require.NoError(t, err)
	require.NoError(t, update())
	var got struct{ N int }
	require.NoError(t, alive.Database("test").Collection("c").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&got))
	require.Equal(t, 2, got.N, "the dead transaction never committed")
}

func TestCrashNeedsAClientCommandsAndAPoint(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	_, err := srv.Crash(Crash{Commands: []string{"insert"}, At: 1})
	require.ErrorContains(t, err, "AppName")
	_, err = srv.Crash(Crash{AppName: "a", At: 1})
	require.ErrorContains(t, err, "Commands")
	_, err = srv.Crash(Crash{AppName: "a", Commands: []string{"insert"}})
	require.ErrorContains(t, err, "counted from 1")
}

// requireServerCode checks that err is a server error with code, whatever
// its form (command error, write exception).
func requireServerCode(t *testing.T, err error, code int) {
	t.Helper()
	var se mongo.ServerError
	require.ErrorAs(t, err, &se)
	require.True(t, se.HasErrorCode(code), "want code %d, got %v", code, err)
}

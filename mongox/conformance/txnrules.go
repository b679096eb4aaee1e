package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
)

// manualTxnOperations is the manual page listing what a transaction may
// run: CRUD, getMore/killCursors, create and createIndexes; count,
// listCollections, listIndexes and the other non-CRUD commands are refused;
// only the first statement carries a read concern and only the commit or
// abort a write concern.
const manualTxnOperations = "https://www.mongodb.com/docs/v7.0/core/transactions-operations/"

// txnRuleCases check the statements a transaction refuses. A refused
// statement fails with its own error and leaves the transaction as it was:
// mongod validates session options before it checks the session out.
func txnRuleCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"RefusedCommandsKeepTheTransaction", testTxnRefusedCommands},
		{"RefusedFirstStatementStartsNothing", testTxnRefusedFirst},
		{"WriteConcernOnAStatement", testTxnStatementWriteConcern},
		{"ReadConcernAfterTheFirstStatement", testTxnLaterReadConcern},
		{"GetMoreStaysInItsTransaction", testTxnGetMore},
		{"ExistingIndexInTransaction", testTxnExistingIndex},
		{"ExplicitCreateNeedsLocalReadConcern", testTxnCreateReadConcern},
		{"StagesRefusedInTransaction", testTxnStagesRefused},
	})
}

// requireRefusedInTxn asserts 263 OperationNotSupportedInTransaction without
// the TransientTransactionError label: retrying cannot help.
func requireRefusedInTxn(t *testing.T, err error, what string) {
	t.Helper()
	se := serverError(t, err)
	require.True(t, se.HasErrorCode(263), "%s in a transaction: want 263 OperationNotSupportedInTransaction (%s), got %v: %v",
		what, manualTxnOperations, se.ErrorCodes(), err)
	require.False(t, se.HasErrorLabel("TransientTransactionError"), "%s: a refused command is not transient: %v", what, err)
}

func testTxnRefusedCommands(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":2}`))
	require.NoError(t, err)

	_, err = coll.EstimatedDocumentCount(sctx)
	requireRefusedInTxn(t, err, "count (EstimatedDocumentCount)")
	_, err = db.ListCollectionNames(sctx, bson.D{})
	requireRefusedInTxn(t, err, "listCollections")
	_, err = coll.Indexes().List(sctx)
	requireRefusedInTxn(t, err, "listIndexes")
	requireRefusedInTxn(t, db.RunCommand(sctx, D(`{"drop":"c"}`)).Err(), "drop")
	requireRefusedInTxn(t, db.RunCommand(sctx, D(`{"collMod":"c"}`)).Err(), "collMod")
	requireRefusedInTxn(t, db.RunCommand(sctx, D(`{"dropIndexes":"c","index":"*"}`)).Err(), "dropIndexes")
	requireRefusedInTxn(t, db.RunCommand(sctx, D(`{"ping":1}`)).Err(), "ping")

	n, err := coll.CountDocuments(sctx, bson.D{})
	require.NoError(t, err, "countDocuments is an aggregation, which a transaction may run")
	require.Equal(t, int64(2), n)
	require.NoError(t, sess.CommitTransaction(ctx), "the refused commands did not abort the transaction")
	require.Equal(t, idList(1, 2), ids(t, ctx, coll, bson.D{}))
}

func testTxnRefusedFirst(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.EstimatedDocumentCount(sctx)
	requireRefusedInTxn(t, err, "count as the first statement")
	err = sess.CommitTransaction(ctx)
	requireCode(t, err, 251, "a refused first statement starts no transaction: commit is NoSuchTransaction")
}

func testTxnStatementWriteConcern(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	err = db.RunCommand(sctx, D(`{"insert":"c","documents":[{"_id":2}],"writeConcern":{"w":1}}`)).Err()
	requireCode(t, err, 72, "an insert carrying its own writeConcern in a transaction is InvalidOptions ("+manualTxnOperations+")")
	require.NoError(t, sess.CommitTransaction(ctx), "the refused statement did not abort the transaction")
	require.Equal(t, idList(1), ids(t, ctx, coll, bson.D{}), "the refused insert wrote nothing")
}

func testTxnLaterReadConcern(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := coll.InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err)
	err = db.RunCommand(sctx, D(`{"find":"c","readConcern":{"level":"snapshot"}}`)).Err()
	requireCode(t, err, 72, "only the first statement of a transaction may carry a readConcern: InvalidOptions")
	require.NoError(t, sess.CommitTransaction(ctx))
	require.Equal(t, idList(1), ids(t, ctx, coll, bson.D{}))
}

// testTxnGetMore: a cursor opened in a transaction is read in it; its
// getMore after the commit fails (50740), and killCursors still works.
func testTxnGetMore(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1},{"_id":2},{"_id":3}]`)
	sess, sctx := startTxn(t, ctx, e.Client)
	cur, err := coll.Find(sctx, bson.D{}, options.Find().SetBatchSize(1))
	require.NoError(t, err)
	require.True(t, cur.Next(sctx))
	require.True(t, cur.Next(sctx), "getMore inside the transaction that opened the cursor")
	require.NoError(t, sess.CommitTransaction(ctx))
	for cur.Next(sctx) {
	}
	requireCode(t, cur.Err(), 50740, "getMore outside the transaction that opened the cursor")
	_ = cur.Close(ctx)
}

// testTxnExistingIndex: createIndexes in a transaction on an existing
// collection succeeds when the index already exists, fails with
// IndexKeySpecsConflict for a conflicting spec and 263 for a new index
// (https://www.mongodb.com/docs/v7.0/core/transactions/#create-collections-and-indexes-in-a-transaction).
func testTxnExistingIndex(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err = coll.Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err, "an index that already exists")
	require.NoError(t, sess.CommitTransaction(ctx))

	_, sctx = startTxn(t, ctx, e.Client)
	_, err = coll.Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"a":-1}`), Options: options.Index().SetName("a_1")})
	requireCode(t, err, 86, "a conflicting spec under an existing name")
	_, sctx = startTxn(t, ctx, e.Client)
	_, err = coll.Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"b":1}`)})
	requireRefusedInTxn(t, err, "a new index on an existing collection")
}

// testTxnCreateReadConcern: explicit creation of a collection or an index
// in a transaction needs read concern "local"; implicit creation by a write
// works with any read concern a transaction takes
// (https://www.mongodb.com/docs/v7.0/reference/read-concern-local/).
func testTxnCreateReadConcern(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	sess, err := e.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(context.Background())
	sctx := mongo.NewSessionContext(ctx, sess)
	snapshot := options.Transaction().SetReadConcern(readconcern.Snapshot())

	require.NoError(t, sess.StartTransaction(snapshot))
	requireRefusedInTxn(t, db.CreateCollection(sctx, "explicit"), "create in a snapshot transaction")
	_ = sess.AbortTransaction(ctx)

	require.NoError(t, sess.StartTransaction(snapshot))
	_, err = db.Collection("implicit").InsertOne(sctx, D(`{"_id":1}`))
	require.NoError(t, err, "an insert creates its collection in a snapshot transaction")
	_, err = db.Collection("implicit").Indexes().CreateOne(sctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	requireRefusedInTxn(t, err, "createIndexes in a snapshot transaction")
	_ = sess.AbortTransaction(ctx)

	require.NoError(t, sess.StartTransaction(options.Transaction().SetReadConcern(readconcern.Local())))
	require.NoError(t, db.CreateCollection(sctx, "explicit"), "create in a transaction with read concern local")
	require.NoError(t, sess.CommitTransaction(ctx))
}

// testTxnStagesRefused: aggregate runs in a transaction without the stages
// the manual excludes ($out, $merge, $changeStream, $listLocalSessions...).
func testTxnStagesRefused(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	for _, p := range []string{
		`[{"$out":"o"}]`,
		`[{"$merge":{"into":"o"}}]`,
		`[{"$changeStream":{}}]`,
	} {
		sess, sctx := startTxn(t, ctx, e.Client)
		_, err := coll.Aggregate(sctx, Ds(p))
		requireRefusedInTxn(t, err, "aggregate "+p)
		_ = sess.AbortTransaction(ctx)
	}
	sess, sctx := startTxn(t, ctx, e.Client)
	_, err := db.Aggregate(sctx, Ds(`[{"$listLocalSessions":{}}]`))
	requireRefusedInTxn(t, err, "$listLocalSessions")
	_ = sess.AbortTransaction(ctx)
}

package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The Stable API: a client that declares API version 1 with strict: true
// may only run the commands and aggregation stages of version 1; the
// server refuses others with APIStrictError (323). Unknown versions fail
// with APIVersionError (322); apiStrict without apiVersion with 4886600.
// https://www.mongodb.com/docs/v7.0/reference/stable-api/
// https://www.mongodb.com/docs/v7.0/reference/stable-api-reference/
func stableAPICases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"Strict", testStableAPIStrict},
		{"Parameters", testStableAPIParameters},
	})
}

// testStableAPIStrict: under strict, version-1 commands and stages run,
// others are refused before they run.
func testStableAPIStrict(t *testing.T, env EnvFunc) {
	e, db, ctx := setup(t, env)
	api := options.ServerAPI(options.ServerAPIVersion1).SetStrict(true)
	client := e.NewClient(t, options.Client().SetServerAPIOptions(api))
	sdb := client.Database(db.Name())
	coll := sdb.Collection("c")

	_, err := coll.InsertOne(ctx, D(`{"_id":1,"k":"a"}`))
	require.NoError(t, err, "insert is in version 1")
	cur, err := coll.Aggregate(ctx, Ds(`[{"$match":{"k":"a"}},{"$project":{"k":1}}]`))
	requireDocs(t, `[{"_id":1,"k":"a"}]`, all(t, ctx, cur, err), "$match and $project are in version 1")
	require.NoError(t, sdb.RunCommand(ctx, D(`{"ping":1}`)).Err())

	err = sdb.RunCommand(ctx, D(`{"buildInfo":1}`)).Err()
	requireCode(t, err, 323, "buildInfo is not in version 1")
	_, err = coll.Aggregate(ctx, Ds(`[{"$planCacheStats":{}}]`))
	requireCode(t, err, 323, "$planCacheStats is not in version 1")
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err, "countDocuments runs as an aggregate of version-1 stages")
	require.Equal(t, int64(1), n)

	// Without strict, the same client version may run anything.
	loose := e.NewClient(t, options.Client().SetServerAPIOptions(options.ServerAPI(options.ServerAPIVersion1)))
	require.NoError(t, loose.Database(db.Name()).RunCommand(ctx, D(`{"buildInfo":1}`)).Err())
}

// testStableAPIParameters: the parameters are checked before the command.
func testStableAPIParameters(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	err := db.RunCommand(ctx, D(`{"ping":1,"apiStrict":true}`)).Err()
	requireCode(t, err, 4886600, "apiStrict without apiVersion")
	err = db.RunCommand(ctx, D(`{"ping":1,"apiVersion":"3"}`)).Err()
	requireCode(t, err, 322, "an unknown API version")
	require.NoError(t, db.RunCommand(ctx, D(`{"ping":1,"apiVersion":"1","apiStrict":false}`)).Err())
	err = db.RunCommand(ctx, D(`{"ping":1,"apiVersion":1}`)).Err()
	require.Error(t, err, "apiVersion must be a string")
}

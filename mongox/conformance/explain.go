package conformance

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// explain: the winning plan names the index it uses, and executionStats
// counts the keys and documents examined.
// https://www.mongodb.com/docs/v7.0/reference/command/explain/
// https://www.mongodb.com/docs/v7.0/reference/explain-results/
func explainCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"Find", testExplainFind},
		{"CountDistinctDeleteUpdate", testExplainOthers},
		{"Aggregate", testExplainAggregate},
	})
}

// planStage returns the first stage named name in a plan tree (the
// stage itself or one of its inputStage descendants), nil if none.
func planStage(plan bson.Raw, name string) bson.Raw {
	for plan != nil {
		if s, ok := plan.Lookup("stage").StringValueOK(); ok && s == name {
			return plan
		}
		next, ok := plan.Lookup("inputStage").DocumentOK()
		if !ok {
			return nil
		}
		plan = next
	}
	return nil
}

func explainSetup(t *testing.T, env EnvFunc) (*mongo.Database, *mongo.Collection) {
	t.Helper()
	_, db, ctx := setup(t, env)
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1,"a":1,"b":"x"},{"_id":2,"a":2,"b":"y"},{"_id":3,"a":3,"b":"x"},{"_id":4,"a":4,"b":"y"}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"a":1}`)})
	require.NoError(t, err)
	return db, coll
}

func testExplainFind(t *testing.T, env EnvFunc) {
	db, _ := explainSetup(t, env)
	ctx := testCtx(t)
	raw, err := db.RunCommand(ctx, D(`{"explain":{"find":"c","filter":{"a":{"$gte":3}}},"verbosity":"executionStats"}`)).Raw()
	require.NoError(t, err)
	win := raw.Lookup("queryPlanner", "winningPlan").Document()
	ix := planStage(win, "IXSCAN")
	require.NotNil(t, ix, "an index scan: %s", win)
	require.Equal(t, "a_1", ix.Lookup("indexName").StringValue(), "%s", win)
	require.NotNil(t, planStage(win, "FETCH"), "documents fetched: %s", win)
	require.Equal(t, db.Name()+".c", raw.Lookup("queryPlanner", "namespace").StringValue())
	require.Equal(t, "2", num(raw.Lookup("executionStats", "nReturned")), "%s", raw)
	require.Equal(t, "2", num(raw.Lookup("executionStats", "totalKeysExamined")), "%s", raw)
	require.Equal(t, "2", num(raw.Lookup("executionStats", "totalDocsExamined")), "%s", raw)

	// No index on b: a collection scan examining every document.
	raw, err = db.RunCommand(ctx, D(`{"explain":{"find":"c","filter":{"b":"x"}},"verbosity":"executionStats"}`)).Raw()
	require.NoError(t, err)
	win = raw.Lookup("queryPlanner", "winningPlan").Document()
	require.NotNil(t, planStage(win, "COLLSCAN"), "%s", win)
	require.Equal(t, "0", num(raw.Lookup("executionStats", "totalKeysExamined")), "%s", raw)
	require.Equal(t, "4", num(raw.Lookup("executionStats", "totalDocsExamined")), "%s", raw)
	require.Equal(t, "2", num(raw.Lookup("executionStats", "nReturned")), "%s", raw)

	// queryPlanner verbosity has no executionStats; a hint forces the index.
	raw, err = db.RunCommand(ctx, D(`{"explain":{"find":"c","filter":{"b":"x"},"hint":{"a":1}},"verbosity":"queryPlanner"}`)).Raw()
	require.NoError(t, err)
	_, hasStats := raw.Lookup("executionStats").DocumentOK()
	require.False(t, hasStats, "%s", raw)
	require.NotNil(t, planStage(raw.Lookup("queryPlanner", "winningPlan").Document(), "IXSCAN"), "%s", raw)
	require.Equal(t, "find", raw.Lookup("command").Document().Index(0).Key(), "the explained command is echoed: %s", raw)
}

func testExplainOthers(t *testing.T, env EnvFunc) {
	db, coll := explainSetup(t, env)
	ctx := testCtx(t)
	for _, c := range []struct {
		cmd, root, index string
	}{
		{`{"count":"c","query":{"a":2}}`, "COUNT", "a_1"},
		{`{"distinct":"c","key":"b","query":{"a":{"$lt":3}}}`, "", "a_1"},
		{`{"delete":"c","deletes":[{"q":{"a":4},"limit":1}]}`, "DELETE", "a_1"},
		{`{"update":"c","updates":[{"q":{"b":"y"},"u":{"$set":{"z":1}},"multi":true}]}`, "UPDATE", ""},
	} {
		raw, err := db.RunCommand(ctx, bson.D{{Key: "explain", Value: D(c.cmd)}, {Key: "verbosity", Value: "queryPlanner"}}).Raw()
		require.NoError(t, err, c.cmd)
		win := raw.Lookup("queryPlanner", "winningPlan").Document()
		if c.root != "" {
			require.Equal(t, c.root, win.Lookup("stage").StringValue(), "%s: %s", c.cmd, win)
		}
		if c.index != "" {
			ix := planStage(win, "IXSCAN")
			require.NotNil(t, ix, "%s: %s", c.cmd, win)
			require.Equal(t, c.index, ix.Lookup("indexName").StringValue())
		} else {
			require.NotNil(t, planStage(win, "COLLSCAN"), "%s: %s", c.cmd, win)
		}
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(4), n, "explain deletes nothing")
	require.Equal(t, int64(0), func() int64 {
		n, err := coll.CountDocuments(ctx, D(`{"z":1}`))
		require.NoError(t, err)
		return n
	}(), "explain updates nothing")
}

func testExplainAggregate(t *testing.T, env EnvFunc) {
	db, _ := explainSetup(t, env)
	ctx := testCtx(t)
	raw, err := db.RunCommand(ctx, D(`{"explain":{"aggregate":"c","pipeline":[{"$match":{"a":1}},{"$group":{"_id":"$b","n":{"$sum":1}}}],"cursor":{}},"verbosity":"queryPlanner"}`)).Raw()
	require.NoError(t, err)
	// The query layer's plan is either at the top (the whole pipeline
	// pushed down) or in the first stage's $cursor.
	qp, ok := raw.Lookup("queryPlanner").DocumentOK()
	if !ok {
		qp, ok = raw.Lookup("stages").Array().Index(0).Document().Lookup("$cursor", "queryPlanner").DocumentOK()
		require.True(t, ok, "%s", raw)
	}
	ix := planStage(qp.Lookup("winningPlan").Document(), "IXSCAN")
	if sbe, ok := qp.Lookup("winningPlan", "queryPlan").DocumentOK(); ix == nil && ok {
		// SBE (7.0+) nests the classic tree under queryPlan.
		ix = planStage(sbe, "IXSCAN")
	}
	require.NotNil(t, ix, "%s", qp)
	require.Equal(t, "a_1", ix.Lookup("indexName").StringValue())
}

package mongofake

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMongosh drives MongoDB's shell against the server: the helpers users
// reach for at their desks (explain, stats, currentOp, validate, capped
// collections, $bucket, $setWindowFields). It runs when mongosh is on PATH
// or named by OUTBOX_MONGOSH (npm install mongosh); otherwise it skips, and
// the conformance suite checks the same commands through the Go driver.
func TestMongosh(t *testing.T) {
	t.Parallel()
	bin := os.Getenv("OUTBOX_MONGOSH")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("mongosh"); err != nil {
			t.Skip("mongosh not found: set OUTBOX_MONGOSH or put it on PATH (npm install mongosh)")
		}
	}
	srv := newTestServer(t)
	uri := strings.Replace(srv.URI(), "/?", "/shtest?", 1)
	script := `
db.c.insertMany([{_id: 1, a: 1}, {_id: 2, a: 2}, {_id: 3, a: 3}]); db.c.createIndex({a: 1});
const e = db.c.find({a: {$gte: 2}}).explain("executionStats");
const s = db.c.stats();
db.createCollection("cap", {capped: true, size: 4096, max: 2}); db.cap.insertMany([{_id: 1}, {_id: 2}, {_id: 3}]);
print(JSON.stringify({
  ixscan: e.queryPlanner.winningPlan.inputStage.indexName,
  keys: Number(e.executionStats.totalKeysExamined), docs: Number(e.executionStats.totalDocsExamined),
  count: Number(s.count), nindexes: Number(s.nindexes),
  currentOp: db.currentOp().inprog.length > 0,
  valid: db.c.validate().valid,
  capped: db.cap.find().toArray().map(d => d._id), isCapped: db.cap.isCapped(),
  buckets: db.c.aggregate([{$bucket: {groupBy: "$a", boundaries: [0, 2, 10]}}]).toArray().map(b => b.count),
  running: db.c.aggregate([{$setWindowFields: {sortBy: {a: 1}, output: {r: {$sum: "$a", window: {documents: ["unbounded", "current"]}}}}}]).toArray().map(d => d.r),
}));`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--quiet", "--nodb", "--eval", "db = connect("+jsString(uri)+");"+script).CombinedOutput()
	require.NoError(t, err, "mongosh: %s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got), "mongosh printed: %s", out)
	require.Equal(t, map[string]any{
		"ixscan": "a_1", "keys": 2.0, "docs": 2.0, "count": 3.0, "nindexes": 2.0,
		"currentOp": true, "valid": true, "capped": []any{2.0, 3.0}, "isCapped": true,
		"buckets": []any{1.0, 2.0}, "running": []any{1.0, 3.0, 6.0},
	}, got)
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

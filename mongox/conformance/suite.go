package conformance

import (
	"testing"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// EnvFunc returns the deployment one case runs against. A case passes
// options when it needs an embedded-server knob (a short TTL interval, a
// tiny oplog, a short transaction lifetime); against a real MongoDB they are
// ignored and such cases skip or wait longer. The function may return a new
// deployment per call or the same one every time: every case works in its
// own database.
type EnvFunc func(t *testing.T, opts ...mongotest.Option) *mongotest.Env

// Run runs every conformance case as a subtest of t, grouped by area
// (CRUD, UpdatePipelines, Let, Collation, Query, Aggregate, AggregateStages,
// Indexes, IndexRules, Transactions, TransactionRules, CatalogRaces,
// Sessions, SnapshotReads, ChangeStreams, ChangeStreamImages, ClusterTime,
// Parameters, Catalog, FailPoints, Unsupported, Limits, Diagnostics, Capped, Tailable, StableAPI, CollStats, Explain). Cases run in parallel.
func Run(t *testing.T, env EnvFunc) {
	groups := []struct {
		name string
		run  func(t *testing.T, env EnvFunc)
	}{
		{"CRUD", crudCases},
		{"UpdatePipelines", updatePipelineCases},
		{"Let", letCases},
		{"Collation", collationCases},
		{"Query", queryCases},
		{"Aggregate", aggregateCases},
		{"AggregateStages", aggregateStageCases},
		{"Indexes", indexCases},
		{"IndexRules", indexRuleCases},
		{"Transactions", txnCases},
		{"TransactionRules", txnRuleCases},
		{"CatalogRaces", catalogRaceCases},
		{"Sessions", sessionCases},
		{"SnapshotReads", snapshotCases},
		{"ChangeStreams", changeStreamCases},
		{"ChangeStreamImages", changeStreamImageCases},
		{"ClusterTime", clusterTimeCases},
		{"Parameters", parameterCases},
		{"Catalog", catalogCases},
		{"FailPoints", failPointCases},
		{"Unsupported", unsupportedCases},
		{"Limits", limitCases},
		{"Diagnostics", diagnosticsCases},
		{"Capped", cappedCases},
		{"Tailable", tailableCases},
		{"StableAPI", stableAPICases},
		{"CollStats", collStatsCases},
		{"Explain", explainCases},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) { g.run(t, env) })
	}
}

// tcase is one named case.
type tcase struct {
	name string
	fn   func(t *testing.T, env EnvFunc)
}

// runCases runs cases as parallel subtests.
func runCases(t *testing.T, env EnvFunc, cases []tcase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, env)
		})
	}
}

package mongofake

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/plan"
)

// The explain command (https://www.mongodb.com/docs/v7.0/reference/command/explain/)
// for find, count, distinct, delete, update, findAndModify and aggregate,
// in the classic engine's format
// (https://www.mongodb.com/docs/v7.0/reference/explain-results/):
// queryPlanner with the winning plan (COLLSCAN, IDHACK or IXSCAN naming
// its index, under FETCH, SORT, SKIP, LIMIT, projection, COUNT, UPDATE or
// DELETE) and the rejected plans; executionStats with the keys and
// documents the plan examines. Package plan chooses the plan as MongoDB's
// planner would for the common cases; nothing is executed (update and
// delete report what they would do).

func init() {
	register(commandSpec{names: []string{"explain"}, handler: dataCommand(cmdExplain)})
}

// explainVerbosities are the verbosity modes, least detailed first.
var explainVerbosities = map[string]int{"queryPlanner": 0, "executionStats": 1, "allPlansExecution": 2}

func cmdExplain(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "verbosity"); err != nil {
		return nil, err
	}
	inner, ok := r.cmd[0].Value.(bson.D)
	if !ok || len(inner) == 0 {
		return nil, wrongType("explain", r.cmd[0].Value, "object")
	}
	verbosity := "allPlansExecution"
	if v, ok := r.get("verbosity"); ok {
		s, isStr := v.(string)
		if _, known := explainVerbosities[s]; !isStr || !known {
			return nil, errorf(2, "BadValue", fmt.Sprintf("verbosity string must be one of {'queryPlanner', 'executionStats', 'allPlansExecution'}, got %v", v))
		}
		verbosity = s
	}
	name := inner[0].Key
	if name == "aggregate" {
		stages, _ := lookupD(inner, "pipeline").(bson.A)
		coll, _ := inner[0].Value.(string)
		return explainAggregate(r, tc, coll, stages, verbosity, inner)
	}
	coll, isStr := inner[0].Value.(string)
	if !isStr {
		return nil, wrongType("explain."+name, inner[0].Value, "string")
	}
	ns := engine.NS{DB: r.db, Coll: coll}
	var q plan.Query
	var proj bson.D
	root := ""
	get := func(k string) bson.D { d, _ := lookupD(inner, k).(bson.D); return d }
	num := func(d bson.D, k string) int64 { n, _ := toInt(lookupD(d, k)); return n }
	switch name {
	case "find":
		q = plan.Query{Filter: get("filter"), Sort: get("sort"), Hint: lookupD(inner, "hint"), Skip: num(inner, "skip"), Limit: num(inner, "limit")}
		proj = get("projection")
		if _, isNatural, _ := naturalSort(q.Sort); isNatural {
			q.Hint, q.Sort = q.Sort, nil
		}
	case "count":
		q = plan.Query{Filter: get("query"), Hint: lookupD(inner, "hint"), Skip: num(inner, "skip"), Limit: num(inner, "limit")}
		root = "COUNT"
	case "distinct":
		q = plan.Query{Filter: get("query"), Hint: lookupD(inner, "hint")}
		if key, ok := lookupD(inner, "key").(string); ok {
			proj = bson.D{{Key: "_id", Value: int32(0)}, {Key: key, Value: int32(1)}}
		}
	case "findAndModify", "findandmodify":
		q = plan.Query{Filter: get("query"), Sort: get("sort"), Hint: lookupD(inner, "hint"), Limit: 1}
		root = "UPDATE"
		if b, _ := lookupD(inner, "remove").(bool); b {
			root = "DELETE"
		}
	case "delete", "update":
		key := name + "s"
		stmts, _ := lookupD(inner, key).(bson.A)
		if len(stmts) != 1 {
			return nil, errorf(2, "BadValue", fmt.Sprintf("explain of %s needs exactly one statement in '%s'", name, key))
		}
		st, _ := stmts[0].(bson.D)
		q = plan.Query{Filter: get2(st, "q"), Sort: get2(st, "sort"), Hint: lookupD(st, "hint")}
		if name == "delete" {
			if num(st, "limit") == 1 {
				q.Limit = 1
			}
		} else if multi, _ := lookupD(st, "multi").(bool); !multi {
			q.Limit = 1
		}
		root = map[string]string{"delete": "DELETE", "update": "UPDATE"}[name]
	default:
		return nil, errorf(238, "NotImplemented", "mongofake: explain of '"+name+"' is not supported (find, count, distinct, delete, update, findAndModify and aggregate are)")
	}
	x, err := explainQuery(r, tc, ns, q, proj, root)
	if err != nil {
		return nil, err
	}
	out := bson.D{
		{Key: "explainVersion", Value: "1"},
		{Key: "queryPlanner", Value: queryPlanner(ns, x)},
	}
	if explainVerbosities[verbosity] > 0 {
		out = append(out, bson.E{Key: "executionStats", Value: x.ExecutionStats(0, verbosity == "allPlansExecution")})
	}
	return append(out, explainTail(r, inner)...), nil
}

func get2(d bson.D, k string) bson.D { v, _ := lookupD(d, k).(bson.D); return v }

// explainQuery chooses the plan of a query over the collection's documents
// and fills in the root stage's figures.
func explainQuery(r *request, tc *txnCtx, ns engine.NS, q plan.Query, proj bson.D, root string) (*plan.Explain, error) {
	m, err := compileFilter(q.Filter, r.vars, nil)
	if err != nil {
		return nil, err
	}
	q.Match = m.Match
	docs, err := allDocs(r, tc, ns)
	if err != nil {
		return nil, err
	}
	p, rejected, err := plan.Choose(planIndexes(r, ns), docs, q)
	if err != nil {
		return nil, err
	}
	x := &plan.Explain{Plan: p, Rejected: rejected, Query: q, Projection: proj, Root: root}
	switch root {
	case "COUNT":
		x.RootStats = bson.D{{Key: "nCounted", Value: p.Returned}, {Key: "nSkipped", Value: min(q.Skip, p.Matched)}}
	case "DELETE":
		x.RootStats = bson.D{{Key: "nWouldDelete", Value: p.Returned}}
	case "UPDATE":
		x.RootStats = bson.D{{Key: "nMatched", Value: p.Returned}, {Key: "nWouldModify", Value: p.Returned},
			{Key: "nWouldUpsert", Value: int64(0)}}
	}
	return x, nil
}

// planIndexes describes the collection's indexes for package plan.
func planIndexes(r *request, ns engine.NS) []plan.Index {
	specs, _ := r.srv.engine.ListIndexes(ns)
	indexes := make([]plan.Index, 0, len(specs))
	for _, s := range specs {
		indexes = append(indexes, plan.Index{Name: s.Name, Key: s.Key, Unique: s.Unique, Sparse: s.Sparse,
			PartialFilter: s.PartialFilter, Special: specialIndexType(s.Key)})
	}
	return indexes
}

// queryPlanner is explain's queryPlanner section.
func queryPlanner(ns engine.NS, x *plan.Explain) bson.D {
	hash := plan.QueryHash(x.Query.Filter, x.Query.Sort, x.Projection)
	return bson.D{
		{Key: "namespace", Value: ns.String()},
		{Key: "indexFilterSet", Value: false},
		{Key: "parsedQuery", Value: plan.ParsedQuery(x.Query.Filter)},
		{Key: "queryHash", Value: hash},
		{Key: "planCacheKey", Value: hash},
		{Key: "maxIndexedOrSolutionsReached", Value: false},
		{Key: "maxIndexedAndSolutionsReached", Value: false},
		{Key: "maxScansToExplodeReached", Value: false},
		{Key: "winningPlan", Value: x.WinningPlan()},
		{Key: "rejectedPlans", Value: x.RejectedPlans()},
	}
}

// explainTail is the end of every explain reply: the command explained,
// and the server's description.
func explainTail(r *request, inner bson.D) bson.D {
	cmd := append(append(bson.D{}, inner...), bson.E{Key: "$db", Value: r.db})
	host, port := r.srv.advertisedHost(r.conn), int32(0)
	if i := lastColon(host); i >= 0 {
		if p, err := strconv.Atoi(host[i+1:]); err == nil {
			host, port = host[:i], int32(p)
		}
	}
	return bson.D{
		{Key: "command", Value: cmd},
		{Key: "serverInfo", Value: bson.D{
			{Key: "host", Value: host}, {Key: "port", Value: port},
			{Key: "version", Value: serverVersion}, {Key: "gitVersion", Value: "mongofake"},
		}},
		{Key: "serverParameters", Value: bson.D{
			{Key: "internalQueryFacetBufferSizeBytes", Value: int32(104857600)},
			{Key: "internalQueryFacetMaxOutputDocSizeBytes", Value: int32(104857600)},
			{Key: "internalLookupStageIntermediateDocumentMaxSizeBytes", Value: int32(104857600)},
			{Key: "internalDocumentSourceGroupMaxMemoryBytes", Value: int32(104857600)},
			{Key: "internalQueryMaxBlockingSortMemoryUsageBytes", Value: int32(104857600)},
			{Key: "internalQueryProhibitBlockingMergeOnMongoS", Value: int32(0)},
			{Key: "internalQueryMaxAddToSetBytes", Value: int32(104857600)},
			{Key: "internalDocumentSourceSetWindowFieldsMaxMemoryBytes", Value: int32(104857600)},
		}},
	}
}

func lastColon(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			return i
		}
	}
	return -1
}

// explainAggregate explains a pipeline: the query its leading $match and
// $sort select, as the $cursor stage, then the other stages as given.
// A pipeline that is only a $match (and $sort, $skip, $limit, $project)
// answers, as in mongod, with the queryPlanner at the top level.
func explainAggregate(r *request, tc *txnCtx, coll string, stages bson.A, verbosity string, inner bson.D) (bson.D, error) {
	if coll == "" {
		return nil, errorf(238, "NotImplemented", "mongofake: explain of a database-level aggregate is not supported")
	}
	ns := engine.NS{DB: r.db, Coll: coll}
	q := plan.Query{}
	var proj bson.D
	i := 0
	pushed := true
	for ; i < len(stages) && pushed; i++ {
		d, _ := stages[i].(bson.D)
		if len(d) != 1 {
			break
		}
		v, _ := d[0].Value.(bson.D)
		switch {
		case d[0].Key == "$match" && q.Filter == nil && q.Sort == nil && q.Skip == 0 && q.Limit == 0 && proj == nil:
			q.Filter = v
		case d[0].Key == "$sort" && q.Sort == nil && q.Skip == 0 && q.Limit == 0 && proj == nil:
			q.Sort = v
		case d[0].Key == "$skip" && q.Limit == 0 && proj == nil:
			q.Skip, _ = toInt(d[0].Value)
		case d[0].Key == "$limit" && q.Limit == 0 && proj == nil:
			q.Limit, _ = toInt(d[0].Value)
		case d[0].Key == "$project" && proj == nil:
			proj = v
		default:
			pushed = false
			i--
		}
	}
	x, err := explainQuery(r, tc, ns, q, proj, "")
	if err != nil {
		return nil, err
	}
	qp := queryPlanner(ns, x)
	var out bson.D
	if i >= len(stages) {
		out = bson.D{{Key: "explainVersion", Value: "1"}, {Key: "queryPlanner", Value: qp}}
		if explainVerbosities[verbosity] > 0 {
			out = append(out, bson.E{Key: "executionStats", Value: x.ExecutionStats(0, verbosity == "allPlansExecution")})
		}
	} else {
		cursor := bson.D{{Key: "queryPlanner", Value: qp}}
		if explainVerbosities[verbosity] > 0 {
			cursor = append(cursor, bson.E{Key: "executionStats", Value: x.ExecutionStats(0, verbosity == "allPlansExecution")})
		}
		all := append(bson.A{bson.D{{Key: "$cursor", Value: cursor}}}, stages[i:]...)
		out = bson.D{{Key: "explainVersion", Value: "1"}, {Key: "stages", Value: all}}
	}
	return append(out, explainTail(r, inner)...), nil
}

package mongofake

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

func init() {
	register(commandSpec{names: []string{"aggregate"}, handler: dataCommand(cmdAggregate)})
}

func cmdAggregate(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "pipeline", "cursor", "explain", "allowDiskUse", "bypassDocumentValidation",
		"collation", "hint", "let", "$readPreference", "fromMongos", "needsMerge", "isMapReduceCommand"); err != nil {
		return nil, err
	}
	pv, ok := r.get("pipeline")
	if !ok {
		return nil, errorf(40414, "Location40414", "BSON field 'aggregate.pipeline' is missing but a required field")
	}
	stages, ok := pv.(bson.A)
	if !ok {
		return nil, wrongType("aggregate.pipeline", pv, "array")
	}
	if err := checkStrictStages(r, stages); err != nil {
		return nil, err
	}
	if explain, _ := r.boolArg("explain", false); explain {
		coll, _ := r.cmd[0].Value.(string)
		inner := bson.D{}
		for _, e := range r.cmd {
			if !genericFields[e.Key] {
				inner = append(inner, e)
			}
		}
		return explainAggregate(r, tc, coll, stages, "queryPlanner", inner)
	}
	collV, _ := r.get("collation")
	coll, err := collationArg(collV)
	if err != nil {
		return nil, err
	}
	curV, hasCursor := r.get("cursor")
	cur, isDoc := curV.(bson.D)
	if !hasCursor || !isDoc {
		return nil, errorf(9, "FailedToParse", "The 'cursor' option is required, except for aggregate with the explain argument")
	}
	batchSize, hasBatch, err := batchSizeArg(cur, "cursor.batchSize")
	if err != nil {
		return nil, err
	}

	var collName string
	switch x := r.cmd[0].Value.(type) {
	case string:
		collName = x
	default:
		if n, ok := bsonkit.ToFloat64(x); !ok || n != 1 {
			return nil, errorf(73, "InvalidNamespace", fmt.Sprintf("Invalid aggregate namespace: %v", x))
		}
	}

	if len(stages) > 0 {
		if first, ok := stages[0].(bson.D); ok && len(first) == 1 && first[0].Key == "$changeStream" {
			return openChangeStream(r, tc, collName, first[0].Value, stages[1:], batchSize, hasBatch)
		}
	}
	for i, st := range stages {
		if name := stageName(st); (name == "$changeStream" || name == "$collStats") && i > 0 {
			return nil, errorf(40602, "Location40602", name+" is only valid as the first stage in a pipeline.")
		}
	}
	stages, writeStage, err := splitWriteStage(stages)
	if err != nil {
		return nil, err
	}
	if collName == "" {
		if coll != nil {
			return nil, errorf(238, "NotImplemented", "mongofake: a database-level aggregate with a non-simple collation is not supported")
		}
		if len(stages) == 0 {
			return nil, errorf(238, "NotImplemented", "mongofake: a database-level aggregate needs a first stage ($documents, $listLocalSessions or $changeStream)")
		}
		src, err := dbLevelSource(r, stages[0])
		if err != nil {
			return nil, err
		}
		out, err := runAfterSource(r, tc, src, stages[1:])
		if err != nil {
			return nil, err
		}
		return aggregateResult(r, tc, engine.NS{DB: r.db, Coll: "$cmd.aggregate"}, out, writeStage, batchSize, hasBatch)
	}
	var collMatch func(bson.D) bool
	if coll != nil {
		if stages, collMatch, err = splitCollatedMatch(stages, coll, r.vars); err != nil {
			return nil, err
		}
	}
	ns := engine.NS{DB: r.db, Coll: collName}
	if len(stages) > 0 && stageName(stages[0]) == "$collStats" {
		src, err := collStatsSource(r, tc, ns, stages[0].(bson.D)[0].Value)
		if err != nil {
			return nil, err
		}
		out, err := runAfterSource(r, tc, src, stages[1:])
		if err != nil {
			return nil, err
		}
		return aggregateResult(r, tc, ns, out, writeStage, batchSize, hasBatch)
	}
	p, err := pipeline.Compile(stages, pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars, Lookup: lookupFn(r, tc)})
	if err != nil {
		return nil, err
	}
	// A leading $match selects through the engine (index on _id or unique
	// fields); the pipeline applies it again.
	q := engine.Query{}
	if len(stages) > 0 {
		if first, ok := stages[0].(bson.D); ok && len(first) == 1 && first[0].Key == "$match" {
			if f, ok := first[0].Value.(bson.D); ok {
				if m, err := query.CompileWithVars(f, r.vars); err == nil {
					q = engine.Query{Filter: f, Match: m.Match}
				}
			}
		}
	}
	var docs []bson.D
	err = r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
		var err error
		docs, err = v.Find(ns, q)
		return err
	})
	if err != nil {
		return nil, err
	}
	if collMatch != nil {
		kept := docs[:0:0]
		for _, d := range docs {
			if collMatch(d) {
				kept = append(kept, d)
			}
		}
		docs = kept
	}
	out, err := p.Run(docs)
	if err != nil {
		return nil, err
	}
	return aggregateResult(r, tc, ns, out, writeStage, batchSize, hasBatch)
}

// runAfterSource runs the stages that follow a source stage the server
// answers itself ($documents, $collStats, $currentOp...) over its documents.
func runAfterSource(r *request, tc *txnCtx, src []bson.D, stages bson.A) ([]bson.D, error) {
	p, err := pipeline.Compile(stages, pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars, Lookup: lookupFn(r, tc)})
	if err != nil {
		return nil, err
	}
	return p.Run(src)
}

// splitCollatedMatch takes the leading $match stages of a pipeline run with
// a non-simple collation and returns the rest with their collated
// predicate. Only stages that compare no strings may follow ($limit,
// $skip, $count, inclusion/exclusion $project): the pipeline package has
// no collated expressions, and answering with simple comparison would be
// silently wrong.
func splitCollatedMatch(stages bson.A, coll *bsonkit.Collation, vars bson.D) (bson.A, func(bson.D) bool, error) {
	var preds []func(bson.D) bool
	i := 0
	for ; i < len(stages); i++ {
		d, ok := stages[i].(bson.D)
		if !ok || len(d) != 1 || d[0].Key != "$match" {
			break
		}
		f, ok := d[0].Value.(bson.D)
		if !ok {
			return nil, nil, errorf(15959, "Location15959", "the match filter must be an expression in an object")
		}
		q, err := compileFilter(f, vars, coll)
		if err != nil {
			return nil, nil, err
		}
		preds = append(preds, q.Match)
	}
	for _, st := range stages[i:] {
		name := stageName(st)
		ok := name == "$limit" || name == "$skip" || name == "$count"
		if name == "$project" {
			ok = true
			spec, _ := st.(bson.D)[0].Value.(bson.D)
			for _, e := range spec {
				switch e.Value.(type) {
				case bool, int32, int64, float64:
				default:
					ok = false
				}
			}
		}
		if name == "$group" {
			ok = groupComparesNoStrings(st.(bson.D)[0].Value)
		}
		if !ok {
			return nil, nil, errorf(238, "NotImplemented", "mongofake: aggregate stage "+name+" with a non-simple collation is not supported (leading $match stages, then $limit, $skip, $count, inclusion $project and a $group by a constant with $sum/$avg/$count are)")
		}
	}
	return stages[i:], func(d bson.D) bool {
		for _, p := range preds {
			if !p(d) {
				return false
			}
		}
		return true
	}, nil
}

// aggregateResult writes the output with the final $out or $merge stage
// (and answers an empty cursor), or returns it as the first batch.
func aggregateResult(r *request, tc *txnCtx, ns engine.NS, out []bson.D, writeStage bson.D, batchSize int, hasBatch bool) (bson.D, error) {
	if writeStage != nil {
		if err := runWriteStage(r, tc, writeStage, out); err != nil {
			return nil, err
		}
		return cursorReply(0, ns.String(), "firstBatch", bson.A{}), nil
	}
	return r.srv.data.firstBatch(r, tc, ns, out, nil, batchSize, hasBatch, 0, false), nil
}

// lookupFn reads a collection of the command's database for $lookup, in
// the command's transaction when it has one.
func lookupFn(r *request, tc *txnCtx) func(coll string) ([]bson.D, error) {
	return func(coll string) ([]bson.D, error) {
		var docs []bson.D
		err := r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
			var err error
			docs, err = v.Find(engine.NS{DB: r.db, Coll: coll}, engine.Query{})
			return err
		})
		return docs, convertErr(err)
	}
}

// groupComparesNoStrings reports a $group by a constant _id whose
// accumulators are $sum, $avg or $count (countDocuments sends one).
func groupComparesNoStrings(arg any) bool {
	spec, ok := arg.(bson.D)
	if !ok {
		return false
	}
	for _, e := range spec {
		if e.Key == "_id" {
			switch e.Value.(type) {
			case nil, int32, int64, float64, bool:
				continue
			}
			return false
		}
		acc, ok := e.Value.(bson.D)
		if !ok || len(acc) != 1 {
			return false
		}
		switch acc[0].Key {
		case "$sum", "$avg", "$count":
		default:
			return false
		}
	}
	return true
}

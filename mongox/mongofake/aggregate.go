package mongofake

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/mongo/bsonkit"
	"github.com/event-outbox/outbox/internal/mongo/engine"
	"github.com/event-outbox/outbox/internal/mongo/pipeline"
	"github.com/event-outbox/outbox/internal/mongo/query"
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
	if explain, _ := r.boolArg("explain", false); explain {
		return nil, errorf(238, "NotImplemented", "mongofake: aggregate explain is not supported")
	}
	if v, ok := r.get("collation"); ok {
		if err := checkCollation(v); err != nil {
			return nil, err
		}
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

	var coll string
	switch x := r.cmd[0].Value.(type) {
	case string:
		coll = x
	default:
		if n, ok := bsonkit.ToFloat64(x); !ok || n != 1 {
			return nil, errorf(73, "InvalidNamespace", fmt.Sprintf("Invalid aggregate namespace: %v", x))
		}
	}

	if len(stages) > 0 {
		if first, ok := stages[0].(bson.D); ok && len(first) == 1 && first[0].Key == "$changeStream" {
			return openChangeStream(r, tc, coll, first[0].Value, stages[1:], batchSize, hasBatch)
		}
	}
	for i, st := range stages {
		if d, ok := st.(bson.D); ok && len(d) == 1 && d[0].Key == "$changeStream" && i > 0 {
			return nil, errorf(40602, "Location40602", "$changeStream is only valid as the first stage in a pipeline.")
		}
	}
	stages, writeStage, err := splitWriteStage(stages)
	if err != nil {
		return nil, err
	}
	if coll == "" {
		if len(stages) == 0 {
			return nil, errorf(238, "NotImplemented", "mongofake: a database-level aggregate needs a first stage ($documents, $listLocalSessions or $changeStream)")
		}
		src, err := dbLevelSource(r, stages[0])
		if err != nil {
			return nil, err
		}
		p, err := pipeline.Compile(stages[1:], pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars, Lookup: lookupFn(r, tc)})
		if err != nil {
			return nil, err
		}
		out, err := p.Run(src)
		if err != nil {
			return nil, err
		}
		return aggregateResult(r, tc, engine.NS{DB: r.db, Coll: "$cmd.aggregate"}, out, writeStage, batchSize, hasBatch)
	}
	ns := engine.NS{DB: r.db, Coll: coll}
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
	out, err := p.Run(docs)
	if err != nil {
		return nil, err
	}
	return aggregateResult(r, tc, ns, out, writeStage, batchSize, hasBatch)
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

package mongofake

import (
	"fmt"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
	"github.com/event-outbox/outbox/mongox/internal/update"
)

// This file holds the aggregation stages that need the server rather than
// the pure pipeline package: the write stages $out and $merge, the
// database-level sources $documents and $listLocalSessions, and the Atlas
// Search stages, which a MongoDB server without Atlas refuses.

// searchNotEnabled is what mongod without Atlas Search (mongot) answers to
// the search index commands and stages.
func searchNotEnabled() *cmdError {
	return errorf(31082, "SearchNotEnabled",
		"Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage requires additional configuration. "+
			"Please connect to Atlas or an AtlasCLI local deployment to enable. For more information on how to connect, see https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs")
}

func init() {
	search := func(r *request) (bson.D, error) { return nil, searchNotEnabled() }
	register(
		commandSpec{names: []string{"createSearchIndexes"}, handler: search},
		commandSpec{names: []string{"updateSearchIndex"}, handler: search},
		commandSpec{names: []string{"dropSearchIndex"}, handler: search},
	)
}

// searchStages need Atlas Search.
var searchStages = map[string]bool{
	"$search": true, "$searchMeta": true, "$vectorSearch": true, "$listSearchIndexes": true,
}

// stageName returns the name of a pipeline stage document, or "".
func stageName(st any) string {
	if d, ok := st.(bson.D); ok && len(d) == 1 {
		return d[0].Key
	}
	return ""
}

// splitWriteStage checks where $out and $merge appear and returns the
// pipeline without the final write stage, and that stage (nil when none).
func splitWriteStage(stages bson.A) (bson.A, bson.D, error) {
	for i, st := range stages {
		name := stageName(st)
		if searchStages[name] {
			return nil, nil, searchNotEnabled()
		}
		if (name == "$out" || name == "$merge") && i != len(stages)-1 {
			return nil, nil, errorf(40601, "Location40601", fmt.Sprintf("%s can only be the final stage in the pipeline", name))
		}
	}
	if n := len(stages); n > 0 {
		if name := stageName(stages[n-1]); name == "$out" || name == "$merge" {
			return stages[:n-1], stages[n-1].(bson.D), nil
		}
	}
	return stages, nil, nil
}

// dbLevelSource runs the first stage of a database-level aggregate
// ({aggregate: 1}) and returns its documents.
func dbLevelSource(r *request, first any) ([]bson.D, error) {
	name := stageName(first)
	arg := first.(bson.D)[0].Value
	switch name {
	case "$documents":
		v, err := pipeline.Eval(arg, nil, pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars})
		if err != nil {
			return nil, convertErr(err)
		}
		a, ok := v.(bson.A)
		if !ok {
			return nil, errorf(5858203, "Location5858203", "error during aggregation :: caused by :: an array is expected")
		}
		docs := make([]bson.D, 0, len(a))
		for _, x := range a {
			d, ok := x.(bson.D)
			if !ok {
				return nil, errorf(40228, "Location40228", "'replacement document' must be a document, but is "+mongoerr.TypeName(x))
			}
			docs = append(docs, d)
		}
		return docs, nil
	case "$listLocalSessions":
		if r.autocommit != nil {
			return nil, errorf(263, "OperationNotSupportedInTransaction", "Operation not permitted in transaction: $listLocalSessions")
		}
		spec, ok := arg.(bson.D)
		if !ok {
			return nil, wrongType("$listLocalSessions", arg, "object")
		}
		for _, e := range spec {
			if e.Key != "allUsers" && e.Key != "users" {
				return nil, errorf(40415, "Location40415", "BSON field '$listLocalSessions."+e.Key+"' is an unknown field.")
			}
		}
		return r.srv.data.localSessions(), nil
	case "$currentOp":
		if r.db != "admin" {
			return nil, errorf(73, "InvalidNamespace", "$currentOp must be run against the 'admin' database with {aggregate: 1}")
		}
		return currentOps(r, arg)
	case "$listSessions":
		return nil, errorf(238, "NotImplemented", "mongofake: aggregate stage "+name+" is not supported")
	}
	return nil, errorf(238, "NotImplemented", "mongofake: a database-level aggregate must start with $documents, $listLocalSessions or $changeStream; first stage: "+name)
}

// localSessions lists the sessions the server knows, as $listLocalSessions
// does: {_id: lsid, lastUse}.
func (d *dataState) localSessions() []bson.D {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]bson.D, 0, len(d.sessions))
	for _, s := range d.sessions {
		out = append(out, bson.D{{Key: "_id", Value: s.lsid}, {Key: "lastUse", Value: bson.NewDateTimeFromTime(s.lastUse)}})
	}
	slices.SortFunc(out, func(a, b bson.D) int { return bsonkit.Compare(a[0].Value, b[0].Value) })
	return out
}

// writeTarget parses the target of $out or $merge: "coll" or {db, coll}.
func writeTarget(r *request, stage string, v any) (engine.NS, error) {
	switch x := v.(type) {
	case string:
		if x == "" {
			return engine.NS{}, errorf(73, "InvalidNamespace", stage+" target collection name cannot be empty")
		}
		return engine.NS{DB: r.db, Coll: x}, nil
	case bson.D:
		ns := engine.NS{DB: r.db}
		for _, e := range x {
			s, _ := e.Value.(string)
			switch e.Key {
			case "db":
				ns.DB = s
			case "coll":
				ns.Coll = s
			case "timeseries":
				return engine.NS{}, errorf(238, "NotImplemented", "mongofake: "+stage+" option 'timeseries' is not supported")
			default:
				return engine.NS{}, errorf(40415, "Location40415", fmt.Sprintf("BSON field '%s.%s' is an unknown field.", stage, e.Key))
			}
		}
		if ns.Coll == "" || ns.DB == "" {
			return engine.NS{}, errorf(73, "InvalidNamespace", stage+" requires a non-empty target db and coll")
		}
		return ns, nil
	}
	return engine.NS{}, errorf(16990, "Location16990", fmt.Sprintf("%s only supports a string or object argument, not %s", stage, mongoerr.TypeName(v)))
}

// runWriteStage writes the pipeline's output with $out or $merge.
func runWriteStage(r *request, tc *txnCtx, stage bson.D, docs []bson.D) error {
	name := stage[0].Key
	if lvl, _ := bsonkit.Get(r.readConcern, "level"); lvl == "linearizable" {
		return errorf(72, "InvalidOptions", fmt.Sprintf("%s cannot be used with a 'linearizable' read concern level", name))
	}
	if tc.txn != nil {
		return errorf(263, "OperationNotSupportedInTransaction", fmt.Sprintf("%s cannot be used in a transaction", name))
	}
	if name == "$out" {
		ns, err := writeTarget(r, name, stage[0].Value)
		if err != nil {
			return err
		}
		return runOut(r, ns, docs)
	}
	return runMerge(r, tc, stage[0].Value, docs)
}

// runOut replaces the target collection with docs, as mongod does: the
// documents go into a temporary collection with the target's indexes, which
// is then renamed over the target, so readers see the old or the new
// contents, never a mix, and a failure leaves the target as it was.
func runOut(r *request, ns engine.NS, docs []bson.D) error {
	if strings.HasPrefix(ns.Coll, "system.") {
		return errorf(73, "InvalidNamespace", "Invalid $out target namespace, "+ns.String())
	}
	e := r.srv.engine
	tmp := engine.NS{DB: ns.DB, Coll: "tmp.agg_out." + bson.NewObjectID().Hex()}
	if err := e.CreateCollection(r.ctx, tmp); err != nil {
		return convertErr(err)
	}
	ok := false
	defer func() {
		if !ok {
			_, _ = e.DropCollection(r.ctx, tmp)
		}
	}()
	if specs, exists := e.ListIndexes(ns); exists {
		var extra []engine.IndexSpec
		for _, s := range specs {
			if s.Name != "_id_" {
				extra = append(extra, s)
			}
		}
		if len(extra) > 0 {
			if _, _, _, err := e.CreateIndexes(r.ctx, tmp, extra); err != nil {
				return convertErr(err)
			}
		}
	}
	err := e.Write(r.ctx, nil, func(v *engine.View) error {
		for _, d := range docs {
			doc, err := prepareInsert(bsonkit.CopyDoc(d))
			if err != nil {
				return err
			}
			if err := v.Insert(tmp, doc); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return convertErr(err)
	}
	if err := e.RenameCollection(r.ctx, tmp, ns, true); err != nil {
		return convertErr(err)
	}
	ok = true
	return nil
}

// mergeSpec is a parsed $merge stage.
type mergeSpec struct {
	into           engine.NS
	on             []string
	whenMatched    string // replace, keepExisting, merge, fail, pipeline
	matchedPipe    bson.A
	whenNotMatched string // insert, discard, fail
	let            bson.D
}

func parseMerge(r *request, arg any) (*mergeSpec, error) {
	m := &mergeSpec{on: []string{"_id"}, whenMatched: "merge", whenNotMatched: "insert"}
	switch x := arg.(type) {
	case string:
		ns, err := writeTarget(r, "$merge", x)
		if err != nil {
			return nil, err
		}
		m.into = ns
		return m, nil
	case bson.D:
		hasInto := false
		for _, e := range x {
			switch e.Key {
			case "into":
				ns, err := writeTarget(r, "$merge", e.Value)
				if err != nil {
					return nil, err
				}
				m.into, hasInto = ns, true
			case "on":
				switch on := e.Value.(type) {
				case string:
					m.on = []string{on}
				case bson.A:
					m.on = nil
					for _, f := range on {
						s, ok := f.(string)
						if !ok {
							return nil, errorf(51134, "Location51134", "$merge 'on' array elements must be strings, but found "+mongoerr.TypeName(f))
						}
						m.on = append(m.on, s)
					}
					if len(m.on) == 0 {
						return nil, errorf(51187, "Location51187", "If explicitly specifying $merge 'on', must include at least one field")
					}
				default:
					return nil, errorf(51186, "Location51186", "$merge 'on' field must be either a string or an array of strings, but found "+mongoerr.TypeName(e.Value))
				}
			case "whenMatched":
				switch wm := e.Value.(type) {
				case string:
					switch wm {
					case "replace", "keepExisting", "merge", "fail":
						m.whenMatched = wm
					default:
						return nil, errorf(2, "BadValue", "Enumeration value '"+wm+"' for field '$merge.whenMatched' is not a valid value.")
					}
				case bson.A:
					m.whenMatched, m.matchedPipe = "pipeline", wm
				default:
					return nil, wrongType("$merge.whenMatched", e.Value, "string or array")
				}
			case "whenNotMatched":
				s, _ := e.Value.(string)
				switch s {
				case "insert", "discard", "fail":
					m.whenNotMatched = s
				default:
					return nil, errorf(2, "BadValue", fmt.Sprintf("Enumeration value '%v' for field '$merge.whenNotMatched' is not a valid value.", e.Value))
				}
			case "let":
				d, ok := e.Value.(bson.D)
				if !ok {
					return nil, wrongType("$merge.let", e.Value, "object")
				}
				m.let = d
			case "targetCollectionVersion":
			default:
				return nil, errorf(40415, "Location40415", "BSON field '$merge."+e.Key+"' is an unknown field.")
			}
		}
		if !hasInto {
			return nil, errorf(40414, "Location40414", "BSON field '$merge.into' is missing but a required field")
		}
		if m.let != nil && m.whenMatched != "pipeline" {
			return nil, errorf(51199, "Location51199", "Cannot use 'let' variables with 'whenMatched: "+m.whenMatched+"' mode")
		}
		return m, nil
	}
	return nil, errorf(51182, "Location51182", "$merge only supports a string or object argument, not "+mongoerr.TypeName(arg))
}

// checkMergeOn requires a unique index on exactly the 'on' fields, as
// mongod does, unless 'on' is _id.
func checkMergeOn(r *request, m *mergeSpec) error {
	if len(m.on) == 1 && m.on[0] == "_id" {
		return nil
	}
	specs, _ := r.srv.engine.ListIndexes(m.into)
	for _, s := range specs {
		if !s.Unique || s.PartialFilter != nil || len(s.Key) != len(m.on) {
			continue
		}
		all := true
		for _, k := range s.Key {
			if !slices.Contains(m.on, k.Key) {
				all = false
				break
			}
		}
		if all {
			return nil
		}
	}
	return errorf(51183, "Location51183", "Cannot find index to verify that join fields will be unique")
}

// runMerge writes each document into the target as $merge's modes say.
// Each document is its own write, as on mongod: a failure leaves the
// documents before it written.
func runMerge(r *request, tc *txnCtx, arg any, docs []bson.D) error {
	m, err := parseMerge(r, arg)
	if err != nil {
		return err
	}
	if err := checkMergeOn(r, m); err != nil {
		return err
	}
	byID := len(m.on) == 1 && m.on[0] == "_id"
	// Read the clock before the writes: the engine's lock is held inside them.
	env := pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars}
	for _, src := range docs {
		src = bsonkit.CopyDoc(src)
		filter := bson.D{}
		for _, f := range m.on {
			v, ok := bsonkit.Get(src, f)
			if !ok && f == "_id" {
				v = bson.NewObjectID()
				src = append(bson.D{{Key: "_id", Value: v}}, src...)
				ok = true
			}
			switch v.(type) {
			case nil, bson.A, bson.Undefined:
				ok = false
			}
			if !ok {
				return errorf(51132, "Location51132", "$merge write error: 'on' field '"+f+"' cannot be missing, null, undefined or an array")
			}
			filter = append(filter, bson.E{Key: f, Value: bson.D{{Key: "$eq", Value: v}}})
		}
		q, err := compileFilter(filter, nil, nil)
		if err != nil {
			return err
		}
		q.Limit = 2
		err = runWrite(r, tc, func(v *engine.View) error {
			found, err := v.Find(m.into, q)
			if err != nil {
				return err
			}
			if len(found) > 1 {
				return errorf(51132, "Location51132", "$merge write error: 'on' fields match more than one document")
			}
			if len(found) == 0 {
				switch m.whenNotMatched {
				case "discard":
					return nil
				case "fail":
					return errorf(13113, "MergeStageNoMatchingDocument", "$merge could not find a matching document in the target collection for at least one document in the source collection")
				}
				doc, err := prepareInsert(src)
				if err != nil {
					return err
				}
				return v.Insert(m.into, doc)
			}
			old := found[0]
			oldID, _ := bsonkit.Get(old, "_id")
			var nd bson.D
			switch m.whenMatched {
			case "keepExisting":
				return nil
			case "fail":
				// The insert fails with the duplicate key error mongod reports.
				doc, err := prepareInsert(src)
				if err != nil {
					return err
				}
				if !byID {
					return errorf(11000, "DuplicateKey", "$merge failed: a document matched the 'on' fields")
				}
				return v.Insert(m.into, doc)
			case "replace":
				nd = src
			case "merge":
				nd = bsonkit.CopyDoc(old)
				for _, e := range src {
					if i := slices.IndexFunc(nd, func(x bson.E) bool { return x.Key == e.Key }); i >= 0 {
						nd[i].Value = e.Value
					} else {
						nd = append(nd, e)
					}
				}
			case "pipeline":
				vars, err := mergeVars(env, m.let, src)
				if err != nil {
					return err
				}
				u, err := update.ParseWithVars(m.matchedPipe, vars)
				if err != nil {
					return err
				}
				if nd, err = u.Apply(old, update.ApplyOptions{Now: env.Now}); err != nil {
					return err
				}
			}
			if newID, ok := bsonkit.Get(nd, "_id"); ok && !bsonkit.Equal(newID, oldID) {
				return errorf(66, "ImmutableField", "$merge failed to update the matching document, did you attempt to modify the _id or the shard key?")
			}
			nd = removeKey(nd, "_id")
			nd = append(bson.D{{Key: "_id", Value: oldID}}, nd...)
			if bsonkit.Equal(old, nd) && sameFieldTypes(old, nd) {
				return nil
			}
			if err := checkStorable(nd); err != nil {
				return err
			}
			return v.Update(m.into, nd, nil)
		})
		if err != nil {
			return convertErr(err)
		}
	}
	return nil
}

// mergeVars evaluates $merge's let against the source document; without
// let, $$new is the source document.
func mergeVars(env pipeline.Env, let bson.D, src bson.D) (bson.D, error) {
	if let == nil {
		return bson.D{{Key: "new", Value: src}}, nil
	}
	out := bson.D{}
	for _, e := range let {
		if err := checkVarName(e.Key); err != nil {
			return nil, err
		}
		v, err := pipeline.Eval(e.Value, src, env)
		if err != nil {
			return nil, convertErr(err)
		}
		out = append(out, bson.E{Key: e.Key, Value: v})
	}
	return out, nil
}

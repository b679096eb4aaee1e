package mongofake

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
	"github.com/event-outbox/outbox/mongox/internal/query"
	"github.com/event-outbox/outbox/mongox/internal/update"
)

func init() {
	register(
		commandSpec{names: []string{"insert"}, handler: dataCommand(cmdInsert)},
		commandSpec{names: []string{"update"}, handler: dataCommand(cmdUpdate)},
		commandSpec{names: []string{"delete"}, handler: dataCommand(cmdDelete)},
		commandSpec{names: []string{"findAndModify", "findandmodify"}, handler: dataCommand(cmdFindAndModify)},
		commandSpec{names: []string{"count"}, handler: dataCommand(cmdCount)},
		commandSpec{names: []string{"distinct"}, handler: dataCommand(cmdDistinct)},
	)
}

// statements returns the array argument of a write command (insert
// documents, update updates, delete deletes).
func statements(r *request, key string) (bson.A, error) {
	v, ok := r.get(key)
	if !ok {
		return nil, errorf(40414, "Location40414", fmt.Sprintf("BSON field '%s.%s' is missing but a required field", r.name, key))
	}
	a, ok := v.(bson.A)
	if !ok {
		return nil, wrongType(r.name+"."+key, v, "array")
	}
	if len(a) > 100000 {
		return nil, errorf(10, "InvalidLength", "Write batch sizes must be between 1 and 100000")
	}
	return a, nil
}

// prepareInsert gives a document an _id (first) and validates it.
func prepareInsert(v any) (bson.D, error) {
	doc, ok := v.(bson.D)
	if !ok {
		return nil, errorf(14, "TypeMismatch", "insert documents must be objects")
	}
	idx := slices.IndexFunc(doc, func(e bson.E) bool { return e.Key == "_id" })
	switch {
	case idx < 0:
		doc = append(bson.D{{Key: "_id", Value: bson.NewObjectID()}}, doc...)
	case idx > 0:
		id := doc[idx]
		rest := slices.Delete(slices.Clone(doc), idx, idx+1)
		doc = append(bson.D{id}, rest...)
	}
	if err := checkStorable(doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// checkStorable rejects what a stored document may not hold. Field names
// starting with '$' or containing '.' are allowed anywhere but inside _id,
// as on MongoDB 5.0+.
func checkStorable(doc bson.D) error {
	if id, ok := bsonkit.Get(doc, "_id"); ok {
		switch x := id.(type) {
		case bson.A:
			return errorf(53, "InvalidIdField", "The '_id' value cannot be of type array")
		case bson.Regex:
			return errorf(53, "InvalidIdField", "can't use a regex for _id")
		case bson.D:
			for _, e := range x {
				if strings.HasPrefix(e.Key, "$") {
					return errorf(52, "DollarPrefixedFieldName", "_id fields may not contain '$'-prefixed fields: "+e.Key)
				}
			}
		}
	}
	return nil
}

// runWrite runs one statement: in the transaction, or auto-committed. A
// statement of a retryable write passes the onPrimaryTransactionalWrite fail
// point after it ran and before it commits.
func runWrite(r *request, tc *txnCtx, fn func(v *engine.View) error) error {
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return err
	}
	defer cancel()
	if !tc.retryable {
		return r.srv.engine.Write(ctx, tc.txn, fn)
	}
	var fp *failPoint
	checked := false // a statement that blocked runs fn again: fire once
	return r.srv.engine.Write(ctx, tc.txn, func(v *engine.View) error {
		if err := fn(v); err != nil {
			return err
		}
		if !checked {
			checked = true
			fp = r.srv.fp.fire(fpTransactionalWrite)
		}
		if fp == nil {
			return nil
		}
		if fp.closeConnection {
			r.dropConn = true
		}
		if fp.failBeforeCommit != 0 {
			r.noRetryRecord = true
			return errorf(fp.failBeforeCommit, mongoerr.CodeName(fp.failBeforeCommit),
				fmt.Sprintf("Failing write for txnNumber %d due to failpoint. The write must not be reflected.", *r.txnNumber))
		}
		return nil
	})
}

func cmdInsert(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "documents", "ordered", "bypassDocumentValidation", "let", "stmtIds", "stmtId"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	docs, err := statements(r, "documents")
	if err != nil {
		return nil, err
	}
	ordered, err := r.boolArg("ordered", true)
	if err != nil {
		return nil, err
	}
	var werrs bson.A
	n := 0
	for i, raw := range docs {
		doc, err := prepareInsert(raw)
		if err == nil {
			err = runWrite(r, tc, func(v *engine.View) error {
				// A fresh top-level copy per attempt: the engine fills empty
				// timestamps in place, and a blocked statement runs again.
				return v.Insert(ns, slices.Clone(doc))
			})
		}
		if err != nil {
			if isCommandLevel(err) && (n == 0 || tc.txn != nil) {
				return nil, err
			}
			werrs = append(werrs, writeError(i, err))
			if ordered || tc.txn != nil {
				break
			}
			continue
		}
		n++
	}
	return writeReply(n, werrs), nil
}

func writeReply(n int, werrs bson.A, extra ...bson.E) bson.D {
	out := bson.D{{Key: "n", Value: int32(n)}}
	out = append(out, extra...)
	if len(werrs) > 0 {
		out = append(out, bson.E{Key: "writeErrors", Value: werrs})
	}
	return out
}

// updateSpec is one parsed update statement.
type updateSpec struct {
	filter       bson.D
	q            engine.Query
	u            *update.Update
	upsert       bool
	multi        bool
	arrayFilters []bson.D
	coll         *bsonkit.Collation // nil: simple
}

func parseUpdateStmt(raw any, multiAllowed bool, vars bson.D) (*updateSpec, error) {
	st, ok := raw.(bson.D)
	if !ok {
		return nil, errorf(14, "TypeMismatch", "update statements must be objects")
	}
	s := &updateSpec{}
	var uArg any
	hasU := false
	for _, e := range st {
		switch e.Key {
		case "q":
			d, ok := e.Value.(bson.D)
			if !ok {
				return nil, wrongType("update.updates.q", e.Value, "object")
			}
			s.filter = d
		case "u":
			uArg, hasU = e.Value, true
		case "upsert":
			b, err := truthy(e.Value, "update.updates.upsert")
			if err != nil {
				return nil, err
			}
			s.upsert = b
		case "multi":
			b, err := truthy(e.Value, "update.updates.multi")
			if err != nil {
				return nil, err
			}
			s.multi = b
		case "arrayFilters":
			a, ok := e.Value.(bson.A)
			if !ok {
				return nil, wrongType("update.updates.arrayFilters", e.Value, "array")
			}
			for _, f := range a {
				d, ok := f.(bson.D)
				if !ok {
					return nil, wrongType("update.updates.arrayFilters", f, "object")
				}
				s.arrayFilters = append(s.arrayFilters, d)
			}
		case "collation":
			c, err := collationArg(e.Value)
			if err != nil {
				return nil, err
			}
			s.coll = c
		case "hint", "upsertSupplied":
		case "c":
			c, ok := e.Value.(bson.D)
			if !ok {
				return nil, wrongType("update.updates.c", e.Value, "object")
			}
			// Statement constants, literal values that shadow let.
			vars = append(slices.Clone(vars), c...)
		default:
			return nil, errorf(40415, "Location40415", fmt.Sprintf("BSON field 'update.updates.%s' is an unknown field.", e.Key))
		}
	}
	if !hasU {
		return nil, errorf(40414, "Location40414", "BSON field 'update.updates.u' is missing but a required field")
	}
	u, err := update.ParseWithVars(uArg, vars)
	if err != nil {
		return nil, err
	}
	s.u = u
	if s.multi && u.IsReplacement() {
		return nil, errorf(9, "FailedToParse", "multi update is not supported for replacement-style update")
	}
	q, err := compileFilter(s.filter, vars, s.coll)
	if err != nil {
		return nil, err
	}
	s.q = q
	return s, nil
}

// checkUpdateStages fails the whole update command when a pipeline-style
// update names a stage MongoDB does not have: mongod parses the stage
// names of every statement with the command (40324), before any statement
// runs, while a known stage that updates do not allow fails only its
// statement.
func checkUpdateStages(stmts bson.A) error {
	for _, raw := range stmts {
		st, _ := raw.(bson.D)
		stages, _ := lookupD(st, "u").(bson.A)
		for _, s := range stages {
			if name := stageName(s); name != "" && !pipeline.KnownStage(name) {
				return errorf(40324, "Location40324", fmt.Sprintf("Unrecognized pipeline stage name: '%s'", name))
			}
		}
	}
	return nil
}

// updateResult is the outcome of one update statement.
type updateResult struct {
	matched, modified int
	upsertedID        any
	upserted          bool
	before, after     bson.D // of the (first) document
}

// applyUpdate runs one update statement inside a view.
func applyUpdate(v *engine.View, ns engine.NS, s *updateSpec, now time.Time, sortFirst *query.Sort) (*updateResult, error) {
	res := &updateResult{}
	q := s.q
	if !s.multi && sortFirst == nil {
		q.Limit = 1
	}
	docs, err := v.Find(ns, q)
	if err != nil {
		return nil, err
	}
	if sortFirst != nil && len(docs) > 1 {
		docs = sortSkipLimitColl(docs, sortFirst, 0, 1, s.coll)
	}
	if !s.multi && len(docs) > 1 {
		docs = docs[:1]
	}
	if len(docs) == 0 {
		if !s.upsert {
			return res, nil
		}
		seed, err := update.UpsertSeed(s.filter)
		if err != nil {
			return nil, err
		}
		var doc bson.D
		if s.u.IsReplacement() {
			doc, err = s.u.Apply(bson.D{}, update.ApplyOptions{IsInsert: true, Now: now})
			if err == nil {
				if id, ok := bsonkit.Get(seed, "_id"); ok {
					if _, has := bsonkit.Get(doc, "_id"); !has {
						doc = append(bson.D{{Key: "_id", Value: id}}, doc...)
					}
				}
			}
		} else {
			doc, err = s.u.Apply(seed, update.ApplyOptions{IsInsert: true, Now: now, ArrayFilters: s.arrayFilters})
		}
		if err != nil {
			return nil, err
		}
		doc, err = prepareInsert(doc)
		if err != nil {
			return nil, err
		}
		if err := v.Insert(ns, doc); err != nil {
			return nil, err
		}
		res.upserted = true
		res.upsertedID, _ = bsonkit.Get(doc, "_id")
		res.after = doc
		return res, nil
	}
	for i, old := range docs {
		nd, err := s.u.Apply(old, update.ApplyOptions{Now: now, ArrayFilters: s.arrayFilters, Query: s.filter})
		if err != nil {
			return nil, err
		}
		res.matched++
		if i == 0 {
			res.before, res.after = old, nd
		}
		if bsonkit.Equal(old, nd) && sameFieldTypes(old, nd) {
			continue
		}
		if err := checkStorable(nd); err != nil {
			return nil, err
		}
		var desc *engine.UpdateDescription
		if !s.u.IsReplacement() {
			dd := update.DiffDescription(old, nd)
			desc = &engine.UpdateDescription{UpdatedFields: dd.Updated, RemovedFields: dd.Removed, DisambiguatedPaths: dd.Disambiguated}
			for _, tr := range dd.Truncated {
				desc.TruncatedArrays = append(desc.TruncatedArrays, bson.D{{Key: "field", Value: tr.Field}, {Key: "newSize", Value: tr.NewSize}})
			}
		}
		if err := v.Update(ns, nd, desc); err != nil {
			return nil, err
		}
		res.modified++
	}
	return res, nil
}

// sameFieldTypes reports whether two equal documents also keep their field
// names and value types (so {$set: {a: 1.0}} over a: 1 is a modification).
func sameFieldTypes(a, b bson.D) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || fmt.Sprintf("%T", a[i].Value) != fmt.Sprintf("%T", b[i].Value) {
			return false
		}
		if da, ok := a[i].Value.(bson.D); ok {
			if !sameFieldTypes(da, b[i].Value.(bson.D)) {
				return false
			}
		}
	}
	return true
}

func cmdUpdate(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "updates", "ordered", "bypassDocumentValidation", "let", "stmtIds", "stmtId"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	stmts, err := statements(r, "updates")
	if err != nil {
		return nil, err
	}
	ordered, err := r.boolArg("ordered", true)
	if err != nil {
		return nil, err
	}
	if err := checkUpdateStages(stmts); err != nil {
		return nil, err
	}
	var werrs, upserted bson.A
	n, nModified := 0, 0
	now := r.srv.engine.Now()
	for i, raw := range stmts {
		s, err := parseUpdateStmt(raw, true, r.vars)
		if ce, ok := err.(*cmdError); ok && ce.Code == 40415 {
			// The command's parser rejects unknown statement fields (like
			// 'sort', new in 8.0) before any statement runs.
			return nil, err
		}
		var res *updateResult
		if err == nil {
			err = runWrite(r, tc, func(v *engine.View) error {
				var err error
				res, err = applyUpdate(v, ns, s, now, nil)
				return err
			})
		}
		if err != nil {
			if isCommandLevel(err) && ((n == 0 && len(werrs) == 0) || tc.txn != nil) {
				return nil, err
			}
			werrs = append(werrs, writeError(i, err))
			if ordered || tc.txn != nil {
				break
			}
			continue
		}
		if res.upserted {
			n++
			upserted = append(upserted, bson.D{{Key: "index", Value: int32(i)}, {Key: "_id", Value: res.upsertedID}})
		} else {
			n += res.matched
			nModified += res.modified
		}
	}
	extra := []bson.E{{Key: "nModified", Value: int32(nModified)}}
	if len(upserted) > 0 {
		extra = append(extra, bson.E{Key: "upserted", Value: upserted})
	}
	return writeReply(n, werrs, extra...), nil
}

func cmdDelete(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "deletes", "ordered", "let", "stmtIds", "stmtId"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	stmts, err := statements(r, "deletes")
	if err != nil {
		return nil, err
	}
	ordered, err := r.boolArg("ordered", true)
	if err != nil {
		return nil, err
	}
	var werrs bson.A
	n := 0
	for i, raw := range stmts {
		var q engine.Query
		var limit int64
		err := func() error {
			st, ok := raw.(bson.D)
			if !ok {
				return errorf(14, "TypeMismatch", "delete statements must be objects")
			}
			var filter bson.D
			var coll *bsonkit.Collation
			hasLimit := false
			for _, e := range st {
				switch e.Key {
				case "q":
					d, ok := e.Value.(bson.D)
					if !ok {
						return wrongType("delete.deletes.q", e.Value, "object")
					}
					filter = d
				case "limit":
					l, ok := toInt(e.Value)
					if !ok || (l != 0 && l != 1) {
						return errorf(9, "FailedToParse", fmt.Sprintf("The limit field in delete objects must be 0 or 1. Got %v", e.Value))
					}
					limit, hasLimit = l, true
				case "collation":
					c, err := collationArg(e.Value)
					if err != nil {
						return err
					}
					coll = c
				case "hint":
				default:
					return errorf(40415, "Location40415", fmt.Sprintf("BSON field 'delete.deletes.%s' is an unknown field.", e.Key))
				}
			}
			if !hasLimit {
				return errorf(40414, "Location40414", "BSON field 'delete.deletes.limit' is missing but a required field")
			}
			var err error
			q, err = compileFilter(filter, r.vars, coll)
			q.Limit = int(limit)
			return err
		}()
		deleted := 0
		if err == nil {
			err = runWrite(r, tc, func(v *engine.View) error {
				deleted = 0
				docs, err := v.Find(ns, q)
				if err != nil {
					return err
				}
				for _, d := range docs {
					id, _ := bsonkit.Get(d, "_id")
					ok, err := v.Delete(ns, id)
					if err != nil {
						return err
					}
					if ok {
						deleted++
					}
				}
				return nil
			})
		}
		if err != nil {
			if isCommandLevel(err) && ((n == 0 && len(werrs) == 0) || tc.txn != nil) {
				return nil, err
			}
			werrs = append(werrs, writeError(i, err))
			if ordered || tc.txn != nil {
				break
			}
			continue
		}
		n += deleted
	}
	return writeReply(n, werrs), nil
}

func cmdFindAndModify(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "query", "sort", "remove", "update", "new", "fields", "upsert",
		"bypassDocumentValidation", "collation", "arrayFilters", "hint", "let", "stmtId"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	filter, err := r.docArg("query")
	if err != nil {
		return nil, err
	}
	sortSpec, err := r.docArg("sort")
	if err != nil {
		return nil, err
	}
	fields, err := r.docArg("fields")
	if err != nil {
		return nil, err
	}
	remove, err := r.boolArg("remove", false)
	if err != nil {
		return nil, err
	}
	returnNew, err := r.boolArg("new", false)
	if err != nil {
		return nil, err
	}
	upsert, err := r.boolArg("upsert", false)
	if err != nil {
		return nil, err
	}
	collV, _ := r.get("collation")
	coll, err := collationArg(collV)
	if err != nil {
		return nil, err
	}
	uArg, hasUpdate := r.get("update")
	if remove == hasUpdate {
		return nil, errorf(9, "FailedToParse", "Either an update or remove=true must be specified")
	}
	if remove && (upsert || returnNew) {
		return nil, errorf(9, "FailedToParse", "Cannot specify both an upsert or new=true with remove=true")
	}
	var srt *query.Sort
	if len(sortSpec) > 0 {
		if srt, err = query.CompileSort(sortSpec); err != nil {
			return nil, err
		}
	}
	proj, err := compileProjection(r, fields, filter)
	if err != nil {
		return nil, err
	}
	stmt := bson.D{{Key: "q", Value: orEmpty(filter)}, {Key: "upsert", Value: upsert}}
	if hasUpdate {
		stmt = append(stmt, bson.E{Key: "u", Value: uArg})
	}
	if af, ok := r.get("arrayFilters"); ok {
		stmt = append(stmt, bson.E{Key: "arrayFilters", Value: af})
	}
	if collV != nil {
		stmt = append(stmt, bson.E{Key: "collation", Value: collV})
	}
	var value any
	lastErr := bson.D{}
	now := r.srv.engine.Now()
	if remove {
		q, err := compileFilter(filter, r.vars, coll)
		if err != nil {
			return nil, err
		}
		err = runWrite(r, tc, func(v *engine.View) error {
			value, lastErr = nil, bson.D{{Key: "n", Value: int32(0)}}
			if srt == nil {
				q.Limit = 1
			}
			docs, err := v.Find(ns, q)
			if err != nil {
				return err
			}
			docs = sortSkipLimitColl(docs, srt, 0, 1, coll)
			if len(docs) == 0 {
				return nil
			}
			id, _ := bsonkit.Get(docs[0], "_id")
			if _, err := v.Delete(ns, id); err != nil {
				return err
			}
			value = docs[0]
			lastErr = bson.D{{Key: "n", Value: int32(1)}}
			return nil
		})
		if err != nil {
			return nil, err
		}
	} else {
		s, err := parseUpdateStmt(stmt, false, r.vars)
		if err != nil {
			return nil, err
		}
		err = runWrite(r, tc, func(v *engine.View) error {
			res, err := applyUpdate(v, ns, s, now, srt)
			if err != nil {
				return err
			}
			value = nil
			switch {
			case res.upserted:
				lastErr = bson.D{{Key: "n", Value: int32(1)}, {Key: "updatedExisting", Value: false}, {Key: "upserted", Value: res.upsertedID}}
				if returnNew {
					value = res.after
				}
			case res.matched > 0:
				lastErr = bson.D{{Key: "n", Value: int32(1)}, {Key: "updatedExisting", Value: true}}
				if returnNew {
					value = res.after
				} else {
					value = res.before
				}
			default:
				lastErr = bson.D{{Key: "n", Value: int32(0)}, {Key: "updatedExisting", Value: false}}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if d, ok := value.(bson.D); ok && proj != nil {
		value = proj(d)
	}
	return bson.D{{Key: "lastErrorObject", Value: lastErr}, {Key: "value", Value: value}}, nil
}

func orEmpty(d bson.D) bson.D {
	if d == nil {
		return bson.D{}
	}
	return d
}

func cmdCount(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "query", "limit", "skip", "hint", "collation", "fields"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	filter, err := r.docArg("query")
	if err != nil {
		return nil, err
	}
	collV, _ := r.get("collation")
	coll, err := collationArg(collV)
	if err != nil {
		return nil, err
	}
	limit, _, err := r.intArg("limit")
	if err != nil {
		return nil, err
	}
	skip, _, err := r.intArg("skip")
	if err != nil {
		return nil, err
	}
	if skip < 0 {
		return nil, errorf(2, "BadValue", "skip value is negative in count query")
	}
	if limit < 0 {
		limit = -limit
	}
	q, err := compileFilter(filter, r.vars, coll)
	if err != nil {
		return nil, err
	}
	var n int64
	err = r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
		docs, err := v.Find(ns, q)
		n = int64(len(docs))
		return err
	})
	if err != nil {
		return nil, err
	}
	n = max(n-skip, 0)
	if limit > 0 {
		n = min(n, limit)
	}
	return bson.D{{Key: "n", Value: int32(n)}}, nil
}

func cmdDistinct(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "key", "query", "collation", "hint"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	kv, _ := r.get("key")
	key, ok := kv.(string)
	if !ok {
		return nil, wrongType("distinct.key", kv, "string")
	}
	filter, err := r.docArg("query")
	if err != nil {
		return nil, err
	}
	collV, _ := r.get("collation")
	coll, err := collationArg(collV)
	if err != nil {
		return nil, err
	}
	q, err := compileFilter(filter, r.vars, coll)
	if err != nil {
		return nil, err
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
	seen := map[string]bool{}
	values := bson.A{}
	add := func(x any) {
		// Collation-equal values are one distinct value: the first seen.
		k := bsonkit.Key(coll.Value(x))
		if !seen[k] {
			seen[k] = true
			values = append(values, x)
		}
	}
	for _, d := range docs {
		for _, x := range distinctValues(d, strings.Split(key, ".")) {
			add(x)
		}
	}
	slices.SortStableFunc(values, func(a, b any) int { return bsonkit.Compare(coll.Value(a), coll.Value(b)) })
	return bson.D{{Key: "values", Value: values}}, nil
}

// distinctValues collects the values at a dotted path, unwinding arrays.
func distinctValues(cur any, parts []string) []any {
	if len(parts) == 0 {
		if a, ok := cur.(bson.A); ok {
			return a
		}
		return []any{cur}
	}
	switch c := cur.(type) {
	case bson.D:
		v, ok := bsonkit.Get(c, parts[0])
		if !ok {
			return nil
		}
		return distinctValues(v, parts[1:])
	case bson.A:
		var out []any
		for _, el := range c {
			if d, ok := el.(bson.D); ok {
				out = append(out, distinctValues(d, parts)...)
			}
		}
		return out
	}
	return nil
}

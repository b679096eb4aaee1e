package mongofake

import (
	"cmp"
	"context"
	"errors"
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
)

func init() {
	register(
		commandSpec{names: []string{"find"}, handler: dataCommand(cmdFind)},
		commandSpec{names: []string{"getMore"}, handler: dataCommand(cmdGetMore)},
		commandSpec{names: []string{"killCursors"}, handler: dataCommand(cmdKillCursors)},
	)
}

const defaultFirstBatch = 101

// cursor is an open server cursor: the remaining documents of a query
// (materialized when it ran), or a change stream.
type cursor struct {
	id      int64
	ns      string // "db.coll" as replies show it
	docs    []bson.D
	proj    func(bson.D) bson.D
	limit   int    // documents still allowed (0: no limit)
	session string // key of the owning session ("" for none)
	// sessionName is the owning session's id as error messages show it.
	sessionName string
	// txnNumber is the transaction the cursor was opened in, nil outside
	// one: getMore must come from the same transaction.
	txnNumber *int64
	lastUse   time.Time
	stream    *changeStream
	tail      *tailState // set on a tailable cursor
	busy      bool
}

// addCursor registers a cursor and returns its id.
func (d *dataState) addCursor(c *cursor) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextCursor++
	c.id = d.nextCursor<<8 | int64(time.Now().UnixNano()&0xff)
	c.lastUse = time.Now()
	d.cursors[c.id] = c
	return c.id
}

// takeBatch removes up to n documents (0: no count limit) from the cursor,
// within the reply size cap, with the projection applied.
func (c *cursor) takeBatch(n int) bson.A {
	if c.limit > 0 && (n == 0 || n > c.limit) {
		n = c.limit
	}
	out := bson.A{}
	size := 0
	for len(c.docs) > 0 && (n == 0 || len(out) < n) {
		d := c.docs[0]
		if c.proj != nil {
			d = c.proj(d)
		}
		s := bsonkit.Size(d)
		if len(out) > 0 && size+s > maxBSONSize-16*1024 {
			break
		}
		size += s
		out = append(out, d)
		c.docs[0] = nil
		c.docs = c.docs[1:]
	}
	if c.limit > 0 {
		c.limit -= len(out)
		if c.limit == 0 {
			c.docs = nil
		}
	}
	return out
}

func cursorReply(id int64, ns string, key string, batch bson.A, extra ...bson.E) bson.D {
	cur := bson.D{{Key: key, Value: batch}, {Key: "id", Value: id}, {Key: "ns", Value: ns}}
	cur = append(cur, extra...)
	return bson.D{{Key: "cursor", Value: cur}}
}

// batchSizeArg reads a non-negative batchSize from a document.
func batchSizeArg(d bson.D, field string) (int, bool, error) {
	v, ok := lookup(d, "batchSize")
	if !ok || v == nil {
		return 0, false, nil
	}
	n, ok := toInt(v)
	if !ok || n < 0 {
		return 0, false, errorf(51024, "Location51024", fmt.Sprintf("BSON field '%s' value must be >= 0, actual value '%v'", field, v))
	}
	return int(n), true, nil
}

func lookup(d bson.D, key string) (any, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case float64:
		return int64(x), x == float64(int64(x))
	}
	return 0, false
}

// takeFirstBatch takes a query's first batch: batchSize documents when
// given (none for 0), defaultFirstBatch otherwise.
func (c *cursor) takeFirstBatch(batchSize int, hasBatch bool) bson.A {
	n := defaultFirstBatch
	if hasBatch {
		n = batchSize
	}
	batch := c.takeBatch(n)
	if hasBatch && batchSize == 0 {
		batch = bson.A{}
	}
	return batch
}

// firstBatch sends the first batch of a query result and keeps a cursor
// for the rest.
func (d *dataState) firstBatch(r *request, tc *txnCtx, ns engine.NS, docs []bson.D, proj func(bson.D) bson.D,
	batchSize int, hasBatch bool, limit int, single bool) bson.D {
	c := &cursor{ns: ns.String(), docs: docs, proj: proj, limit: limit}
	batch := c.takeFirstBatch(batchSize, hasBatch)
	var id int64
	if len(c.docs) > 0 && !single {
		c.setOwner(r, tc)
		id = d.addCursor(c)
	}
	return cursorReply(id, ns.String(), "firstBatch", batch)
}

func cmdFind(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "filter", "sort", "projection", "skip", "limit", "batchSize", "singleBatch",
		"hint", "collation", "allowDiskUse", "noCursorTimeout", "allowPartialResults", "let", "max", "min",
		"returnKey", "showRecordId", "tailable", "awaitData", "oplogReplay", "readOnce", "$_requestResumeToken",
		"$_resumeAfter", "ntoreturn", "exhaust"); err != nil {
		return nil, err
	}
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	if b, _ := r.boolArg("exhaust", false); b {
		return nil, errorf(238, "NotImplemented", "mongofake: find option 'exhaust' is not supported")
	}
	keys, err := keyArgs(r)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"min", "max"} {
		if v, ok := r.get(f); ok && v != nil {
			return nil, errorf(238, "NotImplemented", "mongofake: find option '"+f+"' is not supported")
		}
	}
	collV, _ := r.get("collation")
	coll, err := collationArg(collV)
	if err != nil {
		return nil, err
	}
	filter, err := r.docArg("filter")
	if err != nil {
		return nil, err
	}
	sortSpec, err := r.docArg("sort")
	if err != nil {
		return nil, err
	}
	projSpec, err := r.docArg("projection")
	if err != nil {
		return nil, err
	}
	skip, _, err := r.intArg("skip")
	if err != nil {
		return nil, err
	}
	if skip < 0 {
		return nil, errorf(51024, "Location51024", "BSON field 'skip' value must be >= 0, actual value '"+fmt.Sprint(skip)+"'")
	}
	limit, _, err := r.intArg("limit")
	if err != nil {
		return nil, err
	}
	batchSize, hasBatch, err := batchSizeArg(r.cmd, "batchSize")
	if err != nil {
		return nil, err
	}
	single, err := r.boolArg("singleBatch", false)
	if err != nil {
		return nil, err
	}
	if limit < 0 { // legacy negative limit: one batch
		limit, single = -limit, true
		if !hasBatch || batchSize > int(limit) {
			batchSize, hasBatch = int(limit), true
		}
	}
	tailable, await, err := tailableArgs(r, sortSpec, single)
	if err != nil {
		return nil, err
	}
	if isOplogNS(ns) {
		return findOplog(r, tc, ns, filter, sortSpec, projSpec, skip, limit, batchSize, hasBatch, single)
	}
	q, err := compileFilter(filter, r.vars, coll)
	if err != nil {
		return nil, err
	}
	proj, err := compileProjection(r, projSpec, filter)
	if err != nil {
		return nil, err
	}
	if tailable {
		return findTailable(r, tc, ns, q.Match, proj, batchSize, hasBatch, skip, limit, await)
	}
	natural, isNatural, err := naturalSort(sortSpec)
	if err != nil {
		return nil, err
	}
	var srt *query.Sort
	if len(sortSpec) > 0 && !isNatural {
		if srt, err = query.CompileSort(sortSpec); err != nil {
			return nil, err
		}
	}
	if srt == nil && natural != -1 && skip == 0 && limit > 0 {
		q.Limit = int(limit)
	}
	var docs []bson.D
	err = r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
		if keys.showRecordID {
			docs = keys.records(v.FindRecords(ns, q))
			return nil
		}
		var err error
		docs, err = v.Find(ns, q)
		return err
	})
	if err != nil {
		return nil, err
	}
	if natural == -1 {
		slices.Reverse(docs)
	}
	if keys.returnKey {
		if err := keys.choose(r, ns, docs, filter, sortSpec); err != nil {
			return nil, err
		}
	}
	docs = sortSkipLimitColl(docs, srt, skip, limit, coll)
	if keys.any() {
		docs, proj = keys.render(docs, proj), nil
	}
	return r.srv.data.firstBatch(r, tc, ns, docs, proj, batchSize, hasBatch, 0, single), nil
}

// naturalSort recognises a sort on $natural alone, the collection's natural
// (insertion) order: dir is 1 or -1 when isNatural. Other directions fail
// as in mongod.
func naturalSort(spec bson.D) (dir int64, isNatural bool, err error) {
	if len(spec) != 1 || spec[0].Key != "$natural" {
		return 0, false, nil
	}
	dir, ok := toInt(spec[0].Value)
	if !ok || (dir != 1 && dir != -1) {
		return 0, false, errorf(2, "BadValue", "$natural sort cannot be set to a value other than -1 or 1")
	}
	return dir, true, nil
}

// sortSkipLimitColl orders, skips and limits a result, strings ordered by
// a collation (nil: binary order). Documents that tie on the sort keep
// their order in docs (a stable sort).
func sortSkipLimitColl(docs []bson.D, srt *query.Sort, skip, limit int64, coll *bsonkit.Collation) []bson.D {
	if srt != nil && len(docs) > 1 {
		if limit > 0 && skip < int64(len(docs)) && skip+limit < int64(len(docs)) {
			// Only the first skip+limit in sort order are returned: keep
			// those alone, so a small limit over many matches costs a
			// comparison per match rather than a sort of them all.
			docs = sortFirst(docs, srt, int(skip+limit), coll)
		} else {
			sortStable(docs, srt, coll)
		}
	}
	if skip > 0 {
		if skip >= int64(len(docs)) {
			return nil
		}
		docs = docs[skip:]
	}
	if limit > 0 && int64(len(docs)) > limit {
		docs = docs[:limit]
	}
	return docs
}

// sortKeyed is a document with its sort key and its position in the input
// (which breaks ties, keeping the sort stable).
type sortKeyed struct {
	k   []any
	pos int
	d   bson.D
}

func compareSortKeyed(srt *query.Sort, a, b sortKeyed) int {
	if c := srt.CompareKeys(a.k, b.k); c != 0 {
		return c
	}
	return cmp.Compare(a.pos, b.pos)
}

// sortStable orders docs in place by srt, ties in their input order.
func sortStable(docs []bson.D, srt *query.Sort, coll *bsonkit.Collation) {
	ks := make([]sortKeyed, len(docs))
	for i, d := range docs {
		ks[i] = sortKeyed{srt.Key(coll.Doc(d)), i, d}
	}
	slices.SortStableFunc(ks, func(a, b sortKeyed) int { return srt.CompareKeys(a.k, b.k) })
	for i := range ks {
		docs[i] = ks[i].d
	}
}

// sortFirst returns the first n documents (0 < n < len(docs)) of docs in
// sortStable's order, selected with a max-heap of n: a document enters
// only when it sorts before the heap's last, so the input is read once and
// never sorted whole. Positions break ties, so the result is exactly the
// first n of the stable sort.
func sortFirst(docs []bson.D, srt *query.Sort, n int, coll *bsonkit.Collation) []bson.D {
	h := make([]sortKeyed, 0, n)
	after := func(i, j int) bool { return compareSortKeyed(srt, h[i], h[j]) > 0 }
	down := func(i int) {
		for {
			l, big := 2*i+1, i
			if l < len(h) && after(l, big) {
				big = l
			}
			if r := l + 1; r < len(h) && after(r, big) {
				big = r
			}
			if big == i {
				return
			}
			h[i], h[big] = h[big], h[i]
			i = big
		}
	}
	for i, d := range docs {
		e := sortKeyed{srt.Key(coll.Doc(d)), i, d}
		if len(h) < n {
			h = append(h, e)
			for j := len(h) - 1; j > 0; {
				parent := (j - 1) / 2
				if !after(j, parent) {
					break
				}
				h[j], h[parent] = h[parent], h[j]
				j = parent
			}
			continue
		}
		if compareSortKeyed(srt, e, h[0]) >= 0 {
			continue
		}
		h[0] = e
		down(0)
	}
	slices.SortFunc(h, func(a, b sortKeyed) int { return compareSortKeyed(srt, a, b) })
	out := make([]bson.D, len(h))
	for i := range h {
		out[i] = h[i].d
	}
	return out
}

func cmdGetMore(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "collection", "batchSize", "term", "lastKnownCommittedOpTime"); err != nil {
		return nil, err
	}
	id, ok := r.cmd[0].Value.(int64)
	if !ok {
		return nil, wrongType("getMore", r.cmd[0].Value, "long")
	}
	collV, _ := r.get("collection")
	coll, _ := collV.(string)
	batchSize, _, err := batchSizeArg(r.cmd, "batchSize")
	if err != nil {
		return nil, err
	}
	d := r.srv.data
	d.mu.Lock()
	c := d.cursors[id]
	if c == nil {
		d.mu.Unlock()
		return nil, errorf(43, "CursorNotFound", fmt.Sprintf("cursor id %d not found", id))
	}
	if c.ns != r.db+"."+coll {
		d.mu.Unlock()
		return nil, errorf(13, "Unauthorized", fmt.Sprintf("Requested getMore on namespace '%s.%s', but cursor belongs to a different namespace %s", r.db, coll, c.ns))
	}
	if err := c.checkOwner(r); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	if c.busy {
		d.mu.Unlock()
		return nil, errorf(292, "CursorInUse", fmt.Sprintf("cursor id %d is already in use", id))
	}
	c.busy = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		c.busy = false
		c.lastUse = time.Now()
		d.mu.Unlock()
	}()
	if fp := r.srv.fp.fire(fpFailGetMore); fp != nil {
		// mongod kills a cursor whose getMore failed.
		d.mu.Lock()
		delete(d.cursors, id)
		d.mu.Unlock()
		e := errorf(fp.errorCode, mongoerr.CodeName(fp.errorCode), "Failing getMore via 'failGetMoreAfterCursorCheckout' failpoint")
		if c.stream != nil && resumableChangeStreamCodes[fp.errorCode] {
			e.Labels = append(e.Labels, labelResumableChangeStream)
		}
		return nil, e
	}
	if c.stream != nil {
		out, closed, err := c.stream.getMore(r, tc, batchSize)
		if err != nil || closed {
			d.mu.Lock()
			delete(d.cursors, id)
			d.mu.Unlock()
		}
		if err != nil {
			return nil, err
		}
		if closed {
			return cursorReply(0, c.ns, "nextBatch", out.batch, bson.E{Key: "postBatchResumeToken", Value: out.pbrt}), nil
		}
		return cursorReply(id, c.ns, "nextBatch", out.batch, bson.E{Key: "postBatchResumeToken", Value: out.pbrt}), nil
	}
	if c.tail != nil && len(c.docs) == 0 {
		if err := c.tailMore(r, tc); err != nil {
			d.mu.Lock()
			delete(d.cursors, id)
			d.mu.Unlock()
			return nil, err
		}
	}
	batch := c.takeBatch(batchSize)
	outID := id
	if len(c.docs) == 0 && (c.tail == nil || c.tail.limited && c.limit == 0) {
		d.mu.Lock()
		delete(d.cursors, id)
		d.mu.Unlock()
		outID = 0
	}
	return cursorReply(outID, c.ns, "nextBatch", batch), nil
}

func cmdKillCursors(r *request, _ *txnCtx) (bson.D, error) {
	if err := checkFields(r, "cursors"); err != nil {
		return nil, err
	}
	coll, err := r.collName()
	if err != nil {
		return nil, err
	}
	v, _ := r.get("cursors")
	ids, ok := v.(bson.A)
	if !ok {
		return nil, wrongType("killCursors.cursors", v, "array")
	}
	killed, notFound := bson.A{}, bson.A{}
	d := r.srv.data
	d.mu.Lock()
	for _, x := range ids {
		id, ok := x.(int64)
		if !ok {
			d.mu.Unlock()
			return nil, wrongType("killCursors.cursors", x, "long")
		}
		if c := d.cursors[id]; c != nil && c.ns == r.db+"."+coll {
			delete(d.cursors, id)
			killed = append(killed, id)
		} else {
			notFound = append(notFound, id)
		}
	}
	d.mu.Unlock()
	return bson.D{
		{Key: "cursorsKilled", Value: killed},
		{Key: "cursorsNotFound", Value: notFound},
		{Key: "cursorsAlive", Value: bson.A{}},
		{Key: "cursorsUnknown", Value: bson.A{}},
	}, nil
}

// awaitSignal waits for ch or the context, returning false when the context ended.
func awaitSignal(ctx context.Context, ch <-chan struct{}, t *time.Timer) bool {
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// compileProjection compiles a find projection. Projections with
// aggregation expressions, which the find projection compiler leaves out,
// run as a $project stage (same semantics for those).
func compileProjection(r *request, spec, filter bson.D) (func(bson.D) bson.D, error) {
	if len(spec) == 0 {
		return nil, nil
	}
	for i, e := range spec {
		if prefix, ok := strings.CutSuffix(e.Key, ".$"); ok {
			return positionalProjection(spec, i, prefix, filter)
		}
	}
	p, err := query.CompileProjection(spec)
	if err == nil {
		return p.Apply, nil
	}
	var qe *mongoerr.Error
	if !errors.As(err, &qe) || qe.Code != 238 || strings.Contains(qe.Msg, "positional") || strings.Contains(qe.Msg, "$meta") {
		return nil, err
	}
	pipe, perr := pipeline.Compile(bson.A{bson.D{{Key: "$project", Value: spec}}},
		pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime(), Vars: r.vars})
	if perr != nil {
		return nil, err
	}
	return func(d bson.D) bson.D {
		out, err := pipe.Run([]bson.D{d})
		if err != nil || len(out) == 0 {
			return d
		}
		return out[0]
	}, nil
}

// positionalProjection handles {"arr.$": 1}: the array keeps only its
// first element matching the query's conditions on that array.
func positionalProjection(spec bson.D, at int, prefix string, filter bson.D) (func(bson.D) bson.D, error) {
	if strings.Contains(prefix, ".") || strings.Contains(prefix, "$") {
		return nil, errorf(238, "NotImplemented", "mongofake: positional projection is supported on top-level arrays only: "+spec[at].Key)
	}
	rest := slices.Clone(spec)
	rest[at] = bson.E{Key: prefix, Value: int32(1)}
	for _, e := range rest {
		if strings.HasSuffix(e.Key, ".$") {
			return nil, errorf(31276, "Location31276", "Cannot specify more than one positional projection per query.")
		}
	}
	p, err := query.CompileProjection(rest)
	if err != nil {
		return nil, err
	}
	var sub bson.D
	for _, e := range filter {
		if e.Key == prefix || strings.HasPrefix(e.Key, prefix+".") {
			sub = append(sub, e)
		}
	}
	if len(sub) == 0 {
		return nil, errorf(51246, "Location51246", "Executor error during find command :: caused by :: positional operator '"+spec[at].Key+"' couldn't find a matching element in the array")
	}
	m, err := query.Compile(sub)
	if err != nil {
		return nil, err
	}
	return func(d bson.D) bson.D {
		out := p.Apply(d)
		arr, ok := bsonkit.Get(d, prefix)
		a, isArr := arr.(bson.A)
		if !ok || !isArr {
			return out
		}
		for _, el := range a {
			probe := bson.D{{Key: prefix, Value: bson.A{el}}}
			if m.Match(probe) {
				return bsonkit.Set(bsonkit.CopyDoc(out), prefix, bson.A{el})
			}
		}
		return out
	}, nil
}

// setOwner records the session and transaction that open the cursor.
func (c *cursor) setOwner(r *request, tc *txnCtx) {
	if tc.sess == nil {
		return
	}
	c.session, c.sessionName = tc.sess.key, lsidName(r.lsid)
	if tc.txn != nil {
		n := *r.txnNumber
		c.txnNumber = &n
	}
}

// lsidName renders a session id as mongod's messages do (its UUID).
func lsidName(lsid bson.D) string {
	if id, ok := bsonkit.Get(lsid, "id"); ok {
		if b, isBin := id.(bson.Binary); isBin && len(b.Data) == 16 {
			d := b.Data
			return fmt.Sprintf("%x-%x-%x-%x-%x", d[0:4], d[4:6], d[6:8], d[8:10], d[10:16])
		}
		return fmt.Sprint(id)
	}
	return fmt.Sprint(lsid)
}

// checkOwner applies mongod's getMore rules: a cursor continues in the
// session and the transaction that opened it (and outside any transaction
// when it was opened outside one).
func (c *cursor) checkOwner(r *request) error {
	var sess, name string
	if r.lsid != nil {
		sess, name = sessionKey(r.lsid), lsidName(r.lsid)
	}
	switch {
	case sess != "" && c.session == "":
		return errorf(50736, "Location50736", fmt.Sprintf("Cannot run getMore on cursor %d, which was not created in a session, in session %s", c.id, name))
	case sess == "" && c.session != "":
		return errorf(50737, "Location50737", fmt.Sprintf("Cannot run getMore on cursor %d, which was created in session %s, without an lsid", c.id, c.sessionName))
	case sess != c.session:
		return errorf(50738, "Location50738", fmt.Sprintf("Cannot run getMore on cursor %d, which was created in session %s, in session %s", c.id, c.sessionName, name))
	}
	inTxn := r.autocommit != nil && r.txnNumber != nil
	switch {
	case inTxn && c.txnNumber == nil:
		return errorf(50739, "Location50739", fmt.Sprintf("Cannot run getMore on cursor %d, which was not created in a transaction, in transaction %d", c.id, *r.txnNumber))
	case !inTxn && c.txnNumber != nil:
		return errorf(50740, "Location50740", fmt.Sprintf("Cannot run getMore on cursor %d, which was created in transaction %d, without a txnNumber", c.id, *c.txnNumber))
	case inTxn && *r.txnNumber != *c.txnNumber:
		return errorf(50741, "Location50741", fmt.Sprintf("Cannot run getMore on cursor %d, which was created in transaction %d, in transaction %d", c.id, *c.txnNumber, *r.txnNumber))
	}
	return nil
}

package mongofake

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/engine"
)

// The oplog collection, local.oplog.rs.
//
// A replica set member's oplog is a capped collection of the local
// database that tools read to measure the replication window
// (db.getReplicationInfo(): its first and last entries, in natural order).
// Ours is the engine's change stream log. find on local.oplog.rs answers
// from it with each entry's envelope fields: ts, t, v, wall, op and ns
// (one "c" entry on "admin.$cmd" per transaction, as MongoDB writes an
// applyOps; no-ops "n" with ns ""). The o, o2 and ui fields are not
// rendered, so a query must project the envelope fields only, has an empty
// filter, and sorts by $natural (or not at all); anything else fails with
// NotImplemented rather than return documents that lack fields.

// oplogFields are the fields of an oplog document that find renders.
var oplogFields = map[string]bool{"ts": true, "t": true, "v": true, "wall": true, "op": true, "ns": true, "_id": true}

// isOplogNS reports whether ns is local.oplog.rs.
func isOplogNS(ns engine.NS) bool { return ns.DB == "local" && ns.Coll == "oplog.rs" }

// findOplog runs a find on local.oplog.rs.
func findOplog(r *request, tc *txnCtx, ns engine.NS, filter, sortSpec, projSpec bson.D,
	skip, limit int64, batchSize int, hasBatch, single bool) (bson.D, error) {
	unsupported := func(what string) error {
		return errorf(238, "NotImplemented", "mongofake: find on local.oplog.rs: "+what+
			" (supported: an empty filter, sort {$natural: 1 or -1}, and a projection of ts, t, v, wall, op and ns)")
	}
	if len(filter) > 0 {
		return nil, unsupported("a filter is not supported")
	}
	dir, isNatural, err := naturalSort(sortSpec)
	switch {
	case err != nil:
		return nil, err
	case len(sortSpec) > 0 && !isNatural:
		return nil, unsupported("sort " + bsonString(sortSpec) + " is not supported")
	}
	newestFirst := dir == -1
	if len(projSpec) == 0 {
		return nil, unsupported("the o, o2 and ui fields are not rendered: project the envelope fields")
	}
	for _, e := range projSpec {
		v, ok := toInt(e.Value)
		if b, isBool := e.Value.(bool); isBool {
			v, ok = map[bool]int64{true: 1, false: 0}[b], true
		}
		if !oplogFields[e.Key] || !ok || (v == 0 && e.Key != "_id") {
			return nil, unsupported("projection field " + e.Key + " is not supported")
		}
	}
	proj, err := compileProjection(r, projSpec, filter)
	if err != nil {
		return nil, err
	}
	n := 0
	if limit > 0 {
		n = int(skip + limit)
	}
	heads := r.srv.engine.OplogHeads(newestFirst, n)
	docs := make([]bson.D, 0, len(heads))
	for _, h := range heads {
		docs = append(docs, bson.D{
			{Key: "op", Value: h.Op},
			{Key: "ns", Value: h.NS},
			{Key: "ts", Value: h.TS},
			{Key: "t", Value: int64(1)},
			{Key: "v", Value: int64(2)},
			{Key: "wall", Value: bson.NewDateTimeFromTime(h.Wall)},
		})
	}
	docs = sortSkipLimitColl(docs, nil, skip, limit, nil)
	return r.srv.data.firstBatch(r, tc, ns, docs, proj, batchSize, hasBatch, 0, single), nil
}

// bsonString writes a document as relaxed extended JSON, for messages.
func bsonString(d bson.D) string {
	b, err := bson.MarshalExtJSON(d, false, false)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

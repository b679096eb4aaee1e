package engine

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// OplogHead is an oplog document as local.oplog.rs shows it, without its
// o and o2 fields: one per write, one per transaction (an applyOps command
// entry, op "c" on "admin.$cmd", as MongoDB writes a transaction).
type OplogHead struct {
	TS   bson.Timestamp
	Wall time.Time
	// Op is MongoDB's oplog op code: "i", "u", "d", "c" (commands and
	// transactions) or "n" (no-op).
	Op string
	// NS is "db.coll", "db.$cmd" for commands, "" for the no-op.
	NS string
}

// OplogHeads returns up to limit (0: all) heads of the retained oplog,
// oldest first or newest first. While no entry was dropped, the first is
// the no-op MongoDB writes when a replica set is initiated ("initiating
// set"), at the engine's start; its timestamp's increment is 0, so it
// orders before every write of that second.
func (e *Engine) OplogHeads(newestFirst bool, limit int) []OplogHead {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := &e.oplog
	var heads []OplogHead
	full := func() bool { return limit > 0 && len(heads) >= limit }
	initiating := func() {
		if o.truncated == nil && !full() {
			heads = append(heads, OplogHead{TS: bson.Timestamp{T: uint32(o.initiated.Unix())}, Wall: o.initiated, Op: "n"})
		}
	}
	add := func(en *Entry) {
		if en.TxnNumber != nil {
			if k := len(heads); k > 0 && heads[k-1].NS == "admin.$cmd" && heads[k-1].TS == en.TS {
				return // the transaction's applyOps entry is already there
			}
			heads = append(heads, OplogHead{TS: en.TS, Wall: en.Wall, Op: "c", NS: "admin.$cmd"})
			return
		}
		heads = append(heads, OplogHead{TS: en.TS, Wall: en.Wall, Op: opCode(en.Op), NS: headNS(en)})
	}
	if newestFirst {
		for i := o.n - 1; i >= 0 && !full(); i-- {
			add(o.at(i))
		}
		initiating()
		return heads
	}
	initiating()
	for i := 0; i < o.n && !full(); i++ {
		add(o.at(i))
	}
	return heads
}

// opCode maps an entry kind to MongoDB's oplog op code.
func opCode(op OpType) string {
	switch op {
	case OpInsert:
		return "i"
	case OpUpdate, OpReplace:
		return "u"
	case OpDelete:
		return "d"
	}
	return "c" // DDL: create, drop, renameCollection, dropDatabase, createIndexes, dropIndexes, collMod
}

// headNS is an entry's ns: "db.coll" for CRUD, "db.$cmd" for commands.
func headNS(en *Entry) string {
	switch en.Op {
	case OpInsert, OpUpdate, OpReplace, OpDelete:
		return en.NS.DB + "." + en.NS.Coll
	}
	return en.NS.DB + ".$cmd"
}

package mongofake

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/engine"
)

// Tailable cursors on capped collections
// (https://www.mongodb.com/docs/v7.0/core/tailable-cursors/): the cursor
// stays open after the last document, and each getMore returns the
// documents inserted since, in insertion order. With awaitData a getMore
// that finds nothing waits for an insert, up to its maxTimeMS (1 s by
// default), before it returns an empty batch.

// tailState is the position of a tailable cursor.
type tailState struct {
	ns    engine.NS
	last  int64 // record id of the last document scanned
	match func(bson.D) bool
	await bool
	// limited: the find had a limit; the cursor closes once it is used up.
	limited bool
}

// defaultAwaitDataTimeout is how long a getMore on an awaitData cursor
// waits for new documents when it gives no maxTimeMS, as in mongod.
const defaultAwaitDataTimeout = time.Second

// tailableArgs reads find's tailable and awaitData options and checks them
// against the other options, as mongod's query parser does.
func tailableArgs(r *request, sortSpec bson.D, single bool) (tailable, await bool, err error) {
	if tailable, err = r.boolArg("tailable", false); err != nil {
		return false, false, err
	}
	if await, err = r.boolArg("awaitData", false); err != nil {
		return false, false, err
	}
	if await && !tailable {
		return false, false, errorf(9, "FailedToParse", "Cannot set 'awaitData' without also setting 'tailable'")
	}
	if !tailable {
		return false, false, nil
	}
	if len(sortSpec) > 0 && !(len(sortSpec) == 1 && sortSpec[0].Key == "$natural" && isOne(sortSpec[0].Value)) {
		return false, false, errorf(2, "BadValue", "cannot use tailable option with a sort other than {$natural: 1}")
	}
	if single {
		return false, false, errorf(2, "BadValue", "cannot use tailable option with the 'singleBatch' option")
	}
	return true, await, nil
}

func isOne(v any) bool {
	n, ok := toInt(v)
	return ok && n == 1
}

// findTailable runs a tailable find: the matching documents in insertion
// order, and a cursor that stays open at the end of the collection unless
// the collection is empty (mongod keeps no cursor then).
func findTailable(r *request, tc *txnCtx, ns engine.NS, match func(bson.D) bool, proj func(bson.D) bson.D,
	batchSize int, hasBatch bool, skip, limit int64, await bool) (bson.D, error) {
	var docs []bson.D
	var last int64
	capped, empty := false, true
	err := r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
		capped = v.IsCapped(ns)
		if !capped {
			return nil
		}
		docs, last, _, _ = v.Tail(ns, 0, match)
		empty = last == 0
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !capped {
		return nil, errorf(2, "BadValue", fmt.Sprintf("error processing query: ns=%s: tailable cursor requested on non capped collection", ns))
	}
	if skip > 0 {
		docs = docs[min(int(skip), len(docs)):]
	}
	c := &cursor{ns: ns.String(), docs: docs, proj: proj, limit: int(limit),
		tail: &tailState{ns: ns, last: last, match: match, await: await, limited: limit > 0}}
	batch := c.takeFirstBatch(batchSize, hasBatch)
	var id int64
	if !empty && !(limit > 0 && c.limit == 0) {
		c.setOwner(r, tc)
		id = r.srv.data.addCursor(c)
	}
	return cursorReply(id, ns.String(), "firstBatch", batch), nil
}

// tailMore fills an exhausted tailable cursor with the documents inserted
// since its position, waiting for them on an awaitData cursor. It returns
// an error that kills the cursor when its position or collection is gone.
func (c *cursor) tailMore(r *request, tc *txnCtx) error {
	t := c.tail
	var deadline *time.Timer
	for {
		var docs []bson.D
		var last int64
		var lost, exists bool
		var changed <-chan struct{}
		err := r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
			docs, last, lost, exists = v.Tail(t.ns, t.last, t.match)
			changed = v.Changed()
			return nil
		})
		if err != nil {
			return err
		}
		if !exists {
			return errorf(175, "QueryPlanKilled", "collection dropped: "+t.ns.String())
		}
		if lost {
			return errorf(136, "CappedPositionLost", fmt.Sprintf(
				"CollectionScan died due to position in capped collection being deleted. Last seen record id: RecordId(%d)", t.last))
		}
		t.last = last
		if len(docs) > 0 || !t.await {
			c.docs = append(c.docs, docs...)
			return nil
		}
		if deadline == nil {
			wait := defaultAwaitDataTimeout
			if ms, ok, _ := r.intArg("maxTimeMS"); ok && ms > 0 {
				wait = time.Duration(ms) * time.Millisecond
			}
			deadline = time.NewTimer(wait)
			defer deadline.Stop()
		}
		if !awaitSignal(r.ctx, changed, deadline) {
			return nil
		}
	}
}

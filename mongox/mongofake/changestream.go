package mongofake

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
)

// Resume tokens: {_data: hex} where the hex string is
// TTTTTTTT IIIIIIII XXXXXXXX KK — the cluster time (seconds, increment),
// the oplog entry index within its commit plus one (FFFFFFFF for a
// high-water mark past every entry of that time), and the kind (00 an
// event, 01 the invalidate that follows it). Fixed width upper-case hex,
// so tokens sort as strings in event order.
const (
	tokenEvent      = 0
	tokenInvalidate = 1
	hwmIndex        = 1<<32 - 2 // encoded as FFFFFFFF
)

type resumeToken struct {
	pos  engine.Position
	kind byte
}

func (t resumeToken) doc() bson.D {
	return bson.D{{Key: "_data", Value: fmt.Sprintf("%08X%08X%08X%02X", t.pos.TS.T, t.pos.TS.I, uint32(t.pos.Index+1), t.kind)}}
}

func hwmToken(ts bson.Timestamp) resumeToken {
	return resumeToken{pos: engine.Position{TS: ts, Index: hwmIndex}}
}

func parseToken(v any) (resumeToken, error) {
	var t resumeToken
	d, ok := v.(bson.D)
	if !ok {
		return t, errorf(2, "BadValue", "resume token must be an object")
	}
	s, _ := bsonkit.Get(d, "_data")
	str, ok := s.(string)
	if !ok || len(str) != 26 {
		return t, errorf(2, "BadValue", fmt.Sprintf("mongofake: malformed resume token: %v", engine.FormatValue(d)))
	}
	if _, err := hex.DecodeString(str); err != nil {
		return t, errorf(2, "BadValue", "mongofake: malformed resume token: "+str)
	}
	tt, _ := strconv.ParseUint(str[0:8], 16, 32)
	ti, _ := strconv.ParseUint(str[8:16], 16, 32)
	idx, _ := strconv.ParseUint(str[16:24], 16, 32)
	kind, _ := strconv.ParseUint(str[24:26], 16, 8)
	t.pos = engine.Position{TS: bson.Timestamp{T: uint32(tt), I: uint32(ti)}, Index: int64(idx) - 1}
	t.kind = byte(kind)
	return t, nil
}

// changeStream is the state of a change stream cursor.
type changeStream struct {
	srv          *Server
	db, coll     string // db "" = whole cluster; coll "" = whole database
	pipe         *pipeline.Pipeline
	fullDocument string
	// fullDocumentBeforeChange is off, whenAvailable or required.
	beforeChange string
	// expanded is showExpandedEvents: DDL events, collectionUUID and
	// operationDescription are reported.
	expanded bool
	pos      engine.Position // last oplog position consumed
	pbrt     resumeToken
	closed   bool
}

type streamBatch struct {
	batch bson.A
	pbrt  bson.D
}

func openChangeStream(r *request, tc *txnCtx, coll string, spec any, rest bson.A, batchSize int, hasBatch bool) (bson.D, error) {
	if tc.txn != nil {
		return nil, errorf(263, "OperationNotSupportedInTransaction", "$changeStream is not supported in a transaction")
	}
	opts, ok := spec.(bson.D)
	if !ok {
		return nil, errorf(50808, "Location50808", "$changeStream stage expects a document as argument")
	}
	cs := &changeStream{srv: r.srv, db: r.db, coll: coll, fullDocument: "default", beforeChange: "off"}
	var resume *resumeToken
	var startAfter, startAt bool
	var startTS bson.Timestamp
	allCluster := false
	for _, e := range opts {
		switch e.Key {
		case "fullDocument":
			s, _ := e.Value.(string)
			switch s {
			case "default", "updateLookup", "whenAvailable", "required":
				cs.fullDocument = s
			default:
				return nil, errorf(2, "BadValue", fmt.Sprintf("'%v' is not a valid fullDocument option", e.Value))
			}
		case "fullDocumentBeforeChange":
			s, _ := e.Value.(string)
			switch s {
			case "off", "whenAvailable", "required":
				cs.beforeChange = s
			default:
				return nil, errorf(2, "BadValue", fmt.Sprintf("'%v' is not a valid fullDocumentBeforeChange option", e.Value))
			}
		case "resumeAfter", "startAfter":
			t, err := parseToken(e.Value)
			if err != nil {
				return nil, err
			}
			if resume != nil {
				return nil, errorf(50865, "Location50865", "Do not specify both 'resumeAfter' and 'startAfter' in a $changeStream stage")
			}
			if e.Key == "resumeAfter" && t.kind == tokenInvalidate {
				return nil, errorf(260, "InvalidResumeToken", "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification.")
			}
			resume, startAfter = &t, e.Key == "startAfter"
		case "startAtOperationTime":
			ts, ok := e.Value.(bson.Timestamp)
			if !ok {
				return nil, wrongType("$changeStream.startAtOperationTime", e.Value, "timestamp")
			}
			startAt, startTS = true, ts
		case "allChangesForCluster":
			b, err := truthy(e.Value, "$changeStream.allChangesForCluster")
			if err != nil {
				return nil, err
			}
			allCluster = b
		case "showExpandedEvents":
			b, err := truthy(e.Value, "$changeStream.showExpandedEvents")
			if err != nil {
				return nil, err
			}
			cs.expanded = b
		case "allowToRunOnConfigDB", "showMigrationEvents":
		default:
			return nil, errorf(40415, "Location40415", fmt.Sprintf("BSON field '$changeStream.%s' is an unknown field.", e.Key))
		}
	}
	_ = startAfter
	if resume != nil && startAt {
		return nil, errorf(40674, "Location40674", "Only one type of resume option is allowed, but multiple were found.")
	}
	if allCluster {
		if r.db != "admin" || coll != "" {
			return nil, errorf(ErrCodeInvalidOptions, "InvalidOptions", "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, and with no collection name")
		}
		cs.db = ""
	} else if r.db == "admin" || r.db == "config" || r.db == "local" {
		return nil, errorf(ErrCodeInvalidOptions, "InvalidOptions", "$changeStream may not be opened on the internal "+r.db+" database")
	}
	if len(rest) > 0 {
		p, err := pipeline.Compile(rest, pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime()})
		if err != nil {
			return nil, err
		}
		if err := p.ChangeStreamSafe(); err != nil {
			return nil, convertErr(err)
		}
		cs.pipe = p
	}
	switch {
	case resume != nil:
		cs.pos = resume.pos
		cs.pbrt = *resume
		cs.pbrt.kind = tokenEvent
	case startAt:
		cs.pos = engine.Position{TS: startTS, Index: -1}
		cs.pbrt = resumeToken{pos: cs.pos}
	default:
		ct := r.srv.engine.ClusterTime()
		cs.pos = engine.Position{TS: ct, Index: hwmIndex}
		cs.pbrt = hwmToken(ct)
	}
	n := defaultFirstBatch
	if hasBatch {
		n = batchSize
	}
	out, err := cs.next(n)
	if err != nil {
		return nil, err
	}
	nsName := r.db + "." + coll
	if coll == "" {
		nsName = r.db + ".$cmd.aggregate"
	}
	var id int64
	if !cs.closed {
		c := &cursor{ns: nsName, stream: cs}
		c.setOwner(r, tc)
		id = r.srv.data.addCursor(c)
	}
	return bson.D{{Key: "cursor", Value: bson.D{
		{Key: "firstBatch", Value: out.batch},
		{Key: "postBatchResumeToken", Value: out.pbrt},
		{Key: "id", Value: id},
		{Key: "ns", Value: nsName},
	}}}, nil
}

// ErrCodeInvalidOptions is MongoDB's InvalidOptions code.
const ErrCodeInvalidOptions = 72

// getMore waits up to maxTimeMS (1 s by default) for events.
func (cs *changeStream) getMore(r *request, _ *txnCtx, batchSize int) (streamBatch, bool, error) {
	wait := time.Second
	if ms, ok, err := r.intArg("maxTimeMS"); err != nil {
		return streamBatch{}, false, err
	} else if ok && ms > 0 {
		wait = time.Duration(ms) * time.Millisecond
	}
	n := batchSize
	if n == 0 {
		n = 1000
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		out, signal, err := cs.read(n)
		if err != nil {
			return streamBatch{}, true, err
		}
		if len(out.batch) > 0 || cs.closed {
			return out, cs.closed, nil
		}
		if !awaitSignal(r.ctx, signal, timer) {
			return out, false, nil
		}
	}
}

// next reads the events available now.
func (cs *changeStream) next(n int) (streamBatch, error) {
	out, _, err := cs.read(n)
	return out, err
}

// read turns the oplog entries after the stream's position into up to n
// events.
func (cs *changeStream) read(n int) (streamBatch, <-chan struct{}, error) {
	const chunk = 1024
	batch := bson.A{}
	size := 0
	for {
		entries, signal, hwm, err := cs.srv.engine.ReadOplog(cs.pos, chunk)
		if err != nil {
			return streamBatch{}, signal, convertErr(err)
		}
		for i := range entries {
			en := &entries[i]
			evs, err := cs.events(en)
			if err != nil {
				return streamBatch{}, signal, err
			}
			if len(batch)+len(evs) > n && len(batch) > 0 {
				return streamBatch{batch: batch, pbrt: cs.pbrt.doc()}, signal, nil
			}
			cs.pos = engine.Position{TS: en.TS, Index: int64(en.TxnOpIndex)}
			cs.pbrt = resumeToken{pos: cs.pos}
			for _, ev := range evs {
				batch = append(batch, ev.doc)
				size += bsonkit.Size(ev.doc)
				cs.pbrt = ev.token
				if ev.token.kind == tokenInvalidate {
					cs.closed = true
					return streamBatch{batch: batch, pbrt: cs.pbrt.doc()}, signal, nil
				}
			}
			if len(batch) >= n || size > maxBSONSize/2 {
				return streamBatch{batch: batch, pbrt: cs.pbrt.doc()}, signal, nil
			}
		}
		if len(entries) == chunk {
			continue // more entries are waiting
		}
		// Every entry up to hwm was seen: the resume point moves up to it.
		if bsonkit.CompareTimestamps(hwm, cs.pos.TS) > 0 {
			cs.pos = engine.Position{TS: hwm, Index: hwmIndex}
			cs.pbrt = hwmToken(hwm)
		}
		return streamBatch{batch: batch, pbrt: cs.pbrt.doc()}, signal, nil
	}
}

type event struct {
	doc   bson.D
	token resumeToken
}

// watches reports whether the stream watches a namespace.
func (cs *changeStream) watches(ns engine.NS) bool {
	if cs.db == "" {
		return ns.DB != "admin" && ns.DB != "config" && ns.DB != "local"
	}
	if ns.DB != cs.db {
		return false
	}
	return cs.coll == "" || ns.Coll == cs.coll
}

// events returns the events an oplog entry produces for the stream, after
// the stream's pipeline.
func (cs *changeStream) events(en *engine.Entry) ([]event, error) {
	tok := resumeToken{pos: engine.Position{TS: en.TS, Index: int64(en.TxnOpIndex)}}
	invalidate := false
	switch en.Op {
	case engine.OpDropDatabase:
		if cs.db == "" {
			break
		}
		if cs.db != en.NS.DB || cs.coll != "" {
			return nil, nil
		}
		invalidate = true
	case engine.OpRename:
		if !cs.watches(en.NS) {
			return nil, nil
		}
		invalidate = cs.coll != ""
	case engine.OpDrop:
		if !cs.watches(en.NS) {
			return nil, nil
		}
		invalidate = cs.coll != ""
	case engine.OpCreate, engine.OpCreateIndexes, engine.OpDropIndexes, engine.OpModify:
		if !cs.expanded || !cs.watches(en.NS) {
			return nil, nil
		}
	default:
		if !cs.watches(en.NS) {
			return nil, nil
		}
	}
	var beforeChange bson.E
	d := bson.D{
		{Key: "_id", Value: tok.doc()},
		{Key: "operationType", Value: string(en.Op)},
		{Key: "clusterTime", Value: en.TS},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(en.Wall)},
	}
	if cs.expanded && en.UUID.Data != nil {
		d = append(d, bson.E{Key: "collectionUUID", Value: en.UUID})
	}
	switch en.Op {
	case engine.OpInsert, engine.OpReplace:
		d = append(d, bson.E{Key: "fullDocument", Value: en.Doc})
	case engine.OpUpdate:
		switch cs.fullDocument {
		case "updateLookup":
			var cur any
			_ = cs.srv.engine.Read(cs.srv.ctx, nil, func(v *engine.View) error {
				id, _ := bsonkit.Get(en.DocKey, "_id")
				if doc := v.FindID(en.NS, id); doc != nil {
					cur = doc
				}
				return nil
			})
			d = append(d, bson.E{Key: "fullDocument", Value: cur})
		case "whenAvailable", "required":
			// The post-image exists only where pre- and post-images are
			// recorded (changeStreamPreAndPostImages).
			if !en.Images && cs.fullDocument == "required" {
				return nil, errorf(47, "NoMatchingDocument", fmt.Sprintf(
					"Change stream was configured to require a post-image for all update events, but the post-image was not found for the event at %v on %s", en.TS, en.NS))
			}
			var post any
			if en.Images {
				post = en.Doc
			}
			d = append(d, bson.E{Key: "fullDocument", Value: post})
		}
	}
	if cs.beforeChange != "off" && (en.Op == engine.OpUpdate || en.Op == engine.OpReplace || en.Op == engine.OpDelete) {
		if !en.Images && cs.beforeChange == "required" {
			return nil, errorf(47, "NoMatchingDocument", fmt.Sprintf(
				"Change stream was configured to require a pre-image for all update, delete and replace events, but the pre-image was not found for the event at %v on %s", en.TS, en.NS))
		}
		var pre any
		if en.Images {
			pre = en.Pre
		}
		beforeChange = bson.E{Key: "fullDocumentBeforeChange", Value: pre}
	}
	nsDoc := bson.D{{Key: "db", Value: en.NS.DB}}
	if en.Op != engine.OpDropDatabase {
		nsDoc = append(nsDoc, bson.E{Key: "coll", Value: en.NS.Coll})
	}
	d = append(d, bson.E{Key: "ns", Value: nsDoc})
	if en.Op == engine.OpRename {
		d = append(d, bson.E{Key: "to", Value: bson.D{{Key: "db", Value: en.To.DB}, {Key: "coll", Value: en.To.Coll}}})
	}
	if en.DocKey != nil {
		d = append(d, bson.E{Key: "documentKey", Value: en.DocKey})
	}
	if en.Op == engine.OpUpdate && en.Update != nil {
		upd := en.Update.UpdatedFields
		if upd == nil {
			upd = bson.D{}
		}
		rem := bson.A{}
		for _, f := range en.Update.RemovedFields {
			rem = append(rem, f)
		}
		trunc := en.Update.TruncatedArrays
		if trunc == nil {
			trunc = bson.A{}
		}
		ud := bson.D{
			{Key: "updatedFields", Value: upd},
			{Key: "removedFields", Value: rem},
			{Key: "truncatedArrays", Value: trunc},
		}
		if cs.expanded {
			dp := en.Update.DisambiguatedPaths
			if dp == nil {
				dp = bson.D{}
			}
			ud = append(ud, bson.E{Key: "disambiguatedPaths", Value: dp})
		}
		d = append(d, bson.E{Key: "updateDescription", Value: ud})
	}
	if beforeChange.Key != "" {
		d = append(d, beforeChange)
	}
	if cs.expanded && en.Desc != nil {
		d = append(d, bson.E{Key: "operationDescription", Value: en.Desc})
	}
	if en.TxnNumber != nil {
		d = append(d, bson.E{Key: "txnNumber", Value: *en.TxnNumber}, bson.E{Key: "lsid", Value: en.LSID})
	}
	var out []event
	ev, ok, err := cs.transform(d, tok)
	if err != nil {
		return nil, err
	}
	if ok {
		out = append(out, ev)
	}
	if invalidate {
		itok := tok
		itok.kind = tokenInvalidate
		inv := bson.D{
			{Key: "_id", Value: itok.doc()},
			{Key: "operationType", Value: "invalidate"},
			{Key: "clusterTime", Value: en.TS},
			{Key: "wallTime", Value: bson.NewDateTimeFromTime(en.Wall)},
		}
		// The invalidate always reaches the client, whatever the pipeline.
		out = append(out, event{doc: inv, token: itok})
	}
	return out, nil
}

// transform runs the stream's pipeline over one event; ok is false when
// the pipeline filtered it out.
func (cs *changeStream) transform(d bson.D, tok resumeToken) (event, bool, error) {
	if cs.pipe == nil {
		return event{doc: d, token: tok}, true, nil
	}
	res, err := cs.pipe.Run([]bson.D{d})
	if err != nil {
		return event{}, false, convertErr(err)
	}
	if len(res) == 0 {
		return event{}, false, nil
	}
	id, _ := bsonkit.Get(res[0], "_id")
	if !bsonkit.Equal(id, tok.doc()) {
		return event{}, false, errorf(280, "ChangeStreamFatalError",
			"Encountered an event whose _id field, which contains the resume token, was modified by the pipeline. Modifying the _id field of an event makes it impossible to resume the stream from that point. Only transformations that retain the unmodified _id field are allowed.", "NonResumableChangeStreamError")
	}
	return event{doc: res[0], token: tok}, true, nil
}

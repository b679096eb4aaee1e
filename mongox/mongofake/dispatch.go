package mongofake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
)

// dispatch runs one command and builds its reply. legacyDB is the database
// of an OP_QUERY namespace ("" for OP_MSG, whose body carries $db). drop
// reports that the connection must be closed without a reply (the
// closeConnection fail point).
func (s *Server) dispatch(c *conn, body bson.D, legacyDB string) (reply bson.D, drop bool) {
	reply, drop = s.dispatchCommand(c, body, legacyDB)
	if s.logger.Enabled(c.ctx, slog.LevelDebug) {
		name := ""
		if len(body) > 0 {
			name = body[0].Key
		}
		s.logger.Debug("mongofake: command", "conn", c.id, "command", name,
			"ok", lookupD(reply, "ok"), "code", lookupD(reply, "code"), "dropped", drop)
	}
	return reply, drop
}

func (s *Server) dispatchCommand(c *conn, body bson.D, legacyDB string) (reply bson.D, drop bool) {
	if len(body) == 0 {
		return s.errorReply(nil, errorf(59, "CommandNotFound", "no such command: ''; the command document is empty"), nil), false
	}
	r := &request{ctx: c.ctx, srv: s, conn: c, name: body[0].Key, cmd: body}
	if err := r.lift(legacyDB); err != nil {
		return s.errorReply(r, err, nil), false
	}
	c.op.Store(&runningOp{opid: s.nextOpID.Add(1), name: r.name, db: r.db, cmd: body, started: time.Now()})
	defer c.op.Store(nil)
	spec := commands[r.name]
	if spec == nil || (spec.testOnly && !s.cfg.testCommands) {
		return s.errorReply(r, errorf(59, "CommandNotFound", "no such command: '"+r.name+"'"), nil), false
	}
	if err := checkAPIParams(r.name, spec, r.api); err != nil {
		return s.errorReply(r, err, nil), false
	}
	if spec.adminOnly && r.db != "admin" {
		return s.errorReply(r, errorf(13, "Unauthorized", r.name+" may only be run against the admin database."), nil), false
	}
	if r.autocommit != nil {
		if err := checkTxnStatement(r); err != nil {
			return s.errorReply(r, err, nil), false
		}
	}

	c.noteClientMetadata(r.name, body)
	act, crashed := s.crashes.check(r.name, c.appName)
	if act == crashRefuse {
		return s.errorReply(r, crashed.crashError(r.name), []string{}), false
	}

	fp := s.fp.match(r.name, c.appName)
	if fp != nil {
		if fp.block > 0 {
			if err := blockFor(r, fp.block); err != nil {
				if errors.Is(err, context.Canceled) {
					return nil, true
				}
				return s.errorReply(r, err, nil), false
			}
		}
		if fp.closeConnection {
			s.logger.Debug("mongofake: failCommand closes the connection", "conn", c.id, "command", r.name)
			return nil, true
		}
		if fp.errorCode != 0 {
			e := &cmdError{Code: fp.errorCode, CodeName: mongoerr.CodeName(fp.errorCode), Msg: fp.errmsg}
			var labels []string
			if fp.labelsSet {
				labels = fp.labels
			} else {
				labels = r.errorLabels(e.Code, 0, false)
			}
			return s.errorReply(r, e, labels), false
		}
	}

	out, err := s.run(spec, r)
	if act == crashAfterRun {
		// The command ran; its client died before reading the reply.
		return s.errorReply(r, crashed.crashError(r.name), []string{}), false
	}
	if r.dropConn {
		s.logger.Debug("mongofake: onPrimaryTransactionalWrite closes the connection", "conn", c.id, "command", r.name)
		return nil, true
	}
	if err != nil {
		return s.errorReply(r, err, nil), false
	}
	if wce := unsatisfiableWriteConcern(r); wce != nil && !hasKey(out, "writeConcernError") {
		out = append(out, bson.E{Key: "writeConcernError", Value: wce})
	}
	if fp != nil && fp.wce != nil {
		out = append(removeKey(out, "writeConcernError"), bson.E{Key: "writeConcernError", Value: fp.wce})
		if fp.labelsSet {
			out = setLabels(out, fp.labels)
		}
	}
	return s.okReply(r, out), false
}

// run calls the handler, turning a panic into an InternalError.
func (s *Server) run(spec *commandSpec, r *request) (out bson.D, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.logger.Error("mongofake: command handler panicked",
				"command", r.name, "db", r.db, "conn", r.conn.id, "panic", p, "stack", string(debug.Stack()))
			out = nil
			err = errorf(1, "InternalError", fmt.Sprintf("mongofake: internal error in command %s: %v", r.name, p))
		}
	}()
	return spec.handler(r)
}

// lift copies the generic command fields into the request.
func (r *request) lift(legacyDB string) error {
	var hasDB bool
	for _, e := range r.cmd {
		switch e.Key {
		case "$db":
			db, ok := e.Value.(string)
			if !ok {
				return wrongType("$db", e.Value, "string")
			}
			r.db, hasDB = db, true
		case "lsid":
			d, ok := e.Value.(bson.D)
			if !ok {
				return wrongType("lsid", e.Value, "object")
			}
			r.lsid = d
		case "txnNumber":
			switch n := e.Value.(type) {
			case int64:
				r.txnNumber = &n
			case int32:
				v := int64(n)
				r.txnNumber = &v
			default:
				return wrongType("txnNumber", e.Value, "long")
			}
		case "autocommit":
			b, ok := e.Value.(bool)
			if !ok {
				return wrongType("autocommit", e.Value, "bool")
			}
			r.autocommit = &b
		case "startTransaction":
			b, ok := e.Value.(bool)
			if !ok {
				return wrongType("startTransaction", e.Value, "bool")
			}
			r.startTransaction = b
		case "readConcern":
			d, ok := e.Value.(bson.D)
			if !ok {
				return wrongType("readConcern", e.Value, "object")
			}
			r.readConcern = d
		case "writeConcern":
			d, ok := e.Value.(bson.D)
			if !ok {
				return wrongType("writeConcern", e.Value, "object")
			}
			r.writeConcern = d
		}
	}
	api, err := parseAPIParams(r.cmd)
	if err != nil {
		return err
	}
	r.api = api
	if legacyDB != "" {
		r.db = legacyDB
	} else if !hasDB {
		return errorf(40571, "Location40571", "OP_MSG requests require a $db argument")
	}
	if r.db == "" {
		return errorf(73, "InvalidNamespace", "Invalid database name: ''")
	}
	if r.txnNumber != nil && r.lsid == nil {
		return errorf(50768, "Location50768", "Transaction number requires a session ID to also be specified")
	}
	if r.autocommit != nil && r.txnNumber == nil {
		return errorf(50768, "Location50768", "'autocommit' field requires a transaction number to also be specified")
	}
	return nil
}

func wrongType(field string, v any, want string) *cmdError {
	return errorf(14, "TypeMismatch", fmt.Sprintf("BSON field '%s' is the wrong type '%s', expected type '%s'", field, mongoerr.TypeName(v), want))
}

// okReply appends the generic success fields to a handler's reply body.
func (s *Server) okReply(r *request, body bson.D) bson.D {
	body = removeKey(body, "ok")
	if r != nil && !hasKey(body, "errorLabels") {
		if code, ok := wceCode(body); ok {
			if labels := r.errorLabels(0, code, true); len(labels) > 0 {
				body = append(body, bson.E{Key: "errorLabels", Value: stringsToA(labels)})
			}
		}
	}
	out := make(bson.D, 0, len(body)+3)
	out = append(out, body...)
	out = append(out, bson.E{Key: "ok", Value: 1.0})
	return s.appendClusterTime(out)
}

// errorReply builds {ok: 0, errmsg, code, codeName, errorLabels?, extra...}.
// labels, when non-nil, replace the labels computed from the error; err
// may be any error (a non-*cmdError becomes InternalError).
func (s *Server) errorReply(r *request, err error, labels []string) bson.D {
	var ce *cmdError
	if !errors.As(err, &ce) {
		ce = errorf(1, "InternalError", err.Error())
	}
	name := ce.CodeName
	if name == "" {
		name = mongoerr.CodeName(ce.Code)
	}
	if labels == nil {
		labels = append([]string(nil), ce.Labels...)
		if r != nil {
			for _, l := range r.errorLabels(ce.Code, 0, false) {
				labels = addLabel(labels, l)
			}
		}
	}
	out := bson.D{
		{Key: "ok", Value: 0.0},
		{Key: "errmsg", Value: ce.Msg},
		{Key: "code", Value: ce.Code},
		{Key: "codeName", Value: name},
	}
	if len(labels) > 0 {
		out = append(out, bson.E{Key: "errorLabels", Value: stringsToA(labels)})
	}
	for _, e := range ce.Extra {
		switch e.Key {
		case "ok", "errmsg", "code", "codeName", "errorLabels", "$clusterTime", "operationTime":
			continue
		}
		out = append(out, e)
	}
	return s.appendClusterTime(out)
}

// zeroSignatureHash is the hash of every $clusterTime signature; replies
// only read it.
var zeroSignatureHash = make([]byte, 20)

// appendClusterTime adds $clusterTime and operationTime, as a replica set
// member does on every reply. The signature is a dummy: the server has no
// keys, and drivers only echo it back.
func (s *Server) appendClusterTime(d bson.D) bson.D {
	ts := s.engine.ClusterTime()
	return append(d,
		bson.E{Key: "$clusterTime", Value: bson.D{
			{Key: "clusterTime", Value: ts},
			{Key: "signature", Value: bson.D{
				{Key: "hash", Value: bson.Binary{Subtype: 0, Data: zeroSignatureHash}},
				{Key: "keyId", Value: int64(0)},
			}},
		}},
		bson.E{Key: "operationTime", Value: ts},
	)
}

// Error labels, as mongod 4.4+ computes them.
const (
	labelRetryableWrite       = "RetryableWriteError"
	labelTransientTransaction = "TransientTransactionError"
)

// labelResumableChangeStream marks a change stream getMore error after
// which the driver resumes (mongod 4.4+).
const labelResumableChangeStream = "ResumableChangeStreamError"

// resumableChangeStreamCodes are the errors after which mongod labels a
// change stream's failed getMore ResumableChangeStreamError: network,
// not-primary, shutdown and stale-routing errors, RetryChangeStream and
// FailedToSatisfyReadPreference.
var resumableChangeStreamCodes = map[int32]bool{
	6: true, 7: true, 89: true, 91: true, 189: true, 262: true, 9001: true,
	10107: true, 11600: true, 11602: true, 13435: true, 13436: true,
	63: true, 150: true, 13388: true, 234: true, 133: true,
}

// retryableCodes are the codes mongod treats as retriable
// (ErrorCodes::isRetriableError): network, not-primary and shutdown errors.
var retryableCodes = map[int32]bool{
	6: true, 7: true, 89: true, 91: true, 189: true, 262: true, 9001: true,
	10107: true, 11600: true, 11602: true, 13435: true, 13436: true,
	63: true, 150: true, 134: true,
}

// retryableWriteCommands accept a txnNumber outside a transaction.
var retryableWriteCommands = map[string]bool{
	"insert": true, "update": true, "delete": true,
	"findAndModify": true, "findandmodify": true, "bulkWrite": true,
}

// errorLabels computes the labels of an error with the given code (0 for
// none) and write concern error code (hasWCE false for none).
func (r *request) errorLabels(code, wcCode int32, hasWCE bool) []string {
	var labels []string
	inTxn := r.autocommit != nil
	txnCmd := r.name == "commitTransaction" || r.name == "abortTransaction"
	retryableWrite := r.txnNumber != nil && !inTxn && retryableWriteCommands[r.name]
	if (retryableWrite || txnCmd) && (retryableCodes[code] || (hasWCE && retryableCodes[wcCode])) {
		labels = append(labels, labelRetryableWrite)
	}
	if inTxn && code != 0 && transientTxnError(code, hasWCE, txnCmd) {
		labels = append(labels, labelTransientTransaction)
	}
	return labels
}

// transientTxnError mirrors mongod's isTransientTransactionError.
func transientTxnError(code int32, hasWCE, commitOrAbort bool) bool {
	switch code {
	case 112, // WriteConflict
		24,  // LockTimeout
		267, // PreparedTransactionInProgress
		239, // SnapshotTooOld
		246: // SnapshotUnavailable
		return true
	}
	if commitOrAbort {
		return code == 251 && !hasWCE // NoSuchTransaction
	}
	return retryableCodes[code] || code == 251
}

// wceCode returns the code of a reply's writeConcernError.
func wceCode(body bson.D) (int32, bool) {
	for _, e := range body {
		if e.Key != "writeConcernError" {
			continue
		}
		wce, ok := e.Value.(bson.D)
		if !ok {
			return 0, false
		}
		for _, f := range wce {
			if f.Key == "code" {
				switch n := f.Value.(type) {
				case int32:
					return n, true
				case int64:
					return int32(n), true
				case float64:
					return int32(n), true
				}
			}
		}
		return 0, true
	}
	return 0, false
}

func addLabel(labels []string, l string) []string {
	for _, x := range labels {
		if x == l {
			return labels
		}
	}
	return append(labels, l)
}

func stringsToA(ss []string) bson.A {
	a := make(bson.A, len(ss))
	for i, s := range ss {
		a[i] = s
	}
	return a
}

func setLabels(d bson.D, labels []string) bson.D {
	d = removeKey(d, "errorLabels")
	if len(labels) > 0 {
		d = append(d, bson.E{Key: "errorLabels", Value: stringsToA(labels)})
	}
	return d
}

func removeKey(d bson.D, key string) bson.D {
	out := d[:0:0]
	for _, e := range d {
		if e.Key != key {
			out = append(out, e)
		}
	}
	return out
}

func hasKey(d bson.D, key string) bool {
	for _, e := range d {
		if e.Key == key {
			return true
		}
	}
	return false
}

// unsatisfiableWriteConcern returns the writeConcernError a single-node
// replica set reports after applying a write whose write concern it cannot
// satisfy: w greater than its one data-bearing member (100
// UnsatisfiableWriteConcern) or a w tag mode it has no rule for (79
// UnknownReplWriteConcern). nil when the write concern is satisfiable.
func unsatisfiableWriteConcern(r *request) bson.D {
	w, ok := bsonkit.Get(r.writeConcern, "w")
	if !ok {
		return nil
	}
	if mode, isStr := w.(string); isStr {
		if mode == "majority" {
			return nil
		}
		return bson.D{{Key: "code", Value: int32(79)}, {Key: "codeName", Value: "UnknownReplWriteConcern"},
			{Key: "errmsg", Value: fmt.Sprintf("No write concern mode named '%s' found in replica set configuration", mode)}}
	}
	if n, isNum := wholeNumber(w); isNum && n > 1 {
		return bson.D{{Key: "code", Value: int32(100)}, {Key: "codeName", Value: "UnsatisfiableWriteConcern"},
			{Key: "errmsg", Value: "Not enough data-bearing nodes"}}
	}
	return nil
}

// blockFor waits out a fail point's blockTimeMS. The wait counts against
// the command's maxTimeMS, as mongod's interruptible sleep does: when the
// time limit comes first the command fails with MaxTimeMSExpired (50) and
// never runs. It returns context.Canceled when the connection ends.
func blockFor(r *request, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	var expire <-chan time.Time
	if ms, ok, _ := r.intArg("maxTimeMS"); ok && ms > 0 && time.Duration(ms)*time.Millisecond < d {
		limit := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer limit.Stop()
		expire = limit.C
	}
	select {
	case <-t.C:
		return nil
	case <-expire:
		return errorf(engine.CodeMaxTimeMSExpired, "MaxTimeMSExpired", "operation exceeded time limit")
	case <-r.ctx.Done():
		return context.Canceled
	}
}

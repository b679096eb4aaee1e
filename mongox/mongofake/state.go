package mongofake

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
)

// Idle limits, as mongod's defaults.
const (
	cursorIdleTimeout  = 10 * time.Minute
	sessionIdleTimeout = 30 * time.Minute
	maxBSONSize        = 16 * 1024 * 1024
)

// dataState is the state of the data command families: sessions and their
// transactions, retryable-write records, open cursors.
type dataState struct {
	srv *Server

	mu         sync.Mutex
	sessions   map[string]*session
	cursors    map[int64]*cursor
	nextCursor int64

	stop chan struct{}
	wg   sync.WaitGroup
}

// newDataState is called by NewServer once the engine exists.
func newDataState(srv *Server) *dataState {
	d := &dataState{
		srv:      srv,
		sessions: map[string]*session{},
		cursors:  map[int64]*cursor{},
		stop:     make(chan struct{}),
	}
	d.wg.Add(1)
	go d.reaper()
	return d
}

// close is called by Server.Close before the engine closes: it aborts open
// transactions, closes cursors and stops the state's goroutines.
func (d *dataState) close() {
	select {
	case <-d.stop:
		return
	default:
	}
	close(d.stop)
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, s := range d.sessions {
		s.end("server shutting down")
		delete(d.sessions, k)
	}
	clear(d.cursors)
}

// reaper closes idle cursors and forgets idle sessions.
func (d *dataState) reaper() {
	defer d.wg.Done()
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			d.reap(time.Now())
		}
	}
}

func (d *dataState) reap(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, c := range d.cursors {
		if now.Sub(c.lastUse) > cursorIdleTimeout {
			delete(d.cursors, id)
		}
	}
	for k, s := range d.sessions {
		// A command holds s.mu for its whole run and may take d.mu (cursors):
		// waiting for s.mu here, under d.mu, would deadlock. A locked session
		// is in use, hence not idle.
		if !s.mu.TryLock() {
			continue
		}
		if now.Sub(s.lastUse) > sessionIdleTimeout && !s.busy {
			s.end("session expired")
			delete(d.sessions, k)
		}
		s.mu.Unlock()
	}
}

// session is a logical session: its newest txnNumber, the transaction of
// that number, and the recorded results of its retryable writes.
type session struct {
	mu        sync.Mutex // serializes the session's commands
	busy      bool
	key       string
	lsid      bson.D
	txnNumber int64
	hasNumber bool
	txn       *engine.Txn // transaction of txnNumber, nil for a retryable write
	// txnLevel is the read concern level the transaction started with
	// ("" for the default).
	txnLevel string
	retry    *retryRecord
	lastUse  time.Time
	// snaps are the read snapshots of the session's snapshot reads
	// (readConcern snapshot outside a transaction), by timestamp.
	snaps map[bson.Timestamp]*engine.Snapshot

	// killMu guards what killSessions reaches without waiting for the
	// session's running command (which holds mu): that command's cancel
	// function and the session's transaction.
	killMu  sync.Mutex
	cancel  context.CancelFunc // of the running command, nil when idle
	liveTxn *engine.Txn        // s.txn, for kill
}

// setTxn sets the session's transaction. Caller holds s.mu.
func (s *session) setTxn(t *engine.Txn) {
	s.txn = t
	s.killMu.Lock()
	s.liveTxn = t
	s.killMu.Unlock()
}

// kill interrupts the session's running command (it fails with 11601
// Interrupted) and aborts its transaction, without waiting for the command.
// The session itself stays: its later commands see the transaction aborted
// (251 NoSuchTransaction) and its retryable writes stay recorded, as after
// mongod's killSessions.
func (s *session) kill() {
	s.killMu.Lock()
	cancel, t := s.cancel, s.liveTxn
	s.killMu.Unlock()
	if cancel != nil {
		cancel()
	}
	if t != nil {
		t.AbortWithReason("session killed")
	}
}

// retryRecord is the result of the retryable write with a txnNumber.
type retryRecord struct {
	txnNumber int64
	reply     bson.D
}

// end aborts the session's transaction and releases its read snapshots.
func (s *session) end(reason string) {
	s.abortTxn(reason)
	for ts, snap := range s.snaps {
		snap.Close()
		delete(s.snaps, ts)
	}
}

func (s *session) abortTxn(reason string) {
	if s.txn != nil {
		s.txn.AbortWithReason(reason)
	}
}

// sessionKey identifies a session by its lsid id.
func sessionKey(lsid bson.D) string {
	id, ok := bsonkit.Get(lsid, "id")
	if !ok {
		return bsonkit.Key(lsid)
	}
	return bsonkit.Key(id)
}

// session returns the session of lsid, creating it.
func (d *dataState) session(lsid bson.D) *session {
	k := sessionKey(lsid)
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[k]
	if s == nil {
		s = &session{key: k, lsid: lsid}
		d.sessions[k] = s
	}
	return s
}

// endSession aborts a session's transaction and forgets it, with its cursors.
func (d *dataState) endSession(lsid bson.D) {
	k := sessionKey(lsid)
	d.mu.Lock()
	s := d.sessions[k]
	delete(d.sessions, k)
	for id, c := range d.cursors {
		if c.session == k {
			delete(d.cursors, id)
		}
	}
	d.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.end("session ended")
		s.mu.Unlock()
	}
}

// killSession kills a session (killSessions): its cursors close, its running
// command is interrupted and its transaction aborted; see session.kill.
func (d *dataState) killSession(lsid bson.D) {
	k := sessionKey(lsid)
	d.mu.Lock()
	s := d.sessions[k]
	for id, c := range d.cursors {
		if c.session == k {
			delete(d.cursors, id)
		}
	}
	d.mu.Unlock()
	if s != nil {
		s.kill()
	}
}

// txnCtx is what a data command learns about its session and transaction.
type txnCtx struct {
	sess *session
	txn  *engine.Txn // non-nil inside a multi-document transaction
	// retryable is set for a retryable write (lsid + txnNumber, no autocommit).
	retryable bool
	// snap is the read snapshot of a snapshot read (readConcern snapshot
	// outside a transaction).
	snap *engine.Snapshot
}

// readTxn is what a read goes through: the transaction, the snapshot of a
// snapshot read, or nil for the latest committed state.
func (tc *txnCtx) readTxn() *engine.Txn {
	switch {
	case tc.txn != nil:
		return tc.txn
	case tc.snap != nil:
		return tc.snap.Txn()
	}
	return nil
}

// snapshotReadCommands are the commands that take readConcern snapshot
// outside a transaction (MongoDB 5.0+).
var snapshotReadCommands = map[string]bool{"find": true, "aggregate": true, "distinct": true}

// begin resolves the request's session and transaction and locks the
// session for the duration of the command: call the returned release.
func (d *dataState) begin(r *request) (*txnCtx, func(), error) {
	tc := &txnCtx{}
	if err := checkAfterClusterTime(r.readConcern, d.srv.engine.ClusterTime()); err != nil {
		return nil, nil, err
	}
	level, _ := bsonkit.Get(r.readConcern, "level")
	atV, hasAt := bsonkit.Get(r.readConcern, "atClusterTime")
	var at bson.Timestamp
	if hasAt {
		ts, ok := atV.(bson.Timestamp)
		if !ok {
			return nil, nil, wrongType("readConcern.atClusterTime", atV, "timestamp")
		}
		if level != "snapshot" {
			return nil, nil, errorf(72, "InvalidOptions", "readConcern atClusterTime is only valid with level snapshot")
		}
		if r.autocommit != nil {
			return nil, nil, errorf(238, "NotImplemented", "mongofake: readConcern atClusterTime in a transaction is not supported")
		}
		at = ts
	}
	if r.autocommit != nil {
		if mode, _ := bsonkit.Lookup(r.cmd, "$readPreference.mode"); mode != nil && mode != "primary" {
			return nil, nil, errorf(72, "InvalidOptions", fmt.Sprintf("read preference in a transaction must be primary, not: %v", mode))
		}
	}
	snapshotRead := level == "snapshot" && r.autocommit == nil
	if snapshotRead && !snapshotReadCommands[r.name] {
		return nil, nil, errorf(72, "InvalidOptions",
			fmt.Sprintf("Command %s does not support { readConcern: { level: \"snapshot\" } } outside a transaction", r.name))
	}
	if r.lsid == nil {
		if r.autocommit != nil || r.startTransaction {
			return nil, nil, errorf(50768, "Location50768", "transaction requires a session")
		}
		if snapshotRead {
			snap, _, err := d.srv.engine.OpenSnapshot(at)
			if err != nil {
				return nil, nil, err
			}
			tc.snap = snap
			return tc, snap.Close, nil
		}
		return tc, func() {}, nil
	}
	s := d.session(r.lsid)
	s.mu.Lock()
	s.busy = true
	s.lastUse = time.Now()
	tc.sess = s
	// The command runs under a context killSessions can cancel.
	ctx, cancel := context.WithCancel(r.ctx)
	r.ctx = ctx
	s.killMu.Lock()
	s.cancel = cancel
	s.killMu.Unlock()
	release := func() {
		s.killMu.Lock()
		s.cancel = nil
		s.killMu.Unlock()
		cancel()
		s.busy = false
		s.lastUse = time.Now()
		s.mu.Unlock()
	}
	if snapshotRead {
		// The first snapshot read of a session pins the latest state; the
		// driver sends its timestamp (atClusterTime) with the later ones.
		snap := s.snaps[at]
		if snap == nil || at.IsZero() {
			var ts bson.Timestamp
			var err error
			if snap, ts, err = d.srv.engine.OpenSnapshot(at); err != nil {
				release()
				return nil, nil, err
			}
			if s.snaps == nil {
				s.snaps = map[bson.Timestamp]*engine.Snapshot{}
			}
			if old := s.snaps[ts]; old != nil {
				old.Close()
			}
			s.snaps[ts] = snap
		}
		tc.snap = snap
	}
	if r.txnNumber == nil {
		return tc, release, nil
	}
	n := *r.txnNumber
	if s.hasNumber && n < s.txnNumber {
		release()
		return nil, nil, errorf(225, "TransactionTooOld",
			fmt.Sprintf("Cannot start transaction %d on session because a newer transaction %d has already started", n, s.txnNumber))
	}
	if r.autocommit == nil {
		if r.startTransaction {
			release()
			return nil, nil, errorf(50768, "Location50768", "startTransaction requires autocommit: false")
		}
		if !s.hasNumber || n > s.txnNumber {
			s.abortTxn("a newer transaction number was used")
			s.txnNumber, s.hasNumber, s.retry = n, true, nil
			s.setTxn(nil)
		} else if s.txn != nil {
			release()
			return nil, nil, errorf(50768, "IncompleteTransactionHistory",
				fmt.Sprintf("Cannot run a retryable write with txnNumber %d: it was used for a transaction", n))
		}
		tc.retryable = true
		return tc, release, nil
	}
	if *r.autocommit {
		release()
		return nil, nil, errorf(50768, "Location50768", "autocommit must be false when present")
	}
	if r.startTransaction {
		if s.hasNumber && n == s.txnNumber && (s.txn != nil || s.retry != nil) {
			release()
			return nil, nil, errorf(251, "NoSuchTransaction",
				fmt.Sprintf("Given transaction number %d does not match any in-progress transactions", n))
		}
		if err := checkTxnReadConcern(r.readConcern); err != nil {
			release()
			return nil, nil, err
		}
		s.abortTxn("a newer transaction was started")
		s.txnNumber, s.hasNumber, s.retry = n, true, nil
		s.txnLevel, _ = level.(string)
		s.setTxn(d.srv.engine.Begin(engine.TxnMeta{LSID: r.lsid, TxnNumber: n}))
		tc.txn = s.txn
		return tc, release, nil
	}
	if !s.hasNumber || n != s.txnNumber || s.txn == nil {
		release()
		return nil, nil, errorf(251, "NoSuchTransaction",
			fmt.Sprintf("Given transaction number %d does not match any in-progress transactions.", n))
	}
	tc.txn = s.txn
	return tc, release, nil
}

// checkAfterClusterTime refuses a readConcern afterClusterTime later than
// the server's cluster time with 72 InvalidOptions, as mongod does: a
// client can only have seen times the server issued.
func checkAfterClusterTime(rc bson.D, now bson.Timestamp) error {
	v, ok := bsonkit.Get(rc, "afterClusterTime")
	if !ok {
		return nil
	}
	ts, isTS := v.(bson.Timestamp)
	if !isTS {
		return wrongType("readConcern.afterClusterTime", v, "timestamp")
	}
	if bsonkit.CompareTimestamps(ts, now) > 0 {
		return errorf(72, "InvalidOptions", fmt.Sprintf("readConcern afterClusterTime value must not be greater than the current clusterTime. "+
			"Requested clusterTime: %s; current clusterTime: %s", engine.FormatValue(ts), engine.FormatValue(now)))
	}
	return nil
}

func checkTxnReadConcern(rc bson.D) error {
	if rc == nil {
		return nil
	}
	lvl, _ := bsonkit.Get(rc, "level")
	switch lvl {
	case nil, "snapshot", "majority", "local":
		return nil
	}
	return errorf(72, "InvalidOptions", fmt.Sprintf("The readConcern level must be either 'local' (default), 'majority' or 'snapshot' in order to run in a transaction: %v", lvl))
}

// ---- helpers shared by the command families ----

// dataCommand wraps a data handler: it resolves the session and
// transaction, replays recorded retryable writes and records new ones.
func dataCommand(h func(r *request, tc *txnCtx) (bson.D, error)) handlerFunc {
	return func(r *request) (bson.D, error) {
		tc, release, err := r.srv.data.begin(r)
		if err != nil {
			return nil, convertErr(err)
		}
		defer release()
		if tc.retryable && tc.sess.retry != nil && tc.sess.retry.txnNumber == *r.txnNumber {
			return tc.sess.retry.reply, nil
		}
		if err := r.parseLet(); err != nil {
			return nil, err
		}
		out, err := h(r, tc)
		if err != nil {
			return nil, convertErr(err)
		}
		if tc.snap != nil {
			out = withAtClusterTime(out, tc.snap.Timestamp())
		}
		if tc.retryable && retryableWriteCommands[r.name] && !r.noRetryRecord {
			tc.sess.retry = &retryRecord{txnNumber: *r.txnNumber, reply: out}
		}
		return out, nil
	}
}

// convertErr turns engine and package errors into command errors.
func convertErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *cmdError
	if errors.As(err, &ce) {
		return ce
	}
	return err
}

// writeError renders an error as a writeErrors entry.
func writeError(index int, err error) bson.D {
	ce, ok := convertErr(err).(*cmdError)
	if !ok {
		ce = errorf(1, "InternalError", err.Error())
	}
	d := bson.D{{Key: "index", Value: int32(index)}, {Key: "code", Value: ce.Code}}
	if ce.CodeName != "" {
		d = append(d, bson.E{Key: "codeName", Value: ce.CodeName})
	}
	d = append(d, bson.E{Key: "errmsg", Value: ce.Msg})
	d = append(d, ce.Extra...)
	return d
}

// isCommandLevel reports errors that fail the whole write command rather
// than one statement.
func isCommandLevel(err error) bool {
	if ee, ok := engine.AsError(err); ok {
		switch ee.Code {
		case engine.CodeMaxTimeMSExpired, 11601, engine.CodeNoSuchTransaction, engine.CodeTransactionCommitted, engine.CodeWriteConflict,
			engine.CodeSnapshotUnavailable, engine.CodeLockTimeout:
			return true
		}
	}
	return false
}

// genericFields may appear in every command.
var genericFields = map[string]bool{
	"$db": true, "lsid": true, "txnNumber": true, "autocommit": true, "startTransaction": true,
	"readConcern": true, "writeConcern": true, "$clusterTime": true, "$readPreference": true,
	"maxTimeMS": true, "comment": true, "apiVersion": true, "apiStrict": true,
	"apiDeprecationErrors": true, "$audit": true, "$client": true, "mayBypassWriteBlocking": true,
	"$configServerState": true, "$topologyTime": true, "$configTime": true, "$queryOptions": true,
}

// checkFields rejects fields the command does not know, as mongod does.
func checkFields(r *request, known ...string) error {
	for i, e := range r.cmd {
		if i == 0 || genericFields[e.Key] {
			continue
		}
		found := false
		for _, k := range known {
			if k == e.Key {
				found = true
				break
			}
		}
		if !found {
			return errorf(40415, "Location40415", fmt.Sprintf("BSON field '%s.%s' is an unknown field.", r.name, e.Key))
		}
	}
	return nil
}

func (r *request) get(key string) (any, bool) { return bsonkit.Get(r.cmd, key) }

// collName returns the collection named by the command's first field.
func (r *request) collName() (string, error) {
	s, ok := r.cmd[0].Value.(string)
	if !ok || s == "" {
		return "", errorf(73, "InvalidNamespace", fmt.Sprintf("collection name has invalid type %s", mongoerr.TypeName(r.cmd[0].Value)))
	}
	return s, nil
}

func (r *request) ns() (engine.NS, error) {
	c, err := r.collName()
	return engine.NS{DB: r.db, Coll: c}, err
}

// docArg returns an optional document argument.
func (r *request) docArg(key string) (bson.D, error) {
	v, ok := r.get(key)
	if !ok || v == nil {
		return nil, nil
	}
	d, ok := v.(bson.D)
	if !ok {
		return nil, wrongType(r.name+"."+key, v, "object")
	}
	return d, nil
}

// intArg returns an optional whole-number argument.
func (r *request) intArg(key string) (int64, bool, error) {
	v, ok := r.get(key)
	if !ok || v == nil {
		return 0, false, nil
	}
	n, ok := bsonkit.ToInt64(v)
	if !ok {
		if f, isF := v.(float64); isF && !math.IsNaN(f) {
			return int64(f), true, nil
		}
		return 0, false, wrongType(r.name+"."+key, v, "long")
	}
	return n, true, nil
}

// boolArg returns an optional boolean argument (numbers count as booleans).
func (r *request) boolArg(key string, def bool) (bool, error) {
	v, ok := r.get(key)
	if !ok || v == nil {
		return def, nil
	}
	return truthy(v, r.name+"."+key)
}

func truthy(v any, field string) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case int32, int64, float64, bson.Decimal128:
		f, _ := bsonkit.ToFloat64(x)
		return f != 0, nil
	}
	return false, wrongType(field, v, "bool")
}

// opCtx returns the context of a command: the connection's, bounded by
// maxTimeMS when given.
func (r *request) opCtx() (context.Context, context.CancelFunc, error) {
	ms, ok, err := r.intArg("maxTimeMS")
	if err != nil {
		return nil, nil, err
	}
	if ms < 0 {
		return nil, nil, errorf(2, "BadValue", "maxTimeMS must be non-negative")
	}
	if ok && ms > 0 {
		ctx, cancel := context.WithTimeout(r.ctx, time.Duration(ms)*time.Millisecond)
		return ctx, cancel, nil
	}
	ctx, cancel := context.WithCancel(r.ctx)
	return ctx, cancel, nil
}

// parseLet evaluates the command's let parameters into r.vars. Each value
// is an aggregation expression evaluated once, without a document; names
// follow MongoDB's rules for user variables.
func (r *request) parseLet() error {
	v, ok := r.get("let")
	if !ok || v == nil {
		return nil
	}
	d, ok := v.(bson.D)
	if !ok {
		return wrongType(r.name+".let", v, "object")
	}
	env := pipeline.Env{Now: r.srv.engine.Now(), ClusterTime: r.srv.engine.ClusterTime()}
	vars := make(bson.D, 0, len(d))
	for _, e := range d {
		if err := checkVarName(e.Key); err != nil {
			return err
		}
		val, err := pipeline.Eval(e.Value, nil, env)
		if err != nil {
			return convertErr(err)
		}
		vars = append(vars, bson.E{Key: e.Key, Value: val})
	}
	r.vars = vars
	return nil
}

// checkVarName applies MongoDB's rule for user variable names: a lowercase
// ASCII letter or a non-ASCII character first, then letters, digits and '_'.
func checkVarName(name string) error {
	if name == "" {
		return errorf(16866, "Location16866", "empty variable names are not allowed")
	}
	for i, c := range name {
		switch {
		case i == 0 && !(c >= 'a' && c <= 'z') && c < 0x80:
			return errorf(16870, "Location16870", fmt.Sprintf("'%s' starts with an invalid character for a user variable name", name))
		case c < 0x80 && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') && c != '_':
			return errorf(16871, "Location16871", fmt.Sprintf("'%s' contains an invalid character for a variable name: '%c'", name, c))
		}
	}
	return nil
}

// withAtClusterTime reports a snapshot read's timestamp where drivers look
// for it: in the cursor document of a cursor reply, else at the top level.
func withAtClusterTime(out bson.D, ts bson.Timestamp) bson.D {
	for i, e := range out {
		if c, ok := e.Value.(bson.D); ok && e.Key == "cursor" {
			out[i].Value = append(removeKey(c, "atClusterTime"), bson.E{Key: "atClusterTime", Value: ts})
			return out
		}
	}
	return append(removeKey(out, "atClusterTime"), bson.E{Key: "atClusterTime", Value: ts})
}

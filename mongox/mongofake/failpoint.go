package mongofake

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// FailPoint makes matching commands fail, block, or drop the connection, as
// mongod's failCommand fail point does (the configureFailPoint command with
// EnableTestCommands offers the same through the wire protocol).
//
// A command matches when its name is in Commands and, if AppName is set, the
// connection's handshake carried that application name. Hello, isMaster,
// ping and the fail point commands fail only when named.
//
// The actions run in this order, as in mongod 4.9+: BlockTime delays the
// command; CloseConnection closes the connection without a reply; ErrorCode
// replies with that error instead of running the command; otherwise the command runs and
// WriteConcernError, if set, is attached to its (ok: 1) reply.
type FailPoint struct {
	// Commands are the command names to fail, as sent (for example
	// "insert", "commitTransaction").
	Commands []string
	// Times limits how often the fail point fires; 0 means every time.
	Times int
	// Skip lets the first Skip matching commands through before the fail
	// point starts firing. Defaults to 0.
	Skip int
	// AppName restricts the fail point to connections whose driver sent
	// this application name. Defaults to "" (every connection).
	AppName string

	// ErrorCode is the error code to reply with; 0 runs the command.
	ErrorCode int32
	// ErrorMessage is the errmsg of the error reply. Defaults to
	// "Failing command via 'failCommand' failpoint".
	ErrorMessage string
	// ErrorLabels replace the labels of the reply. nil (the default) lets
	// the server add RetryableWriteError / TransientTransactionError as
	// mongod does; an empty, non-nil slice sends no labels.
	ErrorLabels []string
	// CloseConnection closes the connection without replying, as a
	// network error would.
	CloseConnection bool
	// BlockTime delays the command before it runs or fails.
	BlockTime time.Duration
	// WriteConcernError, when set, is attached to the reply of the
	// command, which runs normally.
	WriteConcernError *WriteConcernError
}

// WriteConcernError is the writeConcernError a FailPoint attaches to a reply.
type WriteConcernError struct {
	// Code is the error code, for example 64 (WriteConcernFailed) or 91
	// (ShutdownInProgress, retryable).
	Code int32
	// CodeName defaults to the name of Code.
	CodeName string
	// Message is the errmsg. Defaults to "".
	Message string
	// Labels are sent inside the writeConcernError document (older
	// servers' placement). Defaults to none.
	Labels []string
}

// The fail points configureFailPoint knows, as mongod names them.
const (
	// fpFailCommand fails, blocks or drops matching commands.
	fpFailCommand = "failCommand"
	// fpTransactionalWrite fires on each statement of a retryable write,
	// after the statement ran and before it commits: it closes the
	// connection (data.closeConnection, default true) and, with
	// data.failBeforeCommitExceptionCode, fails the statement so that it is
	// not reflected.
	fpTransactionalWrite = "onPrimaryTransactionalWrite"
	// fpFailGetMore fails a getMore with data.errorCode once the cursor is
	// checked out.
	fpFailGetMore = "failGetMoreAfterCursorCheckout"
)

// failPoint is one armed fail point.
type failPoint struct {
	id          int64
	kind        string // fpFailCommand, fpTransactionalWrite or fpFailGetMore
	fromCommand bool   // set by configureFailPoint (replaced by the next one of its kind)
	commands    map[string]bool
	appName     string
	remaining   int // < 0: unlimited
	skip        int
	hits        int64

	errorCode       int32
	errmsg          string
	labels          []string
	labelsSet       bool
	closeConnection bool
	block           time.Duration
	wce             bson.D
	// failBeforeCommit is onPrimaryTransactionalWrite's
	// failBeforeCommitExceptionCode (0: none).
	failBeforeCommit int32
}

// failPoints is the set of armed fail points.
type failPoints struct {
	mu     sync.Mutex
	list   []*failPoint
	nextID int64
}

const defaultFailMsg = "Failing command via 'failCommand' failpoint"

// match finds the first armed fail point for a command on a connection with
// appName and consumes one activation. It returns a copy of it, or nil.
func (f *failPoints) match(name, appName string) *failPoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fp := range f.list {
		if fp.kind != fpFailCommand || !fp.commands[name] || (fp.appName != "" && fp.appName != appName) {
			continue
		}
		if fp.skip > 0 {
			fp.skip--
			continue
		}
		fp.hits++
		cp := *fp
		if fp.remaining > 0 {
			fp.remaining--
			if fp.remaining == 0 {
				f.list = append(f.list[:i:i], f.list[i+1:]...)
			}
		}
		return &cp
	}
	return nil
}

// fire consumes one activation of the armed fail point of a kind other
// than failCommand and returns a copy of it, or nil.
func (f *failPoints) fire(kind string) *failPoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fp := range f.list {
		if fp.kind != kind {
			continue
		}
		if fp.skip > 0 {
			fp.skip--
			continue
		}
		fp.hits++
		cp := *fp
		if fp.remaining > 0 {
			fp.remaining--
			if fp.remaining == 0 {
				f.list = append(f.list[:i:i], f.list[i+1:]...)
			}
		}
		return &cp
	}
	return nil
}

func (f *failPoints) add(fp *failPoint) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	fp.id = f.nextID
	if fp.fromCommand {
		f.removeCommandLocked(fp.kind)
	}
	f.list = append(f.list, fp)
	return fp.id
}

func (f *failPoints) remove(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, fp := range f.list {
		if fp.id == id {
			f.list = append(f.list[:i:i], f.list[i+1:]...)
			return
		}
	}
}

// removeCommandLocked disarms the fail point of a kind set by
// configureFailPoint and returns how often it fired.
func (f *failPoints) removeCommandLocked(kind string) int64 {
	for i, fp := range f.list {
		if fp.fromCommand && fp.kind == kind {
			f.list = append(f.list[:i:i], f.list[i+1:]...)
			return fp.hits
		}
	}
	return 0
}

func (f *failPoints) clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = nil
}

// FailCommand arms a fail point and returns a function that disarms it
// (safe to call more than once, and after the fail point ran out). It works
// whether or not EnableTestCommands is set.
func (s *Server) FailCommand(p FailPoint) (cancel func()) {
	fp := &failPoint{
		kind:            fpFailCommand,
		commands:        map[string]bool{},
		appName:         p.AppName,
		remaining:       p.Times,
		skip:            p.Skip,
		errorCode:       p.ErrorCode,
		errmsg:          p.ErrorMessage,
		closeConnection: p.CloseConnection,
		block:           p.BlockTime,
	}
	if fp.remaining <= 0 {
		fp.remaining = -1
	}
	if fp.errmsg == "" {
		fp.errmsg = defaultFailMsg
	}
	for _, c := range p.Commands {
		fp.commands[c] = true
	}
	if p.ErrorLabels != nil {
		fp.labels, fp.labelsSet = append([]string{}, p.ErrorLabels...), true
	}
	if w := p.WriteConcernError; w != nil {
		name := w.CodeName
		if name == "" {
			name = mongoerr.CodeName(w.Code)
		}
		fp.wce = bson.D{{Key: "code", Value: w.Code}, {Key: "codeName", Value: name}, {Key: "errmsg", Value: w.Message}}
		if len(w.Labels) > 0 {
			fp.wce = append(fp.wce, bson.E{Key: "errorLabels", Value: stringsToA(w.Labels)})
		}
	}
	id := s.fp.add(fp)
	return func() { s.fp.remove(id) }
}

// ClearFailPoints disarms every fail point, including the one set with
// configureFailPoint.
func (s *Server) ClearFailPoints() { s.fp.clear() }

func init() {
	register(commandSpec{names: []string{"configureFailPoint"}, handler: configureFailPoint, adminOnly: true, noSession: true})
}

// configureFailPoint implements {configureFailPoint: name, mode, data} for
// the fail points failCommand, onPrimaryTransactionalWrite and
// failGetMoreAfterCursorCheckout.
func configureFailPoint(r *request) (bson.D, error) {
	s := r.srv
	if !s.cfg.testCommands {
		return nil, errorf(59, "CommandNotFound",
			"no such command: 'configureFailPoint'; it requires test commands (mongofake.EnableTestCommands(true), like mongod's enableTestCommands)")
	}
	name, _ := r.cmd[0].Value.(string)
	switch name {
	case fpFailCommand, fpTransactionalWrite, fpFailGetMore:
	default:
		return nil, errorf(2, "BadValue", fmt.Sprintf("mongofake: fail point %q is not supported; only %s, %s and %s are", name, fpFailCommand, fpTransactionalWrite, fpFailGetMore))
	}
	var mode any
	var data bson.D
	for _, e := range r.cmd[1:] {
		switch e.Key {
		case "mode":
			mode = e.Value
		case "data":
			d, ok := e.Value.(bson.D)
			if !ok {
				return nil, wrongType("data", e.Value, "object")
			}
			data = d
		}
	}
	fp := &failPoint{kind: name, fromCommand: true, commands: map[string]bool{}, remaining: -1, errmsg: defaultFailMsg}
	// onPrimaryTransactionalWrite closes the connection unless told not to.
	fp.closeConnection = name == fpTransactionalWrite
	switch m := mode.(type) {
	case string:
		switch m {
		case "alwaysOn":
		case "off":
			s.fp.mu.Lock()
			hits := s.fp.removeCommandLocked(name)
			s.fp.mu.Unlock()
			return bson.D{{Key: "count", Value: hits}}, nil
		default:
			return nil, errorf(2, "BadValue", fmt.Sprintf("mongofake: configureFailPoint mode %q is not supported; use \"alwaysOn\", \"off\", {times: n} or {skip: n}", m))
		}
	case bson.D:
		if len(m) != 1 {
			return nil, errorf(2, "BadValue", "mongofake: configureFailPoint mode document must have exactly one of times, skip")
		}
		n, ok := wholeNumber(m[0].Value)
		if !ok || n < 0 || n > math.MaxInt32 {
			return nil, errorf(2, "BadValue", "mongofake: configureFailPoint mode."+m[0].Key+" must be a non-negative integer")
		}
		switch m[0].Key {
		case "times":
			if n == 0 {
				s.fp.mu.Lock()
				hits := s.fp.removeCommandLocked(name)
				s.fp.mu.Unlock()
				return bson.D{{Key: "count", Value: hits}}, nil
			}
			fp.remaining = int(n)
		case "skip":
			fp.skip = int(n)
		default:
			return nil, errorf(2, "BadValue", "mongofake: configureFailPoint mode "+m[0].Key+" is not supported; use times or skip")
		}
	case nil:
		return nil, errorf(9, "FailedToParse", "mongofake: configureFailPoint requires a mode")
	default:
		return nil, wrongType("mode", mode, "string or object")
	}

	blockConnection := false
	var blockMS int64 = -1
	for _, e := range data {
		switch e.Key {
		case "failCommands":
			a, ok := e.Value.(bson.A)
			if !ok {
				return nil, wrongType("failCommands", e.Value, "array")
			}
			for _, v := range a {
				c, ok := v.(string)
				if !ok {
					return nil, wrongType("failCommands element", v, "string")
				}
				fp.commands[c] = true
			}
		case "errorCode":
			n, ok := wholeNumber(e.Value)
			if !ok || n < math.MinInt32 || n > math.MaxInt32 {
				return nil, wrongType("errorCode", e.Value, "int")
			}
			fp.errorCode = int32(n)
		case "errorLabels":
			a, ok := e.Value.(bson.A)
			if !ok {
				return nil, wrongType("errorLabels", e.Value, "array")
			}
			fp.labels, fp.labelsSet = []string{}, true
			for _, v := range a {
				l, ok := v.(string)
				if !ok {
					return nil, wrongType("errorLabels element", v, "string")
				}
				fp.labels = append(fp.labels, l)
			}
		case "closeConnection":
			b, ok := e.Value.(bool)
			if !ok {
				return nil, wrongType("closeConnection", e.Value, "bool")
			}
			fp.closeConnection = b
		case "blockConnection":
			b, ok := e.Value.(bool)
			if !ok {
				return nil, wrongType("blockConnection", e.Value, "bool")
			}
			blockConnection = b
		case "blockTimeMS":
			n, ok := wholeNumber(e.Value)
			if !ok || n < 0 {
				return nil, wrongType("blockTimeMS", e.Value, "non-negative int")
			}
			blockMS = n
		case "writeConcernError":
			d, ok := e.Value.(bson.D)
			if !ok {
				return nil, wrongType("writeConcernError", e.Value, "object")
			}
			fp.wce = d
		case "appName":
			a, ok := e.Value.(string)
			if !ok {
				return nil, wrongType("appName", e.Value, "string")
			}
			fp.appName = a
		case "errmsg":
			m, ok := e.Value.(string)
			if !ok {
				return nil, wrongType("errmsg", e.Value, "string")
			}
			fp.errmsg = m
		case "failBeforeCommitExceptionCode":
			n, ok := wholeNumber(e.Value)
			if !ok || n < math.MinInt32 || n > math.MaxInt32 || n == 0 {
				return nil, wrongType("failBeforeCommitExceptionCode", e.Value, "non-zero int")
			}
			fp.failBeforeCommit = int32(n)
		case "failInternalCommands", "threadName", "namespace":
			// No internal clients here; threadName and namespace are
			// accepted but not used for matching.
		default:
			// mongod does not validate data strictly either.
			s.logger.Warn("mongofake: configureFailPoint ignores unknown data field", "field", e.Key)
		}
	}
	switch {
	case name == fpFailCommand && len(fp.commands) == 0:
		return nil, errorf(2, "BadValue", "mongofake: failCommand requires data.failCommands, a non-empty array of command names")
	case name == fpFailGetMore && fp.errorCode == 0:
		return nil, errorf(2, "BadValue", "mongofake: failGetMoreAfterCursorCheckout requires data.errorCode")
	}
	if blockConnection {
		if blockMS < 0 {
			return nil, errorf(2, "BadValue", "mongofake: failCommand blockConnection requires data.blockTimeMS")
		}
		fp.block = time.Duration(blockMS) * time.Millisecond
	}
	s.fp.mu.Lock()
	hits := s.fp.removeCommandLocked(name)
	s.fp.mu.Unlock()
	s.fp.add(fp)
	return bson.D{{Key: "count", Value: hits}}, nil
}

// wholeNumber converts an int32, int64 or integral double to int64.
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) || n > math.MaxInt64 || n < math.MinInt64 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

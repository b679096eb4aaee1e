package mongofake

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
)

// request is one decoded command, as the dispatcher hands it to a handler.
// The contract between the server shell (wire, dispatch, admin, fail points)
// and the command families (crud, cursors, aggregate, indexes, transactions,
// change streams): handlers only read it.
type request struct {
	ctx  context.Context // ends when the connection closes or the server stops
	srv  *Server
	conn *conn // the client connection (id, appName, remote address)

	db   string // the command's $db
	name string // command name as sent (first key of the body)
	// cmd is the command body. OP_MSG document sequences (kind 1 sections)
	// are merged into it as arrays under their identifier (for example
	// "documents" for insert), so handlers see one document.
	cmd bson.D

	// Session and transaction fields, lifted from the body by the dispatcher.
	lsid             bson.D // nil when the command has no session
	txnNumber        *int64
	autocommit       *bool // present (false) on every command of a transaction
	startTransaction bool
	readConcern      bson.D
	writeConcern     bson.D
	// api are the Stable API fields (apiVersion, apiStrict,
	// apiDeprecationErrors).
	api apiParams
	// vars are the command's let parameters, evaluated (set by
	// dataCommand before the handler runs).
	vars bson.D

	// Set by handlers (the request is owned by one goroutine).
	// dropConn closes the connection once the command has run, without a
	// reply (the onPrimaryTransactionalWrite fail point).
	dropConn bool
	// noRetryRecord keeps a retryable write's reply from being recorded
	// for replay: a statement failed on purpose and must run again when
	// retried.
	noRetryRecord bool
}

// handlerFunc runs one command and returns the reply body without the
// generic fields: the dispatcher adds ok, $clusterTime and operationTime.
// A returned *cmdError becomes an error reply ({ok: 0, errmsg, code,
// codeName, errorLabels}); any other error becomes code 1 InternalError.
// Write errors that MongoDB reports with ok: 1 (writeErrors,
// writeConcernError) are part of the reply body, not returned errors.
type handlerFunc func(r *request) (bson.D, error)

// commandSpec describes one command for the dispatcher.
type commandSpec struct {
	names   []string // canonical name first, then aliases (matched case-insensitively where MongoDB does)
	handler handlerFunc
	// adminOnly commands must be sent to the admin database.
	adminOnly bool
	// noSession commands ignore lsid (hello, isMaster, ping...).
	noSession bool
	// testOnly commands exist only with EnableTestCommands, as mongod
	// registers them only with enableTestCommands.
	testOnly bool
	// apiVersions are the Stable API versions of the command, and
	// deprecatedIn those it is deprecated in; nil apiVersions means
	// version 1 for the commands in apiV1Commands, none for the others.
	apiVersions, deprecatedIn []string
}

// commands is the command table. Each command family file registers its
// commands from an init function with register.
var commands = map[string]*commandSpec{}

// register adds commands to the table. It panics on a duplicate name, which
// is a programming error caught by any test.
func register(specs ...commandSpec) {
	for i := range specs {
		s := &specs[i]
		for _, n := range s.names {
			if _, dup := commands[n]; dup {
				panic("mongofake: command registered twice: " + n)
			}
			commands[n] = s
		}
	}
}

// cmdError is a command error reply: the server's one error type.
type cmdError = mongoerr.Error

// errorf builds a cmdError for a well-known code.
func errorf(code int32, codeName, msg string, labels ...string) *cmdError {
	return &cmdError{Code: code, CodeName: codeName, Msg: msg, Labels: labels}
}

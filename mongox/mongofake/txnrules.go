package mongofake

import (
	"fmt"
	"strings"
)

// txnPolicy says what a command may do inside a multi-document transaction
// (a command carrying autocommit: false).
type txnPolicy int

const (
	// txnRefused: 263 OperationNotSupportedInTransaction. The default.
	txnRefused txnPolicy = iota
	// txnAllowed: the command runs in the transaction.
	txnAllowed
	// txnNotFirst: allowed, but it cannot start the transaction.
	txnNotFirst
	// txnSessionIgnored: the command ignores the session fields it is
	// sent with (mongod's killSessions family and endSessions do not attach
	// the session to the operation, so that they cannot kill themselves).
	txnSessionIgnored
)

// txnCommands are the commands MongoDB 7.0 runs in a transaction
// (https://www.mongodb.com/docs/v7.0/core/transactions-operations/: the
// CRUD commands, getMore and killCursors, create and createIndexes, and the
// transaction commands). Every other command, count, listCollections,
// listIndexes, the catalog and administration commands and even hello and
// ping among them, fails with 263 OperationNotSupportedInTransaction
// without aborting the transaction.
var txnCommands = map[string]txnPolicy{
	"find": txnAllowed, "getMore": txnAllowed, "aggregate": txnAllowed, "distinct": txnAllowed,
	"insert": txnAllowed, "update": txnAllowed, "delete": txnAllowed,
	"findAndModify": txnAllowed, "findandmodify": txnAllowed,
	"create": txnAllowed, "createIndexes": txnAllowed,
	"commitTransaction": txnAllowed, "abortTransaction": txnAllowed,
	"killCursors": txnNotFirst,
	"endSessions": txnSessionIgnored, "killSessions": txnSessionIgnored,
	"killAllSessions": txnSessionIgnored, "killAllSessionsByPattern": txnSessionIgnored,
}

// writeCommands are the commands that write documents of the collection
// their first field names.
var writeCommands = map[string]bool{
	"insert": true, "update": true, "delete": true, "findAndModify": true, "findandmodify": true,
}

// checkTxnStatement applies MongoDB's rules for a statement of a
// transaction before it reaches the session: a refused statement fails
// without starting or aborting the transaction, as mongod validates session
// options before it checks the session out.
func checkTxnStatement(r *request) error {
	policy := txnCommands[r.name]
	if policy == txnSessionIgnored {
		return nil
	}
	notSupported := func(msg string) error {
		return errorf(263, "OperationNotSupportedInTransaction", msg)
	}
	switch {
	case r.name == "count":
		return notSupported("Cannot run 'count' in a multi-document transaction. Please see " +
			"http://dochub.mongodb.org/core/transaction-count for a recommended alternative.")
	case policy == txnRefused:
		return notSupported(fmt.Sprintf("Cannot run '%s' in a multi-document transaction.", r.name))
	}
	if r.startTransaction {
		switch r.name {
		case "killCursors":
			return notSupported("Cannot run killCursors as the first operation in a multi-document transaction.")
		case "commitTransaction":
			return notSupported("Cannot start a transaction with a commit")
		case "abortTransaction":
			return notSupported("Cannot start a transaction with an abort")
		}
	}
	if r.db == "local" || r.db == "config" {
		return notSupported(fmt.Sprintf("Cannot run command against the '%s' database in a transaction.", r.db))
	}
	if coll := r.txnCollection(); coll != "" {
		ns := r.db + "." + coll
		switch {
		case coll == "system.profile":
			return notSupported(fmt.Sprintf("Cannot run command against the '%s' collection in a transaction.", ns))
		case strings.HasPrefix(coll, "system.") && writeCommands[r.name]:
			return errorf(50791, "Location50791", fmt.Sprintf("Cannot write to system collection %s within a transaction.", ns))
		case strings.HasPrefix(coll, "system.") && (r.name == "create" || r.name == "createIndexes"):
			return notSupported(fmt.Sprintf("Cannot create a collection or an index on system collection %s in a multi-document transaction.", ns))
		}
	}
	if r.readConcern != nil && !r.startTransaction {
		return errorf(72, "InvalidOptions", "Only the first command in a transaction may specify a readConcern")
	}
	if r.writeConcern != nil && r.name != "commitTransaction" && r.name != "abortTransaction" {
		return errorf(72, "InvalidOptions", "writeConcern is not allowed within a multi-statement transaction")
	}
	return nil
}

// txnCollection returns the collection a transaction statement reads or
// writes ("" for none or a database-level command).
func (r *request) txnCollection() string {
	if r.name == "getMore" {
		s, _ := lookupD(r.cmd, "collection").(string)
		return s
	}
	s, _ := r.cmd[0].Value.(string)
	return s
}

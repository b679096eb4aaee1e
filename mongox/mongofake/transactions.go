package mongofake

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/engine"
)

func init() {
	register(
		commandSpec{names: []string{"commitTransaction"}, handler: dataCommand(cmdCommitTransaction), adminOnly: true},
		commandSpec{names: []string{"abortTransaction"}, handler: dataCommand(cmdAbortTransaction), adminOnly: true},
	)
}

// cmdCommitTransaction commits the session's transaction. Committing again
// after a successful commit succeeds (the driver retries commits); after
// an abort it fails with 251 NoSuchTransaction.
func cmdCommitTransaction(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "recoveryToken"); err != nil {
		return nil, err
	}
	if tc.txn == nil {
		return nil, errorf(251, "NoSuchTransaction", "commitTransaction requires a transaction (autocommit: false)")
	}
	return bson.D{}, tc.txn.Commit()
}

// cmdAbortTransaction aborts the session's transaction.
func cmdAbortTransaction(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "recoveryToken"); err != nil {
		return nil, err
	}
	if tc.txn == nil {
		return nil, errorf(251, "NoSuchTransaction", "abortTransaction requires a transaction (autocommit: false)")
	}
	switch tc.txn.State() {
	case engine.TxnCommitted:
		return nil, errorf(256, "TransactionCommitted", "Transaction has been committed; it cannot be aborted")
	case engine.TxnAborted:
		return nil, errorf(251, "NoSuchTransaction", "Transaction has been aborted.")
	}
	tc.txn.Abort()
	return bson.D{}, nil
}

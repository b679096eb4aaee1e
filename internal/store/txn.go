package store

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// One-attempt transactions.
//
// The consumer's writes run in transactions of one attempt each, not
// through the driver's WithTransaction: a write that meets a document
// locked by another session's open transaction fails at once with a
// WriteConflict, and the caller decides what follows (a backoff on that
// key only, ending a dead replica's sessions) instead of the driver
// retrying at full speed for two minutes. A write outside any transaction
// would instead wait on such a lock until the server aborts the other
// transaction (transactionLifetimeLimitSeconds, 60 s by default): no write
// of the handling path is made that way.

// endTimeout bounds the abort that ending a session sends.
const endTimeout = 5 * time.Second

// codeWriteConflict is MongoDB's WriteConflict error code.
const codeWriteConflict = 112

// Commit commits the transaction of sess, trying the commit again (at most
// twice) when its result is unknown, as the driver would. A commit that
// met another transaction's write is reported by IsWriteConflict.
func Commit(ctx context.Context, sess *mongo.Session) error {
	for i := 0; ; i++ {
		err := sess.CommitTransaction(ctx)
		if err == nil || i == 2 || ctx.Err() != nil || !HasLabel(err, "UnknownTransactionCommitResult") {
			return err
		}
	}
}

// End ends sess, aborting its transaction if it is still open, bounded by
// endTimeout even when ctx has ended: an open transaction left behind
// holds its locks until the server's transaction lifetime runs out.
func End(ctx context.Context, sess *mongo.Session) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	sess.EndSession(ctx)
}

// IsWriteConflict reports whether err is a write conflict: a document
// another transaction is writing, or wrote after this one's snapshot.
func IsWriteConflict(err error) bool {
	var se mongo.ServerError
	return err != nil && errors.As(err, &se) && se.HasErrorCode(codeWriteConflict)
}

// HasLabel reports whether err carries the driver's error label.
func HasLabel(err error, label string) bool {
	var le mongo.LabeledError
	return errors.As(err, &le) && le.HasErrorLabel(label)
}

// WithTransaction runs fn in a transaction of sess with the driver's
// retries (majority write concern), but stops retrying once ctx has ended:
// the driver retries a TransientTransactionError for up to 120 s and
// ignores cancellation between attempts, and an operation cut short by the
// end of ctx, or one that found no server, is itself labelled transient.
// Without this check a caller's deadline (an operator command's -timeout,
// a request's context) would be outlived by two minutes.
func WithTransaction(ctx context.Context, sess *mongo.Session, fn func(ctx context.Context) (any, error)) (any, error) {
	return sess.WithTransaction(ctx, func(sctx context.Context) (any, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return fn(sctx)
	}, options.Transaction().SetWriteConcern(writeconcern.Majority()))
}

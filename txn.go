package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/consume"
)

// Transactions of the consumer.
//
// The consumer's writes run in transactions of one attempt each (beginTx,
// txOnce), not through the driver's WithTransaction: a write that meets a
// document locked by another session's open transaction fails at once with
// a WriteConflict, and the consumer decides what follows (a backoff on
// that key only, and ending a dead replica's sessions, see internal/liveness/takeover.go)
// instead of the driver retrying at full speed for two minutes. A write
// outside any transaction would instead wait on such a lock until the
// server aborts the other transaction (transactionLifetimeLimitSeconds, 60
// s by default): no write of the handling path is made that way.

// endTimeout bounds the abort that ending a session sends.
const endTimeout = 5 * time.Second

// tx is one attempt of a consumer transaction.
type tx struct {
	sess *mongo.Session
	// ctx carries the session and the events the attempt records.
	ctx   context.Context
	state *txState
}

// beginTx starts a transaction (majority write concern) in a new session,
// whose id it first records for takeover (internal/liveness/takeover.go).
func (c *Client) beginTx(ctx context.Context) (*tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.ensureUniqueIndex(ctx); err != nil {
		return nil, err
	}
	sess, err := c.cfg.Mongo.StartSession()
	if err != nil {
		return nil, fmt.Errorf("outbox: start session: %w", err)
	}
	if err := c.sessions.Note(ctx, sess.ID()); err != nil {
		sess.EndSession(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := sess.StartTransaction(txnOptions()); err != nil {
		sess.EndSession(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("outbox: start transaction: %w", err)
	}
	st := &txState{client: c}
	return &tx{sess: sess, ctx: context.WithValue(mongo.NewSessionContext(ctx, sess), txKey{}, st), state: st}, nil
}

// commit commits the transaction, trying the commit again (at most twice)
// when its result is unknown, as the driver would.
func (t *tx) commit(ctx context.Context) error {
	for i := 0; ; i++ {
		err := t.sess.CommitTransaction(ctx)
		if err == nil || i == 2 || ctx.Err() != nil || !hasLabel(err, "UnknownTransactionCommitResult") {
			return lockedOr(err)
		}
	}
}

// end ends the session, aborting the transaction if it is still open.
func (t *tx) end(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	t.sess.EndSession(ctx)
}

// txOnce runs fn in one transaction attempt and commits. Its error wraps
// consume.ErrLocked when a write met another transaction's lock.
func (c *Client) txOnce(ctx context.Context, fn func(ctx context.Context) error) error {
	t, err := c.beginTx(ctx)
	if err != nil {
		return err
	}
	defer t.end(ctx)
	if err := fn(t.ctx); err != nil {
		return lockedOr(err)
	}
	return t.commit(ctx)
}

// codeWriteConflict is MongoDB's WriteConflict error code.
const codeWriteConflict = 112

// lockedOr wraps consume.ErrLocked around a write conflict (a document
// another transaction is writing, or wrote after this one's snapshot).
func lockedOr(err error) error {
	var se mongo.ServerError
	if err != nil && errors.As(err, &se) && se.HasErrorCode(codeWriteConflict) {
		return fmt.Errorf("%w: %w", consume.ErrLocked, err)
	}
	return err
}

func hasLabel(err error, label string) bool {
	var le mongo.LabeledError
	return errors.As(err, &le) && le.HasErrorLabel(label)
}

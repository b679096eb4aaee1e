package outbox

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
)

// Transactions of the consumer run one attempt each (store.Commit,
// store.End): a write conflict fails at once and the consumer decides what
// follows (see internal/store's txn.go for why).

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

// commit commits the transaction (see store.Commit); its error wraps
// consume.ErrLocked on a write conflict.
func (t *tx) commit(ctx context.Context) error {
	return lockedOr(store.Commit(ctx, t.sess))
}

// end ends the session, aborting the transaction if it is still open.
func (t *tx) end(ctx context.Context) { store.End(ctx, t.sess) }

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

// lockedOr wraps consume.ErrLocked around a write conflict (a document
// another transaction is writing, or wrote after this one's snapshot).
func lockedOr(err error) error {
	if store.IsWriteConflict(err) {
		return fmt.Errorf("%w: %w", consume.ErrLocked, err)
	}
	return err
}

func hasLabel(err error, label string) bool { return store.HasLabel(err, label) }

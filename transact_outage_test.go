package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// A transaction that fails while MongoDB is down returns soon after, its
// context ended or not: the driver's own abort runs on a background context
// and waited for its server selection timeout (30 s), so a request with a 5 s
// deadline answered after 35 s.
func TestTransactReturnsSoonWhenMongoDBGoesDown(t *testing.T) {
	t.Parallel()
	errHandler := errors.New("the caller's own failure")
	for name, ended := range map[string]bool{"context ended": true, "context alive": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			m := mongotest.StartEmbedded(t)
			cfg := b.config("abort")
			cfg.Mongo, cfg.Database = m.Client, "abort"
			c := b.client(t, cfg)
			things := m.Client.Database("abort").Collection("things")
			// A request's context: a deadline, as outbox.Server gives.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			began := time.Now()
			err := c.Transact(ctx, func(ctx context.Context) error {
				if _, err := things.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
					return err
				}
				require.NoError(t, m.Server.Close()) // MongoDB goes down mid-transaction
				if ended {
					cancel() // and the request's deadline passes
					return ctx.Err()
				}
				return errHandler
			})
			took := time.Since(began)
			if ended {
				require.ErrorIs(t, err, context.Canceled)
			} else {
				require.ErrorIs(t, err, errHandler)
			}
			// The bound is loose (the abort gets the 5 s deadline at most);
			// the driver's own abort took its 30 s server selection timeout.
			require.Less(t, took, 20*time.Second, "Transact returned %v after the failure", took)
		})
	}
}

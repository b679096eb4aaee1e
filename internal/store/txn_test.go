package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A transaction that finds no server fails with errors the driver labels
// transient and retries for two minutes, ignoring cancellation between
// attempts: WithTransaction returns once its context has ended (an
// operator command's -timeout), not two minutes later.
func TestWithTransactionStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100&connectTimeoutMS=100"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	sess, err := client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := WithTransaction(ctx, sess, func(sctx context.Context) (any, error) {
			_, err := client.Database("x").Collection("y").InsertOne(sctx, bson.D{})
			return nil, err
		})
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		require.True(t, errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil, "%v", err)
	case <-time.After(time.Minute):
		t.Fatal("WithTransaction still retrying a minute after its context ended")
	}
}

package mongotest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartEmbedded(t *testing.T) {
	t.Parallel()
	env := mongotest.StartEmbedded(t)
	require.False(t, env.Real)
	require.NotNil(t, env.Server)
	require.Equal(t, env.Server.URI(), env.URI)
	ctx := context.Background()
	require.NoError(t, env.Client.Ping(ctx, nil))

	// Test commands are on by default.
	err := env.Client.Database("admin").RunCommand(ctx, bson.D{
		{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"},
	}).Err()
	require.NoError(t, err)
}

func TestDBIsolatedAndDropped(t *testing.T) {
	t.Parallel()
	env := mongotest.Start(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		a, b := env.DB(t), env.DB(t)
		require.NotEqual(t, a.Name(), b.Name(), "every call gets its own database")
		require.LessOrEqual(t, len(a.Name()), 63)
		_, err := a.Collection("c").InsertOne(context.Background(), bson.D{{Key: "x", Value: 1}})
		require.NoError(t, err)
		n, err := b.Collection("c").CountDocuments(context.Background(), bson.D{})
		require.NoError(t, err)
		require.Zero(t, n)
		name = a.Name()
	})
	names, err := env.Client.ListDatabaseNames(context.Background(), bson.D{{Key: "name", Value: name}})
	require.NoError(t, err)
	require.Empty(t, names, "the database is dropped when its test ends")
}

func TestStartRealSkipsWithoutURI(t *testing.T) {
	if mongotest.RealConfigured() {
		t.Skip("OUTBOX_TEST_MONGODB_URI is set")
	}
	t.Parallel()
	var skipped bool
	t.Run("real", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		mongotest.StartReal(t)
		t.Error("StartReal returned without OUTBOX_TEST_MONGODB_URI")
	})
	require.True(t, skipped, "StartReal skips without OUTBOX_TEST_MONGODB_URI")
}

func TestStartRealUsesURI(t *testing.T) {
	if mongotest.RealConfigured() {
		t.Skip("OUTBOX_TEST_MONGODB_URI is set")
	}
	srv := mongotest.StartEmbedded(t).Server // a replica set member, as a real one
	t.Setenv(mongotest.EnvURI, srv.URI())
	env := mongotest.StartReal(t)
	require.True(t, env.Real)
	require.Nil(t, env.Server)
	require.Equal(t, srv.URI(), env.URI)
	require.NoError(t, env.Client.Ping(context.Background(), nil))
}

func TestUniqueName(t *testing.T) {
	t.Parallel()
	a := mongotest.UniqueName(t)
	require.NotEqual(t, a, mongotest.UniqueName(t))
	require.Regexp(t, `^[a-zA-Z0-9_-]+$`, a)
}

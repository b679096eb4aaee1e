package outbox

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
)

// Transact with attempts failing on a transient label ends with its context.
func TestTransactStopsRetryingWhenContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fault API")
	}
	c := b.client(t, b.config("svc"))
	cancelFP := b.mongo.Server.FailCommand(mongofake.FailPoint{Commands: []string{"insert"}, ErrorCode: 112,
		ErrorLabels: []string{"TransientTransactionError"}})
	defer cancelFP()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := c.Transact(ctx, func(ctx context.Context) error {
		_, err := b.db.Collection("business").InsertOne(ctx, bson.D{{Key: "x", Value: 1}})
		return err
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, time.Since(start), 60*time.Second, "Transact kept retrying after its context ended")
	require.Zero(t, count(t, b.db.Collection("business"), bson.D{}))
}

// With MongoDB unreachable, every attempt of a transaction fails server
// selection, which the driver labels TransientTransactionError, and
// WithTransaction retries for 120 s whatever the context: a replica cut off
// from MongoDB would take minutes to shut down. Transact must stop retrying
// once its context ends.
func TestTransactUnreachableMongoEndsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	refuse := func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("test: network cut")
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(b.mongo.URI).SetDialer(dialerFunc(refuse)).
		SetServerSelectionTimeout(100 * time.Millisecond))
	require.NoError(t, err)
	defer func() { _ = mc.Disconnect(context.Background()) }()
	cfg := b.config("svc")
	cfg.Mongo = mc
	c := b.client(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err = c.Transact(ctx, func(ctx context.Context) error {
		_, err := mc.Database(b.db.Name()).Collection("business").InsertOne(ctx, bson.D{{Key: "x", Value: 1}})
		return err
	})
	require.Error(t, err)
	require.Less(t, time.Since(start), 60*time.Second, "Transact kept retrying after its context ended")
}

type dialerFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (f dialerFunc) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return f(ctx, network, addr)
}

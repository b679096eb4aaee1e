package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// cutNet is a process's network as a test kills it: every connection
// dialled through it is closed at once by cut, and later dials fail. The
// servers see what a killed process leaves: requests without replies,
// transactions left open, a group member that stays until its session
// times out.
type cutNet struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (n *cutNet) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil, errors.New("test: process killed")
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *cutNet) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = true
	for _, c := range n.conns {
		_ = c.Close()
	}
}

// A replica killed while its transactions are open leaves their locks on the
// inbox entries they claimed; MongoDB would release them only when the
// transactions expire (here: after ten minutes). The survivor takes the dead
// replica's partitions over when the group expires it, meets the locks, ends
// the dead replica's sessions (whose ids its replica record lists) and handles
// everything, each event once.
func TestTakeoverEndsTheSessionsOfADeadReplica(t *testing.T) {
	t.Parallel()
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Parallel()
		testTakeoverEndsTheSessionsOfADeadReplica(t)
	})
}

func testTakeoverEndsTheSessionsOfADeadReplica(t *testing.T) {
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(10*time.Minute)))
	if b.mongo.Real {
		t.Skip("needs the embedded server's long transaction lifetime")
	}
	cfg := consumerConfig(b, "takeover")
	cfg.KeyConcurrency = 8
	cfg.DrainTimeout = time.Second
	effects := b.db.Collection("effects")
	killed := make(chan struct{})
	var entered atomic.Int64

	// The replica that dies: every run claims its event, writes an effect
	// and then hangs until the process is killed, its transaction open.
	netA := &cutNet{}
	mA := b.mongo.NewClient(t, options.Client().SetDialer(netA))
	cfgA := cfg
	cfgA.Mongo = mA
	cfgA.KafkaOptions = []kgo.Opt{kgo.Dialer(netA.DialContext)}
	a := b.client(t, cfgA)
	effectsA := mA.Database(b.db.Name()).Collection("effects") // handlers write through the Client's MongoDB client
	MustHandle(a, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if _, err := effectsA.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "by", Value: "a"}}); err != nil {
			return err
		}
		entered.Add(1)
		select {
		case <-killed:
		case <-ctx.Done():
		}
		return errors.New("killed")
	})
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		_ = a.Run(ctxA) // its network is cut: whatever it returns
	}()
	t.Cleanup(func() {
		stopA()
		at := time.Now()
		<-doneA
		t.Logf("the killed replica's Run returned %s after its context ended", time.Since(at).Round(100*time.Millisecond))
	})

	const n = 24
	envs := make([]Envelope, n)
	payloads := make([][]byte, n)
	for i := range n {
		envs[i], payloads[i] = b.keyed(fmt.Sprintf("e-%d", i), fmt.Sprintf("key-%d", i)), b.payload(t, "o", i)
	}
	b.produceMany(t, envs, payloads)
	eventually(t, "the replica running eight open transactions", func() bool { return entered.Load() >= 8 })

	// kill -9: connections closed, nothing more reaches the servers.
	netA.kill()
	close(killed)
	stopA()

	var logs testkit.Buffer
	cfgB := cfg
	cfgB.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	survivor := b.client(t, cfgB)
	MustHandle(survivor, func(ctx context.Context, e orderPlaced, m Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "by", Value: "b"}})
		return err
	})
	started := time.Now()
	stopB := start(t, survivor)
	eventually(t, "every event handled by the survivor", func() bool { return count(t, effects, bson.D{{Key: "by", Value: "b"}}) == n })
	t.Logf("the survivor handled the %d events %s after it started (session timeout %s)", n, time.Since(started).Round(100*time.Millisecond), cfg.SessionTimeout)
	require.EqualValues(t, n, count(t, effects, bson.D{}), "the dead replica's effects were rolled back")
	require.Contains(t, logs.String(), "ended the sessions of a replica that left the group with transactions open")
	at := time.Now()
	stopB()
	t.Logf("the survivor stopped in %s", time.Since(at).Round(100*time.Millisecond))
}

// An event that waits (here on its inbox entry, locked by another session's
// open transaction) shows in Status.Waiting with what it waits on and since
// when, and in the log once; other keys go on.
func TestWaitsShowInStatusAndLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "waits")
	var logs testkit.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := b.client(t, cfg)
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	require.NoError(t, c.EnsureIndexes(context.Background()))

	// Another session holds the inbox entry of "locked-1" in an open
	// transaction (a live process, so no takeover ends it).
	env := b.keyed("locked-1", "L")
	env.Partition = 0
	sess, err := b.mongo.Client.StartSession()
	require.NoError(t, err)
	defer sess.EndSession(context.Background())
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(context.Background(), sess)
	filter, update := store.Claim(inboxIDOf(&env), deliveryAt(&env, 0), time.Now())
	_, err = c.inbox.UpdateOne(sctx, filter, update, options.UpdateOne().SetUpsert(true))
	require.NoError(t, err)

	start(t, c)
	b.produce(t, env, b.payload(t, "o", 1))
	b.produce(t, b.keyed("free-1", "F"), b.payload(t, "o", 2))
	eventually(t, "the other key handled", func() bool { return count(t, effects, bson.D{{Key: "key", Value: "free-1"}}) == 1 })
	var wait Wait
	eventually(t, "the locked event in Status.Waiting", func() bool {
		st, err := c.Status(context.Background())
		require.NoError(t, err)
		for _, w := range st.Waiting {
			if w.PartitionKey == "L" {
				wait = w
				return true
			}
		}
		return false
	})
	require.Equal(t, "locked", wait.What)
	require.Equal(t, ordersTopic, wait.Topic)
	require.False(t, wait.Since.IsZero())
	require.Contains(t, wait.Detail, "locked by another transaction")
	eventually(t, "logged", func() bool { return bytes.Contains([]byte(logs.String()), []byte("partition waiting")) })

	// The lock goes: the event is handled.
	require.NoError(t, sess.AbortTransaction(context.Background()))
	eventually(t, "the locked event handled", func() bool { return count(t, effects, bson.D{{Key: "key", Value: "locked-1"}}) == 1 })
}

// orderPlacedV2 is the next version of orderPlaced, as a producer deploys
// it before its consumers.
type orderPlacedV2 struct {
	orderPlaced
}

func (orderPlacedV2) ContentSchema() string { return "OrderPlaced.v2" }

// A rolling deploy where the producer ships a new event version before the
// consumers. A replica without its handler parks the new events (reason
// no_handler), holding their keys: the key's later events wait behind them, in
// order. Once a replica with the handler owns the partition, it releases them
// on its own, with what waited behind.
func TestRollingDeployKeepsEventsWithoutAHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "deploy")
	effects := b.db.Collection("effects")
	handle := func(ctx context.Context, id string, m Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "pk", Value: m.PartitionKey}, {Key: "schema", Value: m.ContentSchema}})
		return err
	}
	old := b.client(t, cfg)
	MustHandle(old, func(ctx context.Context, e orderPlaced, m Metadata) error { return handle(ctx, e.OrderID, m) })
	stopOld := start(t, old)

	v2 := func(id, key string) Envelope {
		env := b.keyed(id, key)
		env.ContentSchema = "OrderPlaced.v2"
		return env
	}
	b.produce(t, v2("k-v2", "K"), b.payload(t, "k", 1))
	b.produce(t, b.keyed("k-v1-after", "K"), b.payload(t, "k", 2))
	b.produce(t, v2("free-v2", ""), b.payload(t, "free", 3))
	b.produce(t, b.keyed("other", "O"), b.payload(t, "o", 4))
	eventually(t, "the other key handled", func() bool { return count(t, effects, bson.D{{Key: "key", Value: "other"}}) == 1 })
	eventually(t, "both v2 events parked, the v1 after one held", func() bool {
		return count(t, old.inbox, bson.D{{Key: "parked", Value: true}, {Key: "park_reason", Value: "no_handler"}}) == 2 &&
			count(t, old.inbox, bson.D{{Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}) == 1
	})
	st, err := old.Admin().StoreStatus(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, st.ParkedNoHandler)
	stopOld()

	// The new version of the service, with both handlers.
	cfg.Service = old.cfg.Service
	upgraded := b.client(t, cfg)
	upgraded.test.redriveEvery = 50 * time.Millisecond
	MustHandle(upgraded, func(ctx context.Context, e orderPlaced, m Metadata) error { return handle(ctx, e.OrderID, m) })
	MustHandle(upgraded, func(ctx context.Context, e orderPlacedV2, m Metadata) error { return handle(ctx, e.OrderID, m) })
	start(t, upgraded)
	eventually(t, "the parked events and the one held behind released", func() bool {
		return count(t, effects, bson.D{}) == 4
	})
	cur, err := effects.Find(context.Background(), bson.D{{Key: "pk", Value: "K"}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, err)
	var keyK []struct {
		Key string `bson:"key"`
	}
	require.NoError(t, cur.All(context.Background(), &keyK))
	require.Len(t, keyK, 2)
	require.Equal(t, "k-v2", keyK[0].Key, "in key order")
	require.Equal(t, "k-v1-after", keyK[1].Key)
	require.Zero(t, count(t, upgraded.inbox, bson.D{{Key: "parked", Value: true}}))
}

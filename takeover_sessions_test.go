package outbox

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/liveness"
)

// sessionAmong takes sessions of m until it gets one whose id is in ids
// (the driver pools them), ending the others; nil when none comes.
func sessionAmong(t *testing.T, m *mongo.Client, ids []bson.Raw) *mongo.Session {
	t.Helper()
	var others []*mongo.Session
	defer func() {
		for _, s := range others {
			s.EndSession(context.Background())
		}
	}()
	for range 64 {
		s, err := m.StartSession()
		require.NoError(t, err)
		if slices.ContainsFunc(ids, func(id bson.Raw) bool { return bytes.Equal(id, s.ID()) }) {
			return s
		}
		others = append(others, s)
	}
	return nil
}

// openTxn starts a transaction on s that inserts into coll.
func openTxn(t *testing.T, s *mongo.Session, coll *mongo.Collection) {
	t.Helper()
	require.NoError(t, s.StartTransaction())
	_, err := coll.InsertOne(mongo.NewSessionContext(context.Background(), s), bson.D{{Key: "by", Value: "someone else"}})
	require.NoError(t, err)
}

// startMember starts a replica of cfg's group and waits until it is a
// member (it can reap).
func startMember(t *testing.T, b *bundle, cfg Config) *Client {
	t.Helper()
	c := b.client(t, cfg)
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error { return nil })
	start(t, c)
	waitMember(t, c)
	return c
}

// waitMember waits until c, started, is a member of its group.
func waitMember(t *testing.T, c *Client) {
	t.Helper()
	eventually(t, "a member of the group", func() bool {
		cons := c.tel.cons.Load()
		if cons == nil || cons.cl == nil {
			return false
		}
		id, _ := cons.cl.GroupMetadata()
		return id != ""
	})
}

// A replica that stopped gracefully leaves no transaction open; the
// sessions it used go back to the driver's pool and serve whatever uses
// the mongo.Client next (here a transaction as Transact or another Client
// would run it). A takeover check of the group never ends them.
func TestTakeoverNeverEndsTheSessionsOfAStoppedReplica(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := consumerConfig(b, "gracefulstop")
	a := b.client(t, cfg)
	effects := b.db.Collection("effects")
	MustHandle(a, func(ctx context.Context, e orderPlaced, m Metadata) error {
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	stopA := start(t, a)
	b.produce(t, b.keyed("e1", "K"), b.payload(t, "e1", 0))
	eventually(t, "e1 handled", func() bool { return count(t, effects, bson.D{}) == 1 })
	var recorded []bson.Raw
	eventually(t, "the replica's sessions recorded", func() bool {
		_, docs, err := liveness.Read(ctx, a.meta)
		require.NoError(t, err)
		for _, r := range docs {
			if r.ConsumerGroup == a.cfg.ConsumerGroup && !r.Stopped() {
				recorded = r.LSIDs
			}
		}
		return len(recorded) > 0
	})
	stopA()

	s := sessionAmong(t, b.mongo.Client, recorded)
	require.NotNil(t, s, "the driver hands the stopped replica's sessions out again")
	defer s.EndSession(ctx)
	others := b.db.Collection("others")
	openTxn(t, s, others)

	survivor := startMember(t, b, cfg)
	require.NoError(t, survivor.sessions.ReapNow(ctx, survivor.reaper(survivor.tel.cons.Load())))
	require.NoError(t, s.CommitTransaction(ctx), "the transaction of someone else survives the takeover check")
	require.EqualValues(t, 1, count(t, others, bson.D{}))
}

// A record that went silent while another record of the same mongo.Client
// is refreshed (two Clients sharing one mongo.Client, one of whose Runs
// stopped without marking its record) names sessions that the living one
// may be using: a reap leaves them. A silent record of a mongo.Client that
// no live record shares has its sessions ended, as after a crash.
func TestTakeoverSparesTheSessionsOfALiveMongoClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := consumerConfig(b, "sharedpool")
	survivor := startMember(t, b, cfg) // on b.mongo.Client
	meta := b.db.Collection(metaCollection)
	silentRecord := func(id, pool string, lsid bson.Raw) {
		_, err := meta.InsertOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + id}, {Key: "kind", Value: replicaKind},
			{Key: "service", Value: survivor.cfg.Service}, {Key: "consumer_group", Value: survivor.cfg.ConsumerGroup}, {Key: "state", Value: "running"},
			{Key: "consumer_member_id", Value: "gone-" + id}, {Key: "refresh_ms", Value: int64(1000)},
			{Key: "last_seen", Value: time.Now().Add(-time.Minute)}, {Key: "session_pool", Value: pool},
			{Key: "lsids", Value: bson.A{lsid}}})
		require.NoError(t, err)
	}

	shared, err := b.mongo.Client.StartSession()
	require.NoError(t, err)
	defer shared.EndSession(ctx)
	openTxn(t, shared, b.db.Collection("shared"))
	silentRecord("0000000000000001", liveness.SessionPool(b.mongo.Client), shared.ID())

	deadClient := b.mongo.NewClient(t)
	dead, err := deadClient.StartSession()
	require.NoError(t, err)
	defer dead.EndSession(ctx)
	openTxn(t, dead, deadClient.Database(b.db.Name()).Collection("dead"))
	silentRecord("0000000000000002", liveness.SessionPool(deadClient), dead.ID())

	require.NoError(t, survivor.sessions.ReapNow(ctx, survivor.reaper(survivor.tel.cons.Load())))
	require.NoError(t, shared.CommitTransaction(ctx), "a live mongo.Client's session is not ended")
	require.Error(t, dead.CommitTransaction(ctx), "a dead replica's session is ended")
}

// A reap removes from a dead replica's record only the session ids it
// ended: an id recorded between the reap's read and its update (the
// record of a replica that was merely slow) stays, for a later reap to end
// should the replica be dead.
func TestTakeoverReapRemovesOnlyTheSessionsItEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := consumerConfig(b, "reappull")
	meta := b.db.Collection(metaCollection)
	const id = "0000000000000003"
	deadClient := b.mongo.NewClient(t)
	ended, err := deadClient.StartSession()
	require.NoError(t, err)
	defer ended.EndSession(ctx)
	recordedMeanwhile, err := deadClient.StartSession()
	require.NoError(t, err)
	defer recordedMeanwhile.EndSession(ctx)

	c := b.client(t, cfg)
	c.test.reapedHook = func(ctx context.Context, replicaID string) {
		if replicaID != id {
			return
		}
		_, err := meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + id}},
			bson.D{{Key: "$push", Value: bson.D{{Key: "lsids", Value: recordedMeanwhile.ID()}}}})
		require.NoError(t, err)
	}
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error { return nil })
	start(t, c)
	waitMember(t, c)
	_, err = meta.InsertOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + id}, {Key: "kind", Value: replicaKind},
		{Key: "service", Value: c.cfg.Service}, {Key: "consumer_group", Value: c.cfg.ConsumerGroup}, {Key: "state", Value: "running"},
		{Key: "consumer_member_id", Value: "gone-" + id}, {Key: "refresh_ms", Value: int64(1000)},
		{Key: "last_seen", Value: time.Now().Add(-time.Minute)}, {Key: "session_pool", Value: liveness.SessionPool(deadClient)},
		{Key: "lsids", Value: bson.A{ended.ID()}}})
	require.NoError(t, err)

	require.NoError(t, c.sessions.ReapNow(ctx, c.reaper(c.tel.cons.Load())))
	var rec struct {
		LSIDs []bson.Raw `bson:"lsids"`
	}
	require.NoError(t, meta.FindOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + id}}).Decode(&rec))
	require.Len(t, rec.LSIDs, 1, "the reap removed the ids it ended, and only those")
	require.True(t, bytes.Equal(rec.LSIDs[0], recordedMeanwhile.ID()), "the id recorded during the reap stays")
}

// One session list serves a replica's handling transactions and its
// promotions of scheduled events, so a record is judged in both of its
// groups: a silent record whose replica is still a member of its other
// group (here the publisher group, while the reap is the consumer group's)
// lives, and its sessions are not ended.
func TestTakeoverSparesAMemberOfTheRecordsOtherGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config("othergroup") // consumes and publishes
	survivor := startMember(t, b, cfg)
	var pubMember string
	eventually(t, "a member of the publisher group", func() bool {
		if p := survivor.pub.Load(); p != nil {
			pubMember, _ = p.GroupMetadata()
		}
		return pubMember != ""
	})
	meta := b.db.Collection(metaCollection)
	silentRecord := func(id string, m *mongo.Client, publisherMember string, lsid bson.Raw) {
		_, err := meta.InsertOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + id}, {Key: "kind", Value: replicaKind},
			{Key: "service", Value: survivor.cfg.Service}, {Key: "consumer_group", Value: survivor.cfg.ConsumerGroup},
			{Key: "publisher_group", Value: survivor.cfg.PublisherGroup}, {Key: "state", Value: "running"},
			{Key: "consumer_member_id", Value: "gone-" + id}, {Key: "publisher_member_id", Value: publisherMember},
			{Key: "refresh_ms", Value: int64(1000)}, {Key: "last_seen", Value: time.Now().Add(-time.Minute)},
			{Key: "session_pool", Value: liveness.SessionPool(m)}, {Key: "lsids", Value: bson.A{lsid}}})
		require.NoError(t, err)
	}
	openOn := func(m *mongo.Client) *mongo.Session {
		s, err := m.StartSession()
		require.NoError(t, err)
		t.Cleanup(func() { s.EndSession(ctx) })
		openTxn(t, s, m.Database(b.db.Name()).Collection("txns"))
		return s
	}
	publishing, gone := b.mongo.NewClient(t), b.mongo.NewClient(t)
	stillPublishing, dead := openOn(publishing), openOn(gone)
	silentRecord("0000000000000004", publishing, pubMember, stillPublishing.ID())
	silentRecord("0000000000000005", gone, "gone-publisher", dead.ID())

	require.NoError(t, survivor.sessions.ReapNow(ctx, survivor.reaper(survivor.tel.cons.Load())))
	require.NoError(t, stillPublishing.CommitTransaction(ctx), "a member of the record's publisher group keeps its sessions")
	require.Error(t, dead.CommitTransaction(ctx), "a record that is a member of neither group has its sessions ended")
}

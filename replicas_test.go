package outbox

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/event-outbox/outbox/internal/liveness"
)

// A running Client keeps a liveness record in outbox_meta: written at
// start, refreshed with the member ids its two group clients hold, and
// marked stopped when Run returns after a graceful stop. The TTL index that
// expires the records exists.
func TestReplicaRecordFollowsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, b.config("alive"))
	registerConsumer(t, c)
	c.test.replicaEvery = 50 * time.Millisecond
	stop := start(t, c)
	adm := c.Admin()

	members := func() (cons, pub string) {
		if cs := c.tel.cons.Load(); cs != nil {
			cons, _ = cs.cl.GroupMetadata()
		}
		if p := c.pub.Load(); p != nil {
			pub, _ = p.GroupMetadata()
		}
		return cons, pub
	}
	var r Replica
	eventually(t, "a record holding the current member ids of both groups", func() bool {
		rs, err := adm.Replicas(ctx)
		require.NoError(t, err)
		if len(rs) != 1 {
			return false
		}
		r = rs[0]
		cons, pub := members()
		// A refresh made during a rebalance holds generation -1: wait for
		// one made while both groups are stable.
		return cons != "" && pub != "" && r.ConsumerMemberID == cons && r.PublisherMemberID == pub &&
			r.ConsumerGeneration > 0 && r.PublisherGeneration > 0
	})
	require.Equal(t, c.cfg.Service, r.Service)
	require.Equal(t, c.cfg.ReplicaID, r.Name, "the record names the replica (Config.ReplicaID)")
	require.Equal(t, c.cfg.ConsumerGroup, r.ConsumerGroup)
	require.Equal(t, c.cfg.PublisherGroup, r.PublisherGroup)
	require.Equal(t, os.Getpid(), r.PID)
	require.NotEmpty(t, r.ID)
	require.Positive(t, r.ConsumerGeneration)
	require.Positive(t, r.PublisherGeneration)
	require.Equal(t, 50*time.Millisecond, r.RefreshInterval)
	require.False(t, r.Stopped)
	require.False(t, r.StartedAt.IsZero())

	eventually(t, "the record refreshed", func() bool {
		rs, err := adm.Replicas(ctx)
		require.NoError(t, err)
		require.Len(t, rs, 1)
		return rs[0].LastSeen.After(r.LastSeen)
	})

	ttl := indexSpecs(t, c.meta)[liveness.IndexTTL]
	require.NotNil(t, ttl, "the replica TTL index exists")
	require.EqualValues(t, int64(liveness.TTL.Seconds()), ttl["expireAfterSeconds"])
	require.Equal(t, bson.D{{Key: "kind", Value: replicaKind}}, ttl["partialFilterExpression"])

	stop()
	rs, err := adm.Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.True(t, rs[0].Stopped, "marked stopped by the graceful stop")
	require.False(t, rs[0].StoppedAt.IsZero())
	require.Empty(t, rs[0].StopError)
	require.False(t, rs[0].Responding())
	require.NotEmpty(t, rs[0].ConsumerMemberID, "the stopped record still names the members it held")
	require.NotEmpty(t, rs[0].PublisherMemberID)
	require.Equal(t, r.ID, rs[0].ID)
}

// A Run that ends with a fatal error (here a Kafka option kgo refuses)
// leaves a stopped record saying why, whole (with the TTL index's kind
// field) even though Run stopped before its first refresh could be sure to
// have been written.
func TestReplicaRecordOfAFailedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config("failed")
	cfg.KafkaOptions = []kgo.Opt{kgo.MaxProduceRequestsInflightPerBroker(2)} // refused with idempotency
	c := b.client(t, cfg)
	registerConsumer(t, c)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	runErr := c.Run(rctx)
	require.Error(t, runErr)
	rs, err := c.Admin().Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.True(t, rs[0].Stopped)
	require.Equal(t, runErr.Error(), rs[0].StopError)
	require.EqualValues(t, 1, count(t, c.meta, bson.D{{Key: "kind", Value: replicaKind}}))
}

// A refresh that reaches the server after the stop's write leaves the record
// stopped. The stop cancels the refresh in flight, but the driver only gives
// up waiting: the server may run the canceled update after the stop's, on
// another connection, which must not mark a stopped replica running again.
// Here the late refresh is written after the stop on purpose.
func TestReplicaRefreshAfterStopKeepsItStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, b.config("late"))
	r := liveness.NewRecordID(liveness.Owner{Service: c.cfg.Service, Meta: c.meta, Interval: time.Second, Log: c.cfg.Logger}, "late")
	require.NoError(t, r.Write(ctx, false, nil))
	require.NoError(t, r.Write(ctx, true, nil))
	err := r.Write(ctx, false, nil) // the canceled refresh, landing late
	rs, rerr := c.Admin().Replicas(ctx)
	require.NoError(t, rerr)
	require.Len(t, rs, 1)
	require.True(t, rs[0].Stopped, "a late refresh must not mark a stopped replica running")
	require.ErrorIs(t, err, liveness.ErrStopped)
}

// Replica's JSON gives durations in seconds, as Status does.
func TestReplicaJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(Replica{ID: "abc", Name: "orders-1", RefreshInterval: 2 * time.Second, Silence: 1500 * time.Millisecond})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, "orders-1", m["name"])
	require.InDelta(t, 1.5, m["silence_seconds"], 1e-9)
	require.InDelta(t, 2.0, m["refresh_interval_seconds"], 1e-9)
	require.Equal(t, true, m["responding"])
	require.NotContains(t, m, "silence")
}

// Responding: a record refreshed within three periods, not stopped.
func TestReplicaResponding(t *testing.T) {
	t.Parallel()
	r := Replica{RefreshInterval: time.Second, Silence: 2 * time.Second}
	require.True(t, r.Responding())
	r.Silence = 4 * time.Second
	require.False(t, r.Responding(), "stale")
	r.Silence = 0
	r.Stopped = true
	require.False(t, r.Responding(), "stopped")
}

// Replica records are read from the primary whatever the read preference
// of the Admin's database: a takeover decides on a record's silence, and
// a secondary's replication lag would look like silence. Here the
// deployment has no secondary: a read that followed the database's
// preference (secondary) would find no server to read from.
func TestReplicasAreReadFromThePrimary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.db.Collection(metaCollection).InsertOne(ctx, bson.D{{Key: "_id", Value: liveness.IDPrefix + "0000000000000004"},
		{Key: "kind", Value: replicaKind}, {Key: "service", Value: "primaryread"}, {Key: "state", Value: "running"},
		{Key: "last_seen", Value: time.Now()}, {Key: "refresh_ms", Value: int64(1000)}})
	require.NoError(t, err)
	db := b.mongo.Client.Database(b.db.Name(), options.Database().SetReadPreference(readpref.Secondary()))
	reps, err := NewAdmin(db, "", "").Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 1)
}

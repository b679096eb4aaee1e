package outbox

// Replica liveness.
//
// A Kafka group lists a member that died (kill -9, a frozen host, a cut
// network) like a live one until its session times out
// (Config.SessionTimeout), so the group's view alone cannot tell an operator
// which replica just died. Each running Client therefore keeps a liveness
// record of its own in the outbox_meta collection (see metaCollection):
//
//	{_id: "replica:<instance id>", kind: "replica", name, service, consumer_group,
//	 publisher_group, consumer_member_id, consumer_generation,
//	 publisher_member_id, publisher_generation, host, pid, started_at,
//	 last_seen, refresh_ms, state: "running"|"stopped", stopped_at, stop_error,
//	 lsids, session_pool}
//
// Run's liveness goroutine (Client.keepAlive) writes it when Run starts and
// refreshes it every refresh period with the member ids the group clients
// hold at that moment (kgo GroupMetadata). last_seen is MongoDB's clock
// ($currentDate), as is the age Admin.Replicas computes, so the replicas'
// and the reader's clocks do not matter. When Run returns, after both groups
// were left, the record is marked stopped. A record that has not been
// refreshed for three refresh periods belongs to a replica that is not
// responding; matching a group member's id with the records (the console's
// partitions page) shows a dead member as such while the group still lists
// it. The partial TTL index meta_replica_ttl deletes records replicaTTL
// after their last refresh.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
)

// Replica liveness tuning that the Config does not expose.
const (
	// replicaIDPrefix starts the _id of every replica record.
	replicaIDPrefix = "replica:"
	// replicaIDEnd is the least string after every _id with the prefix
	// (';' follows ':'): {$gte: prefix, $lt: end} is an _id index range.
	replicaIDEnd = "replica;"
	// replicaKind is the kind field of replica records, the partial filter
	// of their TTL index.
	replicaKind = "replica"
	// replicaTTL is how long a record outlives its last refresh. Fixed,
	// like the collection's name, so that services sharing a database agree
	// on the index; long enough to outlast any group session.
	replicaTTL = 10 * time.Minute
	// replicaWriteTimeout bounds one write of a record.
	replicaWriteTimeout = 5 * time.Second
	// replicaStaleAfter is how many refresh periods a record may miss
	// before its replica counts as not responding.
	replicaStaleAfter = 3
	// indexMetaReplicaTTL is the TTL index of the replica records.
	indexMetaReplicaTTL = "meta_replica_ttl"
)

// replicaInterval is the refresh period of the liveness record: a fifth of
// the session timeout, between 1 s and 5 s, so that a dead replica is seen
// as such (after replicaStaleAfter periods) before its group session ends.
func replicaInterval(cfg *Config) time.Duration {
	return min(max(cfg.SessionTimeout/5, time.Second), 5*time.Second)
}

// metaIndexes are the indexes of the outbox_meta collection.
func metaIndexes() []indexSpec {
	ttl := int32(replicaTTL.Seconds())
	return []indexSpec{{
		name:    indexMetaReplicaTTL,
		keys:    bson.D{{Key: "last_seen", Value: 1}},
		partial: bson.D{{Key: "kind", Value: replicaKind}},
		ttl:     &ttl,
	}}
}

// Replica is the liveness record of one running Client (one call of Run),
// as Admin.Replicas reads it.
type Replica struct {
	// ID is the random instance id of the Run call: a replica that
	// restarts under the same Name gets a record of its own, so that the
	// record of a run that died keeps the sessions to end (takeover.go).
	ID string `json:"id"`
	// Name is the replica's Config.ReplicaID (host name and process id by
	// default).
	Name string `json:"name"`
	// Service is the replica's Config.Service.
	Service string `json:"service"`
	// ConsumerGroup and PublisherGroup are the replica's groups.
	ConsumerGroup  string `json:"consumer_group"`
	PublisherGroup string `json:"publisher_group"`
	// ConsumerMemberID and PublisherMemberID are the member ids the replica
	// held in its groups at its last refresh ("" when not a member), with
	// their generations.
	ConsumerMemberID    string `json:"consumer_member_id,omitempty"`
	ConsumerGeneration  int32  `json:"consumer_generation"`
	PublisherMemberID   string `json:"publisher_member_id,omitempty"`
	PublisherGeneration int32  `json:"publisher_generation"`
	// Host and PID identify the process.
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// StartedAt is when Run started; LastSeen is the last refresh
	// (MongoDB's clock).
	StartedAt time.Time `json:"started_at"`
	LastSeen  time.Time `json:"last_seen"`
	// RefreshInterval is the replica's refresh period (JSON:
	// refresh_interval_seconds).
	RefreshInterval time.Duration `json:"-"`
	// Stopped reports that Run returned; StoppedAt says when (MongoDB's
	// clock), StopError why, when it returned an error.
	Stopped   bool      `json:"stopped"`
	StoppedAt time.Time `json:"stopped_at,omitzero"`
	StopError string    `json:"stop_error,omitempty"`
	// Silence is the time since LastSeen when the record was read, by
	// MongoDB's clock (JSON: silence_seconds).
	Silence time.Duration `json:"-"`

	// lsids are the sessions the replica's consumer ran transactions on
	// (takeover.go), and pool names the session pool they came from (the
	// mongo.Client, see sessionPool).
	lsids []bson.Raw
	pool  string
}

// MarshalJSON writes the durations in seconds, as Status does
// (refresh_interval_seconds, silence_seconds), and Responding.
func (r Replica) MarshalJSON() ([]byte, error) {
	type fields Replica // the fields without this method
	return json.Marshal(struct {
		fields
		RefreshInterval float64 `json:"refresh_interval_seconds"`
		Silence         float64 `json:"silence_seconds"`
		Responding      bool    `json:"responding"`
	}{fields(r), r.RefreshInterval.Seconds(), r.Silence.Seconds(), r.Responding()})
}

// Responding reports whether the replica is running and refreshed its
// record within the last three refresh periods.
func (r Replica) Responding() bool {
	return !r.Stopped && r.Silence <= replicaStaleAfter*cmp.Or(r.RefreshInterval, 5*time.Second)
}

// replicaDoc is a replica record as stored.
type replicaDoc struct {
	ID                  string     `bson:"_id"`
	Name                string     `bson:"name"`
	Service             string     `bson:"service"`
	ConsumerGroup       string     `bson:"consumer_group"`
	PublisherGroup      string     `bson:"publisher_group"`
	ConsumerMemberID    string     `bson:"consumer_member_id"`
	ConsumerGeneration  int32      `bson:"consumer_generation"`
	PublisherMemberID   string     `bson:"publisher_member_id"`
	PublisherGeneration int32      `bson:"publisher_generation"`
	Host                string     `bson:"host"`
	PID                 int        `bson:"pid"`
	StartedAt           time.Time  `bson:"started_at"`
	LastSeen            time.Time  `bson:"last_seen"`
	RefreshMS           int64      `bson:"refresh_ms"`
	State               string     `bson:"state"`
	StoppedAt           time.Time  `bson:"stopped_at"`
	StopError           string     `bson:"stop_error"`
	LSIDs               []bson.Raw `bson:"lsids"`
	SessionPool         string     `bson:"session_pool"`
}

// Replicas returns the liveness records of the replicas that ran in the
// Admin's database in the last ten minutes (every service sharing the
// database), sorted by service and start time, each with its Silence as of
// now by MongoDB's clock. Reads: the server's clock (hello), then the
// outbox_meta documents whose _id starts with "replica:" (an _id range).
func (a *Admin) Replicas(ctx context.Context) ([]Replica, error) {
	db := a.outbox.Database()
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return nil, fmt.Errorf("outbox: read MongoDB's clock: %w", err)
	}
	now := cmp.Or(hello.LocalTime, time.Now())
	// From the primary whatever the client's read preference: a secondary's
	// lag would look like silence, and a takeover (takeover.go) decides on
	// silence.
	meta := db.Collection(metaCollection, options.Collection().SetReadPreference(readpref.Primary()))
	cur, err := meta.Find(ctx, bson.D{{Key: "_id", Value: bson.D{
		{Key: "$gte", Value: replicaIDPrefix},
		{Key: "$lt", Value: replicaIDEnd},
	}}})
	if err != nil {
		return nil, fmt.Errorf("outbox: read replica records: %w", err)
	}
	var docs []replicaDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("outbox: read replica records: %w", err)
	}
	out := make([]Replica, 0, len(docs))
	for _, d := range docs {
		out = append(out, Replica{
			ID: d.ID[len(replicaIDPrefix):], Name: d.Name, Service: d.Service,
			ConsumerGroup: d.ConsumerGroup, PublisherGroup: d.PublisherGroup,
			ConsumerMemberID: d.ConsumerMemberID, ConsumerGeneration: d.ConsumerGeneration,
			PublisherMemberID: d.PublisherMemberID, PublisherGeneration: d.PublisherGeneration,
			Host: d.Host, PID: d.PID, StartedAt: d.StartedAt, LastSeen: d.LastSeen,
			RefreshInterval: time.Duration(d.RefreshMS) * time.Millisecond,
			Stopped:         d.State == "stopped", StoppedAt: d.StoppedAt, StopError: d.StopError,
			Silence: max(now.Sub(d.LastSeen), 0), lsids: d.LSIDs, pool: d.SessionPool,
		})
	}
	slices.SortFunc(out, func(a, b Replica) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// replica is the liveness record of one Run call.
type replica struct {
	c        *Client
	id       string // the record's _id
	host     string
	pid      int
	started  time.Time
	interval time.Duration
	// The member ids and generations last read from the group clients,
	// kept when a client is gone (Run stopping), so that the stopped record
	// still names the members it held. Owned by the refresh goroutine, then
	// by stop.
	consMember, pubMember string
	consGen, pubGen       int32
}

// keepAlive writes this Run's liveness record and refreshes it every
// refresh period in a goroutine that Run owns: it runs until the returned
// stop is called, which Run does after both groups were left, so the
// record stays fresh while Run drains. A failed write is logged and tried
// again with backoff (Config.RetryMinBackoff to RetryMaxBackoff, never
// later than one refresh period); it never ends Run. stop ends the
// goroutine, waits for it, and writes the record a last time marked
// stopped (with runErr, if any), bounded by replicaWriteTimeout.
func (c *Client) keepAlive(ctx context.Context) (stop func(runErr error)) {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand doc)
	host, _ := os.Hostname()
	r := &replica{
		c: c, id: replicaIDPrefix + hex.EncodeToString(b[:]), host: host, pid: os.Getpid(),
		started:  time.Now().UTC().Truncate(time.Millisecond),
		interval: cmp.Or(c.test.replicaEvery, replicaInterval(&c.cfg)),
		consGen:  -1, pubGen: -1,
	}
	c.sessions.start(r)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.run(lctx) })
	return func(runErr error) {
		cancel()
		wg.Wait()
		c.sessions.stop()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replicaWriteTimeout)
		defer cancel()
		if err := r.write(wctx, true, runErr); err != nil {
			c.cfg.Logger.Warn("outbox: marking the replica record stopped failed; it expires instead", "id", r.id, "error", err)
		}
	}
}

// run refreshes the record until ctx ends.
func (r *replica) run(ctx context.Context) {
	cfg := &r.c.cfg
	rl := newRateLog(errorRelog) // once, then every errorRelog while MongoDB is down
	for attempt := 1; ; {
		wait := r.interval
		wctx, cancel := context.WithTimeout(ctx, min(replicaWriteTimeout, 2*r.interval))
		err := r.write(wctx, false, nil)
		cancel()
		switch {
		case ctx.Err() != nil, errors.Is(err, errReplicaStopped):
			return
		case err != nil:
			rl.warn(cfg.Logger, "outbox: refreshing the replica record failed; retrying", "refresh", "id", r.id, "error", err, "attempt", attempt)
			wait = min(cfg.backoff().Delay(attempt-1), r.interval)
			attempt++
		default:
			attempt = 1
		}
		if !retry.Sleep(ctx, nil, wait) {
			return
		}
	}
}

// errReplicaStopped is what a refresh returns on a record already marked
// stopped: it wrote nothing.
var errReplicaStopped = errors.New("outbox: replica record already marked stopped")

// write upserts the record with the member ids the group clients hold now
// (the last ones read when a client is gone), running or stopped. Every
// field is set, so that a record deleted meanwhile (expired after a long
// MongoDB outage, or by hand) or never written (Run stopped at once) is
// written whole, TTL field included.
func (r *replica) write(ctx context.Context, stopped bool, runErr error) error {
	c := r.c
	if cons := c.tel.cons.Load(); cons != nil && cons.cl != nil {
		r.consMember, r.consGen = cons.cl.GroupMetadata()
	}
	if p := c.pub.Load(); p != nil && p.group != nil {
		r.pubMember, r.pubGen = p.group.GroupMetadata()
	}
	state, now := "running", bson.D{{Key: "last_seen", Value: true}}
	set := bson.D{
		{Key: "kind", Value: replicaKind},
		{Key: "name", Value: c.cfg.ReplicaID},
		{Key: "service", Value: c.cfg.Service},
		{Key: "consumer_group", Value: c.cfg.ConsumerGroup},
		{Key: "publisher_group", Value: c.cfg.PublisherGroup},
		{Key: "consumer_member_id", Value: r.consMember},
		{Key: "consumer_generation", Value: r.consGen},
		{Key: "publisher_member_id", Value: r.pubMember},
		{Key: "publisher_generation", Value: r.pubGen},
		{Key: "host", Value: r.host},
		{Key: "pid", Value: r.pid},
		{Key: "started_at", Value: r.started},
		{Key: "refresh_ms", Value: r.interval.Milliseconds()},
		{Key: "session_pool", Value: sessionPool(c.cfg.Mongo)},
	}
	if stopped {
		state = "stopped"
		now = append(now, bson.E{Key: "stopped_at", Value: true})
		if runErr != nil {
			set = append(set, bson.E{Key: "stop_error", Value: redactSecrets(runErr.Error())})
		}
	}
	set = append(set, bson.E{Key: "state", Value: state})
	filter := bson.D{{Key: "_id", Value: r.id}}
	if !stopped {
		// A refresh canceled by the stop may reach the server after the
		// stop's write: it must not mark the record running again. On a
		// stopped record the filter matches nothing and the upsert's
		// insert meets the _id: a duplicate key, which means "stopped
		// already".
		filter = append(filter, bson.E{Key: "state", Value: bson.D{{Key: "$ne", Value: "stopped"}}})
	}
	update := bson.D{{Key: "$set", Value: set}, {Key: "$currentDate", Value: now}}
	if stopped {
		// A stopped Run has no transaction open: its consumer drained and
		// its re-drives ended. The driver hands its pooled sessions to
		// whatever uses the mongo.Client next (another Client, Transact
		// calls, this Client run again), so their ids are no longer its
		// own to end (takeover.go).
		update = append(update, bson.E{Key: "$unset", Value: bson.D{{Key: "lsids", Value: ""}}})
	}
	_, err := c.meta.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if !stopped && mongo.IsDuplicateKeyError(err) {
		return errReplicaStopped
	}
	if err != nil {
		return fmt.Errorf("outbox: write replica record %s in %s: %w", r.id, metaCollection, err)
	}
	return nil
}

package liveness

// Replica liveness.
//
// A Kafka group lists a member that died (kill -9, a frozen host, a cut
// network) like a live one until its session times out
// (Config.SessionTimeout), so the group's view alone cannot tell an operator
// which replica just died. Each running Client therefore keeps a liveness
// record of its own in the outbox_meta collection:
//
//	{_id: "replica:<instance id>", kind: "replica", name, service, consumer_group,
//	 publisher_group, consumer_member_id, consumer_generation,
//	 publisher_member_id, publisher_generation, host, pid, started_at,
//	 last_seen, refresh_ms, state: "running"|"stopped", stopped_at, stop_error,
//	 lsids, session_pool}
//
// Run's liveness goroutine (Record.Run) writes it when Run starts and
// refreshes it every refresh period with the member ids the group clients
// hold at that moment (kgo GroupMetadata). last_seen is MongoDB's clock
// ($currentDate), as is the age Read computes, so the replicas' and the
// reader's clocks do not matter. When Run returns, after both groups were
// left, the record is marked stopped. A record that has not been refreshed
// for three refresh periods belongs to a replica that is not responding;
// matching a group member's id with the records (the console's partitions
// page) shows a dead member as such while the group still lists it. The
// partial TTL index meta_replica_ttl deletes records TTL after their last
// refresh.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/event-outbox/outbox/internal/retry"
)

// Replica liveness tuning that the Config does not expose.
const (
	// IDPrefix starts the _id of every replica record.
	IDPrefix = "replica:"
	// IDEnd is the least string after every _id with the prefix (';'
	// follows ':'): {$gte: IDPrefix, $lt: IDEnd} is an _id index range.
	IDEnd = "replica;"
	// Kind is the kind field of replica records, the partial filter of
	// their TTL index.
	Kind = "replica"
	// TTL is how long a record outlives its last refresh. Fixed, like the
	// collection's name, so that services sharing a database agree on the
	// index; long enough to outlast any group session.
	TTL = 10 * time.Minute
	// WriteTimeout bounds one write of a record.
	WriteTimeout = 5 * time.Second
	// StaleAfter is how many refresh periods a record may miss before its
	// replica counts as not responding.
	StaleAfter = 3
	// IndexTTL is the name of the TTL index of the replica records.
	IndexTTL = "meta_replica_ttl"
)

// Interval is the refresh period of the liveness record for a group
// session timeout: a fifth of it, between 1 s and 5 s, so that a dead
// replica is seen as such (after StaleAfter periods) before its group
// session ends.
func Interval(sessionTimeout time.Duration) time.Duration {
	return min(max(sessionTimeout/5, time.Second), 5*time.Second)
}

// Doc is a replica record as stored.
type Doc struct {
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

// Stopped reports whether the record is marked stopped.
func (d Doc) Stopped() bool { return d.State == "stopped" }

// Refresh is the record's refresh period.
func (d Doc) Refresh() time.Duration { return time.Duration(d.RefreshMS) * time.Millisecond }

// Read returns MongoDB's clock and the replica records of meta (every
// service sharing its database). Reads: the server's clock (hello), then
// the documents whose _id starts with IDPrefix (an _id range), from the
// primary whatever the collection's read preference: a secondary's lag
// would look like silence, and a takeover decides on silence.
func Read(ctx context.Context, meta *mongo.Collection) (now time.Time, docs []Doc, err error) {
	db := meta.Database()
	var hello struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return time.Time{}, nil, fmt.Errorf("outbox: read MongoDB's clock: %w", err)
	}
	now = cmp.Or(hello.LocalTime, time.Now())
	primary := db.Collection(meta.Name(), options.Collection().SetReadPreference(readpref.Primary()))
	cur, err := primary.Find(ctx, bson.D{{Key: "_id", Value: bson.D{
		{Key: "$gte", Value: IDPrefix},
		{Key: "$lt", Value: IDEnd},
	}}})
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("outbox: read replica records: %w", err)
	}
	if err := cur.All(ctx, &docs); err != nil {
		return time.Time{}, nil, fmt.Errorf("outbox: read replica records: %w", err)
	}
	return now, docs, nil
}

// Owner is what a record says of the Run it belongs to, and what writing
// it needs.
type Owner struct {
	// Name, Service, ConsumerGroup and PublisherGroup are the Config's.
	Name, Service, ConsumerGroup, PublisherGroup string
	// Meta is the outbox_meta collection (majority write concern).
	Meta *mongo.Collection
	// Mongo is the Config's client, whose session pool the record names.
	Mongo *mongo.Client
	// Interval is the refresh period.
	Interval time.Duration
	// Backoff spaces the refreshes that failed (never longer than
	// Interval).
	Backoff retry.Backoff
	// ConsumerMember and PublisherMember return the member id and
	// generation a group client holds now; ok is false when there is no
	// client (the record keeps the last ones read).
	ConsumerMember, PublisherMember func() (member string, generation int32, ok bool)
	// Redact hides secrets in the stop error.
	Redact func(string) string
	// Log is the Client's logger; Warn, rate-limited by the caller, takes
	// the failures of the refresh.
	Log  *slog.Logger
	Warn func(msg string, args ...any)
}

// Record is the liveness record of one Run call.
type Record struct {
	Owner
	id      string // the record's _id
	host    string
	pid     int
	started time.Time
	// The member ids and generations last read from the group clients,
	// kept when a client is gone (Run stopping), so that the stopped record
	// still names the members it held. Owned by the refresh goroutine, then
	// by the stop's write.
	consMember, pubMember string
	consGen, pubGen       int32
}

// NewRecord returns the record of a Run, under a random instance id: a
// replica that restarts under the same Name gets a record of its own, so
// that the record of a run that died keeps the sessions to end.
func NewRecord(o Owner) *Record {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand doc)
	return NewRecordID(o, hex.EncodeToString(b[:]))
}

// NewRecordID returns the record of a Run under the instance id id.
func NewRecordID(o Owner, id string) *Record {
	host, _ := os.Hostname()
	return &Record{
		Owner: o, id: IDPrefix + id, host: host, pid: os.Getpid(),
		started: time.Now().UTC().Truncate(time.Millisecond),
		consGen: -1, pubGen: -1,
	}
}

// ID is the record's _id.
func (r *Record) ID() string { return r.id }

// Run refreshes the record every refresh period until ctx ends. A failed
// write is warned of and tried again with backoff, never later than one
// refresh period; it never ends Run.
func (r *Record) Run(ctx context.Context) {
	for attempt := 1; ; {
		wait := r.Interval
		wctx, cancel := context.WithTimeout(ctx, min(WriteTimeout, 2*r.Interval))
		err := r.Write(wctx, false, nil)
		cancel()
		switch {
		case ctx.Err() != nil, errors.Is(err, ErrStopped):
			return
		case err != nil:
			r.Warn("outbox: refreshing the replica record failed; retrying", "id", r.id, "error", err, "attempt", attempt)
			wait = min(r.Backoff.Delay(attempt-1), r.Interval)
			attempt++
		default:
			attempt = 1
		}
		if !retry.Sleep(ctx, nil, wait) {
			return
		}
	}
}

// Stop writes the record a last time, marked stopped (with runErr, if
// any), bounded by WriteTimeout. The caller has stopped Run.
func (r *Record) Stop(ctx context.Context, runErr error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), WriteTimeout)
	defer cancel()
	if err := r.Write(wctx, true, runErr); err != nil {
		r.Log.Warn("outbox: marking the replica record stopped failed; it expires instead", "id", r.id, "error", err)
	}
}

// ErrStopped is what a refresh returns on a record already marked
// stopped: it wrote nothing.
var ErrStopped = errors.New("outbox: replica record already marked stopped")

// Write upserts the record with the member ids the group clients hold now
// (the last ones read when a client is gone), running or stopped. Every
// field is set, so that a record deleted meanwhile (expired after a long
// MongoDB outage, or by hand) or never written (Run stopped at once) is
// written whole, TTL field included.
func (r *Record) Write(ctx context.Context, stopped bool, runErr error) error {
	if r.ConsumerMember != nil {
		if m, g, ok := r.ConsumerMember(); ok {
			r.consMember, r.consGen = m, g
		}
	}
	if r.PublisherMember != nil {
		if m, g, ok := r.PublisherMember(); ok {
			r.pubMember, r.pubGen = m, g
		}
	}
	state, now := "running", bson.D{{Key: "last_seen", Value: true}}
	set := bson.D{
		{Key: "kind", Value: Kind},
		{Key: "name", Value: r.Name},
		{Key: "service", Value: r.Service},
		{Key: "consumer_group", Value: r.ConsumerGroup},
		{Key: "publisher_group", Value: r.PublisherGroup},
		{Key: "consumer_member_id", Value: r.consMember},
		{Key: "consumer_generation", Value: r.consGen},
		{Key: "publisher_member_id", Value: r.pubMember},
		{Key: "publisher_generation", Value: r.pubGen},
		{Key: "host", Value: r.host},
		{Key: "pid", Value: r.pid},
		{Key: "started_at", Value: r.started},
		{Key: "refresh_ms", Value: r.Interval.Milliseconds()},
		{Key: "session_pool", Value: SessionPool(r.Mongo)},
	}
	if stopped {
		state = "stopped"
		now = append(now, bson.E{Key: "stopped_at", Value: true})
		if runErr != nil {
			msg := runErr.Error()
			if r.Redact != nil {
				msg = r.Redact(msg)
			}
			set = append(set, bson.E{Key: "stop_error", Value: msg})
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
	_, err := r.Meta.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if !stopped && mongo.IsDuplicateKeyError(err) {
		return ErrStopped
	}
	if err != nil {
		return fmt.Errorf("outbox: write replica record %s in %s: %w", r.id, r.Meta.Name(), err)
	}
	return nil
}

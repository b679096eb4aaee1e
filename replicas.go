package outbox

// Replica liveness and takeover: the records, their refresh and the ending
// of dead replicas' sessions live in internal/liveness (see its doc.go);
// the root keeps the public Replica and Admin.Replicas, the index of the
// records, and the glue that starts them under Run.

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/liveness"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// replicaKind is the kind field of replica records, which other files of
// the root use.
const replicaKind = liveness.Kind

// metaIndexes are the indexes of the outbox_meta collection.
func metaIndexes() []store.IndexSpec {
	ttl := int32(liveness.TTL.Seconds())
	return []store.IndexSpec{{
		Name:    liveness.IndexTTL,
		Keys:    bson.D{{Key: "last_seen", Value: 1}},
		Partial: bson.D{{Key: "kind", Value: replicaKind}},
		TTL:     &ttl,
	}}
}

// Replica is the liveness record of one running Client (one call of Run),
// as Admin.Replicas reads it.
type Replica struct {
	// _ keeps Replica incomparable and out of unkeyed literals, so that
	// fields may be added: a Replica is read (Admin.Replicas), not built.
	_ [0]func()

	// ID is the random instance id of the Run call: a replica that
	// restarts under the same Name gets a record of its own, so that the
	// record of a run that died keeps the sessions to end
	// (internal/liveness).
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
	return !r.Stopped && r.Silence <= liveness.StaleAfter*cmp.Or(r.RefreshInterval, 5*time.Second)
}

// Replicas returns the liveness records of the replicas that ran in the
// Admin's database in the last ten minutes (every service sharing the
// database), sorted by service and start time, each with its Silence as of
// now by MongoDB's clock. Reads: the server's clock (hello), then the
// outbox_meta documents whose _id starts with "replica:" (an _id range),
// from the primary.
func (a *Admin) Replicas(ctx context.Context) ([]Replica, error) {
	now, docs, err := liveness.Read(ctx, a.outbox.Database().Collection(metaCollection))
	if err != nil {
		return nil, err
	}
	out := make([]Replica, 0, len(docs))
	for _, d := range docs {
		out = append(out, Replica{
			ID: d.ID[len(liveness.IDPrefix):], Name: d.Name, Service: d.Service,
			ConsumerGroup: d.ConsumerGroup, PublisherGroup: d.PublisherGroup,
			ConsumerMemberID: d.ConsumerMemberID, ConsumerGeneration: d.ConsumerGeneration,
			PublisherMemberID: d.PublisherMemberID, PublisherGeneration: d.PublisherGeneration,
			Host: d.Host, PID: d.PID, StartedAt: d.StartedAt, LastSeen: d.LastSeen,
			RefreshInterval: d.Refresh(),
			Stopped:         d.Stopped(), StoppedAt: d.StoppedAt, StopError: d.StopError,
			Silence: max(now.Sub(d.LastSeen), 0),
		})
	}
	slices.SortFunc(out, func(a, b Replica) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// keepAlive writes this Run's liveness record and refreshes it every
// refresh period in a goroutine that Run owns: it runs until the returned
// stop is called, which Run does after both groups were left, so the
// record stays fresh while Run drains. A failed write is logged
// (rate-limited) and tried again with backoff (Config.RetryMinBackoff to
// RetryMaxBackoff, never later than one refresh period); it never ends
// Run. stop ends the goroutine, waits for it, and writes the record a last
// time marked stopped (with runErr, if any), bounded by
// liveness.WriteTimeout.
func (c *Client) keepAlive(ctx context.Context) (stop func(runErr error)) {
	rl := itel.NewRateLog(itel.ErrorRelog) // once, then every itel.ErrorRelog while MongoDB is down
	r := liveness.NewRecord(liveness.Owner{
		Name: c.cfg.ReplicaID, Service: c.cfg.Service,
		ConsumerGroup: c.cfg.ConsumerGroup, PublisherGroup: c.cfg.PublisherGroup,
		Meta: c.meta, Mongo: c.cfg.Mongo,
		Interval: cmp.Or(c.test.replicaEvery, liveness.Interval(c.cfg.SessionTimeout)),
		Backoff:  c.cfg.backoff(),
		ConsumerMember: func() (string, int32, bool) {
			if cons := c.tel.cons.Load(); cons != nil && cons.cl != nil {
				m, g := cons.cl.GroupMetadata()
				return m, g, true
			}
			return "", 0, false
		},
		PublisherMember: func() (string, int32, bool) {
			if p := c.pub.Load(); p != nil {
				m, g := p.GroupMetadata()
				return m, g, true
			}
			return "", 0, false
		},
		Redact: redactSecrets,
		Log:    c.cfg.Logger,
		Warn: func(msg string, args ...any) {
			rl.Warn(c.cfg.Logger, msg, "refresh", args...)
		},
	})
	c.sessions.Start(r)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(lctx) })
	return func(runErr error) {
		cancel()
		wg.Wait()
		c.sessions.Stop()
		r.Stop(ctx, runErr)
	}
}

// reapDeadSessions ends, in the background, the recorded sessions of the
// consumer group's replicas that died, at most once per a few seconds
// (internal/liveness/takeover.go). A worker or a re-drive that meets a
// lock asks for it.
func (c *Client) reapDeadSessions(cons *consumer) {
	if cons == nil || cons.cl == nil {
		return
	}
	c.sessions.Reap(c.reaper(cons))
}

// reaper is what a reap of the consumer's group needs.
func (c *Client) reaper(cons *consumer) liveness.Reaper {
	return liveness.Reaper{
		Kafka: kadm.NewClient(cons.cl), Group: c.cfg.ConsumerGroup,
		ConsumerProtocol: c.cfg.GroupProtocol == GroupConsumer,
		Meta:             c.meta, Mongo: c.cfg.Mongo,
		Reaped: c.test.reapedHook,
		Log:    cons.log,
		Warn: func(msg string, args ...any) {
			cons.errLog.Warn(cons.log, msg, "reap", args...)
		},
	}
}

package console

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/event-outbox/outbox"
)

// partitionsService is one service's part of the partitions page.
type partitionsService struct {
	Name                          string
	ConsumerGroup, PublisherGroup string
	Consumer, Publisher           groupInfo
	Rows                          []partitionRow
	Err                           string
	// Replicas are the service's liveness records (outbox.Admin.Replicas):
	// the replicas that ran in the last ten minutes.
	Replicas    []outbox.Replica
	ReplicasErr string
}

// groupInfo is a group's state and members.
type groupInfo struct {
	State   string
	Members []memberInfo
	Err     string
}

// memberInfo is a group member, with the liveness of the replica whose
// record holds its member id.
type memberInfo struct {
	MemberID, ClientID, Host string
	// Replica is the record holding MemberID; nil when none does (a
	// replica that never wrote one, or whose record expired or could not
	// be read).
	Replica *outbox.Replica
}

// Alive reports whether the member's replica is running and refreshed its
// record recently.
func (m memberInfo) Alive() bool { return m.Replica != nil && m.Replica.Responding() }

// Liveness describes the member's replica for the page: "alive (last seen
// 2s ago)", "not responding since ... (40s)", "stopped at ...", or "not
// responding (no liveness record)".
func (m memberInfo) Liveness() string {
	r := m.Replica
	switch {
	case r == nil:
		return "not responding (no liveness record)"
	case r.Stopped:
		return "stopped at " + fmtTime(r.StoppedAt)
	case !r.Responding():
		return fmt.Sprintf("not responding since %s (%s)", fmtTime(r.LastSeen), fmtAge(r.Silence))
	}
	return "alive (last seen " + fmtAgo(r.Silence) + ")"
}

// partitionRow is one topic partition: who publishes it, who handles it,
// and the consumer group's committed offset, end offset and lag.
type partitionRow struct {
	Topic         string
	Partition     int32
	Publisher     *memberInfo
	Consumer      *memberInfo
	Committed     int64 // -1 when none
	End           int64 // -1 when unknown
	Lag           int64 // -1 when unknown
	HasCommit     bool
	ConsumerError string
	// Publishes and Handles are the service's roles for the row's topic:
	// its publisher group subscribes to the topic, its consumer group
	// subscribes to it or has committed offsets for it. A role the
	// service does not have shows no owner and no warning.
	Publishes, Handles bool
}

// partitions shows, per service and topic partition, the publisher group's
// member that publishes it, the consumer group's member that handles it,
// and the consumer group's committed offset, end offset and lag.
//
// Each member is matched by member id with the replicas' liveness records,
// so that a replica that died shows as not responding while its group
// still lists it (until its session times out), and the service's replicas
// are listed with their last refresh.
//
// Reads: Kafka, through kadm: Lag for both groups (DescribeGroups,
// OffsetFetch, ListOffsets). MongoDB, per service (outbox.Admin.Replicas):
// the server's clock (hello), then
// outbox_meta.find({_id: {$gte: "replica:", $lt: "replica;"}}), a range of
// the _id index over a collection of a few documents per replica, filtered
// here to the service's groups.
func (c *Console) partitions(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := c.ctx(r)
	defer cancel()
	out := make([]partitionsService, 0, len(c.services))
	for _, s := range c.services {
		ps := partitionsService{Name: s.Name, ConsumerGroup: s.ConsumerGroup, PublisherGroup: s.PublisherGroup}
		reps, err := s.admin.Replicas(ctx)
		if err != nil {
			ps.ReplicasErr = redact(err.Error())
		}
		for _, rep := range reps {
			if rep.ConsumerGroup == s.ConsumerGroup || rep.PublisherGroup == s.PublisherGroup {
				ps.Replicas = append(ps.Replicas, rep)
			}
		}
		if c.opts.Kafka != nil {
			partitionsOf(ctx, c.opts.Kafka, &ps)
		}
		out = append(out, ps)
	}
	c.render(w, r, "partitions", nil, struct {
		Kafka    bool
		Services []partitionsService
	}{c.opts.Kafka != nil, out}, start)
}

// partitionsOf fills ps's groups and rows from Kafka, matching the members
// with ps.Replicas.
func partitionsOf(ctx context.Context, adm *kadm.Client, ps *partitionsService) {
	lags, err := adm.Lag(ctx, ps.ConsumerGroup, ps.PublisherGroup)
	if err != nil {
		ps.Err = redact(err.Error())
		return
	}
	// replicaOf returns the record holding a member id of the group.
	replicaOf := func(consumer bool, memberID string) *outbox.Replica {
		for i := range ps.Replicas {
			r := &ps.Replicas[i]
			if consumer && r.ConsumerGroup == ps.ConsumerGroup && r.ConsumerMemberID == memberID ||
				!consumer && r.PublisherGroup == ps.PublisherGroup && r.PublisherMemberID == memberID {
				return r
			}
		}
		return nil
	}
	type tp struct {
		t string
		p int32
	}
	rows := map[tp]*partitionRow{}
	row := func(t string, p int32) *partitionRow {
		k := tp{t, p}
		if rows[k] == nil {
			rows[k] = &partitionRow{Topic: t, Partition: p, Committed: -1, End: -1, Lag: -1}
		}
		return rows[k]
	}
	info := func(l kadm.DescribedGroupLag, consumer bool) groupInfo {
		g := groupInfo{State: l.State}
		if e := l.Error(); e != nil {
			g.Err = redact(e.Error())
		}
		for _, m := range l.Members {
			g.Members = append(g.Members, memberInfo{m.MemberID, m.ClientID, m.ClientHost, replicaOf(consumer, m.MemberID)})
		}
		return g
	}
	// The topics of each role: the groups' subscriptions and assignments,
	// and the consumer group's commits.
	publishes, handles := map[string]bool{}, map[string]bool{}
	roles := func(l kadm.DescribedGroupLag, set map[string]bool) {
		for _, m := range l.Members {
			if j, ok := m.Join.AsConsumer(); ok {
				for _, t := range j.Topics {
					set[t] = true
				}
			}
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range a.Topics {
					set[t.Topic] = true
				}
			}
		}
	}
	if pl, ok := lags[ps.PublisherGroup]; ok {
		roles(pl, publishes)
	}
	if cl, ok := lags[ps.ConsumerGroup]; ok {
		roles(cl, handles)
		for _, l := range cl.Lag.Sorted() {
			if l.Commit.At >= 0 {
				handles[l.Topic] = true
			}
		}
	}
	if pl, ok := lags[ps.PublisherGroup]; ok {
		ps.Publisher = info(pl, false)
		for _, m := range pl.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			mi := &memberInfo{m.MemberID, m.ClientID, m.ClientHost, replicaOf(false, m.MemberID)}
			for _, t := range a.Topics {
				for _, p := range t.Partitions {
					row(t.Topic, p).Publisher = mi
				}
			}
		}
	}
	if cl, ok := lags[ps.ConsumerGroup]; ok {
		ps.Consumer = info(cl, true)
		for _, m := range cl.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			mi := &memberInfo{m.MemberID, m.ClientID, m.ClientHost, replicaOf(true, m.MemberID)}
			for _, t := range a.Topics {
				for _, p := range t.Partitions {
					row(t.Topic, p).Consumer = mi
				}
			}
		}
		for _, l := range cl.Lag.Sorted() {
			r := row(l.Topic, l.Partition)
			if l.Commit.At >= 0 {
				r.Committed, r.HasCommit = l.Commit.At, true
			}
			if l.End.Err == nil {
				r.End = l.End.Offset
			}
			r.Lag = l.Lag
			if l.Err != nil {
				r.ConsumerError = redact(l.Err.Error())
			}
		}
	}
	for _, r := range rows {
		r.Publishes, r.Handles = publishes[r.Topic], handles[r.Topic]
		ps.Rows = append(ps.Rows, *r)
	}
	slices.SortFunc(ps.Rows, func(a, b partitionRow) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
}

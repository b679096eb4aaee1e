package console

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// partitionsService is one service's part of the partitions page.
type partitionsService struct {
	Name                          string
	ConsumerGroup, PublisherGroup string
	Consumer, Publisher           groupInfo
	Rows                          []partitionRow
	Err                           string
}

// groupInfo is a group's state and members.
type groupInfo struct {
	State   string
	Members []memberInfo
	Err     string
}

type memberInfo struct{ MemberID, ClientID, Host string }

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
}

// partitions shows, per service and topic partition, the publisher group's
// member that publishes it, the consumer group's member that handles it,
// and the consumer group's committed offset, end offset and lag.
//
// Reads: Kafka only, through kadm: Lag for both groups (DescribeGroups,
// OffsetFetch, ListOffsets). No MongoDB query.
func (c *Console) partitions(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var out []partitionsService
	if c.opts.Kafka != nil {
		ctx, cancel := c.ctx(r)
		defer cancel()
		for _, s := range c.services {
			out = append(out, partitionsOf(ctx, c.opts.Kafka, s))
		}
	}
	c.render(w, r, "partitions", nil, struct {
		Kafka    bool
		Services []partitionsService
	}{c.opts.Kafka != nil, out}, start)
}

func partitionsOf(ctx context.Context, adm *kadm.Client, s *service) partitionsService {
	ps := partitionsService{Name: s.Name, ConsumerGroup: s.ConsumerGroup, PublisherGroup: s.PublisherGroup}
	lags, err := adm.Lag(ctx, s.ConsumerGroup, s.PublisherGroup)
	if err != nil {
		ps.Err = redact(err.Error())
		return ps
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
	info := func(l kadm.DescribedGroupLag) groupInfo {
		g := groupInfo{State: l.State}
		if e := l.Error(); e != nil {
			g.Err = redact(e.Error())
		}
		for _, m := range l.Members {
			g.Members = append(g.Members, memberInfo{m.MemberID, m.ClientID, m.ClientHost})
		}
		return g
	}
	if pl, ok := lags[s.PublisherGroup]; ok {
		ps.Publisher = info(pl)
		for _, m := range pl.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			mi := &memberInfo{m.MemberID, m.ClientID, m.ClientHost}
			for _, t := range a.Topics {
				for _, p := range t.Partitions {
					row(t.Topic, p).Publisher = mi
				}
			}
		}
	}
	if cl, ok := lags[s.ConsumerGroup]; ok {
		ps.Consumer = info(cl)
		for _, m := range cl.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			mi := &memberInfo{m.MemberID, m.ClientID, m.ClientHost}
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
		ps.Rows = append(ps.Rows, *r)
	}
	slices.SortFunc(ps.Rows, func(a, b partitionRow) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return ps
}

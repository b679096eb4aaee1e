package console

import (
	"context"
	"html"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// memberStatus reads the liveness the partitions page shows for a member id.
func memberStatus(body, memberID string) (string, bool) {
	re := regexp.MustCompile(`<li data-member="` + regexp.QuoteMeta(memberID) + `">[^<]*<span class="[^"]*">([^<]*)</span></li>`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return "", false
	}
	return html.UnescapeString(m[1]), true
}

// waitPage polls the partitions page until cond holds for its body.
func waitPage(t *testing.T, b *bundle, what string, cond func(body string) bool) string {
	t.Helper()
	cl := jarClient(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, cl, b.url("partitions"))
		require.Equal(t, 200, code)
		if cond(body) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the partitions page to show %s; last page:\n%s", what, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A replica that dies abruptly stays a member of its groups until its
// session times out. The partitions page matches each member with the
// replicas' liveness records: the running replica shows alive, a member
// without a record and a member whose record went stale (its replica no
// longer refreshes it: a kill -9, simulated by a record last refreshed a
// minute ago for a member the group still lists) show as not responding,
// and a member whose replica marked its record stopped shows as stopped.
func TestPartitionsShowDeadReplicasWhileTheGroupListsThem(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.run(t)
	ctx := context.Background()

	// The running replica's record, once it holds both member ids.
	var live outbox.Replica
	deadline := time.Now().Add(30 * time.Second)
	for {
		reps, err := b.client.Admin().Replicas(ctx)
		require.NoError(t, err)
		if len(reps) == 1 && reps[0].ConsumerMemberID != "" && reps[0].PublisherMemberID != "" {
			live = reps[0]
			break
		}
		require.False(t, time.Now().After(deadline), "the running replica never recorded its member ids")
		time.Sleep(20 * time.Millisecond)
	}
	waitPage(t, b, "the running replica alive in both groups", func(body string) bool {
		c, ok1 := memberStatus(body, live.ConsumerMemberID)
		p, ok2 := memberStatus(body, live.PublisherMemberID)
		return ok1 && ok2 && regexp.MustCompile(`^alive \(last seen (just now|\d+s ago)\)$`).MatchString(c) &&
			regexp.MustCompile(`^alive \(last seen (just now|\d+s ago)\)$`).MatchString(p)
	})

	// Two more members of the consumer group, as replicas that still hold
	// their group sessions but no longer refresh their records would be.
	join := func() string {
		cl := b.kafka.Client(t, kgo.ConsumerGroup(live.ConsumerGroup), kgo.ConsumeTopics(b.kafkaTopic(ordersTopic)),
			kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(200*time.Millisecond))
		var member string
		deadline := time.Now().Add(30 * time.Second)
		for member == "" {
			require.False(t, time.Now().After(deadline), "the member never joined")
			pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			cl.PollFetches(pctx) // drives the join
			cancel()
			member, _ = cl.GroupMetadata()
		}
		return member
	}
	dead, stopped := join(), join()

	// Without a record, a member is not known to respond.
	waitPage(t, b, "the members without a record", func(body string) bool {
		d, ok1 := memberStatus(body, dead)
		s, ok2 := memberStatus(body, stopped)
		return ok1 && ok2 && d == "not responding (no liveness record)" && s == d
	})

	now := time.Now().UTC().Truncate(time.Millisecond)
	record := func(id, member, state string, lastSeen time.Time) bson.D {
		return bson.D{
			{Key: "_id", Value: "replica:" + id}, {Key: "kind", Value: "replica"}, {Key: "service", Value: live.Service},
			{Key: "consumer_group", Value: live.ConsumerGroup}, {Key: "publisher_group", Value: live.PublisherGroup},
			{Key: "consumer_member_id", Value: member}, {Key: "consumer_generation", Value: int32(1)},
			{Key: "publisher_member_id", Value: ""}, {Key: "publisher_generation", Value: int32(-1)},
			{Key: "host", Value: "host-" + id}, {Key: "pid", Value: 4242}, {Key: "started_at", Value: now.Add(-5 * time.Minute)},
			{Key: "last_seen", Value: lastSeen}, {Key: "refresh_ms", Value: int64(1000)}, {Key: "state", Value: state},
			{Key: "stopped_at", Value: lastSeen},
		}
	}
	stale := now.Add(-time.Minute)
	insert(t, b.db.Collection("outbox_meta"),
		record("dead", dead, "running", stale),
		record("gone", stopped, "stopped", now))

	body := waitPage(t, b, "the dead and stopped members", func(body string) bool {
		d, _ := memberStatus(body, dead)
		s, _ := memberStatus(body, stopped)
		return d != "not responding (no liveness record)" && s != "not responding (no liveness record)"
	})
	d, ok := memberStatus(body, dead)
	require.True(t, ok, "the group still lists the dead member")
	require.Regexp(t, `^not responding since `+regexp.QuoteMeta(stale.Format("2006-01-02 15:04:05Z"))+` \(1m\d+s\)$`, d)
	s, ok := memberStatus(body, stopped)
	require.True(t, ok, "the group still lists the stopped member")
	require.Equal(t, "stopped at "+now.Format("2006-01-02 15:04:05Z"), s)
	c, _ := memberStatus(body, live.ConsumerMemberID)
	require.Regexp(t, `^alive \(last seen (just now|\d+s ago)\)$`, c, "the running replica is still alive")

	// The replicas of the service are listed with their last refresh.
	rows := regexp.MustCompile(`(?s)<tr data-replica="([^"]+)">(.*?)</tr>`).FindAllStringSubmatch(body, -1)
	states := map[string]string{}
	for _, r := range rows {
		states[r[1]] = r[2]
	}
	require.Len(t, states, 3)
	require.Contains(t, states[live.ID], ">alive<")
	require.NotEmpty(t, live.Name)
	require.Contains(t, states[live.ID], "<code>"+live.Name+"</code>", "the replica's name (Config.ReplicaID) is shown")
	require.Contains(t, states["dead"], "not responding")
	require.Contains(t, states["dead"], stale.Format("2006-01-02 15:04:05Z"))
	require.Contains(t, states["gone"], "stopped at")
}

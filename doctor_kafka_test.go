package outbox

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
)

// findingsOf returns the findings of one check and the worst severity
// among them (-1 when none).
func findingsOf(r DoctorReport, check string) ([]Finding, Severity) {
	var out []Finding
	worst := Severity(-1)
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
			worst = max(worst, f.Severity)
		}
	}
	return out, worst
}

func dump(r DoctorReport) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintln(&b, f.String())
	}
	return b.String()
}

// doctorBundle is a consuming and publishing service with events recorded,
// its indexes and partition counts stored, ready for the doctor.
func doctorBundle(t *testing.T) (*bundle, *Client) {
	t.Helper()
	b := setup(t)
	c := b.client(t, b.config("doctor"))
	require.NoError(t, Handle(c, func(context.Context, orderPlaced, Metadata) error { return nil }))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	for i := range 10 {
		require.NoError(t, c.Transact(context.Background(), func(ctx context.Context) error {
			return Record(ctx, orderPlaced{Run: b.run, OrderID: fmt.Sprintf("o-%d", i), Amount: i, Seq: i})
		}))
	}
	return b, c
}

// TestDoctorKafkaChecks applies each bad topic setting through kadm, as an
// operator would, and checks that the doctor reports it with the right
// severity; then repairs it and checks that the finding is gone. Every
// Kafka check is covered.
func TestDoctorKafkaChecks(t *testing.T) {
	b, c := doctorBundle(t)
	ctx := context.Background()
	adm := b.kafka.Admin()
	orders := b.kafkaTopic(ordersTopic)

	// The healthy setup: nothing breaks a guarantee. kfake's topics have
	// one replica, a risk the report names.
	r, err := c.Doctor(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Breaking(), dump(r))
	if !b.kafka.Real {
		_, sev := findingsOf(r, "kafka.min_insync_replicas")
		require.Equal(t, SeverityRisk, sev, dump(r))
	}

	set := func(key, value string) func(t *testing.T) {
		return func(t *testing.T) { b.kafka.SetTopicConfig(t, orders, key, &value) }
	}
	unset := func(key string) func(t *testing.T) {
		return func(t *testing.T) { b.kafka.SetTopicConfig(t, orders, key, nil) }
	}
	group := c.cfg.ConsumerGroup
	cases := []struct {
		name, check string
		severity    Severity
		bad, fix    func(t *testing.T)
		contains    string // in the finding's Read
	}{
		{"unclean leader election", "kafka.unclean_leader_election", SeverityBreaks,
			set("unclean.leader.election.enable", "true"), unset("unclean.leader.election.enable"), "unclean.leader.election.enable=true"},
		// kfake and Apache Kafka 4 serve Produce v10 and cap the minimum
		// at the replica count: a risk (internal/doctor TestJudgeMinISRAboveReplicas).
		{"min.insync.replicas above the replication factor", "kafka.min_insync_replicas", SeverityRisk,
			set("min.insync.replicas", "2"), unset("min.insync.replicas"), "min.insync.replicas=2"},
		{"compacted", "kafka.cleanup_policy", SeverityBreaks,
			set("cleanup.policy", "compact"), unset("cleanup.policy"), "cleanup.policy=compact"},
		{"retention shorter than the expected outage", "kafka.retention", SeverityBreaks,
			set("retention.ms", "3600000"), unset("retention.ms"), "retention.ms=3600000"},
		{"retention by size shorter than the expected outage", "kafka.retention", SeverityBreaks,
			set("retention.bytes", "10000"), unset("retention.bytes"), "retention.bytes=10000"},
		{"events larger than max.message.bytes", "kafka.max_message_bytes", SeverityBreaks,
			set("max.message.bytes", "250"), unset("max.message.bytes"), "max.message.bytes=250"},
		{"a codec some consumers cannot read", "kafka.compression_type", SeverityRisk,
			set("compression.type", "snappy"), unset("compression.type"), "compression.type=snappy"},
		{"partitions added since events were recorded", "kafka.partitions", SeverityBreaks,
			func(t *testing.T) {
				_, err := adm.CreatePartitions(ctx, 1, orders)
				require.NoError(t, err)
			},
			func(t *testing.T) {
				// What Run's refresh does within a minute.
				_, err := c.meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: store.TopicMetaID(c.outbox.Name(), ordersTopic)}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "partitions", Value: 4}}}})
				require.NoError(t, err)
			}, "4 partitions in Kafka, 3 stored"},
		{"records expired before the group read them", "kafka.expired_unread", SeverityBreaks,
			func(t *testing.T) {
				cl := b.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
				for range 5 {
					require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: orders, Partition: 0, Value: []byte("x")}).FirstErr())
				}
				commit(t, adm, group, orders, 1)
				var o kadm.Offsets
				o.Add(kadm.Offset{Topic: orders, Partition: 0, At: 3})
				resp, err := adm.DeleteRecords(ctx, o)
				require.NoError(t, err)
				require.NoError(t, resp.Error())
			},
			func(t *testing.T) { commit(t, adm, group, orders, 3) }, "committed 1, log start 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.bad(t)
			fixed := false
			t.Cleanup(func() { // a failed case leaves no bad setting to the next
				if !fixed {
					tc.fix(t)
				}
			})
			r, err := c.Doctor(ctx)
			require.NoError(t, err)
			var found *Finding
			for _, f := range r.Findings {
				if f.Check == tc.check && strings.Contains(f.Read, tc.contains) {
					found = &f
				}
			}
			require.NotNil(t, found, dump(r))
			require.Equal(t, tc.severity, found.Severity, found.String())
			require.Contains(t, found.Subject, "topic orders")
			require.NotEmpty(t, found.Problem)
			require.NotEmpty(t, found.Fix)
			require.NotEmpty(t, found.Guarantee)
			require.Equal(t, tc.severity == SeverityBreaks, len(r.Breaking()) > 0, dump(r))

			tc.fix(t)
			fixed = true
			r, err = c.Doctor(ctx)
			require.NoError(t, err)
			require.Empty(t, r.Breaking(), dump(r))
			for _, f := range r.Findings {
				if f.Check == tc.check {
					require.NotContains(t, f.Read, tc.contains)
				}
			}
		})
	}
}

// commit sets a group's committed offset of partition 0.
func commit(t *testing.T, adm *kadm.Client, group, topic string, at int64) {
	t.Helper()
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: topic, Partition: 0, At: at, LeaderEpoch: -1})
	resp, err := adm.CommitOffsets(context.Background(), group, o)
	require.NoError(t, err)
	require.NoError(t, resp.Error())
}

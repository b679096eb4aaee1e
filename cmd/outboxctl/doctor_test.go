package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

var spaces = regexp.MustCompile(` +`)

// orderPlaced is the event of the doctor's test service.
type orderPlaced struct {
	OrderID string `json:"order_id"`
	Note    string `json:"note"`
}

func (orderPlaced) Topic() string          { return "orders" }
func (orderPlaced) ContentSchema() string  { return "OrderPlaced.v1" }
func (e orderPlaced) PartitionKey() string { return e.OrderID }

// TestDoctor runs "outboxctl doctor" on the embedded servers as the
// development stack starts them, with a service that recorded events:
// exit status 0 and a summary on the default setup; then, for each Kafka
// check, applies the bad setting through kadm and expects exit status 1
// (0 for a setting that only risks a guarantee) with the finding printed,
// and 0 again once it is repaired.
func TestDoctor(t *testing.T) {
	c := newCtl(t)
	k := kafkatest.Start(t, kafkatest.SeedTopics(6, "orders"))
	if k.Real {
		t.Skip("changes the settings and partitions of topic \"orders\", which other tests on shared real brokers use: needs a kfake cluster of its own")
	}
	ctx := context.Background()
	cfg := outbox.Config{Mongo: c.db.Client(), Database: c.db.Name(), Brokers: k.Seeds, Service: "shop",
		PublishTopics: []string{"orders"}}
	svc, err := outbox.New(cfg)
	require.NoError(t, err)
	require.NoError(t, outbox.Handle(svc, func(context.Context, orderPlaced, outbox.Metadata) error { return nil }))
	require.NoError(t, svc.EnsureIndexes(ctx))
	for i := range 20 {
		require.NoError(t, svc.Transact(ctx, func(ctx context.Context) error {
			return outbox.Record(ctx, orderPlaced{OrderID: fmt.Sprint(i), Note: strings.Repeat("x", 100)})
		}))
	}
	// doctor runs the command; its stdout comes back with runs of spaces
	// (the table's alignment) made single.
	doctor := func(extra ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := c.run(append([]string{"doctor", "-brokers", strings.Join(k.Seeds, ","), "-group", "shop", "-consume", "orders"}, extra...)...)
		return code, spaces.ReplaceAllString(out, " "), errOut
	}

	code, out, errOut := doctor()
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Regexp(t, `(?m)^doctor: nothing breaks a guarantee; \d+ risks?, \d+ notes? \(\d+ checks\)$`, out)
	require.Contains(t, out, "RISK topic orders (published and consumed): each record has one copy")

	adm := k.Admin()
	set := func(key, value string) func() { return func() { k.SetTopicConfig(t, "orders", key, &value) } }
	unset := func(key string) func() { return func() { k.SetTopicConfig(t, "orders", key, nil) } }
	commit := func(at int64) func() {
		return func() {
			var o kadm.Offsets
			o.Add(kadm.Offset{Topic: "orders", Partition: 0, At: at, LeaderEpoch: -1})
			resp, err := adm.CommitOffsets(ctx, "shop", o)
			require.NoError(t, err)
			require.NoError(t, resp.Error())
		}
	}
	cases := []struct {
		name     string
		code     int
		bad, fix func()
		want     string
	}{
		{"unclean leader election", 1, set("unclean.leader.election.enable", "true"), unset("unclean.leader.election.enable"),
			"BREAKS topic orders (published and consumed): a replica that is out of sync may become leader"},
		// Brokers of Kafka 3.7 and later (kfake among them) cap the minimum
		// at the replica count: a risk, not a refusal of every write.
		{"min.insync.replicas", 0, set("min.insync.replicas", "2"), unset("min.insync.replicas"),
			"RISK topic orders (published and consumed): the brokers cap the minimum at the replica count (1)"},
		{"cleanup.policy", 1, set("cleanup.policy", "compact"), unset("cleanup.policy"), "read: cleanup.policy=compact"},
		{"retention.ms", 1, set("retention.ms", "86400000"), unset("retention.ms"), "read: retention.ms=86400000 (1d), expected outage 3d"},
		{"retention.bytes", 1, set("retention.bytes", "100000"), unset("retention.bytes"), "read: retention.bytes=100000 per partition"},
		{"max.message.bytes", 1, set("max.message.bytes", "250"), unset("max.message.bytes"), "read: max.message.bytes=250"},
		{"compression.type", 0, set("compression.type", "lz4"), unset("compression.type"), "RISK topic orders (published and consumed): the broker recompresses every batch with lz4"},
		{"partition count", 1, func() {
			_, err := adm.CreatePartitions(ctx, 2, "orders")
			require.NoError(t, err)
		}, func() {
			_, err := c.db.Collection("outbox_meta").UpdateOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "outbox", Value: "outbox"}, {Key: "topic", Value: "orders"}}}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "partitions", Value: 8}}}})
			require.NoError(t, err)
		}, "read: 8 partitions in Kafka, 6 stored in outbox_meta"},
		{"records expired unread", 1, func() {
			cl := k.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
			for range 4 {
				require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "orders", Partition: 0, Value: []byte("{}")}).FirstErr())
			}
			commit(0)()
			var o kadm.Offsets
			o.Add(kadm.Offset{Topic: "orders", Partition: 0, At: 2})
			resp, err := adm.DeleteRecords(ctx, o)
			require.NoError(t, err)
			require.NoError(t, resp.Error())
		}, commit(2), "read: consumer group shop: partition 0 committed 0, log start 2"},
	}
	for _, tc := range cases {
		tc.bad()
		code, out, errOut := doctor()
		require.Equal(t, tc.code, code, "%s: stdout:\n%s\nstderr:\n%s", tc.name, out, errOut)
		require.Contains(t, out, tc.want, tc.name)
		if tc.code == 1 {
			require.Contains(t, errOut, "breaks a guarantee", tc.name)
			require.Regexp(t, `(?m)^doctor: 1 breaks a guarantee`, out, tc.name)
		}
		tc.fix()
		code, out, errOut = doctor()
		require.Equal(t, 0, code, "%s repaired: stdout:\n%s\nstderr:\n%s", tc.name, out, errOut)
		require.NotContains(t, out, tc.want, tc.name)
	}

	// -json: the report for scripts, exit status as without.
	set("cleanup.policy", "compact")()
	code, out, _ = doctor("-json")
	require.Equal(t, 1, code)
	var r struct {
		Summary  string           `json:"summary"`
		Findings []outbox.Finding `json:"findings"`
		Checks   int              `json:"checks"`
		At       time.Time        `json:"checked_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Equal(t, outbox.SeverityBreaks, r.Findings[0].Severity)
	require.Equal(t, "kafka.cleanup_policy", r.Findings[0].Check)
	require.Equal(t, "set cleanup.policy=delete", r.Findings[0].Fix)
	require.Contains(t, r.Summary, "1 breaks a guarantee")
	require.Positive(t, r.Checks)

	// Without brokers the Kafka checks are skipped, and a note says so.
	code, out, _ = c.run("doctor")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "the Kafka checks did not run")
}

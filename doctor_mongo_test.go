package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// findingWith returns the finding of check whose Read contains s.
func findingWith(r DoctorReport, check, s string) *Finding {
	for _, f := range r.Findings {
		if f.Check == check && strings.Contains(f.Read, s) {
			return &f
		}
	}
	return nil
}

// TestDoctorMongoChecks sets each bad state the embedded server can hold
// (a TTL index that deletes waiting events, a conflicting index, a missing
// one, an inbox owned by another group) and checks the finding, then
// repairs it and checks that the finding is gone. The server-wide settings
// the embedded server cannot have wrong are judged on hand-made facts in
// TestDoctorMongoJudges.
func TestDoctorMongoChecks(t *testing.T) {
	_, c := doctorBundle(t)
	ctx := context.Background()

	r, err := c.Doctor(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Breaking(), dump(r))
	for _, f := range r.Findings {
		require.NotEqual(t, "mongo.indexes", f.Check, "every index in place: %s", f)
		require.NotEqual(t, "mongo.replica_set", f.Check, f.String())
		require.NotEqual(t, "mongo.transaction_lifetime", f.Check, f.String())
		require.NotEqual(t, "mongo.write_concern", f.Check, f.String())
		require.NotEqual(t, "mongo.clock", f.Check, f.String())
		require.NotContains(t, f.Read, "could not read", f.String())
	}

	createIndex := func(coll *mongo.Collection, keys bson.D, opts *options.IndexOptionsBuilder) func(t *testing.T) {
		return func(t *testing.T) {
			_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys, Options: opts})
			require.NoError(t, err)
		}
	}
	dropIndex := func(coll *mongo.Collection, name string) func(t *testing.T) {
		return func(t *testing.T) { require.NoError(t, coll.Indexes().DropOne(ctx, name)) }
	}
	ensure := func(t *testing.T) { require.NoError(t, c.EnsureIndexes(ctx)) }
	stampID := bson.D{{Key: "_id", Value: bson.D{{Key: "inbox", Value: c.cfg.InboxCollection}}}}
	setOwner := func(group string) func(t *testing.T) {
		return func(t *testing.T) {
			_, err := c.meta.UpdateOne(ctx, stampID, bson.D{{Key: "$set", Value: bson.D{{Key: "consumer_group", Value: group}}}})
			require.NoError(t, err)
		}
	}
	cases := []struct {
		name, check string
		severity    Severity
		bad, fix    func(t *testing.T)
		contains    string
	}{
		{"a TTL index that deletes unpublished events", "mongo.indexes", SeverityBreaks,
			createIndex(c.outbox, bson.D{{Key: "created_at", Value: 1}}, options.Index().SetName("expire_all").SetExpireAfterSeconds(3600)),
			dropIndex(c.outbox, "expire_all"), `"name":"expire_all"`},
		{"a TTL index that deletes parked events", "mongo.indexes", SeverityBreaks,
			createIndex(c.inbox, bson.D{{Key: "parked_at", Value: -1}}, options.Index().SetName("expire_parked").SetExpireAfterSeconds(60)),
			dropIndex(c.inbox, "expire_parked"), "expire_parked"},
		{"an index under the framework's name with another key", "mongo.indexes", SeverityBreaks,
			func(t *testing.T) {
				dropIndex(c.outbox, indexOutboxFailed)(t)
				createIndex(c.outbox, bson.D{{Key: "failed", Value: 1}}, options.Index().SetName(indexOutboxFailed))(t)
			},
			func(t *testing.T) { dropIndex(c.outbox, indexOutboxFailed)(t); ensure(t) }, "index outbox_failed is"},
		{"a missing TTL index", "mongo.indexes", SeverityRisk,
			dropIndex(c.outbox, indexOutboxTTL), ensure, "index outbox_published_ttl"},
		{"an inbox owned by another consumer group", "mongo.inbox_owner", SeverityBreaks,
			setOwner("someone-else"), setOwner(c.cfg.ConsumerGroup), `owned by consumer group "someone-else"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.bad(t)
			fixed := false
			t.Cleanup(func() {
				if !fixed {
					tc.fix(t)
				}
			})
			r, err := c.Doctor(ctx)
			require.NoError(t, err)
			f := findingWith(r, tc.check, tc.contains)
			require.NotNil(t, f, dump(r))
			require.Equal(t, tc.severity, f.Severity, f.String())
			require.NotEmpty(t, f.Fix)
			require.NotEmpty(t, f.Problem)
			tc.fix(t)
			fixed = true
			r, err = c.Doctor(ctx)
			require.NoError(t, err)
			require.Nil(t, findingWith(r, tc.check, tc.contains), dump(r))
			require.Empty(t, r.Breaking(), dump(r))
		})
	}
}

// TestDoctorTransactionLifetime: a server whose transactionLifetimeLimitSeconds
// is below HandlerTimeout breaks processing; a HandlerTimeout below it
// does not.
func TestDoctorTransactionLifetime(t *testing.T) {
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(30*time.Second)))
	if b.mongo.Real {
		t.Skip("sets the embedded server's transaction lifetime")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		timeout time.Duration
		breaks  bool
		read    string // literal: the formatter must not build the expectation
	}{{45 * time.Second, true, "HandlerTimeout 45s"}, {30 * time.Second, true, "HandlerTimeout 30s"}, {20 * time.Second, false, ""}} {
		cfg := b.config("lifetime")
		cfg.HandlerTimeout = tc.timeout
		c := b.client(t, cfg)
		r, err := c.Doctor(ctx)
		require.NoError(t, err)
		f := findingWith(r, "mongo.transaction_lifetime", "transactionLifetimeLimitSeconds 30")
		if !tc.breaks {
			require.Nil(t, f, dump(r))
			continue
		}
		require.NotNil(t, f, dump(r))
		require.Equal(t, SeverityBreaks, f.Severity)
		require.Contains(t, f.Read, tc.read)
		require.Contains(t, f.Fix, "lower Config.HandlerTimeout below 30s")
	}
}

// TestDoctorMongoJudges judges the server-wide facts the embedded server
// cannot have wrong: a standalone server, a clock off, a short oplog
// window, a weak default write concern.
func TestDoctorMongoJudges(t *testing.T) {
	one := func(fs []Finding, check string, sev Severity) {
		t.Helper()
		require.Len(t, fs, 1)
		require.Equal(t, check, fs[0].Check)
		require.Equal(t, sev, fs[0].Severity, fs[0].String())
		require.NotEmpty(t, fs[0].Fix)
	}
	one(judgeReplicaSet("", ""), "mongo.replica_set", SeverityBreaks)
	require.Empty(t, judgeReplicaSet("rs0", ""))
	one(judgeReplicaSet("", "isdbgrid"), "mongo.replica_set", SeverityNote)

	one(judgeClock(90*time.Second, 2*time.Millisecond), "mongo.clock", SeverityRisk)
	one(judgeClock(-90*time.Second, 2*time.Millisecond), "mongo.clock", SeverityRisk)
	require.Empty(t, judgeClock(800*time.Millisecond, 2*time.Millisecond))

	now := time.Now()
	one(judgeOplog(now.Add(-time.Hour), now, 3*24*time.Hour), "mongo.oplog_window", SeverityRisk)
	require.Empty(t, judgeOplog(now.Add(-4*24*time.Hour), now, 3*24*time.Hour))

	one(judgeWriteConcern(int64(1), "global"), "mongo.write_concern", SeverityRisk)
	one(judgeWriteConcern(int64(0), "global"), "mongo.write_concern", SeverityRisk)
	require.Empty(t, judgeWriteConcern("majority", "implicit"))
	require.Empty(t, judgeWriteConcern(int64(2), "global"))
	require.Empty(t, judgeWriteConcern(nil, "implicit"))

	one(judgeTransactionLifetime(60*time.Second, 60*time.Second), "mongo.transaction_lifetime", SeverityBreaks)
	require.Empty(t, judgeTransactionLifetime(60*time.Second, 45*time.Second))

	stamp := &inboxStamp{ConsumerGroup: "a", Service: "a"}
	one(judgeInboxOwner("db", "inbox", stamp, "b", true), "mongo.inbox_owner", SeverityBreaks)
	require.Empty(t, judgeInboxOwner("db", "inbox", stamp, "a", true))
	one(judgeInboxOwner("db", "inbox", nil, "a", true), "mongo.inbox_owner", SeverityNote)
}

// TestDoctorDurationText pins the durations the findings print, as
// literal text: an expectation built with the same formatter would agree
// with any mistake it makes.
func TestDoctorDurationText(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "0s",
		400 * time.Millisecond:            "0s",
		time.Second:                       "1s",
		10 * time.Second:                  "10s",
		30 * time.Second:                  "30s",
		45 * time.Second:                  "45s",
		time.Minute:                       "1m",
		90 * time.Second:                  "1m30s",
		2*time.Minute + 30*time.Second:    "2m30s",
		10 * time.Minute:                  "10m",
		time.Hour:                         "1h",
		time.Hour + 30*time.Minute:        "1h30m",
		10*time.Hour + 10*time.Second:     "10h0m10s",
		20 * time.Hour:                    "20h",
		24 * time.Hour:                    "1d",
		3*24*time.Hour + 12*time.Hour:     "3d12h",
		30 * 24 * time.Hour:               "30d",
		-(2*time.Minute + 30*time.Second): "-2m30s",
	} {
		require.Equal(t, want, fmtDuration(d), "%v", d)
	}

	fs := judgeTransactionLifetime(30*time.Second, 30*time.Second)
	require.Len(t, fs, 1)
	require.Equal(t, "transactionLifetimeLimitSeconds 30, HandlerTimeout 30s", fs[0].Read)
	require.Equal(t, "raise transactionLifetimeLimitSeconds above 30 (setParameter), or lower Config.HandlerTimeout below 30s", fs[0].Fix)

	fs = judgeClock(10*time.Second, 2*time.Millisecond)
	require.Len(t, fs, 1)
	require.Equal(t, "the server's clock is 10s ahead of this service's (round trip 2ms)", fs[0].Read)

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fs = judgeOplog(now.Add(-(2*time.Minute + 30*time.Second)), now, 20*time.Minute)
	require.Len(t, fs, 1)
	require.Equal(t, "oplog window 2m30s (first entry 2026-01-02T03:01:35Z, last 2026-01-02T03:04:05Z), expected outage 20m", fs[0].Read)

	f := &topicFacts{configs: map[string]string{"retention.ms": "600000"}}
	fs = judgeRetention("t", f, 40*time.Minute, 30*24*time.Hour)
	require.Len(t, fs, 1)
	require.Equal(t, "retention.ms=600000 (10m), expected outage 40m", fs[0].Read)
	require.Equal(t, "set retention.ms to at least 2400000 (40m), or plan for shorter outages (ExpectedOutage, outboxctl -outage)", fs[0].Fix)
}

// TestDoctorKafkaJudges covers the Kafka judgements that kfake's single
// broker cannot reach: replicated topics.
func TestDoctorKafkaJudges(t *testing.T) {
	sev := func(fs []Finding) Severity {
		require.Len(t, fs, 1)
		return fs[0].Severity
	}
	for _, c := range []minISRCap{minISRCapUnknown, minISRCapped, minISRNotCapped} {
		require.Equal(t, SeverityBreaks, sev(judgeMinISR("t", "1", 3, c)))
		require.Empty(t, judgeMinISR("t", "2", 3, c))
		require.Equal(t, SeverityRisk, sev(judgeMinISR("t", "3", 3, c)))
		require.Equal(t, SeverityRisk, sev(judgeMinISR("t", "1", 1, c)))
	}
	require.Equal(t, SeverityBreaks, sev(judgeCleanupPolicy("t", "compact,delete")))
	require.Empty(t, judgeCompression("t", "gzip"))
	require.Empty(t, judgeCompression("t", "producer"))
	require.Equal(t, SeverityRisk, sev(judgeCompression("t", "zstd")))

	// Retention against the inbox's: a consumed topic kept longer than
	// the inbox remembers risks duplicates after a replay.
	f := &topicFacts{consume: true, configs: map[string]string{"retention.ms": "-1"}}
	require.Equal(t, SeverityRisk, sev(judgeRetention("t", f, 3*24*time.Hour, 30*24*time.Hour)))
	f.configs["retention.ms"] = "2592000000" // 30 days
	require.Equal(t, SeverityRisk, sev(judgeRetention("t", f, 3*24*time.Hour, 30*24*time.Hour)))
	f.configs["retention.ms"] = "604800000" // 7 days
	require.Empty(t, judgeRetention("t", f, 3*24*time.Hour, 30*24*time.Hour))
	f.consume = false
	f.configs["retention.ms"] = "-1"
	require.Empty(t, judgeRetention("t", f, 3*24*time.Hour, 30*24*time.Hour), "a topic this service only publishes")

	require.Equal(t, SeverityRisk, sev(judgeMaxMessageBytes("t", "1000", []int64{100, 200, 900}, 0, "none")))
	require.Empty(t, judgeMaxMessageBytes("t", "1000", []int64{100, 200, 700}, 300, "gzip"))
	require.Equal(t, SeverityRisk, sev(judgeMaxMessageBytes("t", "1000", []int64{100, 200, 1500}, 400, "gzip")), "fits only compressed")
	require.Equal(t, SeverityBreaks, sev(judgeMaxMessageBytes("t", "1000", []int64{100, 200, 1500}, 1200, "gzip")))
	require.Equal(t, SeverityRisk, sev(judgeProducerCompression("snappy")))
	require.Empty(t, judgeProducerCompression("gzip"))
	require.Equal(t, SeverityBreaks, sev(judgePartitionCount("t", 3, 6)))
	require.Empty(t, judgePartitionCount("t", 6, 0), "no count stored yet")
}

package doctor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestMongoJudges judges the server-wide facts the embedded server
// cannot have wrong: a standalone server, a clock off, a short oplog
// window, a weak default write concern.
func TestMongoJudges(t *testing.T) {
	one := func(fs []Finding, check string, sev Severity) {
		t.Helper()
		require.Len(t, fs, 1)
		require.Equal(t, check, fs[0].Check)
		require.Equal(t, sev, fs[0].Severity, "%+v", fs[0])
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

	stamp := &Owner{ConsumerGroup: "a", Service: "a"}
	one(judgeInboxOwner("db", "inbox", "outbox_meta", stamp, "b", true), "mongo.inbox_owner", SeverityBreaks)
	require.Empty(t, judgeInboxOwner("db", "inbox", "outbox_meta", stamp, "a", true))
	one(judgeInboxOwner("db", "inbox", "outbox_meta", nil, "a", true), "mongo.inbox_owner", SeverityNote)
}

// TestDurationText pins the durations the findings print, as
// literal text: an expectation built with the same formatter would agree
// with any mistake it makes.
func TestDurationText(t *testing.T) {
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

// TestKafkaJudges covers the Kafka judgements that kfake's single
// broker cannot reach: replicated topics.
func TestKafkaJudges(t *testing.T) {
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
	require.Equal(t, SeverityBreaks, sev(judgePartitionCount("t", 3, 6, "outbox_meta")))
	require.Empty(t, judgePartitionCount("t", 6, 0, "outbox_meta"), "no count stored yet")
}

// TestJudgeMinISRAboveReplicas: min.insync.replicas above the replication
// factor refuses every acks=all write on Kafka before 3.7 and only asks
// every replica to be in sync on 3.7 and later (the broker uses
// min(min.insync.replicas, replicas)), which the brokers' Produce versions
// tell apart (v10 came with 3.7); the finding says what holds for the
// brokers read, and both when their versions are unknown.
func TestJudgeMinISRAboveReplicas(t *testing.T) {
	t.Parallel()
	require.Equal(t, minISRCapUnknown, minISRCapOf(nil))
	require.Equal(t, minISRCapped, minISRCapOf([]int16{10, 13}))
	require.Equal(t, minISRNotCapped, minISRCapOf([]int16{13, 9}))

	const read = "min.insync.replicas=4, replication factor 3, producer acks=all (the publisher's)"
	const fix = "set min.insync.replicas to at most 3 (replication factor - 1 is usual), or add replicas"
	require.Equal(t, []Finding{{Severity: SeverityRisk, Check: "kafka.min_insync_replicas", Subject: "t",
		Read:      read + ", brokers of Kafka 3.7 or later (Produce v10)",
		Problem:   "the brokers cap the minimum at the replica count (3): every replica must be in sync, so one broker down stops publishing to the topic until it is back (events wait in the outbox)",
		Guarantee: GuaranteePublishing, Fix: fix}}, judgeMinISR("t", "4", 3, minISRCapped))
	require.Equal(t, []Finding{{Severity: SeverityBreaks, Check: "kafka.min_insync_replicas", Subject: "t",
		Read:      read + ", a broker older than Kafka 3.7 (no Produce v10)",
		Problem:   "Kafka before 3.7 refuses every acks=all write (NOT_ENOUGH_REPLICAS): no event is ever published",
		Guarantee: GuaranteePublishing, Fix: fix}}, judgeMinISR("t", "4", 3, minISRNotCapped))
	require.Equal(t, []Finding{{Severity: SeverityBreaks, Check: "kafka.min_insync_replicas", Subject: "t",
		Read:      read + ", the brokers' versions unknown",
		Problem:   "Kafka before 3.7 refuses every acks=all write (NOT_ENOUGH_REPLICAS): no event is ever published; 3.7 and later cap the minimum at the replica count (3), so one broker down stops publishing",
		Guarantee: GuaranteePublishing, Fix: fix}}, judgeMinISR("t", "4", 3, minISRCapUnknown))
}

// TestJudgeGroupProtocol: GroupConsumer asked of brokers that do not all
// serve KIP-848 is a risk; otherwise a note names the protocol in use.
func TestJudgeGroupProtocol(t *testing.T) {
	t.Parallel()
	f := judgeGroupProtocol("consumer", true, []int32{1}, []int32{2}, 0)
	require.Len(t, f, 1)
	require.Equal(t, SeverityRisk, f[0].Severity)
	require.Contains(t, f[0].Read, "brokers [1] serve ConsumerGroupHeartbeat v1 (KIP-848), brokers [2] do not")
	f = judgeGroupProtocol("classic", false, []int32{1}, []int32{2}, 0)
	require.Equal(t, SeverityNote, f[0].Severity)
	require.Equal(t, "none: the groups run the classic protocol", f[0].Problem)
	f = judgeGroupProtocol("consumer", true, []int32{1, 2}, nil, 45*time.Second)
	require.Equal(t, SeverityNote, f[0].Severity)
	require.Contains(t, f[0].Read, "group.consumer.session.timeout.ms is 45s")
}

// TestJudgeIndexes judges hand-made index lists against a spec set: a
// missing TTL index, a conflicting one under the framework's name, and a
// foreign TTL index that would delete waiting documents.
func TestJudgeIndexes(t *testing.T) {
	t.Parallel()
	ttl := int32(60)
	field := func(ix bson.D, k string) (any, bool) {
		for _, e := range ix {
			if e.Key == k {
				return e.Value, true
			}
		}
		return nil, false
	}
	key := func(ix bson.D) string { v, _ := field(ix, "key"); s, _ := v.(string); return s }
	want := Indexes{
		Field: field,
		Specs: []IndexSpec{{Name: "x_ttl", Doc: bson.D{{Key: "key", Value: "at"}, {Key: "name", Value: "x_ttl"}}, TTL: &ttl,
			Matches: func(ix bson.D) bool { return key(ix) == "at" }}},
		Expiring: func(partial any) bool { return partial == "done" },
		Format:   func(ix bson.D) string { v, _ := field(ix, "name"); return v.(string) },
		TTL: func(ix bson.D) (int64, bool) {
			v, ok := field(ix, "expireAfterSeconds")
			n, _ := v.(int64)
			return n, ok
		},
	}
	fs := judgeIndexes("db.x", nil, want, true, "waiting documents", "done documents")
	require.Len(t, fs, 1)
	require.Equal(t, SeverityRisk, fs[0].Severity)
	require.Equal(t, "done documents never expire: the collection grows without bound", fs[0].Problem)

	fs = judgeIndexes("db.x", []bson.D{{{Key: "key", Value: "other"}, {Key: "name", Value: "x_ttl"}}}, want, true, "waiting documents", "done documents")
	require.Len(t, fs, 1)
	require.Equal(t, SeverityBreaks, fs[0].Severity)
	require.Contains(t, fs[0].Problem, "ErrIndexConflict")

	ok := bson.D{{Key: "key", Value: "at"}, {Key: "name", Value: "x_ttl"}, {Key: "expireAfterSeconds", Value: int64(60)}}
	require.Empty(t, judgeIndexes("db.x", []bson.D{ok}, want, true, "waiting documents", "done documents"))
	foreign := bson.D{{Key: "key", Value: "b"}, {Key: "name", Value: "expiration"}, {Key: "expireAfterSeconds", Value: int64(5)}}
	fs = judgeIndexes("db.x", []bson.D{ok, foreign}, want, true, "waiting documents", "done documents")
	require.Len(t, fs, 1)
	require.Equal(t, "it deletes waiting documents when they expire: they are lost", fs[0].Problem)
	restricted := append(bson.D{}, foreign...)
	restricted = append(restricted, bson.E{Key: "partialFilterExpression", Value: "done"})
	require.Empty(t, judgeIndexes("db.x", []bson.D{ok, restricted}, want, true, "waiting documents", "done documents"))
}

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

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
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
// internal/doctor (TestMongoJudges).
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
				dropIndex(c.outbox, store.IndexOutboxFailed)(t)
				createIndex(c.outbox, bson.D{{Key: "failed", Value: 1}}, options.Index().SetName(store.IndexOutboxFailed))(t)
			},
			func(t *testing.T) { dropIndex(c.outbox, store.IndexOutboxFailed)(t); ensure(t) }, "index outbox_failed is"},
		{"a missing TTL index", "mongo.indexes", SeverityRisk,
			dropIndex(c.outbox, store.IndexOutboxTTL), ensure, "index outbox_published_ttl"},
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

// The doctor checks the claim check's payload collection of a service that
// publishes with it: a missing TTL index (payloads never expire) is a
// risk, and a TTL other than the outbox retention plus the margin a note
// (payloads expire before the redelivery the margin covers, or later
// than configured); the service's own indexes satisfy it.
func TestDoctorClaimCheckIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000, Margin: time.Hour}))
	require.NoError(t, c.EnsureIndexes(ctx))
	payloads := b.db.Collection(store.PayloadsCollection)
	subject := "collection " + b.db.Name() + "." + store.PayloadsCollection
	payloadFindings := func() []Finding {
		r, err := c.Doctor(ctx)
		require.NoError(t, err)
		var out []Finding
		for _, f := range r.Findings {
			if f.Subject == subject {
				out = append(out, f)
			}
		}
		return out
	}
	require.Empty(t, payloadFindings(), "the service's own indexes")

	require.NoError(t, payloads.Indexes().DropOne(ctx, claimcheck.IndexTTL))
	fs := payloadFindings()
	require.Len(t, fs, 1, fs)
	require.Equal(t, SeverityRisk, fs[0].Severity)
	require.Contains(t, fs[0].Read, "index "+claimcheck.IndexTTL)
	require.Contains(t, fs[0].Problem, "payloads of published events never expire")

	// The TTL of the outbox alone: no margin for redelivery.
	_, err := payloads.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: store.PayloadPublishedAt, Value: 1}},
		Options: options.Index().SetName(claimcheck.IndexTTL).SetExpireAfterSeconds(int32(c.cfg.OutboxRetention.Seconds())).
			SetPartialFilterExpression(bson.D{{Key: store.PayloadPublished, Value: true}})})
	require.NoError(t, err)
	fs = payloadFindings()
	require.Len(t, fs, 1, fs)
	require.Equal(t, SeverityNote, fs[0].Severity)
	require.Contains(t, fs[0].Read, "the configured retention is")

	require.NoError(t, c.EnsureIndexes(ctx))
	require.Empty(t, payloadFindings(), "Run's collMod restores the TTL")

	// A service that only consumes does not own the collection: no check.
	cons := b.client(t, func() Config { cfg := consumerConfig(b, "cons"); cfg.ClaimCheck = &ClaimCheck{}; return cfg }())
	require.NoError(t, payloads.Indexes().DropOne(ctx, claimcheck.IndexTTL))
	r, err := cons.Doctor(ctx)
	require.NoError(t, err)
	for _, f := range r.Findings {
		require.NotEqual(t, subject, f.Subject, f.String())
	}
}

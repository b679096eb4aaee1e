package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/schedule"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// claimPub is a publisher config with the claim check on.
func claimPub(b *bundle, cc ClaimCheck) Config {
	cfg := pubConfig(b)
	cfg.ClaimCheck = &cc
	return cfg
}

// recordPad records one paddedOrder of key k, seq, padded with n bytes.
func recordPad(t *testing.T, b *bundle, c *Client, k string, seq, n int) error {
	t.Helper()
	e := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: k, Amount: 1, Seq: seq}}
	if n > 0 {
		e.Pad = pad(n)
	}
	return c.Transact(context.Background(), func(ctx context.Context) error { return Record(ctx, e) })
}

// padConsumer starts a consumer of the orders topic with cc (nil: no
// claim check) and returns the pad lengths its handler saw, by seq.
func padConsumer(t *testing.T, b *bundle, service string, cc *ClaimCheck) (*Client, func() map[int]int) {
	t.Helper()
	return padConsumerWith(t, b, service, cc, nil)
}

// padConsumerWith is padConsumer with its metrics in o (nil: none).
func padConsumerWith(t *testing.T, b *bundle, service string, cc *ClaimCheck, o **otelBundle) (*Client, func() map[int]int) {
	t.Helper()
	cfg := consumerConfig(b, service)
	cfg.ClaimCheck = cc
	cfg.MaxAttempts = 2
	if o != nil {
		*o = newOtel(t, &cfg)
	}
	c := b.client(t, cfg)
	var mu sync.Mutex
	seen := map[int]int{}
	MustHandle(c, func(_ context.Context, e paddedOrder, _ Metadata) error {
		mu.Lock()
		defer mu.Unlock()
		seen[e.Seq] = len(e.Pad)
		return nil
	})
	return c, func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[int]int{}
		for k, v := range seen {
			out[k] = v
		}
		return out
	}
}

// setupFastTTL is setup on an embedded server whose TTL monitor runs every
// 50 ms; it skips the test on a real MongoDB, whose monitor runs every
// 60 s.
func setupFastTTL(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, mongotest.ServerOptions(mongofake.TTLInterval(50*time.Millisecond)))
	if b.mongo.Real {
		t.Skip("the TTL monitor of a real MongoDB runs every 60 s; covered on the embedded server")
	}
	return b
}

func headerOf(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// An event whose record would not fit in its topic goes out of band: its
// payload in outbox_payloads, written in the transaction; Kafka carries an
// empty value and the reference; a consumer with the claim check hands
// the whole event to its handler.
func TestClaimCheckCarriesEventOverTopicLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := claimPub(b, ClaimCheck{})
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	require.NoError(t, c.EnsureIndexes(ctx))
	b.setMaxMessageBytes(t, 64<<10)
	require.NoError(t, recordPad(t, b, c, "big", 0, 0))
	require.NoError(t, recordPad(t, b, c, "big", 1, 300000))
	require.NoError(t, recordPad(t, b, c, "big", 2, 0))

	payloads := b.db.Collection(store.PayloadsCollection)
	var big outboxDoc
	require.NoError(t, c.outbox.FindOne(ctx, bson.D{{Key: store.OutboxPayloadRef, Value: bson.D{{Key: "$exists", Value: true}}}}).Decode(&big))
	require.Empty(t, big.Payload)
	require.Equal(t, big.ID, *big.PayloadRef)
	require.Greater(t, big.PayloadSize, int64(300000))
	require.EqualValues(t, 1, count(t, payloads, bson.D{{Key: store.PayloadRef, Value: big.ID}, {Key: store.PayloadPublished, Value: false}}))
	require.EqualValues(t, 2, count(t, c.outbox, bson.D{{Key: store.OutboxPayloadRef, Value: bson.D{{Key: "$exists", Value: false}}}}))
	require.EqualValues(t, 1, sumOf(o.collect(t)["outbox.claimcheck.stored"], itel.AttrTopic.String(ordersTopic)))
	require.EqualValues(t, 3, sumOf(o.collect(t)["outbox.events.recorded"], itel.AttrTopic.String(ordersTopic)))

	runPub(t, c, publisherOptions{})
	eventually(t, "three events published", func() bool { return b.published(t, Config{}) == 3 })
	eventually(t, "the payload marked published", func() bool {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: big.ID}, {Key: store.PayloadPublished, Value: true}}) == 1
	})

	recs := b.kafkaEvents(t, ordersTopic, 3)
	var refs int
	for _, r := range recs {
		ref, ok := headerOf(r, claimcheck.HeaderNative)
		if !ok {
			require.NotEmpty(t, r.Value)
			continue
		}
		refs++
		require.Equal(t, "outbox-payload:"+big.ID.Hex(), ref)
		require.Empty(t, r.Value, "a consumer that does not resolve sees the reference, not a cut payload")
		require.Less(t, len(r.Key)+len(r.Value), 1<<10)
		env, _, err := decodeRecord(r)
		require.NoError(t, err, "the envelope is readable without resolving")
		require.Equal(t, "OrderPlaced.v1", env.ContentSchema)
	}
	require.Equal(t, 1, refs)

	cons, seen := padConsumer(t, b, "cons", &ClaimCheck{Database: b.db})
	start(t, cons)
	eventually(t, "the three events handled whole", func() bool {
		s := seen()
		return len(s) == 3 && s[1] == 300000 && s[0] == 0 && s[2] == 0
	})
}

// Above Threshold a payload goes out of band even when it fits; on a
// CloudEvents topic the reference is the dataref extension attribute.
func TestClaimCheckThresholdCloudEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := claimPub(b, ClaimCheck{Threshold: 10000})
	cfg.WireFormats = map[string]Format{ordersTopic: FormatCloudEvents}
	c := b.client(t, cfg)
	require.NoError(t, c.EnsureIndexes(ctx))
	require.NoError(t, recordPad(t, b, c, "k", 0, 20000))
	require.NoError(t, recordPad(t, b, c, "k", 1, 100))
	require.EqualValues(t, 1, count(t, b.db.Collection(store.PayloadsCollection), bson.D{}))
	runPub(t, c, publisherOptions{})
	recs := b.kafkaEvents(t, ordersTopic, 2)
	var refs int
	for _, r := range recs {
		if _, ok := headerOf(r, claimcheck.HeaderCloudEvents); ok {
			refs++
			require.Empty(t, r.Value)
			_, native := headerOf(r, claimcheck.HeaderNative)
			require.False(t, native)
		}
	}
	require.Equal(t, 1, refs)
	cons, seen := padConsumer(t, b, "cons", &ClaimCheck{Database: b.db})
	start(t, cons)
	eventually(t, "both handled whole", func() bool {
		s := seen()
		return len(s) == 2 && s[0] == 20000 && s[1] == 100
	})
}

// publishOutOfBand publishes, with a publisher that runs until the test
// ends, one event of key "k", seq 0, padded with 5000 bytes, whose payload
// goes out of band.
func publishOutOfBand(t *testing.T, b *bundle) {
	t.Helper()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, c.EnsureIndexes(context.Background()))
	require.NoError(t, recordPad(t, b, c, "k", 0, 5000))
	runPub(t, c, publisherOptions{})
}

// A consumer without the claim check parks such a record, saying what to
// configure; configured, a re-drive resolves it.
func TestClaimCheckConsumerWithoutConfigParksThenRedrives(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	publishOutOfBand(t, b)

	var o *otelBundle
	cons, seen := padConsumerWith(t, b, "cons", nil, &o)
	stop := start(t, cons)
	var d inboxDoc
	eventually(t, "the event parked", func() bool {
		return cons.inbox.FindOne(ctx, bson.D{{Key: store.InboxParked, Value: true}}).Decode(&d) == nil
	})
	stop()
	require.Empty(t, seen())
	require.Contains(t, d.LastError, "Config.ClaimCheck")
	require.Contains(t, d.LastError, "outbox-payload:")
	require.True(t, strings.HasPrefix(d.PayloadRef, "outbox-payload:"))
	require.EqualValues(t, 1, d.Attempts, "parked at once, not retried")
	require.EqualValues(t, 1, sumOf(o.collect(t)["outbox.claimcheck.unresolved"], itel.AttrTopic.String(ordersTopic), itel.AttrReason.String("not_configured")))
	st, err := cons.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.ClaimCheck.Unresolved, "the parked event's payload is not resolved")

	fixed, seen2 := padConsumer(t, b, "cons", &ClaimCheck{Database: b.db})
	require.NoError(t, fixed.Redrive(ctx, d.ID))
	require.Equal(t, map[int]int{0: 5000}, seen2())
	require.EqualValues(t, 1, count(t, fixed.inbox, bson.D{{Key: store.InboxHandled, Value: true}}))
	st, err = cons.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.Zero(t, st.ClaimCheck.Unresolved)
}

// Status counts the payloads stored out of band that wait for their
// events' publication, their bytes and the oldest one's age, and names
// the claim-check database; a publication takes them out.
func TestStatusClaimCheckPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, c.EnsureIndexes(ctx))
	require.NoError(t, recordPad(t, b, c, "a", 0, 5000))
	require.NoError(t, recordPad(t, b, c, "b", 1, 7000))
	require.NoError(t, recordPad(t, b, c, "c", 2, 10), "in band")
	var sizes []int64
	cur, err := c.outbox.Find(ctx, bson.D{{Key: store.OutboxPayloadSize, Value: bson.D{{Key: "$exists", Value: true}}}})
	require.NoError(t, err)
	var docs []store.OutboxDoc
	require.NoError(t, cur.All(ctx, &docs))
	for _, d := range docs {
		sizes = append(sizes, d.PayloadSize)
	}
	require.Len(t, sizes, 2)

	st, err := c.Status(ctx)
	require.NoError(t, err)
	cc := st.Store.ClaimCheck
	require.Equal(t, b.db.Name(), cc.Database)
	require.EqualValues(t, 2, cc.Pending)
	require.EqualValues(t, 3, st.Store.Pending)
	require.Equal(t, sizes[0]+sizes[1], cc.PendingBytes)
	require.Positive(t, cc.OldestPendingAge)
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	var js struct {
		ClaimCheck map[string]any `json:"claim_check"`
	}
	require.NoError(t, json.Unmarshal(raw, &js))
	require.Equal(t, b.db.Name(), js.ClaimCheck["database"])
	require.EqualValues(t, 2, js.ClaimCheck["pending"])
	require.EqualValues(t, sizes[0]+sizes[1], js.ClaimCheck["pending_bytes"])

	runPub(t, c, publisherOptions{})
	eventually(t, "the events published", func() bool {
		st, err := c.Admin().StoreStatus(ctx)
		require.NoError(t, err)
		return st.Pending == 0
	})
	st2, err := c.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, ClaimCheckStatus{}, st2.ClaimCheck, "published: no payload waits, and Admin does not know the database")
}

// A consumer that cannot reach the claim-check database fails its
// attempts with a clear error, then parks the event as usual.
func TestClaimCheckUnreachableStoreFailsAttemptsThenParks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	publishOutOfBand(t, b)

	dead, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/?directConnection=true").
		SetServerSelectionTimeout(100 * time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = dead.Disconnect(context.Background()) })
	var o *otelBundle
	cons, seen := padConsumerWith(t, b, "cons", &ClaimCheck{Database: dead.Database("claims")}, &o)
	start(t, cons)
	var d inboxDoc
	eventually(t, "the event parked after its attempts", func() bool {
		return cons.inbox.FindOne(ctx, bson.D{{Key: store.InboxParked, Value: true}}).Decode(&d) == nil
	})
	require.Empty(t, seen())
	require.EqualValues(t, 2, d.Attempts)
	require.Contains(t, d.LastError, ErrPayloadUnavailable.Error())
	require.EqualValues(t, 2, sumOf(o.collect(t)["outbox.claimcheck.unresolved"], itel.AttrTopic.String(ordersTopic), itel.AttrReason.String("unavailable")))
}

// The event-outbox format has no place for a reference: an event over the
// limit is refused with the reason, and Threshold does not apply.
func TestClaimCheckEventOutboxFormatRefusesLargeEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := claimPub(b, ClaimCheck{Threshold: 1000})
	cfg.WireFormats = map[string]Format{ordersTopic: FormatEventOutbox}
	c := b.client(t, cfg)
	b.setMaxMessageBytes(t, 64<<10)
	err := recordPad(t, b, c, "7", 0, 200000)
	require.ErrorIs(t, err, ErrEventTooLarge)
	require.Contains(t, err.Error(), "event-outbox format")
	require.NoError(t, recordPad(t, b, c, "7", 0, 5000), "under the limit it goes inline")
	require.Zero(t, count(t, b.db.Collection(store.PayloadsCollection), bson.D{}))
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{}))
}

// The largest payload is claimcheck.MaxPayload: one above it is refused
// at Record, nothing is written; the largest itself round-trips.
func TestClaimCheckLargestPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1}))
	require.NoError(t, c.EnsureIndexes(ctx))
	overhead := len(`{"run":"` + b.run + `","order_id":"k","amount":1,"seq":0,"pad":""}`)
	err := recordPad(t, b, c, "k", 0, claimcheck.MaxPayload-overhead+2)
	require.ErrorIs(t, err, ErrEventTooLarge)
	require.Contains(t, err.Error(), "largest")
	require.Zero(t, count(t, c.outbox, bson.D{}))
	if testing.Short() {
		t.Skip("the 64 MiB round trip is long")
	}
	require.NoError(t, recordPad(t, b, c, "k", 0, claimcheck.MaxPayload-overhead))
	var d outboxDoc
	require.NoError(t, c.outbox.FindOne(ctx, bson.D{}).Decode(&d))
	require.EqualValues(t, claimcheck.MaxPayload, d.PayloadSize)
	got, err := c.claims.Resolve(ctx, claimcheck.Ref(d.ID))
	require.NoError(t, err)
	require.Len(t, got, claimcheck.MaxPayload)
	require.EqualValues(t, claimcheck.MaxPayload/claimcheck.ChunkSize, count(t, c.claims.Coll, bson.D{}))
}

// Payloads expire OutboxRetention plus Margin after their publication,
// after the outbox documents that refer to them, and unpublished ones
// never.
func TestClaimCheckPayloadOutlivesOutboxByMargin(t *testing.T) {
	t.Parallel()
	b := setupFastTTL(t)
	ctx := context.Background()
	cfg := claimPub(b, ClaimCheck{Threshold: 1000, Margin: 2 * time.Second})
	cfg.OutboxRetention = time.Second
	c := b.client(t, cfg)
	require.NoError(t, c.EnsureIndexes(ctx))
	require.EqualValues(t, 3, indexSpecs(t, c.claims.Coll)[claimcheck.IndexTTL]["expireAfterSeconds"])

	// An unpublished payload: recorded, never published (its document is
	// not one the publisher would see: it is inserted by hand).
	pending := bson.NewObjectID()
	require.NoError(t, c.claims.Insert(ctx, claimcheck.Chunks(pending, []byte(`{"pad":"x"}`))))

	require.NoError(t, recordPad(t, b, c, "k", 0, 5000))
	stop := runPub(t, c, publisherOptions{})
	eventually(t, "published", func() bool { return b.published(t, Config{}) == 1 })
	stop()
	var ch claimcheck.Chunk
	require.NoError(t, c.claims.Coll.FindOne(ctx, bson.D{{Key: store.PayloadPublished, Value: true}}).Decode(&ch))
	require.NotNil(t, ch.PublishedAt)
	eventually(t, "the outbox document expired", func() bool { return count(t, c.outbox, bson.D{}) == 0 })
	require.EqualValues(t, 1, count(t, c.claims.Coll, bson.D{{Key: store.PayloadRef, Value: ch.Ref}}),
		"the payload outlives its outbox document")
	eventually(t, "the payload expired", func() bool {
		return count(t, c.claims.Coll, bson.D{{Key: store.PayloadRef, Value: ch.Ref}}) == 0
	})
	require.GreaterOrEqual(t, time.Since(*ch.PublishedAt), 3*time.Second, "not before retention plus margin")
	require.EqualValues(t, 1, count(t, c.claims.Coll, bson.D{{Key: store.PayloadRef, Value: pending}}), "unpublished never expires")
}

// crashClient connects a client to b's embedded server that dies at the
// at-th of its commands named cmd (after running it with afterRun), and
// records the collection each of its inserts and updates names.
func crashClient(t *testing.T, b *bundle, app, cmd string, at int, afterRun bool) (*mongo.Client, *mongofake.Crashed, func() []string) {
	t.Helper()
	cr, err := b.mongo.Server.Crash(mongofake.Crash{AppName: app, Commands: []string{cmd}, At: at, AfterRun: afterRun})
	require.NoError(t, err)
	var mu sync.Mutex
	var colls []string
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == cmd {
			mu.Lock()
			defer mu.Unlock()
			v, _ := e.Command.Lookup(cmd).StringValueOK()
			colls = append(colls, v)
		}
	}}
	mc, err := mongo.Connect(options.Client().ApplyURI(b.mongo.URI).SetAppName(app).SetMonitor(mon).SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	return mc, cr, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), colls...)
	}
}

// Every write of Record with an out-of-band payload is crashed: the chunk
// insert, the outbox insert, the commit (before it runs, and after with
// its reply lost). The payload and its outbox document commit together or
// not at all, and a fresh process records again.
func TestClaimCheckCrashEveryRecordWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("crash points need the embedded server")
	}
	points := []struct {
		cmd      string
		at       int
		afterRun bool
		coll     string // the collection the crashed command names
		commits  bool
	}{
		{"insert", 1, false, store.PayloadsCollection, false},
		{"insert", 2, false, "outbox", false},
		{"commitTransaction", 1, false, "", false},
		{"commitTransaction", 1, true, "", true},
	}
	for i, p := range points {
		db := b.mongo.Client.Database(b.db.Name() + "-" + itoa(i))
		t.Cleanup(func() { _ = db.Drop(context.Background()) })
		app := b.run + "-rec-" + itoa(i)
		mc, cr, colls := crashClient(t, b, app, p.cmd, p.at, p.afterRun)
		cfg := claimPub(b, ClaimCheck{Threshold: 1000})
		cfg.Mongo, cfg.Database = mc, db.Name()
		c := b.client(t, cfg)
		c.topics.Set(ordersTopic, 3)
		err := recordPad(t, b, c, "k", 0, 5000)
		require.Error(t, err, "point %d", i)
		<-cr.Fired()
		if p.coll != "" {
			got := colls()
			require.Equal(t, p.coll, got[len(got)-1], "point %d crashed the write it names", i)
		}
		want := int64(0)
		if p.commits {
			want = 1
		}
		require.Equal(t, want, count(t, db.Collection("outbox"), bson.D{}), "point %d", i)
		require.Equal(t, want, count(t, db.Collection(store.PayloadsCollection), bson.D{}), "point %d", i)

		// A fresh process (the dead one's transaction still open) records.
		fcfg := claimPub(b, ClaimCheck{Threshold: 1000})
		fcfg.Database = db.Name()
		fresh := b.client(t, fcfg)
		fresh.topics.Set(ordersTopic, 3)
		require.NoError(t, recordPad(t, b, fresh, "k", 1, 5000), "point %d", i)
		require.Equal(t, want+1, count(t, db.Collection("outbox"), bson.D{}), "point %d", i)
		require.Equal(t, want+1, count(t, db.Collection(store.PayloadsCollection), bson.D{}), "point %d", i)
	}
}

// The publisher's mark of published events writes the payloads' mark,
// then the outbox's; each is crashed. A payload is never left unmarked
// under a published event (it would never expire) nor marked before an
// earlier publication than its event's latest (it would expire early): the
// event stays unpublished, is published again, and its payload is marked
// again with the later time. Every point runs for an immediate event and
// for a promoted scheduled one, whose chunks' ref is not its _id.
func TestClaimCheckCrashEveryMarkWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("crash points need the embedded server")
	}
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, c.EnsureIndexes(ctx))
	for i, p := range []struct {
		at       int
		afterRun bool
		coll     string
		promoted bool
	}{
		{1, false, store.PayloadsCollection, false}, {1, true, store.PayloadsCollection, false}, {2, false, "outbox", false}, {2, true, "outbox", false},
		{1, false, store.PayloadsCollection, true}, {1, true, store.PayloadsCollection, true}, {2, false, "outbox", true}, {2, true, "outbox", true},
	} {
		if p.promoted {
			e := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: "k" + itoa(i), Amount: 1}, Pad: pad(5000)}
			require.NoError(t, c.Transact(ctx, func(ctx context.Context) error { return Record(ctx, e, WithDelay(time.Hour)) }))
			var s store.ScheduledDoc
			require.NoError(t, c.scheduled.FindOne(ctx, bson.D{{Key: store.ScheduledPromoted, Value: false}}).Decode(&s))
			st := schedule.Mongo{Client: b.mongo.Client, Scheduled: c.scheduled, Outbox: c.outbox}
			n, err := st.Promote(ctx, schedule.TopicPartition{Topic: s.Topic, Partition: s.Partition}, time.Now().Add(2*time.Hour), 10)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		} else {
			require.NoError(t, recordPad(t, b, c, "k"+itoa(i), 0, 5000))
		}
		var d outboxDoc
		require.NoError(t, c.outbox.FindOne(ctx, bson.D{{Key: store.OutboxPublished, Value: false}}).Decode(&d))
		ref := *d.PayloadRef
		require.Equal(t, p.promoted, ref != d.ID, "point %d", i)
		mc, cr, colls := crashClient(t, b, b.run+"-mark-"+itoa(i), "update", p.at, p.afterRun)
		db := mc.Database(b.db.Name())
		dying := outboxStore{coll: db.Collection("outbox"), claims: &claimcheck.Store{Coll: db.Collection(store.PayloadsCollection)}}
		first := time.Now().UTC().Truncate(time.Millisecond)
		require.Error(t, dying.MarkPublished(ctx, []any{outboxItem(&d, "").ID}, first))
		<-cr.Fired()
		got := colls()
		require.Equal(t, p.coll, got[len(got)-1], "point %d", i)

		published := count(t, c.outbox, bson.D{{Key: store.OutboxID, Value: d.ID}, {Key: store.OutboxPublished, Value: true}})
		chunksMarked := count(t, c.claims.Coll, bson.D{{Key: store.PayloadRef, Value: ref}, {Key: store.PayloadPublished, Value: true}})
		if published == 1 {
			require.EqualValues(t, 1, chunksMarked, "point %d: a published event's payload is marked", i)
			continue
		}
		// Not marked: the publisher publishes it again and marks it later.
		again := first.Add(time.Minute)
		require.NoError(t, outboxStore{coll: c.outbox, claims: c.claims}.MarkPublished(ctx, []any{outboxItem(&d, "").ID}, again))
		var ch claimcheck.Chunk
		require.NoError(t, c.claims.Coll.FindOne(ctx, bson.D{{Key: store.PayloadRef, Value: ref}}).Decode(&ch))
		require.True(t, ch.Published)
		require.True(t, ch.PublishedAt.Equal(again), "point %d: the payload's clock starts at the latest publication", i)
	}
}

// A scheduled event's payload goes out of band as an immediate one's: its
// chunks are inserted in the scheduling transaction, keyed by its
// payload_ref, and never expire while it waits (here longer than the
// payloads' whole retention); its promotion gives its outbox document a
// new _id and keeps payload_ref, so it is published at its due time with
// the reference to its chunks, the consumer's handler sees the whole
// payload, and the publisher marks the chunks to expire. A cancelled one's
// chunks are marked by the cancelling transaction and expire; one
// scheduled and cancelled in one transaction leaves none.
func TestClaimCheckScheduledLargeEvent(t *testing.T) {
	t.Parallel()
	b := setupFastTTL(t)
	ctx := context.Background()
	cfg := claimPub(b, ClaimCheck{Threshold: 1000, Margin: time.Second})
	cfg.OutboxRetention = time.Second // chunks expire 2 s after their mark
	c := b.client(t, cfg)
	require.NoError(t, c.EnsureIndexes(ctx))
	payloads := b.db.Collection(store.PayloadsCollection)
	large := func(seq int) paddedOrder {
		return paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: "s", Amount: 1, Seq: seq}, Pad: pad(5000)}
	}
	due := time.Now().Add(4 * time.Second)
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		if err := Record(ctx, large(1), WithIdempotencyKey("kept"), WithPublishAt(due)); err != nil {
			return err
		}
		if err := Record(ctx, large(2), WithIdempotencyKey("cancelled"), WithDelay(time.Hour)); err != nil {
			return err
		}
		if err := Record(ctx, large(3), WithIdempotencyKey("same-txn"), WithDelay(time.Hour)); err != nil {
			return err
		}
		return CancelScheduled(ctx, ordersTopic, "same-txn")
	}))
	scheduled := map[string]store.ScheduledDoc{}
	for _, key := range []string{"kept", "cancelled"} {
		var d store.ScheduledDoc
		require.NoError(t, c.scheduled.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: key}}).Decode(&d))
		require.NotNil(t, d.PayloadRef, key)
		require.Equal(t, d.ID, *d.PayloadRef, key)
		require.Empty(t, d.Payload, key)
		require.EqualValues(t, 1, count(t, payloads, bson.D{{Key: store.PayloadRef, Value: d.ID}, {Key: store.PayloadPublished, Value: false}}), key)
		scheduled[key] = d
	}
	require.EqualValues(t, 2, count(t, payloads, bson.D{}), "the event cancelled in its own transaction left no chunks")
	require.Zero(t, count(t, c.outbox, bson.D{}))

	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error { return CancelScheduled(ctx, ordersTopic, "cancelled") }))
	cancelled := scheduled["cancelled"].ID
	require.EqualValues(t, 1, count(t, payloads, bson.D{{Key: store.PayloadRef, Value: cancelled}, {Key: store.PayloadPublished, Value: true}}),
		"the cancelling transaction marked the chunks")
	eventually(t, "the cancelled event's chunks expired", func() bool {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: cancelled}}) == 0
	})

	// The kept event has waited longer than the chunks' retention (2 s):
	// its chunks are there, unmarked.
	kept := scheduled["kept"].ID
	require.EqualValues(t, 1, count(t, payloads, bson.D{{Key: store.PayloadRef, Value: kept}, {Key: store.PayloadPublished, Value: false}}))

	cons, seen := padConsumer(t, b, "cons", &ClaimCheck{Database: b.db})
	start(t, cons)
	runPub(t, c, publisherOptions{})
	eventually(t, "the scheduled event handled whole", func() bool { return seen()[1] == 5000 })
	require.NotContains(t, seen(), 2)
	require.NotContains(t, seen(), 3)

	var promoted outboxDoc
	require.NoError(t, c.outbox.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: "kept"}}).Decode(&promoted))
	require.NotEqual(t, kept, promoted.ID, "the promotion gave the outbox document a new _id")
	require.Equal(t, kept, *promoted.PayloadRef, "and kept the ref of the chunks")
	recs := b.kafkaEvents(t, ordersTopic, 1)
	ref, ok := headerOf(recs[0], claimcheck.HeaderNative)
	require.True(t, ok)
	require.Equal(t, claimcheck.Ref(kept), ref)
	eventually(t, "the published event's chunks marked", func() bool {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: kept}, {Key: store.PayloadPublished, Value: true}}) == 1
	})
	var ch claimcheck.Chunk
	require.NoError(t, payloads.FindOne(ctx, bson.D{{Key: store.PayloadRef, Value: kept}}).Decode(&ch))
	require.False(t, ch.PublishedAt.Before(due.Truncate(time.Millisecond)), "published at %v, before its due time %v", ch.PublishedAt, due)
	eventually(t, "the published event's chunks expired", func() bool {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: kept}}) == 0
	})
}

// Discarding a failed event (Admin.DiscardFailed) marks its payload's
// chunks in the same transaction, so that they expire as a published
// event's would; a discarded event without a payload out of band, and the
// failed events left, keep theirs as they were, until a retry publishes
// them.
func TestClaimCheckDiscardFailedExpiresPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, c.EnsureIndexes(ctx))
	payloads := b.db.Collection(store.PayloadsCollection)
	for i, n := range []int{5000, 5000, 0} {
		require.NoError(t, recordPad(t, b, c, "k"+itoa(i), i, n))
	}
	cur, err := c.outbox.Find(ctx, bson.D{})
	require.NoError(t, err)
	var all []outboxDoc
	require.NoError(t, cur.All(ctx, &all))
	require.Len(t, all, 3)
	var keep outboxDoc // a failed event with its payload out of band, not discarded
	var discard []string
	for _, d := range all {
		require.NoError(t, store.Outbox{Coll: c.outbox}.MarkFailed(ctx, d.ID, "refused", time.Now(), true))
		if d.PayloadRef != nil && keep.PayloadRef == nil {
			keep = d
			continue
		}
		discard = append(discard, d.ID.Hex())
	}
	require.NotNil(t, keep.PayloadRef)
	before := time.Now().Add(-time.Millisecond)
	n, err := c.Admin().DiscardFailed(ctx, FailedFilter{}, discard, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.EqualValues(t, 1, count(t, c.outbox, bson.D{}))
	for _, d := range all {
		if d.PayloadRef == nil {
			continue
		}
		var ch claimcheck.Chunk
		require.NoError(t, payloads.FindOne(ctx, bson.D{{Key: store.PayloadRef, Value: *d.PayloadRef}}).Decode(&ch))
		if d.ID == keep.ID {
			require.False(t, ch.Published, "a failed event kept keeps its payload unmarked")
			continue
		}
		require.True(t, ch.Published, "a discarded event's payload is marked to expire")
		require.True(t, ch.PublishedAt.After(before))
	}

	// Retried (Admin.RetryFailed), the kept one is published and its
	// payload marked then: retry rewrites the document, not the payload.
	n, err = c.Admin().RetryFailed(ctx, FailedFilter{}, nil, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	runPub(t, c, publisherOptions{})
	eventually(t, "the retried event's payload marked", func() bool {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: *keep.PayloadRef}, {Key: store.PayloadPublished, Value: true}}) == 1
	})
}

// A consumer whose claim-check database is reached through a mongo.Client
// of its own (the producer's deployment) releases a held out-of-band
// event: the payload is read outside the inbox transaction, whose session
// belongs to the consumer's client and which another client refuses.
func TestClaimCheckHeldEventReleasedWithAnotherClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pub := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, pub.EnsureIndexes(ctx))
	require.NoError(t, recordPad(t, b, pub, "k", 0, 10))   // inline; its handler parks it
	require.NoError(t, recordPad(t, b, pub, "k", 1, 5000)) // out of band; held behind it
	runPub(t, pub, publisherOptions{})

	other, err := mongo.Connect(options.Client().ApplyURI(b.mongo.URI).SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Disconnect(context.Background()) })
	cfg := consumerConfig(b, "cons")
	cfg.PoisonPolicy = HoldKey
	cfg.ClaimCheck = &ClaimCheck{Database: other.Database(b.db.Name())}
	cons := b.client(t, cfg)
	var mu sync.Mutex
	seen := map[int]int{}
	MustHandle(cons, func(_ context.Context, e paddedOrder, _ Metadata) error {
		if e.Seq == 0 {
			return Park(errors.New("poison"))
		}
		mu.Lock()
		defer mu.Unlock()
		seen[e.Seq] = len(e.Pad)
		return nil
	})
	start(t, cons)
	var head inboxDoc
	eventually(t, "seq 0 parked and seq 1 held behind it", func() bool {
		return cons.inbox.FindOne(ctx, bson.D{{Key: store.InboxParked, Value: true}, {Key: store.InboxHeldBy, Value: bson.D{{Key: "$exists", Value: false}}}}).Decode(&head) == nil &&
			count(t, cons.inbox, bson.D{{Key: store.InboxHeldBy, Value: head.ID}}) == 1
	})
	var held inboxDoc
	require.NoError(t, cons.inbox.FindOne(ctx, bson.D{{Key: store.InboxHeldBy, Value: head.ID}}).Decode(&held))
	require.Empty(t, held.Payload, "held unresolved: the release reads the payload")
	require.NotEmpty(t, held.PayloadRef)
	_, err = cons.Admin().PurgeParked(ctx, ParkedFilter{IDs: []InboxID{head.ID}}, false)
	require.NoError(t, err)
	eventually(t, "the held event released and handled whole", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[1] == 5000
	})
}

// The operator's cancellation (Admin.CancelScheduled, the console's)
// marks a cancelled event's out-of-band payload to expire in the
// transaction that deletes the event, as a service's CancelScheduled does;
// a dry run marks nothing, and the events not cancelled keep their
// chunks unmarked.
func TestClaimCheckAdminCancelScheduledMarksPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, docs, marked := scheduledOutOfBand(t, "cancelled", "kept")
	cancelled, kept := *docs["cancelled"].PayloadRef, *docs["kept"].PayloadRef

	n, err := c.Admin().CancelScheduled(ctx, ordersTopic, "cancelled", true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, marked(cancelled), "a dry run marks nothing")

	n, err = c.Admin().CancelScheduled(ctx, ordersTopic, "cancelled", false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, marked(cancelled), "the cancellation marked the cancelled event's chunks")
	require.Zero(t, marked(kept), "and no other event's")
	require.Zero(t, count(t, c.scheduled, bson.D{{Key: store.OutboxIdempotencyKey, Value: "cancelled"}}))

	_, err = c.Admin().CancelScheduled(ctx, ordersTopic, "cancelled", false)
	require.ErrorIs(t, err, ErrNotScheduled)
}

// The operator lists and discards the scheduled events whose promotion was
// refused (FailedFilter.Scheduled): the discard deletes the scheduled
// document and marks its out-of-band payload to expire in the same
// transaction; retrying them is refused, and other events are untouched.
func TestClaimCheckDiscardFailedScheduledMarksPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, docs, marked := scheduledOutOfBand(t, "refused", "kept")
	refused, kept := docs["refused"], docs["kept"]
	// As a promotion refused for a duplicate idempotency key marks it.
	_, err := c.scheduled.UpdateOne(ctx, bson.D{{Key: store.OutboxID, Value: refused.ID}},
		store.MarkFailedUpdate("promotion refused: duplicate", time.Now(), true))
	require.NoError(t, err)
	a := c.Admin()
	sched := FailedFilter{Scheduled: true}

	evs, err := a.FailedEvents(ctx, sched)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, refused.ID.Hex(), evs[0].ID)
	require.Equal(t, int(refused.PayloadSize), evs[0].PayloadSize)
	require.Contains(t, evs[0].Error, "promotion refused")
	evs, err = a.FailedEvents(ctx, FailedFilter{})
	require.NoError(t, err)
	require.Empty(t, evs, "not an outbox failed event")

	_, err = a.RetryFailed(ctx, sched, nil, false)
	require.ErrorContains(t, err, "cannot be retried")
	n, err := a.DiscardFailed(ctx, sched, nil, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, marked(*refused.PayloadRef), "a dry run marks nothing")

	n, err = a.DiscardFailed(ctx, sched, []string{refused.ID.Hex()}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Positive(t, marked(*refused.PayloadRef), "the discard marked the refused event's chunks")
	require.Zero(t, marked(*kept.PayloadRef), "and no other event's")
	require.Zero(t, count(t, c.scheduled, bson.D{{Key: store.OutboxID, Value: refused.ID}}))
	require.EqualValues(t, 1, count(t, c.scheduled, bson.D{{Key: store.OutboxID, Value: kept.ID}}))
}

// scheduledOutOfBand starts a producer whose payloads above 1000 bytes go
// out of band, records an event scheduled an hour ahead for each of keys,
// and returns the client, their scheduled documents by key, and a count of
// the published-marked chunks of a ref.
func scheduledOutOfBand(t *testing.T, keys ...string) (*Client, map[string]store.ScheduledDoc, func(bson.ObjectID) int64) {
	t.Helper()
	b := setup(t)
	ctx := context.Background()
	c := b.client(t, claimPub(b, ClaimCheck{Threshold: 1000}))
	require.NoError(t, c.EnsureIndexes(ctx))
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		for i, key := range keys {
			o := paddedOrder{orderPlaced: orderPlaced{Run: b.run, OrderID: key, Amount: 1, Seq: i}, Pad: pad(5000)}
			if err := Record(ctx, o, WithIdempotencyKey(key), WithDelay(time.Hour)); err != nil {
				return err
			}
		}
		return nil
	}))
	docs := map[string]store.ScheduledDoc{}
	for _, key := range keys {
		var d store.ScheduledDoc
		require.NoError(t, c.scheduled.FindOne(ctx, bson.D{{Key: store.OutboxIdempotencyKey, Value: key}}).Decode(&d))
		require.NotNil(t, d.PayloadRef, key)
		docs[key] = d
	}
	payloads := b.db.Collection(store.PayloadsCollection)
	marked := func(ref bson.ObjectID) int64 {
		return count(t, payloads, bson.D{{Key: store.PayloadRef, Value: ref}, {Key: store.PayloadPublished, Value: true}})
	}
	return c, docs, marked
}

package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// schedule records an order of key id due at due, in a transaction of the
// (not running) service: it waits in the scheduled events' collection.
func (b *bundle) schedule(t *testing.T, id string, due time.Time) {
	t.Helper()
	require.NoError(t, b.client.Transact(context.Background(), func(ctx context.Context) error {
		return outbox.Record(ctx, orderPlaced{OrderID: id, Amount: 1}, outbox.WithIdempotencyKey(id), outbox.WithPublishAt(due))
	}))
}

// scheduledColl is the service's collection of scheduled events.
func (b *bundle) scheduledColl() string { return "outbox" + store.ScheduledSuffix }

// The scheduled page lists the events waiting for their due time, by
// topic, partition and due time, a page at a time, filtered by topic and
// partition; promoted events are not listed.
func TestScheduledPageListsWaitingEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	base := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	for i := range 7 {
		b.schedule(t, fmt.Sprintf("s-%d", i), base.Add(time.Duration(7-i)*time.Minute))
	}
	coll := b.db.Collection(b.scheduledColl())
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "idempotency_key", Value: "s-6"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "promoted", Value: true}, {Key: "promoted_at", Value: time.Now()}}}})
	require.NoError(t, err)

	code, body := get(t, jarClient(t), b.url("scheduled"))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "6", stats(body)["matching"])
	require.NotContains(t, body, `data-key="s-6"`, "promoted: not waiting")
	require.NotContains(t, body, `data-cancel=`, "read-only: no Cancel button")

	// Pages of 2 in the index's order: topic, partition, due time.
	s := b.console.services[0]
	var all []scheduledDoc
	for page := 0; ; page++ {
		docs, n, err := listScheduled(ctx, s, scheduledQuery{Topic: ordersTopic, Partition: -1, Page: page}, 2)
		require.NoError(t, err)
		require.EqualValues(t, 6, n)
		if len(docs) == 0 {
			break
		}
		all = append(all, docs...)
	}
	require.Len(t, all, 6)
	for i := 1; i < len(all); i++ {
		a, z := all[i-1], all[i]
		require.True(t, a.Partition < z.Partition || (a.Partition == z.Partition && !z.DueAt.Before(a.DueAt)), "index order at %d", i)
	}
	p := all[0].Partition
	var inP int64
	for _, d := range all {
		if d.Partition == p {
			inP++
		}
		require.NotEmpty(t, d.Key)
		require.Equal(t, "OrderPlaced.v1", d.Schema)
	}
	code, body = get(t, jarClient(t), b.url(fmt.Sprintf("scheduled?topic=%s&partition=%d", ordersTopic, p)))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, fmt.Sprint(inP), stats(body)["matching"])
	require.Contains(t, body, all[0].DueAt.UTC().Format("2006-01-02 15:04:05Z"), "the first event's due time shown")
	require.Contains(t, body, `data-key="`+all[0].IdempotencyKey+`"`)

	code, body = get(t, jarClient(t), b.url("scheduled?topic=nope"))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "0", stats(body)["matching"])
	for _, bad := range []string{"scheduled?partition=1", "scheduled?topic=orders&partition=-1", "scheduled?page=x"} {
		code, _ = get(t, jarClient(t), b.url(bad))
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
}

// The overview shows per topic the scheduled events and the next due
// time, and the claim check's figures.
func TestOverviewShowsScheduledAndClaimCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	b.schedule(t, "s-1", due.Add(time.Minute))
	b.schedule(t, "s-2", due)
	oob := outboxDocOf("big", time.Now().Add(-time.Minute), false, false)
	oob = append(oob, bson.E{Key: "payload_ref", Value: oob[0].Value}, bson.E{Key: "payload_size", Value: int64(123456)})
	insert(t, b.outbox(), oob)
	unresolved := parkDoc("k-unresolved", "o-9", time.Now(), nil)
	for i := range unresolved {
		if unresolved[i].Key == "payload" {
			unresolved[i].Value = ""
		}
	}
	insert(t, b.inbox(), append(unresolved, bson.E{Key: "payload_ref", Value: "outbox-payload:0123456789abcdef01234567"}))

	code, body := get(t, jarClient(t), b.url(""))
	require.Equal(t, http.StatusOK, code, body)
	st := stats(body)
	svc := b.cfg.Service
	require.Equal(t, "2", st[svc+"/scheduled"])
	require.Equal(t, due.Format("2006-01-02 15:04:05Z"), st[svc+"/nextdue"])
	require.Equal(t, "2", st[svc+"/"+ordersTopic+"/scheduled"])
	require.Equal(t, due.Format("2006-01-02 15:04:05Z"), st[svc+"/"+ordersTopic+"/nextdue"])
	require.Equal(t, "1", st[svc+"/claimpending"])
	require.Equal(t, "123456", st[svc+"/claimbytes"])
	require.Equal(t, "1", st[svc+"/claimunresolved"])
	admin, err := b.client.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, admin.Scheduled)
}

// Cancelling a scheduled event goes through outbox.Admin.CancelScheduled:
// a confirmation with the count, then the deletion; an event already
// moved into the outbox is "too late" (409) and one not scheduled 404,
// never a silent success.
func TestCancelScheduledAction(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	b.schedule(t, "s-1", due)
	b.schedule(t, "s-2", due)
	coll := b.db.Collection(b.scheduledColl())
	cl := jarClient(t)

	// Without an operator: refused.
	form := url.Values{"topic": {ordersTopic}, "idempotency_key": {"s-1"}}
	code, body := get(t, cl, b.url("scheduled"))
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "data-cancel=", "not signed in: no Cancel button")
	_, login := get(t, cl, b.url("login"))
	form.Set("csrf", csrfOf(t, login))
	code, _ = post(t, cl, b.url("cancel"), form, map[string]string{"Origin": b.srv.URL})
	require.Equal(t, http.StatusUnauthorized, code)

	token := b.signIn(t, cl)
	hdr := map[string]string{"Origin": b.srv.URL}
	_, body = get(t, cl, b.url("scheduled"))
	require.Contains(t, body, `data-cancel="s-1"`)
	form.Set("csrf", token)
	code, body = post(t, cl, b.url("cancel"), form, hdr)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "1", stats(body)["count"])
	require.Contains(t, body, `name="idempotency_key" value="s-1"`)
	require.Equal(t, int64(2), count(t, coll, bson.D{}), "the first POST changes nothing")

	form.Set("confirm", "yes")
	code, body = post(t, cl, b.url("cancel"), form, hdr)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "1", stats(body)["done"])
	require.Equal(t, int64(0), count(t, coll, bson.D{{Key: "idempotency_key", Value: "s-1"}}))
	require.Equal(t, int64(1), count(t, coll, bson.D{{Key: "idempotency_key", Value: "s-2"}}))

	code, body = post(t, cl, b.url("cancel"), form, hdr)
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "no scheduled event")

	// Moved into the outbox (as the promoter leaves it): too late, for
	// the count and the cancellation alike, and nothing changes.
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "idempotency_key", Value: "s-2"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "promoted", Value: true}, {Key: "promoted_at", Value: time.Now()}}}})
	require.NoError(t, err)
	for _, confirm := range []string{"", "yes"} {
		f := url.Values{"csrf": {token}, "topic": {ordersTopic}, "idempotency_key": {"s-2"}, "confirm": {confirm}}
		code, body = post(t, cl, b.url("cancel"), f, hdr)
		require.Equal(t, http.StatusConflict, code, body)
		require.Contains(t, body, "too late")
	}
	require.Equal(t, int64(1), count(t, coll, bson.D{{Key: "idempotency_key", Value: "s-2"}}))

	code, _ = post(t, cl, b.url("cancel"), url.Values{"csrf": {token}, "topic": {ordersTopic}}, hdr)
	require.Equal(t, http.StatusBadRequest, code)
}

// An event whose payload is out of band says so on its page, with the
// reference and the sizes: the event's and the stored chunks'.
func TestEventPagesShowPayloadOutOfBand(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(cfg *outbox.Config) { cfg.ClaimCheck = &outbox.ClaimCheck{Threshold: 100} })
	ctx := context.Background()
	big := strings.Repeat("x", 500)
	require.NoError(t, b.client.Transact(ctx, func(ctx context.Context) error {
		return outbox.Record(ctx, orderPlaced{OrderID: big, Amount: 1}, outbox.WithIdempotencyKey("big"))
	}))
	var d struct {
		ID   bson.ObjectID `bson:"_id"`
		Size int64         `bson:"payload_size"`
	}
	require.NoError(t, b.outbox().FindOne(ctx, bson.D{{Key: "idempotency_key", Value: "big"}}).Decode(&d))
	require.Positive(t, d.Size)
	ref := "outbox-payload:" + d.ID.Hex()

	code, body := get(t, jarClient(t), b.url("outbox-event?id="+d.ID.Hex()))
	require.Equal(t, http.StatusOK, code, body)
	st := stats(body)
	require.Equal(t, ref, st["ref"])
	require.Equal(t, fmt.Sprintf("%d bytes", d.Size), st["oobsize"])
	require.Contains(t, st["oobstored"], fmt.Sprintf("%d bytes in 1 chunk(s) in %s.outbox_payloads, not published yet", d.Size, b.db.Name()))

	// In the inbox: parked without its payload (not resolved), then
	// resolved.
	doc := parkDoc("k-oob", "o-1", time.Now(), nil)
	for i := range doc {
		if doc[i].Key == "payload" {
			doc[i].Value = ""
		}
	}
	insert(t, b.inbox(), append(doc, bson.E{Key: "payload_ref", Value: ref}))
	id := outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-oob"}
	code, body = get(t, jarClient(t), b.url("event?id="+url.QueryEscape(id.String())))
	require.Equal(t, http.StatusOK, code, body)
	st = stats(body)
	require.Equal(t, ref, st["ref"])
	require.Equal(t, "not resolved", st["oobsize"])
	require.Contains(t, st["oobstored"], fmt.Sprintf("%d bytes in 1 chunk(s)", d.Size))

	// A service without the claim-check database shows the reference.
	s := ServiceOf(b.cfg)
	s.ClaimCheckDatabase = nil
	c, err := New(Options{Services: []Service{s}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/outbox-event?id="+d.ID.Hex(), nil)
	req.Host = "127.0.0.1"
	c.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), ref)
	require.Contains(t, rec.Body.String(), "not configured in the console")

	// An event in band shows no such section.
	code, body = get(t, jarClient(t), b.url("event?id="+url.QueryEscape(outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-plain"}.String())))
	require.Equal(t, http.StatusNotFound, code, body)
	insert(t, b.inbox(), parkDoc("k-plain", "o-2", time.Now(), nil))
	_, body = get(t, jarClient(t), b.url("event?id="+url.QueryEscape(outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-plain"}.String())))
	require.NotContains(t, body, "out-of-band")
}

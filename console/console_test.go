package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

func jarClient(t testing.TB) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second}
}

// seed writes a known state: 3 pending outbox events (one of them 10
// minutes old), 2 failed, 4 published in the last hour; in the inbox 2
// parked heads, 3 events held behind the first head, 5 handled in the
// last hour, one 2 hours ago.
func seed(t *testing.T, b *bundle) (head outbox.InboxID) {
	now := time.Now().UTC()
	head = outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "k-head"}
	insert(t, b.inbox(),
		parkDoc("k-head", "o-1", now.Add(-5*time.Minute), nil),
		parkDoc("k-other", "o-2", now.Add(-4*time.Minute), nil),
		parkDoc("k-held1", "o-1", now.Add(-3*time.Minute), &head),
		parkDoc("k-held2", "o-1", now.Add(-2*time.Minute), &head),
		parkDoc("k-held3", "o-1", now.Add(-1*time.Minute), &head),
	)
	for i := range 5 {
		insert(t, b.inbox(), handledDoc(fmt.Sprintf("h-%d", i), now.Add(-time.Duration(i)*time.Minute)))
	}
	insert(t, b.inbox(), handledDoc("h-old", now.Add(-2*time.Hour)))
	insert(t, b.outbox(),
		outboxDocOf("p-1", now.Add(-10*time.Minute), false, false),
		outboxDocOf("p-2", now.Add(-time.Minute), false, false),
		outboxDocOf("p-3", now, false, false),
		outboxDocOf("f-1", now.Add(-time.Hour), false, true),
		outboxDocOf("f-2", now.Add(-time.Hour), false, true),
	)
	// p-3 waits behind f-1: same partition key.
	_, err := b.outbox().UpdateOne(context.Background(), bson.D{{Key: "idempotency_key", Value: "p-3"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "key", Value: "o-f-1"}}}})
	require.NoError(t, err)
	// Published a second after creation: start a minute back, so that no
	// published_at lies in a minute the page has not reached yet.
	for i := range 4 {
		insert(t, b.outbox(), outboxDocOf(fmt.Sprintf("x-%d", i), now.Add(-time.Duration(i*10+1)*time.Minute), true, false))
	}
	return head
}

func TestOverviewShowsTheDatabaseCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	code, body := get(t, jarClient(t), b.url(""))
	require.Equal(t, http.StatusOK, code, body)
	st := stats(body)
	svc := b.cfg.Service
	want := map[string]int64{
		"pending":     count(t, b.outbox(), bson.D{{Key: "published", Value: false}, {Key: "failed", Value: false}}),
		"failed":      count(t, b.outbox(), bson.D{{Key: "failed", Value: true}}),
		"parked":      count(t, b.inbox(), bson.D{{Key: "parked", Value: true}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: false}}}}),
		"held":        count(t, b.inbox(), bson.D{{Key: "parked", Value: true}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}}}),
		"published1h": count(t, b.outbox(), bson.D{{Key: "published_at", Value: bson.D{{Key: "$gte", Value: time.Now().Add(-59 * time.Minute)}}}}),
		"handled1h":   count(t, b.inbox(), bson.D{{Key: "handled_at", Value: bson.D{{Key: "$gte", Value: time.Now().Add(-59 * time.Minute)}}}}),
	}
	require.Equal(t, map[string]int64{"pending": 3, "failed": 2, "parked": 2, "held": 3, "published1h": 4, "handled1h": 5}, want, "seeded state")
	for k, n := range want {
		require.Equal(t, strconv.FormatInt(n, 10), st[svc+"/"+k], k)
	}
	require.Equal(t, "1", st[svc+"/heldkeys"])
	require.Equal(t, "1", st[svc+"/outboxheld"], "p-3 behind f-1")
	require.Equal(t, "2", st[svc+"/outboxheldkeys"], "the keys of f-1 and f-2")
	require.Equal(t, "3", st[svc+"/orders/pending"])
	require.Equal(t, "2", st[svc+"/orders/parked"])
	require.Equal(t, "3", st[svc+"/orders/held"])
	require.Contains(t, body, "<svg class=\"chart\"")
	require.Contains(t, body, "read-only")
	require.Regexp(t, `data-stat="`+svc+`/oldest">10m`, body)
	require.NotContains(t, body, `data-stat="unroutable"`)
}

// Issue 27, item 9: pending events stored for a partition their topic does
// not have are named, with the cause.
func TestOverviewNamesEventsBeyondThePartitionCount(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b) // pending events on partition 2
	insert(t, b.db.Collection("outbox_meta"), bson.D{
		{Key: "_id", Value: bson.D{{Key: "outbox", Value: "outbox"}, {Key: "topic", Value: ordersTopic}}}, {Key: "partitions", Value: 2}})
	code, body := get(t, jarClient(t), b.url(""))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `data-stat="unroutable">3 pending events of topic &#34;orders&#34; are stored for partitions beyond its 2`)
}

func TestParkedPageListsHeadsAndHeldWithFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	cl := jarClient(t)
	code, body := get(t, cl, b.url("parked"))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "5", stats(body)["matching"])
	require.Equal(t, 3, strings.Count(body, `class="badge held"`))
	require.Equal(t, 2, strings.Count(body, `class="badge parked"`))
	require.NotContains(t, body, `name="id"`, "read-only: no selection")
	require.NotContains(t, body, "<form method=\"post\"")

	for q, n := range map[string]string{"view=heads": "2", "view=held": "3", "key=o-2": "1", "key=o-1&view=held": "3",
		"topic=payments": "0", "schema=OrderPlaced.v1": "5", "after=150s": "2", "before=150s": "3"} {
		_, body := get(t, cl, b.url("parked?"+q))
		require.Equal(t, n, stats(body)["matching"], q)
	}
	code, _ = get(t, cl, b.url("parked?view=bogus"))
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, cl, b.url("parked?svc=nope"))
	require.Equal(t, http.StatusNotFound, code)
}

func TestParkedPagePages(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	now := time.Now().UTC()
	var docs []bson.D
	for i := range 250 {
		docs = append(docs, parkDoc(fmt.Sprintf("k-%03d", i), "o", now.Add(time.Duration(i)*time.Second), nil))
	}
	insert(t, b.inbox(), docs...)
	cl := jarClient(t)
	_, body := get(t, cl, b.url("parked"))
	require.Contains(t, body, "showing 1–100")
	require.Contains(t, body, "k-000")
	require.NotContains(t, body, "k-100")
	_, body = get(t, cl, b.url("parked?page=2"))
	require.Contains(t, body, "showing 201–250")
	require.Contains(t, body, "k-249")
	require.NotContains(t, body, "next page")
}

func TestEventPageShowsDetailAndHeldEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	head := seed(t, b)
	cl := jarClient(t)
	code, body := get(t, cl, b.url("event?id="+url.QueryEscape(head.String())))
	require.Equal(t, http.StatusOK, code, body)
	st := stats(body)
	require.Equal(t, "parked", st["state"])
	require.Equal(t, "2", st["attempts"])
	require.Equal(t, "3", st["heldcount"])
	require.Contains(t, body, "4bf92f3577b34da6a3ce929d0e0e4736", "trace id")
	require.Contains(t, body, "&#34;order_id&#34;: &#34;o-1&#34;", "pretty JSON payload")
	require.Contains(t, body, "card declined")
	for _, k := range []string{"k-held1", "k-held2", "k-held3"} {
		require.Contains(t, body, k)
	}

	_, body = get(t, cl, b.url("event?id="+url.QueryEscape("orders/OrderPlaced.v1/k-held2")))
	require.Equal(t, "held", stats(body)["state"])
	require.Contains(t, body, "Held behind")

	_, body = get(t, cl, b.url("event?id="+url.QueryEscape("orders/OrderPlaced.v1/h-1")))
	require.Equal(t, "handled", stats(body)["state"])

	code, _ = get(t, cl, b.url("event?id=orders/OrderPlaced.v1/nope"))
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, cl, b.url("event?id=bad"))
	require.Equal(t, http.StatusBadRequest, code)
}

// Data written before held events existed has no held_by: every parked
// event is a head and nothing breaks.
func TestParkedPageWithoutHeldByField(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	insert(t, b.inbox(), parkDoc("k-1", "o-1", time.Now(), nil))
	_, body := get(t, jarClient(t), b.url("parked?view=held"))
	require.Equal(t, "0", stats(body)["matching"])
	_, body = get(t, jarClient(t), b.url(""))
	require.Equal(t, "0", stats(body)[b.cfg.Service+"/held"])
	require.Equal(t, "1", stats(body)[b.cfg.Service+"/parked"])
}

func TestFailedPagesListAndShowFailedEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b) // p-3 has f-1's key
	cl := jarClient(t)
	code, body := get(t, cl, b.url("failed"))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "2", stats(body)["matching"])
	require.Contains(t, body, "MESSAGE_TOO_LARGE")
	var d struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(t, b.outbox().FindOne(context.Background(), bson.D{{Key: "idempotency_key", Value: "f-1"}}).Decode(&d))
	require.Contains(t, body, "outbox-event?svc="+url.QueryEscape(b.cfg.Service)+"&amp;id="+d.ID.Hex())
	code, body = get(t, cl, b.url("outbox-event?id="+d.ID.Hex()))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "failed", stats(body)["state"])
	require.Equal(t, "1", stats(body)["heldcount"], "p-3 waits behind f-1")
	require.Contains(t, body, "OrderPlaced.v1 / p-3")
	code, _ = get(t, cl, b.url("outbox-event?id=zz"))
	require.Equal(t, http.StatusBadRequest, code)
}

func TestFindNeedsItsIndexesThenShowsTheJourney(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	cl := jarClient(t)
	_, body := get(t, cl, b.url("find?q=k-head"))
	require.Contains(t, body, "inbox.console_partition_key missing")
	require.NoError(t, EnsureFindIndexes(context.Background(), ServiceOf(b.cfg)))
	require.NoError(t, EnsureFindIndexes(context.Background(), ServiceOf(b.cfg)), "idempotent")
	_, body = get(t, cl, b.url("find?q=k-head"))
	svc := b.cfg.Service
	require.Equal(t, "1", stats(body)[svc+"/inbox"], body)
	require.Equal(t, "0", stats(body)[svc+"/outbox"])
	_, body = get(t, cl, b.url("find?by=partition&q=o-1"))
	require.Equal(t, "4", stats(body)[svc+"/inbox"], "head and three held")
	_, body = get(t, cl, b.url("find?q=f-1"))
	require.Equal(t, "1", stats(body)[svc+"/outbox"])
	require.Contains(t, body, "failed")
}

func TestReadOnlyConsoleRefusesActions(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	// Even a request that would pass the CSRF checks (the token of its
	// cookie) is refused.
	cookie := strings.Repeat("c", 64)
	u, err := url.Parse(b.url(""))
	require.NoError(t, err)
	for _, path := range []string{"redrive", "purge", "retry", "discard"} {
		cl := jarClient(t)
		cl.Jar.SetCookies(u, []*http.Cookie{{Name: csrfCookie, Value: cookie}})
		code, body := post(t, cl, b.url(path), url.Values{"csrf": {b.console.sign(cookie)}, "scope": {"all"}, "confirm": {"yes"}},
			map[string]string{"Origin": b.srv.URL})
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "actions are not enabled")
	}
	require.Equal(t, int64(5), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}))
}

func TestCSRFRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	head := seed(t, b)
	cl := jarClient(t)
	token := b.signIn(t, cl)
	form := func(tok string) url.Values {
		return url.Values{"csrf": {tok}, "scope": {"ids"}, "id": {head.String()}, "confirm": {"yes"}}
	}
	origin := b.srv.URL
	cases := []struct {
		name string
		cl   *http.Client
		form url.Values
		hdr  map[string]string
	}{
		{"no token", cl, form(""), map[string]string{"Origin": origin}},
		{"wrong token", cl, form(strings.Repeat("ab", 32)), map[string]string{"Origin": origin}},
		{"no cookie", jarClient(t), form(token), map[string]string{"Origin": origin}},
		{"other origin", cl, form(token), map[string]string{"Origin": "https://evil.example"}},
		{"other referer", cl, form(token), map[string]string{"Referer": "https://evil.example/page"}},
		{"cross-site fetch", cl, form(token), map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": origin}},
	}
	for _, tc := range cases {
		code, body := post(t, tc.cl, b.url("purge"), tc.form, tc.hdr)
		require.Equal(t, http.StatusForbidden, code, tc.name)
		require.Contains(t, body, "CSRF", tc.name)
	}
	require.Equal(t, int64(5), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}), "nothing purged")

	// The same request from the console's own page passes.
	code, body := post(t, cl, b.url("purge"), form(token), map[string]string{"Origin": origin, "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "1", stats(body)["done"])
	require.Equal(t, int64(4), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}))
}

func TestActionsConfirmWithTheDryRunCount(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	seed(t, b)
	cl := jarClient(t)
	token := b.signIn(t, cl)
	hdr := map[string]string{"Origin": b.srv.URL}
	all := url.Values{"csrf": {token}, "scope": {"all"}, "key": {"o-1"}}

	// First POST: a confirmation with the count of outbox.Admin's dry run;
	// nothing changes.
	var ids []outbox.InboxID
	require.NoError(t, eachParkedPage(context.Background(), b.console.services[0], parkedQuery{Key: "o-1"}, 2, func(page []outbox.InboxID) error {
		ids = append(ids, page...)
		return nil
	}))
	dry, err := b.client.Admin().RequestRedrive(context.Background(), outbox.ParkedFilter{IDs: ids}, true)
	require.NoError(t, err)
	require.Equal(t, int64(4), dry)
	code, body := post(t, cl, b.url("redrive"), all, hdr)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "4", stats(body)["count"])
	require.Contains(t, body, `name="confirm" value="yes"`)
	require.Equal(t, int64(0), count(t, b.inbox(), bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}))

	// Confirmed: the requests are recorded.
	all.Set("confirm", "yes")
	_, body = post(t, cl, b.url("redrive"), all, hdr)
	require.Equal(t, "4", stats(body)["done"], body)
	require.Equal(t, int64(4), count(t, b.inbox(), bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}))

	// Failed events: retry one, discard the rest (all of the topic).
	var f struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(t, b.outbox().FindOne(context.Background(), bson.D{{Key: "idempotency_key", Value: "f-1"}}).Decode(&f))
	_, body = post(t, cl, b.url("retry"), url.Values{"csrf": {token}, "id": {f.ID.Hex()}}, hdr)
	require.Equal(t, "1", stats(body)["count"])
	_, body = post(t, cl, b.url("retry"), url.Values{"csrf": {token}, "id": {f.ID.Hex()}, "confirm": {"yes"}}, hdr)
	require.Equal(t, "1", stats(body)["done"])
	_, body = post(t, cl, b.url("discard"), url.Values{"csrf": {token}, "scope": {"all"}, "topic": {ordersTopic}, "confirm": {"yes"}}, hdr)
	require.Equal(t, "1", stats(body)["done"])
	require.Equal(t, int64(0), count(t, b.outbox(), bson.D{{Key: "failed", Value: true}}))
	require.Equal(t, int64(0), count(t, b.outbox(), bson.D{{Key: "idempotency_key", Value: "f-2"}}), "discarded: deleted")

	// Bad forms are refused with 400 and change nothing.
	code, _ = post(t, cl, b.url("purge"), url.Values{"csrf": {token}, "scope": {"ids"}, "confirm": {"yes"}}, hdr)
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = post(t, cl, b.url("purge"), url.Values{"csrf": {token}, "id": {"bad"}, "confirm": {"yes"}}, hdr)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, int64(5), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}))
}

// The console is mounted under a prefix; its bare path redirects to the
// overview, and its assets are served from the binary.
func TestMountAndAssets(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	cl := jarClient(t)
	cl.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := cl.Get(b.srv.URL + "/outbox/ui")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode) // ServeMux redirects to the subtree
	require.Equal(t, "/outbox/ui/", resp.Header.Get("Location"))
	for _, a := range []string{"assets/style.css", "assets/console.js"} {
		code, body := get(t, cl, b.url(a))
		require.Equal(t, http.StatusOK, code, a)
		require.NotEmpty(t, body)
	}
	resp, err = cl.Get(b.url(""))
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	code, _ := get(t, cl, b.url("nope"))
	require.Equal(t, http.StatusNotFound, code)
}

// No page shows a connection string or its password, even in an error.
func TestPagesShowNoCredentials(t *testing.T) {
	t.Parallel()
	require.Equal(t, "dial mongodb://u:xxxxx@h:1/db failed", redact("dial mongodb://u:s3cret@h:1/db failed"))
	b := setup(t, true)
	seed(t, b)
	cl := jarClient(t)
	for _, p := range []string{"", "parked", "failed", "partitions", "find?q=x"} {
		_, body := get(t, cl, b.url(p))
		require.NotContains(t, body, b.mongo.URI, p)
		require.NotContains(t, body, "mongodb://", p)
		for _, s := range b.kafka.Seeds {
			require.NotContains(t, body, s, p)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	_, err := New(Options{})
	require.ErrorIs(t, err, ErrOptions)
	_, err = New(Options{Services: []Service{{Name: "x"}}})
	require.ErrorContains(t, err, "Database is required")
	_, err = New(Options{Services: []Service{{Name: "x", Database: nil}}, CSRFKey: []byte("short")})
	require.ErrorIs(t, err, ErrOptions)
}

// A console shows several services; the svc parameter picks one and the
// switcher links to the same listing of the others.
func TestSeveralServices(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	other := b.mongo.DB(t)
	insert(t, other.Collection("inbox"), parkDoc("k-x", "o-x", time.Now(), nil))
	c, err := New(Options{Services: []Service{ServiceOf(b.cfg), {Name: "billing", Database: other}}})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	defer srv.Close()
	cl := jarClient(t)
	_, body := get(t, cl, srv.URL+"/")
	st := stats(body)
	require.Equal(t, "2", st["shop/parked"])
	require.Equal(t, "1", st["billing/parked"])
	require.Equal(t, "0", st["billing/pending"])
	_, body = get(t, cl, srv.URL+"/parked?svc=billing")
	require.Equal(t, "1", stats(body)["matching"])
	require.Contains(t, body, `href="parked?svc=shop"`)
	_, body = get(t, cl, srv.URL+"/event?svc=billing&id=orders/OrderPlaced.v1/k-x")
	require.Contains(t, body, `href="parked?svc=shop"`, "the switcher leaves a detail page for the listing")
	_, err = New(Options{Services: []Service{ServiceOf(b.cfg), ServiceOf(b.cfg)}})
	require.ErrorContains(t, err, "twice")
}

// A malformed record that can never be re-driven is refused by the
// console as by outbox.Admin, with the reason, and nothing is marked.
func TestConsoleRefusesToRedriveUnreadableRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	id := bson.D{{Key: "topic", Value: ordersTopic}, {Key: "content_schema", Value: "unknown"}, {Key: "idempotency_key", Value: "malformed:0:7"}}
	_, err := b.inbox().InsertOne(context.Background(), bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: false},
		{Key: "parked", Value: true}, {Key: "parked_at", Value: time.Now().UTC()}, {Key: "attempts", Value: int32(1)},
		{Key: "last_error", Value: "outbox: malformed record: missing header outbox-version"}, {Key: "partition", Value: int32(0)},
		{Key: "offset", Value: int64(7)}, {Key: "payload", Value: "junk"}, {Key: "unreadable", Value: true}})
	require.NoError(t, err)
	cl := jarClient(t)
	token := b.signIn(t, cl)
	hdr := map[string]string{"Origin": b.srv.URL}
	code, body := post(t, cl, b.url("redrive"), url.Values{"csrf": {token}, "id": {ordersTopic + "/unknown/malformed:0:7"}}, hdr)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "cannot be re-driven")
	require.Contains(t, body, "purge it instead")
	require.Zero(t, count(t, b.inbox(), bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}))
}

// The health page checks the service's Kafka topics as Config.TopicPrefix
// names them: the prefixed orders topic is found (no "does not exist" for
// the bare name) and checked as the one topic both published and
// consumed, whose compaction breaks a guarantee.
func TestHealthChecksTheTopicsTheServicePrefixes(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	require.NotEmpty(t, b.cfg.TopicPrefix)
	b.kafka.SetTopicConfig(t, b.kafkaTopic(ordersTopic), "cleanup.policy", kadm.StringPtr("compact"))
	b.run(t)
	cl := jarClient(t)
	var body string
	// The topic is "consumed" once the running service's consumer says
	// so; a page rendered before that names it published only.
	subject := "topic orders (Kafka " + b.kafkaTopic(ordersTopic) + ", published and consumed)"
	waitFor(t, "the compacted topic found, published and consumed", func() bool {
		_, body = get(t, cl, b.url("health"))
		return strings.Contains(body, `data-check="kafka.cleanup_policy" data-severity="breaks"`) && strings.Contains(body, subject)
	})
	require.NotContains(t, body, `data-check="kafka.topic"`, "the topic exists under its Kafka name")
}

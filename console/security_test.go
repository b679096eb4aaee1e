package console

import (
	"context"
	"fmt"
	"html"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
)

// DNS rebinding: a page on attacker.example whose name now resolves to
// 127.0.0.1 reaches the console with Host: attacker.example. It used to be
// served every page (and its CSRF token), and its same-origin form posts
// passed the Origin check, which compared Origin with that same Host. Now
// any host the console does not serve gets 421 before a page, a cookie or
// a token; localhost, IP literals and the listed names are served.
func TestDNSRebindingIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	seed(t, b)
	u, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	port := ":" + u.Port()
	cl := jarClient(t)
	attacker := "attacker.example" + port
	for _, path := range []string{"", "parked", "event?id=orders/OrderPlaced.v1/k-head", "failed", "partitions", "find?q=x", "login", "assets/style.css", "nope"} {
		resp, body := send(t, cl, http.MethodGet, b.url(path), attacker, nil, nil)
		require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, path)
		require.Empty(t, resp.Header.Values("Set-Cookie"), path)
		require.NotContains(t, body, "csrf", path)
		require.NotContains(t, body, "k-head", path)
		require.Contains(t, body, "DNS rebinding", path)
	}
	// The attack's form post, with the attacker's own origin (same origin
	// as its page under rebinding).
	resp, _ := send(t, cl, http.MethodPost, b.url("purge"), attacker,
		url.Values{"scope": {"all"}, "confirm": {"yes"}, "csrf": {strings.Repeat("ab", 32)}},
		map[string]string{"Origin": "http://" + attacker, "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	require.Equal(t, int64(5), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}))

	for _, host := range []string{"localhost" + port, "LOCALHOST." + port, "127.0.0.1" + port, "[::1]" + port, "10.1.2.3"} {
		resp, body := send(t, cl, http.MethodGet, b.url("parked"), host, nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, host)
		require.Equal(t, "5", stats(body)["matching"], host)
	}
}

// AllowedHosts names the hosts served beyond localhost and IP literals;
// an action's Origin must be the request's own or a listed name (a proxy
// that rewrites Host), never another port or address.
func TestAllowedHostsAndOrigins(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	head := seed(t, b)
	c, err := New(Options{Services: []Service{ServiceOf(b.cfg)}, EnableActions: true, OperatorPassword: testPassword,
		AllowedHosts: []string{"Console.Example.com", "ops.internal:8443"}})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	defer srv.Close()
	cl := jarClient(t)
	for host, want := range map[string]int{"console.example.com": 200, "CONSOLE.EXAMPLE.COM.:80": 200, "ops.internal": 200,
		"example.com": 421, "evil.console.example.com": 421} {
		resp, _ := send(t, cl, http.MethodGet, srv.URL+"/", host, nil, nil)
		require.Equal(t, want, resp.StatusCode, host)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "" // HTTP/1.0 without Host
	c.ServeHTTP(rec, req)
	require.Equal(t, http.StatusMisdirectedRequest, rec.Code)

	// Signed in; the proxy forwards with Host 127.0.0.1:port.
	token := func() string {
		_, page := get(t, cl, srv.URL+"/login")
		_, page = post(t, cl, srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "password": {testPassword}},
			map[string]string{"Origin": srv.URL})
		return csrfOf(t, page)
	}()
	form := url.Values{"csrf": {token}, "scope": {"ids"}, "id": {head.String()}}
	for origin, want := range map[string]int{
		srv.URL:                            200, // its own origin
		"https://console.example.com":      200, // a listed name: the proxy's
		"https://console.example.com:9443": 200, // ports of listed names are ignored
		"http://127.0.0.1:1":               403, // another port of the same address is another origin
		strings.Replace(srv.URL, "127.0.0.1", "localhost", 1): 403, // a name not equal to the request's host
		"https://attacker.example":                            403,
		"null":                                                403,
		"http://console.example.com.evil.x":                   403,
	} {
		code, body := post(t, cl, srv.URL+"/redrive", form, map[string]string{"Origin": origin})
		require.Equal(t, want, code, "%s: %s", origin, body)
	}
	code, _ := post(t, cl, srv.URL+"/redrive", form, map[string]string{"Referer": "https://console.example.com/parked"})
	require.Equal(t, http.StatusOK, code)
	code, _ = post(t, cl, srv.URL+"/redrive", form, map[string]string{"Referer": "https://attacker.example/x"})
	require.Equal(t, http.StatusForbidden, code)

	_, err = New(Options{Services: []Service{ServiceOf(b.cfg)}, AllowedHosts: []string{"http://x.example/"}})
	require.ErrorIs(t, err, ErrOptions)
}

// Loopback is not authentication: actions need an operator. A console
// with actions and a password shows no action to a browser that has not
// signed in and refuses its posts with 401, even with a valid CSRF token.
func TestActionsNeedAnOperator(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	head := seed(t, b)
	cl := jarClient(t)
	hdr := map[string]string{"Origin": b.srv.URL}
	_, page := get(t, cl, b.url("parked"))
	require.Contains(t, page, "sign in to act")
	require.NotContains(t, page, `name="id"`, "no selection before sign-in")
	_, page = get(t, cl, b.url("login"))
	token := csrfOf(t, page)
	form := url.Values{"csrf": {token}, "scope": {"ids"}, "id": {head.String()}, "confirm": {"yes"}}
	for _, path := range []string{"redrive", "purge", "retry", "discard"} {
		code, body := post(t, cl, b.url(path), form, hdr)
		require.Equal(t, http.StatusUnauthorized, code, path)
		require.Contains(t, body, "sign in first", path)
	}

	// Wrong passwords: refused; after five in a row sign-in pauses, even
	// for the right one, until the pause is over.
	now := time.Now()
	var mu sync.Mutex
	b.console.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	for i := range freeSignInFailures + 1 {
		code, body := post(t, cl, b.url("login"), url.Values{"csrf": {token}, "password": {"hunter22"}}, hdr)
		require.Equal(t, http.StatusUnauthorized, code, i)
		require.Contains(t, body, "Wrong password")
	}
	code, body := post(t, cl, b.url("login"), url.Values{"csrf": {token}, "password": {testPassword}}, hdr)
	require.Equal(t, http.StatusTooManyRequests, code, body)
	advance(time.Second)
	code, body = post(t, cl, b.url("login"), url.Values{"csrf": {token}, "password": {testPassword}}, hdr)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "actions enabled")
	require.Contains(t, body, `id="signout"`)
	code, _ = post(t, cl, b.url("redrive"), form, hdr)
	require.Equal(t, http.StatusOK, code)

	// The session is worth nothing in another browser (another CSRF
	// cookie), or once it expired.
	u, err := url.Parse(b.url(""))
	require.NoError(t, err)
	other := jarClient(t)
	_, page = get(t, other, b.url("login"))
	for _, ck := range cl.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			other.Jar.SetCookies(u, []*http.Cookie{ck})
		}
	}
	code, _ = post(t, other, b.url("redrive"), url.Values{"csrf": {csrfOf(t, page)}, "id": {head.String()}}, hdr)
	require.Equal(t, http.StatusUnauthorized, code, "a stolen session cookie alone")
	advance(b.console.opts.SessionTTL)
	code, _ = post(t, cl, b.url("redrive"), form, hdr)
	require.Equal(t, http.StatusUnauthorized, code, "expired")

	// Sign out ends the session.
	advance(-b.console.opts.SessionTTL)
	code, _ = post(t, cl, b.url("logout"), url.Values{"csrf": {token}}, hdr)
	require.Equal(t, http.StatusOK, code)
	code, _ = post(t, cl, b.url("redrive"), form, hdr)
	require.Equal(t, http.StatusUnauthorized, code, "signed out")
}

// Actions are off unless enabled with a credential; a service may
// authenticate operators itself (Authorize).
func TestActionsNeedACredentialToBeEnabled(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	head := seed(t, b)
	svc := []Service{ServiceOf(b.cfg)}
	_, err := New(Options{Services: svc, EnableActions: true})
	require.ErrorIs(t, err, ErrOptions)
	require.ErrorContains(t, err, "operator credential")
	_, err = New(Options{Services: svc, EnableActions: true, OperatorPassword: "short"})
	require.ErrorContains(t, err, "at least 8")

	c, err := New(Options{Services: svc, EnableActions: true, Authorize: func(r *http.Request) (string, bool) {
		u, p, ok := r.BasicAuth()
		return u, ok && p == "s3cret-pass"
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	defer srv.Close()
	cl := jarClient(t)
	code, _ := get(t, cl, srv.URL+"/login")
	require.Equal(t, http.StatusNotFound, code, "no sign-in page without a password")
	_, page := get(t, cl, srv.URL+"/parked")
	require.NotContains(t, page, `name="id"`)
	var token string
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	for _, ck := range cl.Jar.Cookies(u) {
		if ck.Name == csrfCookie {
			token = c.sign(ck.Value)
		}
	}
	require.NotEmpty(t, token)
	form := url.Values{"csrf": {token}, "id": {head.String()}}
	code, body := post(t, cl, srv.URL+"/redrive", form, map[string]string{"Origin": srv.URL})
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "Authorize")
	code, _ = post(t, cl, srv.URL+"/redrive", form, map[string]string{"Origin": srv.URL, "Authorization": "Basic " + basic("ada", "s3cret-pass")})
	require.Equal(t, http.StatusOK, code)
}

func basic(u, p string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	req.SetBasicAuth(u, p)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// Behind a proxy that terminates TLS, the requests reach the console over
// plain HTTP: SecureCookies marks its cookies Secure anyway.
func TestSecureCookies(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for _, secure := range []bool{false, true} {
		c, err := New(Options{Services: []Service{ServiceOf(b.cfg)}, EnableActions: true, OperatorPassword: testPassword, SecureCookies: secure})
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		c.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
		cookies := rec.Result().Cookies()
		require.Len(t, cookies, 1)
		require.Equal(t, secure, cookies[0].Secure)
	}
}

// ?page= used to overflow page × size into a negative skip: a 500.
func TestParkedPageNumberIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	seed(t, b)
	cl := jarClient(t)
	for _, p := range []string{"92233720368547758", "92233720368547759", "-1", "x", "99999999999999999999", fmt.Sprint(maxPage(100) + 1)} {
		code, body := get(t, cl, b.url("parked?page="+p))
		require.Equal(t, http.StatusBadRequest, code, p)
		require.Contains(t, body, "page must", p)
	}
	code, body := get(t, cl, b.url(fmt.Sprintf("parked?page=%d", maxPage(100))))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "5", stats(body)["matching"])
}

// "All matching" actions the Admin filter cannot express act a page of
// ids at a time: no command carries more than actionPageSize ids, however
// many events match, including many parked in the same millisecond; the
// count and the result are those of one action.
func TestAllMatchingActionsPageThroughIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	var mu sync.Mutex
	maxIn := 0
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		n := longestIn(e.Command)
		mu.Lock()
		maxIn = max(maxIn, n)
		mu.Unlock()
	}}
	mc, err := mongo.Connect(options.Client().ApplyURI(b.mongo.URI).SetMonitor(mon))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	// A purge releases the events held behind each purged head, one
	// transaction each: 700 under -race on a loaded machine need more than
	// the default 10 s.
	c, err := New(Options{Services: []Service{{Name: "shop", Database: mc.Database(b.db.Name())}}, EnableActions: true,
		OperatorPassword: testPassword, QueryTimeout: 5 * time.Minute})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/outbox/ui/", http.StripPrefix("/outbox/ui", c))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	pb := &bundle{srv: srv}

	// 700 events of key "big": groups of 300 share a millisecond, one
	// across the boundary of the first page; 7 of another key.
	base := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var docs []bson.D
	for i := range 700 {
		docs = append(docs, parkDoc(fmt.Sprintf("big-%04d", i), "big", base.Add(time.Duration(i/300)*time.Millisecond), nil))
	}
	for i := range 7 {
		docs = append(docs, parkDoc(fmt.Sprintf("small-%d", i), "small", base.Add(time.Duration(i)*time.Second), nil))
	}
	insert(t, b.inbox(), docs...)
	cl := jarClient(t)
	token := pb.signIn(t, cl)
	hdr := map[string]string{"Origin": srv.URL}
	all := url.Values{"csrf": {token}, "scope": {"all"}, "key": {"big"}}
	mu.Lock()
	maxIn = 0
	mu.Unlock()
	code, body := post(t, cl, srv.URL+"/outbox/ui/redrive", all, hdr)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "700", stats(body)["count"])
	all.Set("confirm", "yes")
	_, body = post(t, cl, srv.URL+"/outbox/ui/redrive", all, hdr)
	require.Equal(t, "700", stats(body)["done"], body)
	require.Equal(t, int64(700), count(t, b.inbox(), bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}))
	_, body = post(t, cl, srv.URL+"/outbox/ui/purge", all, hdr)
	require.Equal(t, "700", stats(body)["done"], body)
	require.Equal(t, int64(7), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}), "the other key's events stay")
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, maxIn)
	require.LessOrEqual(t, maxIn, actionPageSize, "the longest $in list sent")
}

// longestIn returns the length of the longest $in array in a command.
func longestIn(raw bson.Raw) int {
	best := 0
	var walk func(v bson.RawValue)
	walk = func(v bson.RawValue) {
		switch v.Type {
		case bson.TypeEmbeddedDocument:
			elems, _ := v.Document().Elements()
			for _, e := range elems {
				if e.Key() == "$in" && e.Value().Type == bson.TypeArray {
					vals, _ := e.Value().Array().Values()
					best = max(best, len(vals))
				}
				walk(e.Value())
			}
		case bson.TypeArray:
			vals, _ := v.Array().Values()
			for _, x := range vals {
				walk(x)
			}
		}
	}
	walk(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: raw})
	return best
}

var (
	eventLinkRe = regexp.MustCompile(`href="(event\?svc=[^"]*)"`)
	checkboxRe  = regexp.MustCompile(`<input type="checkbox" name="id" value="([^"]*)"`)
)

// A key with a slash used to misaddress events: B {schema OrderPlaced.v1,
// key order/42} and A {schema OrderPlaced.v1/order, key 42} shared the
// string orders/OrderPlaced.v1/order/42, so purging B purged A, and B could
// not be opened. Every id now round-trips through the console's links and
// forms, whatever its parts hold.
func TestSlashesInKeysAndSchemasAddressTheRightEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	at := time.Now().UTC().Add(-time.Minute)
	doc := func(schema, key string, i int) bson.D {
		d := parkDoc(key, fmt.Sprint("pk-", i), at.Add(time.Duration(i)*time.Millisecond), nil)
		d[0].Value = outbox.InboxID{Topic: ordersTopic, ContentSchema: schema, IdempotencyKey: key}
		return d
	}
	ids := []outbox.InboxID{
		{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1/order", IdempotencyKey: "42"},
		{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "order/42"},
	}
	r := rand.New(rand.NewPCG(7, 8))
	parts := []string{"/", "%", "%2F", "%25", "+", " ", "?", "&", "#", "=", "é", "<b>", `"`, "'", ";", "\\", "a", "Z", "0", "\t"}
	word := func() string {
		var s strings.Builder
		for range 1 + r.IntN(6) {
			s.WriteString(parts[r.IntN(len(parts))])
		}
		return s.String()
	}
	for range 30 {
		ids = append(ids, outbox.InboxID{Topic: ordersTopic, ContentSchema: word(), IdempotencyKey: word()})
	}
	var docs []bson.D
	seen := map[outbox.InboxID]bool{}
	for i, id := range ids {
		if !seen[id] {
			seen[id] = true
			docs = append(docs, doc(id.ContentSchema, id.IdempotencyKey, i))
		}
	}
	insert(t, b.inbox(), docs...)

	cl := jarClient(t)
	token := b.signIn(t, cl)
	_, page := get(t, cl, b.url("parked"))
	// Every event's link opens that event.
	opened := map[outbox.InboxID]bool{}
	for _, m := range eventLinkRe.FindAllStringSubmatch(page, -1) {
		code, body := get(t, cl, b.url(html.UnescapeString(m[1])))
		require.Equal(t, http.StatusOK, code, m[1])
		id := outbox.InboxID{Topic: ordersTopic, ContentSchema: ddOf(t, body, "Content schema"), IdempotencyKey: ddOf(t, body, "Idempotency key")}
		require.True(t, seen[id], "link %s opened %+v", m[1], id)
		opened[id] = true
	}
	require.Equal(t, seen, opened, "every event opened by its link")
	// Each checkbox names its own event: purge B alone.
	var boxes []string
	for _, m := range checkboxRe.FindAllStringSubmatch(page, -1) {
		boxes = append(boxes, html.UnescapeString(m[1]))
	}
	require.Len(t, boxes, len(seen))
	require.Contains(t, boxes, ids[1].String())
	code, body := post(t, cl, b.url("purge"), url.Values{"csrf": {token}, "scope": {"ids"}, "id": {ids[1].String()}, "confirm": {"yes"}},
		map[string]string{"Origin": b.srv.URL})
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "1", stats(body)["done"])
	parked := func(id outbox.InboxID) bool {
		return count(t, b.inbox(), bson.D{{Key: "_id", Value: id}, {Key: "parked", Value: true}}) == 1
	}
	require.False(t, parked(ids[1]), "B purged")
	require.True(t, parked(ids[0]), "A untouched")
}

// ddOf reads the text of the <dd> after <dt>label</dt>.
func ddOf(t *testing.T, body, label string) string {
	t.Helper()
	m := regexp.MustCompile(`<dt>` + regexp.QuoteMeta(label) + `</dt><dd>([^<]*)</dd>`).FindStringSubmatch(body)
	require.NotNil(t, m, label)
	return html.UnescapeString(m[1])
}

// An error page says what every other page says about actions: read-only
// with a sign-in link to a visitor who has not signed in (it said "actions
// enabled"), actions enabled once signed in.
func TestErrorPageShowsTheVisitorsMode(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	c, err := New(Options{Services: []Service{ServiceOf(b.cfg)}, EnableActions: true, OperatorPassword: testPassword})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	defer srv.Close()
	cl := jarClient(t)
	code, page := get(t, cl, srv.URL+"/parked?svc=no-such-service")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, page, `<span class="mode">read-only · <a href="login" id="signin">sign in to act</a></span>`)
	_, ok := get(t, cl, srv.URL+"/parked")
	require.Contains(t, ok, `<span class="mode">read-only · <a href="login" id="signin">sign in to act</a></span>`, "the same as a page that works")

	_, login := get(t, cl, srv.URL+"/login")
	post(t, cl, srv.URL+"/login", url.Values{"csrf": {csrfOf(t, login)}, "password": {testPassword}}, map[string]string{"Origin": srv.URL})
	_, page = get(t, cl, srv.URL+"/parked?svc=no-such-service")
	require.Contains(t, page, `<span class="mode">actions enabled</span>`)
}

package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/testkit"
)

// The browser test drives headless Chromium through the console of a
// running service: it reads the numbers each page shows and compares them
// with the database, signs in as the operator, re-drives a parked event
// with the buttons and waits for its handler to run, cancels a scheduled
// event (and is told when it is too late), and checks that a
// form posted from another origin is refused and that a name resolving to
// 127.0.0.1 (DNS rebinding, simulated with Chromium's host resolver rules)
// gets no page.
//
// It needs Chromium (Debian: apt-get install chromium); without it the test
// skips. CONSOLE_SCREENSHOTS=<dir> keeps a PNG of each page there (the
// README's screenshots: CONSOLE_SCREENSHOTS=$PWD/docs go test -run
// TestBrowser ./console).

// chromium finds the browser: $CHROMIUM, then the usual names.
func chromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

func TestBrowser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("browser test skipped: no Chromium found (install Debian's chromium package or set CHROMIUM=/path/to/chrome)")
	}
	// The service publishes and handles orders, only publishes payments
	// and only handles refunds.
	b := setup(t, true, func(cfg *outbox.Config) { cfg.PublishTopics = append(cfg.PublishTopics, paymentsTopic) })
	b.kafka.CreateTopic(t, 2, b.kafkaTopic(paymentsTopic))
	b.kafka.CreateTopic(t, 2, b.kafkaTopic(refundsTopic))
	require.NoError(t, outbox.Handle(b.client, func(context.Context, refundIssued, outbox.Metadata) error { return nil }))
	ctx := context.Background()
	svc := b.cfg.Service

	// A running service: three orders handled, one poison order parked
	// after MaxAttempts, plus (seeded directly, as the consumer's poison
	// handling writes them) two events held behind it and a failed outbox
	// event.
	// (The failed event goes in before the publisher starts: its backlog
	// scan skips failed events, its change stream does not filter inserts.)
	insert(t, b.outbox(), outboxDocOf("too-big", time.Now().Add(-time.Minute), false, true))
	b.run(t)
	for _, id := range []string{"o-1", "o-2", "o-3", "poison-1"} {
		require.NoError(t, b.client.Transact(ctx, func(ctx context.Context) error {
			return outbox.Record(ctx, orderPlaced{OrderID: id, Amount: 42})
		}))
	}
	waitFor(t, "the poison order parked and the others handled", func() bool {
		return count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}) == 1 &&
			count(t, b.inbox(), bson.D{{Key: "handled", Value: true}}) == 3
	})
	var head struct {
		ID        outbox.InboxID `bson:"_id"`
		Partition int32          `bson:"partition"`
		Offset    int64          `bson:"offset"`
	}
	require.NoError(t, b.inbox().FindOne(ctx, bson.D{{Key: "parked", Value: true}}).Decode(&head))
	now := time.Now().UTC()
	// Held behind the head as the consumer stores them: same partition,
	// later offsets.
	held := func(key string, at time.Time, n int64) bson.D {
		d := parkDoc(key, "poison-1", at, &head.ID)
		for i := range d {
			switch d[i].Key {
			case "partition":
				d[i].Value = head.Partition
			case "offset":
				d[i].Value = head.Offset + n
			}
		}
		return d
	}
	insert(t, b.inbox(), held("held-a", now, 1), held("held-b", now.Add(time.Second), 2))
	require.NoError(t, EnsureFindIndexes(ctx, ServiceOf(b.cfg)))
	waitFor(t, "nothing pending", func() bool {
		return count(t, b.outbox(), bson.D{{Key: "published", Value: false}, {Key: "failed", Value: false}}) == 0
	})
	waitFor(t, "both groups stable with every partition assigned", func() bool {
		lags, err := b.kafka.Admin().Lag(ctx, b.cfg.ConsumerGroup, b.cfg.PublisherGroup)
		if err != nil {
			return false
		}
		for _, g := range lags {
			if g.State != "Stable" || len(g.Members) == 0 {
				return false
			}
		}
		c := lags[b.cfg.ConsumerGroup]
		return c.Lag.Total() == 0 && len(c.Lag.Sorted()) == 5 // orders and refunds
	})

	shots := os.Getenv("CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		// The attacker's name resolves to the console's address, as after
		// a DNS rebinding.
		chromedp.Flag("host-resolver-rules", "MAP rebind.attacker.test 127.0.0.1"))...)
	defer cancelAlloc()
	bctx, cancelB := chromedp.NewContext(alloc)
	defer cancelB()
	require.NoError(t, chromedp.Do(bctx), "start Chromium") // the first run may not have a deadline
	bctx, cancelT := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelT()

	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return strings.TrimSpace(s)
	}
	stat := func(name string) string { return text(`[data-stat="` + name + `"]`) }
	num := func(name string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(stat(name), 10, 64)
		require.NoError(t, err, name)
		return n
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, "console-"+name+".png"), png, 0o644))
	}
	open := func(path string) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(b.url(path)), chromedp.WaitReady(chromedp.CSS("footer"))))
	}

	// Two events scheduled an hour ahead, waiting.
	for _, id := range []string{"cancel-me", "late"} {
		require.NoError(t, b.client.Transact(ctx, func(ctx context.Context) error {
			return outbox.Record(ctx, orderPlaced{OrderID: id, Amount: 7}, outbox.WithIdempotencyKey(id), outbox.WithDelay(time.Hour))
		}))
	}
	scheduled := b.db.Collection("outbox_scheduled")

	// Overview: the numbers are the database's.
	open("")
	st, err := b.client.Admin().StoreStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, st.Pending, num(svc+"/pending"))
	require.Equal(t, st.Failed, num(svc+"/failed"))
	require.Equal(t, int64(1), num(svc+"/failed"))
	require.Equal(t, count(t, b.inbox(), bson.D{{Key: "parked", Value: true}, {Key: "held_by", Value: bson.D{{Key: "$exists", Value: false}}}}), num(svc+"/parked"))
	require.Equal(t, int64(2), num(svc+"/held"))
	require.Equal(t, count(t, b.outbox(), bson.D{{Key: "published", Value: true}}), num(svc+"/published1h"))
	require.Equal(t, count(t, b.inbox(), bson.D{{Key: "handled", Value: true}}), num(svc+"/handled1h"))
	require.Equal(t, int64(2), num(svc+"/scheduled"))
	require.Equal(t, int64(2), num(svc+"/"+ordersTopic+"/scheduled"))
	require.Equal(t, fmtTime(st.NextDue), stat(svc+"/"+ordersTopic+"/nextdue"))
	shot("overview")

	// Partitions: owners and offsets as kadm reports them.
	open("partitions")
	lags, err := b.kafka.Admin().Lag(ctx, b.cfg.ConsumerGroup)
	require.NoError(t, err)
	for _, l := range lags[b.cfg.ConsumerGroup].Lag.Sorted() {
		p := fmt.Sprintf("%s/%s/%d/", svc, l.Topic, l.Partition)
		require.Equal(t, strconv.FormatInt(l.End.Offset, 10), stat(p+"end"), p)
		require.Equal(t, "0", stat(p+"lag"), p)
		if l.Commit.At >= 0 {
			require.Equal(t, strconv.FormatInt(l.Commit.At, 10), stat(p+"committed"), p)
		}
	}
	// Each topic's rows show the roles the service has for it: no owner
	// and no warning for a role it does not have.
	require.NotContains(t, text("main"), "nobody")
	for _, row := range []struct {
		topic, role string
		publishes   bool
		handles     bool
	}{{ordersTopic, "publishes, handles", true, true}, {paymentsTopic, "publishes", true, false}, {refundsTopic, "handles", false, true}} {
		p := fmt.Sprintf("%s/%s/0/", svc, b.kafkaTopic(row.topic))
		require.Equal(t, row.role, stat(p+"role"), p)
		require.Equal(t, !row.publishes, stat(p+"publisher") == "–", p+"publisher: "+stat(p+"publisher"))
		require.Equal(t, !row.handles, stat(p+"consumer") == "–", p+"consumer: "+stat(p+"consumer"))
	}
	shot("partitions")

	// Health: the doctor's findings; a compacted topic breaks a guarantee.
	open("health")
	require.Equal(t, "0", stat(svc+"/breaks"), text("main"))
	require.Contains(t, stat(svc+"/summary"), "nothing breaks a guarantee")
	b.kafka.SetTopicConfig(t, b.kafkaTopic(ordersTopic), "cleanup.policy", kadm.StringPtr("compact"))
	open("health")
	require.Equal(t, "1", stat(svc+"/breaks"))
	require.Equal(t, "breaks", strings.ToLower(text(`tr[data-check="kafka.cleanup_policy"] .sev`)))
	require.Contains(t, text(`tr[data-check="kafka.cleanup_policy"]`), "set cleanup.policy=delete")
	shot("health")
	b.kafka.SetTopicConfig(t, b.kafkaTopic(ordersTopic), "cleanup.policy", nil)

	open("failed")
	require.Equal(t, "1", stat("matching"))
	shot("failed")

	open("find?by=partition&q=poison-1")
	require.Equal(t, "3", stat(svc+"/inbox"))
	require.Equal(t, "1", stat(svc+"/outbox"))
	shot("find")

	// Parked page, read-only until the operator signs in; then the head's
	// detail, then re-drive it with the buttons: a confirmation with the
	// count, then the request.
	open("parked")
	require.Equal(t, "3", stat("matching"))
	require.Contains(t, text(".mode"), "sign in to act")
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#signin")), chromedp.WaitVisible(chromedp.CSS("#password"))))
	shot("login")
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS("#password"), testPassword), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#signout"))))
	require.Equal(t, "actions enabled", text(".mode"))
	open("parked")
	shot("parked")
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`a.evt[href*="`+head.ID.IdempotencyKey+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#redrive"))))
	require.Equal(t, "parked", stat("state"))
	require.Equal(t, "2", stat("heldcount"))
	require.Equal(t, "actions enabled", text(".mode"))
	shot("event")
	// A held event and a malformed record offer no Re-drive, and say why.
	notRedrivable := func(id outbox.InboxID, why string) {
		t.Helper()
		open("event?id=" + id.String())
		require.Contains(t, text("#not-redrivable"), why)
		require.Equal(t, 0, countOf(t, bctx, "#redrive"), "no Re-drive button")
		require.Equal(t, 1, countOf(t, bctx, "#purge"), "Purge stays")
	}
	notRedrivable(outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: "held-a"}, "held behind an earlier parked event")
	malformed := outbox.InboxID{Topic: ordersTopic, ContentSchema: "unknown", IdempotencyKey: "malformed:0:7"}
	insert(t, b.inbox(), bson.D{{Key: "_id", Value: malformed}, {Key: "handled", Value: false}, {Key: "parked", Value: true},
		{Key: "parked_at", Value: now}, {Key: "attempts", Value: int32(1)}, {Key: "last_error", Value: "outbox: malformed record: missing header outbox-version"},
		{Key: "partition", Value: int32(0)}, {Key: "offset", Value: int64(7)}, {Key: "payload", Value: "junk"}, {Key: "unreadable", Value: true}})
	notRedrivable(malformed, "envelope could not be read")
	_, err = b.inbox().DeleteOne(ctx, bson.D{{Key: "_id", Value: malformed}})
	require.NoError(t, err)
	// The same badge on an error page.
	open("event?id=" + ordersTopic + "/none/none")
	require.Equal(t, "actions enabled", text(".mode"))
	require.Contains(t, text(".error"), "no inbox event")
	open("event?id=" + head.ID.String())
	b.heal.Store(true)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#redrive")), chromedp.WaitVisible(chromedp.CSS("#confirm"))))
	require.Equal(t, "1", stat("count"))
	shot("confirm")
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(`[data-stat="done"]`))))
	require.Equal(t, "1", stat("done"))
	// The head, then the two events held behind it, in order.
	waitFor(t, "the re-driven order and its held events handled", func() bool { return b.timesHandled("poison-1") == 3 })
	waitFor(t, "their inbox documents handled", func() bool {
		return count(t, b.inbox(), bson.D{{Key: "partition_key", Value: "poison-1"}, {Key: "handled", Value: true}, {Key: "parked", Value: false}}) == 3
	})
	open("event?id=" + head.ID.String())
	require.Equal(t, "handled", stat("state"))

	// Scheduled events: listed with a Cancel button each. Cancelling one
	// asks for confirmation, then deletes it; the other, moved into the
	// outbox between the confirmation and the click (as its publisher does
	// at its due time), is too late, said so, and stays. One due now is
	// published by the running service.
	open("scheduled")
	require.Equal(t, "2", stat("matching"))
	shot("scheduled")
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`[data-cancel="cancel-me"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm"))))
	require.Equal(t, "1", stat("count"))
	require.Equal(t, int64(2), count(t, scheduled, bson.D{}), "the confirmation changes nothing")
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(`[data-stat="done"]`))))
	require.Equal(t, "1", stat("done"))
	require.Equal(t, int64(0), count(t, scheduled, bson.D{{Key: "idempotency_key", Value: "cancel-me"}}))
	open("scheduled")
	require.Equal(t, "1", stat("matching"))
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`[data-cancel="late"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm"))))
	_, err = scheduled.UpdateOne(ctx, bson.D{{Key: "idempotency_key", Value: "late"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "promoted", Value: true}, {Key: "promoted_at", Value: time.Now()}}}})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(".error"))))
	require.Contains(t, text(".error"), "too late")
	shot("cancel-too-late")
	require.Equal(t, int64(1), count(t, scheduled, bson.D{{Key: "idempotency_key", Value: "late"}}), "not deleted")
	require.NoError(t, b.client.Transact(ctx, func(ctx context.Context) error {
		return outbox.Record(ctx, orderPlaced{OrderID: "due-now", Amount: 7}, outbox.WithIdempotencyKey("due-now"), outbox.WithDelay(200*time.Millisecond))
	}))
	waitFor(t, "the event due now handled", func() bool { return b.timesHandled("due-now") == 1 })
	open("scheduled")
	require.Equal(t, "0", stat("matching"))

	// A form posted from another site is refused, with the right cookie
	// attached by the browser and even a valid-looking token field.
	insert(t, b.inbox(), parkDoc("k-stays", "o-9", time.Now(), nil))
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s"><input name="scope" value="all"><input name="confirm" value="yes"><input name="csrf" value="%s"></form><script>document.getElementById("f").submit()</script>`,
			b.url("purge"), strings.Repeat("ab", 32))
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another site, not only another port
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(evilURL), chromedp.WaitReady(chromedp.CSS(".error"))))
	require.Contains(t, text(".error"), "CSRF")
	shot("csrf-refused")
	require.Equal(t, int64(1), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}), "the parked event is not purged")

	// DNS rebinding: the attacker's name now resolves to the console's
	// address. The browser reaches the console under that name, and gets
	// neither a page nor a token; its same-origin post is refused too.
	rebound := strings.Replace(b.url("parked"), "127.0.0.1", "rebind.attacker.test", 1)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(rebound), chromedp.WaitReady(chromedp.CSS("body"))))
	body := text("body")
	require.Contains(t, body, "DNS rebinding")
	require.NotContains(t, body, "k-stays")
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("purge", {method: "POST",
		headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "scope=all&confirm=yes"}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, http.StatusMisdirectedRequest, status)
	require.Equal(t, int64(1), count(t, b.inbox(), bson.D{{Key: "parked", Value: true}}), "the parked event is not purged")
}

// countOf counts the elements a CSS selector matches.
func countOf(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
	require.NoError(t, err)
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, what, cond)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type ctl struct {
	t      *testing.T
	uri    string
	db     *mongo.Database
	getenv func(string) string
}

func newCtl(t *testing.T) *ctl {
	t.Helper()
	env := mongotest.Start(t)
	db := env.DB(t)
	return &ctl{t: t, uri: env.URI, db: db, getenv: func(string) string { return "" }}
}

// run runs outboxctl with the test database and returns its exit status
// and outputs.
func (c *ctl) run(args ...string) (int, string, string) {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	args = append([]string{"-uri", c.uri, "-db", c.db.Name()}, args...)
	code := run(context.Background(), args, &stdout, &stderr, c.getenv)
	return code, stdout.String(), stderr.String()
}

// seed writes documents in the framework's storage format: two pending
// orders (one a minute old), one failed order, two parked events.
func (c *ctl) seed() {
	c.t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	outboxColl, inbox := c.db.Collection("outbox"), c.db.Collection("inbox")
	for i, created := range []time.Time{now.Add(-time.Minute), now} {
		_, err := outboxColl.InsertOne(ctx, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "topic", Value: "orders"},
			{Key: "partition", Value: int32(i)}, {Key: "schema", Value: "OrderPlaced.v1"}, {Key: "payload", Value: "{}"},
			{Key: "created_at", Value: created}, {Key: "published", Value: false}, {Key: "failed", Value: false}})
		require.NoError(c.t, err)
	}
	_, err := outboxColl.InsertOne(ctx, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "topic", Value: "orders"},
		{Key: "partition", Value: int32(2)}, {Key: "schema", Value: "OrderPlaced.v1"}, {Key: "payload", Value: "{\"big\":true}"},
		{Key: "created_at", Value: now}, {Key: "published", Value: false}, {Key: "failed", Value: true},
		{Key: "failed_at", Value: now}, {Key: "error", Value: "MESSAGE_TOO_LARGE: the message is too large"}, {Key: "attempts", Value: int32(1)}})
	require.NoError(c.t, err)
	for i, key := range []string{"k-1", "k-2"} {
		_, err := inbox.InsertOne(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: []string{"orders", "payments"}[i]}, {Key: "content_schema", Value: "Evt.v1"}, {Key: "idempotency_key", Value: key}}},
			{Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "parked_at", Value: now.Add(time.Duration(i-10) * time.Minute)},
			{Key: "attempts", Value: int32(3)}, {Key: "last_error", Value: "boom\nsecond line"}, {Key: "partition", Value: int32(0)},
			{Key: "offset", Value: int64(40 + i)}, {Key: "partition_key", Value: "pk"}, {Key: "received_at", Value: now}, {Key: "payload", Value: "{}"},
		})
		require.NoError(c.t, err)
	}
}

func (c *ctl) count(coll string, filter bson.D) int64 {
	c.t.Helper()
	n, err := c.db.Collection(coll).CountDocuments(context.Background(), filter)
	require.NoError(c.t, err)
	return n
}

var requested = bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}

func TestStatus(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	code, out, errOut := c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `pending\s+2\s+oldest 1m`, out)
	require.Regexp(t, `failed\s+1`, out)
	require.Regexp(t, `parked\s+2\s+held behind them 0, re-drive requested 0`, out)
	require.Regexp(t, `orders\s+2\s+1m\d*s?\s+1`, out)

	code, out, _ = c.run("status", "-json")
	require.Equal(t, exitOK, code)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 2, st["pending"])
	require.EqualValues(t, 1, st["failed"])
	require.EqualValues(t, 2, st["parked"])
	require.GreaterOrEqual(t, st["oldest_pending_age_seconds"], 60.0)
	require.NotContains(t, out, "unroutable")
}

// Issue 27, item 9: a pending event stored for a partition its topic does
// not have waited with no reason given; status names the cause.
func TestStatusNamesEventsBeyondThePartitionCount(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed() // pending orders on partitions 0 and 1
	_, err := c.db.Collection("outbox_meta").InsertOne(context.Background(), bson.D{
		{Key: "_id", Value: bson.D{{Key: "outbox", Value: "outbox"}, {Key: "topic", Value: "orders"}}}, {Key: "partitions", Value: 1}})
	require.NoError(t, err)
	code, out, errOut := c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, `warning: 1 pending events of topic "orders" are stored for partitions beyond its 1: no publisher owns those partitions`)
	code, out, _ = c.run("status", "-json")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, `"unroutable": 1`)
}

func TestParkedListRedrivePurge(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()

	code, out, errOut := c.run("parked", "list")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "LAST ERROR")
	require.Contains(t, lines[1], "orders/Evt.v1/k-1")
	require.Contains(t, lines[1], "0@40")
	require.Contains(t, lines[1], "boom second line")
	require.Contains(t, lines[2], "payments/Evt.v1/k-2")

	code, out, _ = c.run("parked", "list", "-topic", "payments", "-json")
	require.Equal(t, exitOK, code)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 1)
	// The id in the form redrive and purge take, and its fields.
	require.Equal(t, "payments/Evt.v1/k-2", listed[0]["id"])
	require.Equal(t, "k-2", listed[0]["inbox_id"].(map[string]any)["idempotency_key"])
	require.EqualValues(t, 41, listed[0]["offset"])
	code, out, errOut = c.run("-dry-run", "parked", "redrive", listed[0]["id"].(string))
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would request re-drive of 1")

	// Re-drive one: a dry run changes nothing.
	code, out, _ = c.run("-dry-run", "parked", "redrive", "orders/Evt.v1/k-1")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "dry run: would request re-drive of 1")
	require.Zero(t, c.count("inbox", requested))
	code, out, _ = c.run("parked", "redrive", "orders/Evt.v1/k-1", "-json")
	require.Equal(t, exitOK, code)
	require.JSONEq(t, `{"command":"parked redrive","dry_run":false,"count":1}`, out)
	require.EqualValues(t, 1, c.count("inbox", requested))
	code, out, _ = c.run("parked", "list")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "requested")

	// Unknown id: failure; no id and no -all, or both: usage.
	code, _, errOut = c.run("parked", "redrive", "orders/Evt.v1/nope")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "not parked")
	code, _, errOut = c.run("parked", "redrive")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "-all")
	code, _, _ = c.run("parked", "purge", "-all", "orders/Evt.v1/k-1")
	require.Equal(t, exitUsage, code)
	code, _, errOut = c.run("parked", "purge", "not-an-id")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "topic/schema/key")

	// Purge all: dry run, then for real.
	code, out, _ = c.run("parked", "purge", "-all", "-dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "would purge 2")
	require.EqualValues(t, 2, c.count("inbox", bson.D{{Key: "parked", Value: true}}))
	code, out, _ = c.run("parked", "purge", "-all", "-topic", "payments")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "purged 1")
	require.EqualValues(t, 1, c.count("inbox", bson.D{{Key: "parked", Value: true}}))
	require.EqualValues(t, 1, c.count("inbox", bson.D{{Key: "handled", Value: true}, {Key: "discarded_at", Value: bson.D{{Key: "$exists", Value: true}}}}))
}

func TestOutboxFailed(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	code, out, errOut := c.run("outbox", "failed", "list")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "orders/2")
	require.Contains(t, out, "MESSAGE_TOO_LARGE")

	code, out, _ = c.run("outbox", "failed", "list", "-json")
	require.Equal(t, exitOK, code)
	var failed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &failed))
	require.Len(t, failed, 1)
	id := failed[0]["id"].(string)

	code, out, _ = c.run("outbox", "failed", "retry", id, "-dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "would retry 1")
	require.EqualValues(t, 1, c.count("outbox", bson.D{{Key: "failed", Value: true}}))
	code, out, _ = c.run("outbox", "failed", "retry", "-all")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "retrying 1")
	require.Zero(t, c.count("outbox", bson.D{{Key: "failed", Value: true}}))
	code, _, errOut = c.run("outbox", "failed", "retry", id)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "no failed outbox event")
}

func TestUsageAndEnvironment(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"status"}, &stdout, &stderr, func(string) string { return "" })
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr.String(), "MONGODB_URI")

	c.seed()
	env := map[string]string{"MONGODB_URI": c.uri, "OUTBOX_DB": c.db.Name()}
	stderr.Reset()
	code = run(context.Background(), []string{"status", "-json"}, &stdout, &stderr, func(k string) string { return env[k] })
	require.Equal(t, exitOK, code, stderr.String())

	for _, args := range [][]string{{"frobnicate"}, {"parked"}, {"outbox", "failed"}, {"status", "-no-such-flag"}, {"status", "-before", "yesterday"},
		{"outbox", "failed", "retry", "123"}, {"outbox", "failed", "discard", "6650a1b2c3d4e5f601234567", "nope"}, {"parked", "redrive", "no-slashes"}} {
		code, _, _ := c.run(args...)
		require.Equal(t, exitUsage, code, args)
	}
	code, _, _ = c.run("-h")
	require.Equal(t, exitOK, code)
	// The unknown command's message lists every command (it left out
	// migrate).
	_, _, errOut := c.run("frobnicate")
	for _, cmd := range []string{"status", "doctor", "parked list|redrive|purge", "outbox failed list|retry|discard", "migrate event-outbox", "ui"} {
		require.Contains(t, errOut, cmd)
	}
}

// The connection string is never printed, nor any form of its password,
// whatever the password holds and whatever is wrong: a password with an
// unescaped space or tab in a URI with a bad option used to be printed
// whole in the error of status and ui, and one with "@" everything after
// it. Every command, with passwords holding specials, raw or escaped.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	commands := [][]string{
		{"status"}, {"parked", "list"}, {"parked", "redrive", "orders/Evt.v1/k-1"}, {"parked", "purge", "-all"},
		{"outbox", "failed", "list"}, {"outbox", "failed", "retry", "-all"}, {"outbox", "failed", "discard", "-all"},
		{"migrate", "event-outbox", "-partitions", "orders=3", "-brokers", "127.0.0.1:1"}, {"ui", "-find-indexes", "-addr", "127.0.0.1:0"},
	}
	// Every piece of each password holds the marker Q7z, which must never
	// be printed: not the password, nor any part of it.
	for _, pw := range []string{"Q7za Q7zb", "Q7za\tQ7zb", "Q7z@Q7zb", "Q7z@Q7z w0Q7z/Q7z?Q7z#Q7z", "Q7zhunter%zz", "Q7z:Q7z@Q7z/%41+Q7z", "ünQ7z cödQ7z"} {
		t.Run(pw, func(t *testing.T) {
			t.Parallel()
			const fast = "serverSelectionTimeoutMS=200&connectTimeoutMS=200"
			uris := map[string]string{
				"bad option":  "mongodb://app:" + pw + "@127.0.0.1:1/?serverSelectionTimeoutMS=abc",
				"raw":         "mongodb://app:" + pw + "@127.0.0.1:1/?" + fast,
				"escaped":     "mongodb://app:" + url.QueryEscape(pw) + "@127.0.0.1:1/?" + fast,
				"no host":     "mongodb://app:" + pw + "@",
				"srv":         "mongodb+srv://app:" + url.QueryEscape(pw) + "@h1,h2/?" + fast,
				"bad escape":  "mongodb://app:" + pw + "%zz@127.0.0.1:1/?" + fast,
				"two options": "mongodb://app:" + pw + "@127.0.0.1:1/?tls=maybe&w=nonsense",
			}
			for name, uri := range uris {
				for _, cmd := range commands {
					var stdout, stderr bytes.Buffer
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					code := run(ctx, append([]string{"-uri", uri, "-db", "x", "-timeout", "2s"}, cmd...), &stdout, &stderr,
						func(string) string { return "" })
					cancel()
					out := stdout.String() + stderr.String()
					what := fmt.Sprintf("%s %v: %s", name, cmd, out)
					require.NotEqual(t, exitOK, code, what)
					require.NotEmpty(t, stderr.String(), what)
					require.NotContains(t, out, "Q7z", what)
					require.NotContains(t, out, "mongodb://", what)
					require.NotContains(t, out, "mongodb+srv://", what)
					if name == "bad option" && !strings.ContainsAny(pw, "%@") {
						require.Contains(t, out, "serverSelectionTimeoutMS", "the invalid option is named: "+what)
					}
				}
			}
		})
	}
	require.Equal(t, "connect to xxxxx failed", redact("connect to p@ss failed", uriSecrets("mongodb://u:p@ss@h")))
	require.Equal(t, "h1:1,h2", uriHosts("mongodb://u:p@s/s?x@h1:1,h2/db?a=b"))
}

func TestOutboxFailedHeldAndDiscard(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	now := time.Now().UTC()
	coll := c.db.Collection("outbox")
	doc := func(key string, failed bool) bson.D {
		d := bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "topic", Value: "orders"}, {Key: "partition", Value: int32(5)},
			{Key: "key", Value: key}, {Key: "schema", Value: "OrderPlaced.v1"}, {Key: "payload", Value: "{}"},
			{Key: "created_at", Value: now}, {Key: "published", Value: false}, {Key: "failed", Value: failed}}
		if failed {
			d = append(d, bson.E{Key: "failed_at", Value: now}, bson.E{Key: "error", Value: "MESSAGE_TOO_LARGE"})
		}
		return d
	}
	for _, d := range []bson.D{doc("k", true), doc("k", false), doc("k", false), doc("other", false)} {
		_, err := coll.InsertOne(ctx, d)
		require.NoError(t, err)
	}
	code, out, errOut := c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `failed\s+1\s+held keys 1, held events 2`, out)
	code, out, _ = c.run("status", "-json")
	require.Equal(t, exitOK, code)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 1, st["outbox_held_keys"])
	require.EqualValues(t, 2, st["outbox_held_events"])

	code, out, _ = c.run("outbox", "failed", "discard", "-all", "-dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "would discard 1")
	require.EqualValues(t, 4, c.count("outbox", bson.D{}))
	code, out, _ = c.run("outbox", "failed", "discard", "-all")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "discarded 1")
	require.EqualValues(t, 3, c.count("outbox", bson.D{}))
	require.Zero(t, c.count("outbox", bson.D{{Key: "failed", Value: true}}))
	code, out, _ = c.run("status")
	require.Equal(t, exitOK, code)
	require.Regexp(t, `failed\s+0\s+held keys 0, held events 0`, out)
}

// A mistyped database or collection name must not read as a healthy,
// empty service.
func TestStatusOfMissingDatabaseOrCollections(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-uri", c.uri, "-db", c.db.Name() + "_no_such_db", "status"}, &stdout, &stderr, c.getenv)
	require.Equal(t, exitFailure, code, stdout.String())
	require.Contains(t, stderr.String(), `database "`+c.db.Name()+`_no_such_db" does not exist`)
	require.Empty(t, stdout.String())

	// The database exists, the collections do not.
	_, err := c.db.Collection("business").InsertOne(context.Background(), bson.D{{Key: "x", Value: 1}})
	require.NoError(t, err)
	code, out, errOut := c.run("status")
	require.Equal(t, exitFailure, code, out)
	require.Contains(t, errOut, `neither an outbox collection "outbox" nor an inbox collection "inbox"`)
	code, _, errOut = c.run("-outbox", "outbx", "status", "-json")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, `"outbx"`)

	// A service that only publishes has no inbox: a warning, exit 0.
	_, err = c.db.Collection("outbox").InsertOne(context.Background(), bson.D{{Key: "published", Value: true}})
	require.NoError(t, err)
	code, out, errOut = c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, `warning: database "`+c.db.Name()+`" has no inbox collection "inbox"`)
	require.Regexp(t, `pending\s+0`, out)
}

func TestFailedIDsMustBeObjectIDs(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	code, _, errOut := c.run("outbox", "failed", "retry", "123")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `id "123": want the 24 hex digits of an ObjectID`)
}

// A malformed record that can never be re-driven is refused with the
// reason, and -all leaves it out.
func TestParkedRedriveRefusesUnreadable(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	_, err := c.db.Collection("inbox").InsertOne(context.Background(), bson.D{
		{Key: "_id", Value: bson.D{{Key: "topic", Value: "orders"}, {Key: "content_schema", Value: "unknown"}, {Key: "idempotency_key", Value: "malformed:0:9"}}},
		{Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "parked_at", Value: time.Now().UTC()},
		{Key: "attempts", Value: int32(1)}, {Key: "last_error", Value: "outbox: malformed record: missing header outbox-version"},
		{Key: "partition", Value: int32(0)}, {Key: "offset", Value: int64(9)}, {Key: "payload", Value: "junk"}, {Key: "unreadable", Value: true},
	})
	require.NoError(t, err)
	code, _, errOut := c.run("parked", "redrive", "orders/unknown/malformed:0:9")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "malformed record cannot be re-driven")
	require.Contains(t, errOut, "purge it instead")
	require.Zero(t, c.count("inbox", requested))

	code, out, errOut := c.run("parked", "redrive", "-all")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "requested re-drive of 2 parked event(s)")
	require.EqualValues(t, 2, c.count("inbox", requested))
}

// A change naming several ids, some of which match nothing, changes the
// others, names each id that matched nothing on stderr and exits 1: a
// script must not take a partial change for a whole one.
func TestChangeWithUnmatchedIDsFails(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	parked := bson.D{{Key: "parked", Value: true}}

	code, out, errOut := c.run("-dry-run", "parked", "purge", "orders/Evt.v1/k-1", "orders/Evt.v1/nope")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "would purge 1")
	require.Contains(t, errOut, "no parked event with id orders/Evt.v1/nope")
	require.EqualValues(t, 2, c.count("inbox", parked))

	code, out, errOut = c.run("parked", "redrive", "orders/Evt.v1/gone", "orders/Evt.v1/k-1", "payments/Evt.v1/nope")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "requested re-drive of 1")
	require.Contains(t, errOut, "no parked event with id orders/Evt.v1/gone\n")
	require.Contains(t, errOut, "no parked event with id payments/Evt.v1/nope\n")
	require.EqualValues(t, 1, c.count("inbox", requested))

	code, out, errOut = c.run("parked", "purge", "orders/Evt.v1/k-1", "orders/Evt.v1/nope")
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "purged 1")
	require.Contains(t, errOut, "no parked event with id orders/Evt.v1/nope")
	require.NotContains(t, errOut, "k-1")
	require.EqualValues(t, 1, c.count("inbox", parked))

	failed := bson.D{{Key: "failed", Value: true}}
	var ev struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(t, c.db.Collection("outbox").FindOne(context.Background(), failed).Decode(&ev))
	unknown := bson.NewObjectID().Hex()
	for _, action := range []string{"retry", "discard"} {
		code, _, errOut = c.run("-dry-run", "outbox", "failed", action, ev.ID.Hex(), unknown)
		require.Equal(t, exitFailure, code, errOut)
		require.Contains(t, errOut, "no failed outbox event with id "+unknown)
		require.NotContains(t, errOut, ev.ID.Hex())
	}
	code, out, errOut = c.run("outbox", "failed", "retry", unknown, ev.ID.Hex())
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, out, "retrying 1")
	require.Contains(t, errOut, "no failed outbox event with id "+unknown)
	require.Zero(t, c.count("outbox", failed))
}

// -scheduled lists and discards the scheduled events whose promotion was
// refused, not the outbox's failed events.
func TestOutboxFailedScheduled(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	c.seed()
	id := bson.NewObjectID()
	now := time.Now().UTC()
	_, err := c.db.Collection("outbox_scheduled").InsertOne(context.Background(), bson.D{{Key: "_id", Value: id},
		{Key: "topic", Value: "orders"}, {Key: "partition", Value: int32(0)}, {Key: "schema", Value: "OrderPlaced.v1"},
		{Key: "payload", Value: "{}"}, {Key: "created_at", Value: now}, {Key: "due_at", Value: now}, {Key: "promoted", Value: false},
		{Key: "published", Value: false}, {Key: "failed", Value: true}, {Key: "failed_at", Value: now},
		{Key: "error", Value: "promotion refused: duplicate"}})
	require.NoError(t, err)
	code, out, errOut := c.run("-scheduled", "outbox", "failed", "list")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, id.Hex())
	require.NotContains(t, out, "MESSAGE_TOO_LARGE", "the outbox's failed event is not listed")

	code, out, errOut = c.run("-scheduled", "outbox", "failed", "discard", "-all")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "discarded 1")
	require.Zero(t, c.count("outbox_scheduled", bson.D{}))
	require.EqualValues(t, 1, c.count("outbox", bson.D{{Key: "failed", Value: true}}), "the outbox's failed event stays")
}

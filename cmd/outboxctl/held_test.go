package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/store"
)

// Issue 12 item 6: parked list and status show held events and what they
// wait for.
func TestParkedListShowsHeld(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	now := time.Now().UTC()
	id := func(key string) bson.D {
		return bson.D{{Key: "topic", Value: "orders"}, {Key: "content_schema", Value: "Evt.v1"}, {Key: "idempotency_key", Value: key}}
	}
	for i, key := range []string{"head", "held"} {
		doc := bson.D{{Key: "_id", Value: id(key)}, {Key: "handled", Value: false}, {Key: "parked", Value: true},
			{Key: "parked_at", Value: now.Add(time.Duration(i) * time.Second)}, {Key: "partition", Value: int32(0)},
			{Key: "offset", Value: int64(i)}, {Key: "partition_key", Value: "pk"}, {Key: "payload", Value: "{}"}}
		if key == "held" {
			doc = append(doc, bson.E{Key: "held_by", Value: id("head")})
		}
		_, err := c.db.Collection("inbox").InsertOne(ctx, doc)
		require.NoError(t, err)
	}
	code, out, errOut := c.run("parked", "list")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "STATE")
	require.Contains(t, lines[0], "HELD BY")
	require.Regexp(t, `^orders/Evt.v1/head\s+parked\s+-\s`, lines[1])
	require.Regexp(t, `^orders/Evt.v1/held\s+held\s+orders/Evt.v1/head\s`, lines[2])

	code, out, _ = c.run("parked", "list", "-json")
	require.Equal(t, exitOK, code)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 2)
	require.Equal(t, "held", listed[1]["state"])
	require.Equal(t, "orders/Evt.v1/held", listed[1]["id"])
	require.Equal(t, "orders/Evt.v1/head", listed[1]["held_by"], "the id re-drive and purge take")

	code, out, _ = c.run("status")
	require.Equal(t, exitOK, code)
	require.Regexp(t, `parked\s+1\s+held behind them 1, re-drive requested 0`, out)
	code, out, _ = c.run("status", "-json")
	require.Equal(t, exitOK, code)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 1, st["held"])

	// A re-drive of every parked event requests the head's alone: its
	// re-drive releases the held event (the dry run counted both).
	for _, dry := range []string{"-dry-run", ""} {
		args := []string{"parked", "redrive", "-all", "-json"}
		if dry != "" {
			args = append(args, dry)
		}
		code, out, errOut = c.run(args...)
		require.Equal(t, exitOK, code, errOut)
		require.JSONEq(t, fmt.Sprintf(`{"command":"parked redrive","dry_run":%t,"count":1}`, dry != ""), out)
	}
}

// status shows the scheduled events waiting, per topic, with the next
// due time.
func TestStatusShowsScheduled(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	require.NoError(t, c.db.CreateCollection(ctx, "outbox"))
	due := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, topic := range []string{"orders", "orders", "payments"} {
		d := &store.ScheduledDoc{DueAt: due.Add(time.Duration(i) * time.Hour)}
		d.ID, d.Topic, d.Key, d.Schema, d.IdempotencyKey, d.Payload = bson.NewObjectID(), topic, "k", "Evt.v1", fmt.Sprintf("s%d", i), "{}"
		_, err := c.db.Collection("outbox"+store.ScheduledSuffix).InsertOne(ctx, d)
		require.NoError(t, err)
	}
	code, out, errOut := c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `scheduled\s+3\s+next due 2030-01-02T03:04:05Z, promotion refused 0`, out)
	require.Regexp(t, `orders\s+2\s+next due 2030-01-02T03:04:05Z`, out)
	require.Regexp(t, `payments\s+1\s+next due 2030-01-02T05:04:05Z`, out)
}

// status shows the payloads stored out of band that wait for their
// events' publication, and the parked events whose payload was not
// resolved.
func TestStatusShowsClaimCheck(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	now := time.Now().UTC()
	for i, size := range []int64{0, 5000, 7000} {
		d := store.OutboxDoc{ID: bson.NewObjectID(), Topic: "orders", Key: "k", Schema: "Evt.v1",
			IdempotencyKey: fmt.Sprintf("o%d", i), CreatedAt: now.Add(-time.Duration(i) * time.Minute), PayloadSize: size}
		if size > 0 {
			ref := d.ID
			d.PayloadRef = &ref
		} else {
			d.Payload = "{}"
		}
		_, err := c.db.Collection("outbox").InsertOne(ctx, &d)
		require.NoError(t, err)
	}
	// Parked without its payload: unresolved. Parked with it (its handler
	// failed) and held behind another: not.
	parked := func(key, payload string, extra ...bson.E) {
		doc := bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: "orders"}, {Key: "content_schema", Value: "Evt.v1"}, {Key: "idempotency_key", Value: key}}},
			{Key: "handled", Value: false}, {Key: "parked", Value: true}, {Key: "parked_at", Value: now}, {Key: "payload", Value: payload},
			{Key: "payload_ref", Value: "outbox-payload:0123456789abcdef01234567"}}
		_, err := c.db.Collection("inbox").InsertOne(ctx, append(doc, extra...))
		require.NoError(t, err)
	}
	parked("p", "")
	parked("resolved", `{"big":"payload"}`)
	parked("held", "", bson.E{Key: "held_by", Value: bson.D{{Key: "topic", Value: "orders"}, {Key: "content_schema", Value: "Evt.v1"}, {Key: "idempotency_key", Value: "resolved"}}})
	code, out, errOut := c.run("status")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `claim check\s+2\s+payloads out of band waiting for publication, 12000 bytes, oldest 2m0s; parked unresolved 1`, out)
}

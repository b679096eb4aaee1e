package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// A key with a slash used to misaddress events: B {schema OrderPlaced.v1,
// key order/42} and A {schema OrderPlaced.v1/order, key 42} printed the
// same id, and "parked purge" of it purged A and left B parked. Every id
// "parked list" prints, whatever its parts hold, now names its own event.
func TestParkedIDsRoundTripWhateverTheyHold(t *testing.T) {
	t.Parallel()
	c := newCtl(t)
	ctx := context.Background()
	ids := []outbox.InboxID{
		{Topic: "orders", ContentSchema: "OrderPlaced.v1/order", IdempotencyKey: "42"},
		{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "order/42"},
	}
	r := rand.New(rand.NewPCG(5, 6))
	parts := []string{"/", "%", "%2F", "%25", "+", " ", "\t", "\n", "?", "#", "é", "a", "Z", "-"}
	word := func() string {
		var s strings.Builder
		for range 1 + r.IntN(6) {
			s.WriteString(parts[r.IntN(len(parts))])
		}
		return s.String()
	}
	for range 40 {
		ids = append(ids, outbox.InboxID{Topic: "orders", ContentSchema: word(), IdempotencyKey: word()})
	}
	seen := map[outbox.InboxID]bool{}
	for i, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		_, err := c.db.Collection("inbox").InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: false},
			{Key: "parked", Value: true}, {Key: "parked_at", Value: time.Now().UTC().Add(time.Duration(i) * time.Millisecond)},
			{Key: "attempts", Value: int32(1)}, {Key: "partition", Value: int32(0)}, {Key: "offset", Value: int64(i)},
			{Key: "partition_key", Value: "pk"}, {Key: "payload", Value: "{}"}})
		require.NoError(t, err)
	}

	code, out, errOut := c.run("parked", "list", "-json", "-limit", "0")
	require.Equal(t, exitOK, code, errOut)
	var listed []struct {
		ID      string         `json:"id"`
		InboxID outbox.InboxID `json:"inbox_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, len(seen))
	for _, e := range listed {
		back, err := outbox.ParseInboxID(e.ID)
		require.NoError(t, err, e.ID)
		require.Equal(t, e.InboxID, back, e.ID)
	}
	// The table's ids are one field each: no tab or newline breaks a row.
	code, out, _ = c.run("parked", "list", "-limit", "0")
	require.Equal(t, exitOK, code)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), len(seen)+1)
	for id := range seen {
		require.Contains(t, out, id.String())
	}

	// Purge B by its id: B alone.
	code, out, errOut = c.run("parked", "purge", ids[1].String())
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "purged 1")
	require.Zero(t, c.count("inbox", bson.D{{Key: "_id", Value: ids[1]}, {Key: "parked", Value: true}}), "B purged")
	require.EqualValues(t, 1, c.count("inbox", bson.D{{Key: "_id", Value: ids[0]}, {Key: "parked", Value: true}}), "A untouched")

	// An id with a stray slash is refused, saying how to write one.
	code, _, errOut = c.run("parked", "purge", "orders/OrderPlaced.v1/order/42")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "%2F")
}

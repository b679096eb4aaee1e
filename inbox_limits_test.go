package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// A record too large to store whole in the inbox (near MongoDB's 16 MiB
// document limit) is still parked, or its partition would retry it for ever:
// with a truncated payload and a note, and it cannot be re-driven from it.
func TestOversizeRecordIsParkedTruncated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "big")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		return errors.New("too big to handle")
	})
	env := b.keyed("big-1", "big")
	env.OccurredAt = time.Now()
	pad := strings.Repeat("é", 9<<20) // 18 MiB of two-byte runes
	rec := encodeRecord(&env, []byte(`{"run":"`+b.run+`","order_id":"big","pad":"`+pad+`"}`))
	rec.Partition = 0
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // 16 MiB documents are slow under -race
	defer cancel()
	h := c.host()
	tp := consume.TopicPartition{Topic: ordersTopic, Partition: 0}
	e := h.Decode(rec)
	require.NoError(t, e.Fault)
	_, err := h.Park(ctx, tp, e, errors.New("too big to handle"), 1, 1, "handler_error")
	require.NoError(t, err)

	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	p := parked[0]
	require.True(t, p.PayloadTruncated)
	require.LessOrEqual(t, len(p.Payload), maxStoredPayload)
	require.Greater(t, len(p.Payload), maxStoredPayload-4)
	require.True(t, strings.HasPrefix(p.Payload, `{"run":"`+b.run))
	require.Contains(t, p.LastError, "too big to handle")
	require.Contains(t, p.LastError, "truncated")
	require.ErrorIs(t, c.Redrive(ctx, p.ID), ErrPayloadTruncated)

	// A held event is stored the same way.
	r2 := withKey(rec, b, "big-2")
	e2 := h.Decode(r2)
	e2.Offset = r2.Offset
	require.NoError(t, h.Hold(ctx, tp, e2))
	var doc inboxDoc
	require.NoError(t, c.inbox.FindOne(ctx, bson.D{{Key: "_id.idempotency_key", Value: "big-2"}}).Decode(&doc))
	require.True(t, doc.PayloadTruncated)
	require.Equal(t, &p.ID, doc.HeldBy)
}

func withKey(rec *kgo.Record, b *bundle, key string) *kgo.Record {
	env := b.keyed(key, "big")
	env.OccurredAt = time.Now()
	r := encodeRecord(&env, rec.Value)
	r.Partition = rec.Partition
	r.Offset = rec.Offset + 1
	return r
}

// Failure notes and parks are written before the offset is committed, in
// transactions of their own (so that a lock held by a dead replica's
// transaction fails them at once); the commits of those transactions ask for
// majority write concern explicitly, whatever the client's default.
func TestFailureNotesUseMajorityWriteConcern(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var notes []bson.Raw
	noteTxns := map[string]bool{} // lsid and txnNumber of the notes
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		txn := e.Command.Lookup("lsid").String() + e.Command.Lookup("txnNumber").String()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case (e.CommandName == "update" || e.CommandName == "findAndModify") && strings.Contains(e.Command.String(), "last_error"):
			_, err := e.Command.LookupErr("autocommit")
			require.NoError(t, err, "a failure note outside a transaction: %s", e.Command)
			noteTxns[txn] = true
		case e.CommandName == "commitTransaction" && noteTxns[txn]:
			notes = append(notes, append(bson.Raw(nil), e.Command...))
		}
	}}
	b := setup(t, mongotest.ClientOptions(options.Client().SetMonitor(monitor)))
	cfg := consumerConfig(b, "wc")
	cfg.MaxAttempts = 2
	c := b.client(t, cfg)
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error { return errors.New("no") })
	start(t, c)
	b.produce(t, b.envelope("wc-1"), b.payload(t, "o", 0))
	eventually(t, "parked", func() bool { return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 1 })
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(notes), 2, "a failure note and a park")
	for _, cmd := range notes {
		w, err := cmd.LookupErr("writeConcern", "w")
		require.NoError(t, err, "no write concern in %s", cmd)
		require.Equal(t, "majority", w.StringValue())
	}
}

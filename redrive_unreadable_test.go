package outbox

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// A record whose envelope could not be read can never be re-driven: a
// request for it is refused at once, with a message saying what to do,
// instead of staying "re-drive requested" forever. A record whose payload
// failed to decode can still be re-driven (a later version may accept it).
func TestRedriveRefusesUnreadableRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := consumerConfig(b, "pay")
	cfg.PoisonPolicy = SkipEvent // the records share a key
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produceRaw(t, &kgo.Record{Topic: ordersTopic, Partition: 0, Value: []byte("no headers at all")})
	badKey := b.envelope("x")
	badKey.OccurredAt = time.Now()
	rec := encodeRecord(&badKey, []byte(`{}`))
	// A native record with a key but an unsupported wire version.
	for i := range rec.Headers {
		if rec.Headers[i].Key == HeaderVersion {
			rec.Headers[i].Value = []byte("99")
		}
	}
	rec.Partition = 0
	b.produceRaw(t, rec)
	b.produce(t, b.envelope("bad-json"), []byte(`{"order_id": 12`))
	eventually(t, "three malformed records parked", func() bool {
		return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 3
	})
	noKey := InboxID{Topic: ordersTopic, ContentSchema: "unknown", IdempotencyKey: "malformed:0:0"}
	badVersion := InboxID{Topic: ordersTopic, ContentSchema: orderPlaced{}.ContentSchema(), IdempotencyKey: "x"}
	badJSON := InboxID{Topic: ordersTopic, ContentSchema: orderPlaced{}.ContentSchema(), IdempotencyKey: "bad-json"}
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: badVersion}, {Key: "unreadable", Value: true}}))
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: noKey}, {Key: "unreadable", Value: true}}))
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "_id", Value: badJSON}, {Key: "unreadable", Value: true}}))

	admin := c.Admin()
	requested := bson.D{{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}}}
	for _, id := range []InboxID{noKey, badVersion} {
		for _, dry := range []bool{true, false} {
			n, err := admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{id, badJSON}}, dry)
			require.ErrorIs(t, err, ErrNotRedrivable, "%s dry=%v", id, dry)
			require.ErrorContains(t, err, id.String())
			require.ErrorContains(t, err, "purge it instead")
			require.Zero(t, n)
		}
		require.ErrorIs(t, c.Redrive(ctx, id), ErrNotRedrivable)
	}
	require.Zero(t, count(t, c.inbox, requested), "a refused request marks nothing")

	// A selection without ids leaves them out.
	n, err := admin.RequestRedrive(ctx, ParkedFilter{Topic: ordersTopic}, true)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	// Documents parked before the unreadable flag existed, known only by
	// their invented key, are flagged at start (EnsureIndexes).
	_, err = c.inbox.UpdateOne(ctx, bson.D{{Key: "_id", Value: noKey}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "unreadable", Value: ""}}}})
	require.NoError(t, err)
	require.NoError(t, c.EnsureIndexes(ctx))
	_, err = admin.RequestRedrive(ctx, ParkedFilter{IDs: []InboxID{noKey}}, false)
	require.ErrorIs(t, err, ErrNotRedrivable)

	n, err = admin.RequestRedrive(ctx, ParkedFilter{}, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, count(t, c.inbox, append(bson.D{{Key: "_id", Value: badJSON}}, requested...)))
	require.EqualValues(t, 1, count(t, c.inbox, requested))

	// Purging is the way out.
	n, err = admin.PurgeParked(ctx, ParkedFilter{IDs: []InboxID{noKey, badVersion}}, false)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

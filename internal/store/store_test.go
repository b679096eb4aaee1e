package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestSameBSONComparesIndexDefinitions(t *testing.T) {
	t.Parallel()
	key := bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int64(-1)}}
	require.True(t, SameBSON(key, bson.D{{Key: "a", Value: 1.0}, {Key: "b", Value: -1}}, true), "numbers by value")
	require.False(t, SameBSON(key, bson.D{{Key: "b", Value: -1}, {Key: "a", Value: 1}}, true), "a key pattern is ordered")
	filter := bson.D{{Key: "x", Value: true}, {Key: "y", Value: "s"}}
	require.True(t, SameBSON(filter, bson.M{"y": "s", "x": true}, false), "a partial filter is a conjunction")
	require.False(t, SameBSON(filter, bson.D{{Key: "x", Value: true}}, false))
	require.False(t, SameBSON(bson.D{}, 1, false))
}

func TestFindEquivalentsMatchesByDefinitionNotName(t *testing.T) {
	t.Parallel()
	spec := InboxIndexes(time.Hour)[2]
	require.Equal(t, IndexInboxTTL, spec.Name)
	other := bson.D{{Key: "key", Value: bson.D{{Key: InboxHandledAt, Value: int32(1)}}}, {Key: "name", Value: "expiration"},
		{Key: "partialFilterExpression", Value: bson.D{{Key: InboxHandled, Value: true}}}, {Key: "expireAfterSeconds", Value: int32(60)}}
	unrelated := bson.D{{Key: "key", Value: bson.D{{Key: InboxHandledAt, Value: int32(1)}}}, {Key: "name", Value: IndexInboxTTL}}
	require.Equal(t, []bson.D{other}, FindEquivalents([]bson.D{unrelated, other}, spec))
	ttl, ok := IndexTTL(other)
	require.True(t, ok)
	require.EqualValues(t, 60, ttl)
	require.Equal(t, "expiration", IndexName(other))
}

func TestSameIndexKeysNeverPanics(t *testing.T) {
	t.Parallel()
	raw, err := bson.Marshal(bson.D{{Key: "payload.topic", Value: 1.0}, {Key: "payload.content_schema", Value: int64(1)},
		{Key: "payload.idempotency_key", Value: int32(1)}})
	require.NoError(t, err)
	require.True(t, SameIndexKeys(raw, LibraryIdempotencyKeys()))
	require.False(t, SameIndexKeys(raw, bson.D{{Key: "payload.topic", Value: "1"}, {Key: "payload.content_schema", Value: 1},
		{Key: "payload.idempotency_key", Value: 1}}), "a want of another type is no match, not a panic")
	require.False(t, SameIndexKeys(bson.Raw{1, 2}, LibraryIdempotencyKeys()))
}

func TestEnsureIndexesAdjustsTTLAndReportsConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Start(t).DB(t)
	coll := db.Collection("outbox")
	require.NoError(t, EnsureIndexes(ctx, coll, OutboxIndexes(time.Hour, true)...))
	require.NoError(t, EnsureIndexes(ctx, coll, OutboxIndexes(2*time.Hour, true)...), "idempotent, and a new retention")
	ixs, err := ListIndexes(ctx, coll)
	require.NoError(t, err)
	found := false
	for _, ix := range ixs {
		if IndexName(ix) == IndexOutboxTTL {
			ttl, _ := IndexTTL(ix)
			require.EqualValues(t, 7200, ttl)
			found = true
		}
	}
	require.True(t, found)

	other := db.Collection("other")
	_, err = other.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "x", Value: 1}},
		Options: options.Index().SetName(IndexOutboxFailed)})
	require.NoError(t, err)
	err = EnsureIndexes(ctx, other, OutboxIndexes(time.Hour, false)...)
	require.ErrorIs(t, err, ErrIndexConflict)

	none, err := ListIndexes(ctx, db.Collection("absent"))
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestStampInboxKeepsTheFirstOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	meta := mongotest.Start(t).DB(t).Collection(MetaCollection)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = StampInbox(ctx, meta, "in", "g1", "s1")
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	st, err := StampInbox(ctx, meta, "in", "g2", "s2")
	require.NoError(t, err)
	require.Equal(t, "g1", st.ConsumerGroup, "set on insert only")
	require.Equal(t, "s1", st.Service)
}

func TestReadInboxStampIsNilUntilStamped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	meta := mongotest.Start(t).DB(t).Collection(MetaCollection)
	st, err := ReadInboxStamp(ctx, meta, "in")
	require.NoError(t, err)
	require.Nil(t, st)
	_, err = StampInbox(ctx, meta, "in", "g1", "s1")
	require.NoError(t, err)
	st, err = ReadInboxStamp(ctx, meta, "in")
	require.NoError(t, err)
	require.Equal(t, "g1", st.ConsumerGroup)
	require.Equal(t, "s1", st.Service)
}

// The sampled sizes count only the fields that go into a record, newest
// event first.
func TestLatestEventSizesSumTheRecordFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	outbox := mongotest.Start(t).DB(t).Collection("outbox")
	older := bson.D{{Key: OutboxID, Value: bson.NewObjectID()}, {Key: OutboxTopic, Value: "t"}, {Key: OutboxPayload, Value: "12345"}}
	newer := bson.D{{Key: OutboxID, Value: bson.NewObjectID()}, {Key: OutboxTopic, Value: "u"}, {Key: OutboxPayload, Value: "ab"},
		{Key: OutboxKey, Value: "k"}, {Key: OutboxSchema, Value: "s1"}, {Key: OutboxFormat, Value: "not a record field"}}
	_, err := outbox.InsertMany(ctx, []any{older, newer})
	require.NoError(t, err)
	sizes, err := LatestEventSizes(ctx, outbox, 1)
	require.NoError(t, err)
	require.Len(t, sizes, 1)
	require.Equal(t, "u", sizes[0].Topic)
	require.EqualValues(t, 5, sizes[0].Size)
	fields, err := EventRecordFields(ctx, outbox, sizes[0].ID)
	require.NoError(t, err)
	require.Equal(t, "abks1", fields, "payload, key, schema, in RecordFields' order")
	_, err = EventRecordFields(ctx, outbox, bson.NewObjectID())
	require.ErrorIs(t, err, mongo.ErrNoDocuments)
}

// The reset claim of a recreated topic is claimed once, per group, topic
// and topic id; a withdrawal leaves a done claim alone.
func TestTopicResetsClaimOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	meta := mongotest.Start(t).DB(t).Collection(MetaCollection)
	a := TopicResets{Meta: meta, Group: "g", Replica: "a"}
	b := TopicResets{Meta: meta, Group: "g", Replica: "b"}
	id, other := [16]byte{1}, [16]byte{2}

	found, _, _, err := a.State(ctx, "t", id)
	require.NoError(t, err)
	require.False(t, found)
	claimed, err := a.Claim(ctx, "t", id)
	require.NoError(t, err)
	require.True(t, claimed)
	claimed, err = b.Claim(ctx, "t", id)
	require.NoError(t, err)
	require.False(t, claimed, "claimed by a")
	claimed, err = b.Claim(ctx, "t", other)
	require.NoError(t, err)
	require.True(t, claimed, "another topic id is another reset")

	found, done, replica, err := b.State(ctx, "t", id)
	require.NoError(t, err)
	require.Equal(t, []any{true, false, "a"}, []any{found, done, replica})
	require.NoError(t, b.Withdraw(ctx, "t", other))
	found, _, _, err = b.State(ctx, "t", other)
	require.NoError(t, err)
	require.False(t, found, "withdrawn")

	require.NoError(t, b.Finish(ctx, "t", id))
	require.NoError(t, a.Withdraw(ctx, "t", id))
	found, done, replica, err = a.State(ctx, "t", id)
	require.NoError(t, err)
	require.Equal(t, []any{true, true, "b"}, []any{found, done, replica}, "a done claim stays")
}

// The publisher's reads of an outbox walk a partition's pending events in
// publishing order, stop at the event or byte cap (the first event always
// fits) and leave held keys out; marks settle the events they name.
func TestOutboxPendingMarksAndFailedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	coll := mongotest.Start(t).DB(t).Collection("outbox")
	o := Outbox{Coll: coll}
	var ids []bson.ObjectID
	for i, key := range []string{"a", "b", "a", "c"} {
		id := bson.NewObjectID()
		ids = append(ids, id)
		_, err := coll.InsertOne(ctx, OutboxDoc{ID: id, Topic: "t", Partition: 0, Key: key,
			Payload: `{}`, Seq: bson.Timestamp{T: 1, I: uint32(i + 1)}})
		require.NoError(t, err)
	}
	_, err := coll.InsertOne(ctx, OutboxDoc{ID: bson.NewObjectID(), Topic: "t", Partition: 1, Key: "a", Seq: bson.Timestamp{T: 1, I: 9}})
	require.NoError(t, err)

	pending := func(exclude []string, events, bytes int) (got []bson.ObjectID, more bool) {
		t.Helper()
		more, err := o.Pending(ctx, "t", 0, exclude, events, bytes, func(raw bson.Raw) {
			got = append(got, raw.Lookup(OutboxID).ObjectID())
		})
		require.NoError(t, err)
		return got, more
	}
	got, more := pending(nil, 10, 1<<20)
	require.Equal(t, ids, got, "publishing order, one partition")
	require.False(t, more)
	got, more = pending(nil, 2, 1<<20)
	require.Equal(t, ids[:2], got)
	require.True(t, more, "the event cap cut the read short")
	got, more = pending(nil, 10, 1)
	require.Equal(t, ids[:1], got, "the first event always fits")
	require.True(t, more, "the byte cap cut the read short")
	got, _ = pending([]string{"a"}, 10, 1<<20)
	require.Equal(t, []bson.ObjectID{ids[1], ids[3]}, got, "held keys left out")

	now := time.Now()
	require.NoError(t, o.MarkPublished(ctx, []any{ids[0], ids[1]}, now))
	require.NoError(t, o.MarkFailed(ctx, ids[2], "refused", now, true))
	got, _ = pending(nil, 10, 1<<20)
	require.Equal(t, ids[3:], got)
	keys, err := o.FailedKeys(ctx, "t", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, keys)
	var failed OutboxDoc
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: OutboxID, Value: ids[2]}}).Decode(&failed))
	require.True(t, failed.Failed)
	require.Equal(t, "refused", failed.Error)
	require.EqualValues(t, 1, failed.Attempts)
}

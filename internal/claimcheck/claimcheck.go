package claimcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// Header names of the reference in a Kafka record. A record with either
// header carries no payload in its value (the value is empty): a consumer
// that does not resolve references sees the reference, never a cut or
// empty event mistaken for the whole one.
const (
	// HeaderNative carries the reference in the native format.
	HeaderNative = "outbox-dataref"
	// HeaderCloudEvents is CloudEvents' dataref extension attribute in
	// binary mode.
	HeaderCloudEvents = "ce_dataref"
)

// Scheme is the URI scheme of a reference: "outbox-payload:<ref>", where
// ref is the 24 hexadecimal digits of the chunks' ref (an ObjectID).
const Scheme = "outbox-payload"

// ChunkSize is the largest chunk: well under MongoDB's 16 MiB document
// limit, so that a chunk document with its fields always fits.
const ChunkSize = 8 << 20

// MaxPayload is the largest payload the claim check stores: 64 MiB, eight
// chunks. The chunks are inserted in the caller's transaction, whose whole
// size MongoDB bounds (it splits a large transaction's oplog entries, but
// a transaction of hundreds of MiB holds its memory and locks for long);
// the consumer holds the payload in memory, then the decoded event.
const MaxPayload = 64 << 20

// Ref is the reference of the chunks of ref, as records carry it.
func Ref(ref bson.ObjectID) string { return Scheme + ":" + ref.Hex() }

// ParseRef reads a reference written by Ref.
func ParseRef(s string) (bson.ObjectID, error) {
	hex, ok := strings.CutPrefix(s, Scheme+":")
	if !ok {
		return bson.ObjectID{}, fmt.Errorf("payload reference %q: not an %s: URI", s, Scheme)
	}
	id, err := bson.ObjectIDFromHex(hex)
	if err != nil {
		return bson.ObjectID{}, fmt.Errorf("payload reference %q: %w", s, err)
	}
	return id, nil
}

// AddRef adds the header carrying ref to rec, whose value must be empty:
// HeaderCloudEvents for a CloudEvents record, HeaderNative otherwise.
func AddRef(rec *kgo.Record, cloudEvents bool, ref string) {
	key := HeaderNative
	if cloudEvents {
		key = HeaderCloudEvents
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: key, Value: []byte(ref)})
}

// RefOf returns the reference rec carries, if any.
func RefOf(rec *kgo.Record) (string, bool) {
	for _, h := range rec.Headers {
		if h.Key == HeaderNative || h.Key == HeaderCloudEvents {
			return string(h.Value), true
		}
	}
	return "", false
}

// Chunk is a stored chunk of a payload.
type Chunk struct {
	ID          bson.ObjectID `bson:"_id"`
	Ref         bson.ObjectID `bson:"ref"`
	N           int32         `bson:"n"`
	Count       int32         `bson:"count"`
	Size        int64         `bson:"size"`
	Data        []byte        `bson:"data"`
	Published   bool          `bson:"published"`
	PublishedAt *time.Time    `bson:"published_at,omitempty"`
}

// Chunks cuts payload into the chunk documents of ref, unpublished.
func Chunks(ref bson.ObjectID, payload []byte) []any {
	count := max(1, (len(payload)+ChunkSize-1)/ChunkSize)
	out := make([]any, 0, count)
	for n := range count {
		data := payload[n*ChunkSize : min(len(payload), (n+1)*ChunkSize)]
		out = append(out, &Chunk{ID: bson.NewObjectID(), Ref: ref, N: int32(n), Count: int32(count), Size: int64(len(payload)), Data: data})
	}
	return out
}

// Index names of the payload collection.
const (
	IndexRef = "payloads_ref"
	IndexTTL = "payloads_published_ttl"
)

// Indexes are the indexes of the payload collection: unique {ref, n},
// which reads a payload's chunks in order and finds those the publisher
// marks, and the TTL on published_at where published is true, deleting a
// payload ttl after its publication (whole seconds).
func Indexes(ttl time.Duration) []store.IndexSpec {
	secs := int32(ttl.Seconds())
	return []store.IndexSpec{
		{
			Name:   IndexRef,
			Keys:   bson.D{{Key: store.PayloadRef, Value: 1}, {Key: store.PayloadN, Value: 1}},
			Unique: true,
		},
		{
			Name:    IndexTTL,
			Keys:    bson.D{{Key: store.PayloadPublishedAt, Value: 1}},
			Partial: bson.D{{Key: store.PayloadPublished, Value: true}},
			TTL:     &secs,
		},
	}
}

// Store is the payload collection of a claim-check database.
type Store struct {
	Coll *mongo.Collection
}

// Insert inserts chunks (from Chunks) in the transaction of ctx.
func (s *Store) Insert(ctx context.Context, chunks []any) error {
	if len(chunks) == 0 {
		return nil
	}
	if _, err := s.Coll.InsertMany(ctx, chunks); err != nil {
		return fmt.Errorf("claim check: insert %d payload chunks into %s: %w", len(chunks), s.where(), err)
	}
	return nil
}

// MarkPublished marks the chunks of refs published at at, which starts
// their TTL. It sets at even on chunks marked before: an event published
// again (its outbox document's mark was lost) keeps its payload for the
// full time after its latest publication. It also marks the chunks of
// events that will never be published (a scheduled event cancelled, a
// failed event discarded), in the transaction that drops them, so that
// they expire by the same rule instead of staying forever. refs are the
// events' payload_ref values (store.OutboxPayloadRef), not their outbox
// _ids, which a promotion changes.
func (s *Store) MarkPublished(ctx context.Context, refs []any, at time.Time) error {
	_, err := s.Coll.UpdateMany(ctx,
		bson.D{{Key: store.PayloadRef, Value: bson.D{{Key: "$in", Value: refs}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: store.PayloadPublished, Value: true}, {Key: store.PayloadPublishedAt, Value: at.UTC()}}}})
	if err != nil {
		return fmt.Errorf("claim check: mark payloads published in %s: %w", s.where(), err)
	}
	return nil
}

// ErrMissing is wrapped by Resolve's error when the payload's chunks are
// not all in the collection: deleted after their expiry, or looked for in
// another database than the producer's.
var ErrMissing = errors.New("payload not found")

// Resolve reads the payload of reference ref (as Ref writes it). It reads
// outside any transaction of ctx: the claim-check database may belong to
// another deployment than the caller's transaction. An error wrapping
// ErrMissing says the payload is not (wholly) there; any other error is
// the store failing or a bad reference.
func (s *Store) Resolve(ctx context.Context, ref string) ([]byte, error) {
	id, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	ctx = mongo.NewSessionContext(ctx, nil)
	cur, err := s.Coll.Find(ctx, bson.D{{Key: store.PayloadRef, Value: id}},
		options.Find().SetSort(bson.D{{Key: store.PayloadRef, Value: 1}, {Key: store.PayloadN, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("claim check: read payload %s from %s: %w", ref, s.where(), err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var buf bytes.Buffer
	var count int32 = -1
	var size int64
	n := int32(0)
	for cur.Next(ctx) {
		var c Chunk
		if err := cur.Decode(&c); err != nil {
			return nil, fmt.Errorf("claim check: payload %s in %s: chunk %d: %w", ref, s.where(), n, err)
		}
		if c.N != n || (count >= 0 && (c.Count != count || c.Size != size)) {
			return nil, fmt.Errorf("claim check: payload %s in %s: chunk %d found where chunk %d of %d was due: %w", ref, s.where(), c.N, n, count, ErrMissing)
		}
		if count < 0 {
			count, size = c.Count, c.Size
			if size > MaxPayload {
				return nil, fmt.Errorf("claim check: payload %s in %s: %d bytes, above the largest supported %d", ref, s.where(), size, MaxPayload)
			}
			buf.Grow(int(size))
		}
		buf.Write(c.Data)
		n++
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("claim check: read payload %s from %s: %w", ref, s.where(), err)
	}
	switch {
	case count < 0:
		return nil, fmt.Errorf("claim check: payload %s in %s: %w (expired after the producer's outbox retention plus its ClaimCheck.Margin, or this is not the producer's claim-check database)", ref, s.where(), ErrMissing)
	case n != count || int64(buf.Len()) != size:
		return nil, fmt.Errorf("claim check: payload %s in %s: %d of %d chunks, %d of %d bytes: %w", ref, s.where(), n, count, buf.Len(), size, ErrMissing)
	}
	return buf.Bytes(), nil
}

func (s *Store) where() string { return s.Coll.Database().Name() + "." + s.Coll.Name() }

package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
)

// outOfBand is what an event page shows of a payload the claim check
// stored out of band (outbox.ClaimCheck).
type outOfBand struct {
	// Ref is the reference the Kafka record carries.
	Ref string
	// Size is the payload's length as the event's document records it: the
	// outbox's payload_size, or the inbox's resolved payload; 0 when the
	// inbox holds the event without its payload (not resolved).
	Size int64
	// Where names the payload collection looked in, "" when the service
	// has no Service.ClaimCheckDatabase.
	Where string
	// Found: the payload's first chunk is there, with the stored size,
	// chunk count and publication mark.
	Found       bool
	StoredSize  int64
	Chunks      int32
	Published   bool
	PublishedAt *time.Time
}

// outboxOutOfBand describes the payload of d stored out of band, or nil.
func outboxOutOfBand(ctx context.Context, s *service, d *outboxDoc) (*outOfBand, error) {
	if d.PayloadRef == nil {
		return nil, nil
	}
	o := &outOfBand{Ref: claimcheck.Ref(*d.PayloadRef), Size: d.PayloadSize}
	return o, o.lookUp(ctx, s, *d.PayloadRef)
}

// inboxOutOfBand describes the payload of d stored out of band, or nil.
func inboxOutOfBand(ctx context.Context, s *service, d *inboxDoc) (*outOfBand, error) {
	if d.PayloadRef == "" {
		return nil, nil
	}
	o := &outOfBand{Ref: d.PayloadRef, Size: int64(len(d.Payload))}
	if d.PayloadTruncated {
		o.Size = d.PayloadSize
	}
	ref, err := claimcheck.ParseRef(d.PayloadRef)
	if err != nil {
		return o, nil // shown as it is: nothing to look up
	}
	return o, o.lookUp(ctx, s, ref)
}

// lookUp reads the first chunk of ref (without its data) from the
// service's claim-check database, if it has one.
//
// Query: findOne {ref, n: 0} on outbox_payloads, served by the unique
// index payloads_ref.
func (o *outOfBand) lookUp(ctx context.Context, s *service, ref bson.ObjectID) error {
	if s.ClaimCheckDatabase == nil {
		return nil
	}
	coll := s.ClaimCheckDatabase.Collection(store.PayloadsCollection)
	o.Where = coll.Database().Name() + "." + coll.Name()
	var c claimcheck.Chunk
	err := coll.FindOne(ctx, bson.D{{Key: store.PayloadRef, Value: ref}, {Key: store.PayloadN, Value: 0}},
		options.FindOne().SetProjection(bson.D{{Key: store.PayloadData, Value: 0}})).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil
	case err != nil:
		return fmt.Errorf("read payload %s from %s: %w", o.Ref, o.Where, err)
	}
	o.Found, o.StoredSize, o.Chunks, o.Published, o.PublishedAt = true, c.Size, c.Count, c.Published, c.PublishedAt
	return nil
}

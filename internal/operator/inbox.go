package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/store"
)

// ErrNotParked is returned for an event that is not parked (the root's
// outbox.ErrNotParked).
var ErrNotParked = errors.New("outbox: event is not parked")

// ErrNotRedrivable is returned for a parked record whose envelope could
// not be read: it has no reliable identity and can never be handled (the
// root's outbox.ErrNotRedrivable).
var ErrNotRedrivable = errors.New("outbox: malformed record cannot be re-driven (its envelope could not be read); purge it instead")

// ID is the type of an inbox document's _id as the caller decodes it (the
// root's outbox.InboxID): comparable, so that the documents of one event
// can be told apart, and printed by String in errors.
type ID interface {
	comparable
	String() string
}

// Inbox runs the operator's actions on the parked documents of an inbox
// collection.
type Inbox[I ID] struct {
	// Coll is the inbox collection.
	Coll *mongo.Collection
}

// ParkedFilter selects parked documents. The zero value selects all of
// them.
type ParkedFilter[I ID] struct {
	// IDs keeps only these events; empty keeps any.
	IDs []I
	// Topic and ContentSchema keep the events of one topic and one content
	// schema; empty keeps any.
	Topic, ContentSchema string
	// ParkedBefore keeps the events parked before it; zero keeps any.
	ParkedBefore time.Time
	// Limit caps the events List returns; 0 is no limit.
	Limit int
	// Redrivable leaves out the events that can never be re-driven
	// (unreadable records).
	Redrivable bool
	// HeadsOnly leaves out the held events: a request for a held event
	// alone is dropped when served (its head's re-drive releases it), so a
	// selection that counted it would promise more re-drives than happen.
	HeadsOnly bool
}

// query is the filter of f, served by the partial index inbox_parked.
func (f ParkedFilter[I]) query() bson.D {
	q := bson.D{{Key: store.InboxParked, Value: true}}
	if len(f.IDs) > 0 {
		ids := make(bson.A, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id
		}
		q = append(q, bson.E{Key: store.InboxID, Value: bson.D{{Key: "$in", Value: ids}}})
	}
	if f.Topic != "" {
		q = append(q, bson.E{Key: store.InboxIDTopic, Value: f.Topic})
	}
	if f.ContentSchema != "" {
		q = append(q, bson.E{Key: store.InboxIDContentSchema, Value: f.ContentSchema})
	}
	if !f.ParkedBefore.IsZero() {
		q = append(q, bson.E{Key: store.InboxParkedAt, Value: bson.D{{Key: "$lt", Value: f.ParkedBefore.UTC()}}})
	}
	if f.Redrivable {
		q = append(q, bson.E{Key: "$nor", Value: unreadableConds()})
	}
	if f.HeadsOnly {
		q = append(q, bson.E{Key: store.InboxHeldBy, Value: nil})
	}
	return q
}

// unreadableConds matches the parked documents that cannot be re-driven.
func unreadableConds() bson.A {
	return bson.A{bson.D{{Key: store.InboxUnreadable, Value: true}}}
}

// Parked is a parked inbox document as the operator's actions read it.
type Parked[I ID] struct {
	// Doc is the document as the consumer writes it (exported: the codec
	// skips unexported fields).
	Doc store.InboxDoc[I] `bson:",inline"`
	// RedriveRequestedAt is when a pending re-drive was requested; nil
	// when none is.
	RedriveRequestedAt *time.Time `bson:"redrive_requested_at,omitempty"`
	// RedriveDeferred is why the last try of the pending request could not
	// run; RedriveNotBefore is when it is tried again, or until when a
	// replica's claim on it lasts.
	RedriveDeferred  string     `bson:"redrive_deferred,omitempty"`
	RedriveNotBefore *time.Time `bson:"redrive_not_before,omitempty"`
	// Head is set by List on a held event (Doc.HeldBy set): the head of
	// its key now, which may have changed since it was held (Doc.HeldBy
	// names that one). Nil when the held event is its key's head itself
	// (it is released next) or its key holds nothing any more.
	Head *I `bson:"-"`
}

// Held reports whether the event waits behind another one of its key
// rather than being parked on its own account.
func (p *Parked[I]) Held() bool { return p.Doc.HeldBy != nil }

// List returns the parked documents f selects, oldest first, with the
// current head of each held event's key (Parked.Head): one query, and one
// more per held key met.
func (in Inbox[I]) List(ctx context.Context, f ParkedFilter[I]) ([]Parked[I], error) {
	opts := options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}, {Key: store.InboxID, Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := in.Coll.Find(ctx, f.query(), opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked events: %w", err)
	}
	var raws []bson.Raw
	if err := cur.All(ctx, &raws); err != nil {
		return nil, fmt.Errorf("outbox: list parked events: %w", err)
	}
	docs := make([]Parked[I], len(raws))
	// The head of each key met, whichever event it is: a held head is its
	// key's head for the held events listed after it too.
	heads := map[seqKey]*I{}
	for i, raw := range raws {
		p := &docs[i]
		if err := bson.Unmarshal(raw, p); err != nil {
			return nil, fmt.Errorf("outbox: list parked events: %w", err)
		}
		if !p.Held() {
			continue
		}
		// The topic is read from the raw _id: I is opaque here.
		topic, _ := raw.Lookup(store.InboxID, store.IDTopic).StringValueOK()
		k := seqKey{topic, p.Doc.Partition, p.Doc.PartitionKey}
		head, ok := heads[k]
		if !ok {
			d, found, err := in.First(ctx, k.topic, k.partition, k.key)
			if err != nil {
				return nil, fmt.Errorf("outbox: list parked events: %w", err)
			}
			if found {
				head = &d.ID
			}
			heads[k] = head
		}
		if head != nil && *head != p.Doc.ID {
			p.Head = head
		}
	}
	return docs, nil
}

// seqKey names a key's sequence.
type seqKey struct {
	topic     string
	partition int32
	key       string
}

// First reads the head of key's sequence in a partition of topic; ok is
// false when the key holds nothing.
func (in Inbox[I]) First(ctx context.Context, topic string, partition int32, key string) (d store.HeadDoc[I], ok bool, err error) {
	err = in.Coll.FindOne(ctx, store.SeqFilter(topic, partition, key),
		options.FindOne().SetSort(bson.D{{Key: store.InboxOffset, Value: 1}}).SetProjection(store.HeadProjection())).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("outbox: read the held events of key %q in %s/%d: %w", key, topic, partition, err)
	}
	return d, true, nil
}

// Get reads the parked document of id for a re-drive: the error wraps
// ErrNotParked when it is missing or not parked, ErrNotRedrivable when its
// envelope could not be read.
func (in Inbox[I]) Get(ctx context.Context, id I) (store.InboxDoc[I], error) {
	var d store.InboxDoc[I]
	err := in.Coll.FindOne(ctx, bson.D{{Key: store.InboxID, Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !d.Parked) {
		return d, fmt.Errorf("%w: %+v", ErrNotParked, id)
	}
	if err != nil {
		return d, fmt.Errorf("outbox: redrive: %w", err)
	}
	if d.Unreadable {
		return d, fmt.Errorf("%w: %s", ErrNotRedrivable, id)
	}
	return d, nil
}

// RequestRedrive marks the parked events f selects (Limit ignored) for
// re-drive at now, clearing what an earlier request's deferral left. When
// f names ids of unreadable records it refuses (ErrNotRedrivable) and
// marks nothing; a selection without ids leaves them out, and the held
// events too (their heads' re-drive releases them). With dryRun nothing
// changes. It returns how many events were (or would be) marked; when f
// names ids and none of them is parked, the error wraps ErrNotParked.
func (in Inbox[I]) RequestRedrive(ctx context.Context, f ParkedFilter[I], dryRun bool, now time.Time) (int64, error) {
	if err := in.refuseUnreadable(ctx, f); err != nil {
		return 0, err
	}
	f.Redrivable = true
	f.HeadsOnly = len(f.IDs) == 0
	return in.update(ctx, f, dryRun, "request re-drive of", bson.D{
		{Key: "$set", Value: bson.D{{Key: store.InboxRedriveRequestedAt, Value: now.UTC()}}},
		{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: ""}, {Key: store.InboxRedriveDeferred, Value: ""}}},
	})
}

// Purge marks the parked events f selects (Limit ignored) handled and
// discarded at now, which takes them off their keys' sequences for good:
// a redelivery is skipped as a duplicate and the inbox TTL index deletes
// them. With dryRun nothing changes. It returns how many events were (or
// would be) purged; when f names ids and none of them is parked, the error
// wraps ErrNotParked.
func (in Inbox[I]) Purge(ctx context.Context, f ParkedFilter[I], dryRun bool, now time.Time) (int64, error) {
	now = now.UTC()
	return in.update(ctx, f, dryRun, "purge", bson.D{
		{Key: "$set", Value: bson.D{
			{Key: store.InboxParked, Value: false},
			{Key: store.InboxHandled, Value: true},
			{Key: store.InboxHandledAt, Value: now},
			{Key: store.InboxDiscardedAt, Value: now},
		}},
		{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveRequestedAt, Value: ""}, {Key: store.InboxRedriveNotBefore, Value: ""},
			{Key: store.InboxRedriveDeferred, Value: ""}, {Key: store.InboxHeldBy, Value: ""}}},
	})
}

// update applies update to the selection of f (one updateMany), or counts
// it with dryRun; what names the action in errors.
func (in Inbox[I]) update(ctx context.Context, f ParkedFilter[I], dryRun bool, what string, update bson.D) (int64, error) {
	q := f.query()
	var n int64
	if dryRun {
		c, err := in.Coll.CountDocuments(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("outbox: %s parked events: %w", what, err)
		}
		n = c
	} else {
		res, err := in.Coll.UpdateMany(ctx, q, update)
		if err != nil {
			return 0, fmt.Errorf("outbox: %s parked events: %w", what, err)
		}
		n = res.MatchedCount
	}
	if n == 0 && len(f.IDs) > 0 {
		return 0, fmt.Errorf("%w: %s", ErrNotParked, f.IDs[0])
	}
	return n, nil
}

// refuseUnreadable fails with ErrNotRedrivable, naming up to three of
// them, when the ids f names include unreadable records: a request for
// one would wait for a consumer that can never serve it. A selection
// without ids skips them instead (ParkedFilter.Redrivable).
func (in Inbox[I]) refuseUnreadable(ctx context.Context, f ParkedFilter[I]) error {
	if len(f.IDs) == 0 {
		return nil
	}
	q := append(f.query(), bson.E{Key: "$or", Value: unreadableConds()})
	cur, err := in.Coll.Find(ctx, q, options.Find().SetProjection(bson.D{{Key: store.InboxID, Value: 1}}).SetLimit(4))
	if err != nil {
		return fmt.Errorf("outbox: request re-drive of parked events: %w", err)
	}
	var docs []struct {
		ID I `bson:"_id"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return fmt.Errorf("outbox: request re-drive of parked events: %w", err)
	}
	if len(docs) == 0 {
		return nil
	}
	names := make([]string, 0, 3)
	for i, d := range docs {
		if i == 3 {
			names = append(names, "...")
			break
		}
		names = append(names, d.ID.String())
	}
	return fmt.Errorf("%w: %s", ErrNotRedrivable, strings.Join(names, ", "))
}

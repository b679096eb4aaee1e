package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Admin inspects and repairs the outbox and inbox collections of a service
// directly in MongoDB: backlog, failed and parked events, re-drive requests.
// It needs no Kafka and no handlers, so tools (cmd/outboxctl) use it as well
// as services (Client.Admin). Its methods are safe for concurrent use.
type Admin struct {
	outbox, inbox *mongo.Collection
}

// NewAdmin returns an Admin for the collections of a service in db. Empty
// collection names default to "outbox" and "inbox", as in Config.
func NewAdmin(db *mongo.Database, outboxCollection, inboxCollection string) *Admin {
	return &Admin{
		outbox: db.Collection(cmp.Or(outboxCollection, "outbox")),
		inbox:  db.Collection(cmp.Or(inboxCollection, "inbox")),
	}
}

// Admin returns an Admin on the Client's collections.
func (c *Client) Admin() *Admin { return &Admin{outbox: c.outbox, inbox: c.inbox} }

// MarshalJSON writes snake_case keys and ages in seconds.
func (s StoreStatus) MarshalJSON() ([]byte, error) { return json.Marshal(s.jsonForm()) }

// StoreStatus reads the backlog and the counts of failed and parked events.
//
// Cost: one aggregation over the outbox's unpublished documents (the
// partial index outbox_pending holds exactly those), grouped by topic, and
// up to three counts over the inbox's parked documents (partial index
// inbox_parked). When events failed, one more read of the failed events
// (partial index outbox_failed) and one count of the pending events of
// their partitions give the held keys and events. Published and handled
// documents are never read.
func (a *Admin) StoreStatus(ctx context.Context) (StoreStatus, error) {
	now := time.Now().UTC()
	st := StoreStatus{CheckedAt: now}
	cur, err := a.outbox.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "published", Value: false}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: "$topic"}, {Key: "failed", Value: "$failed"}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "oldest", Value: bson.D{{Key: "$min", Value: "$created_at"}}},
		}}},
	})
	if err != nil {
		return st, fmt.Errorf("outbox: read outbox backlog: %w", err)
	}
	var groups []struct {
		ID struct {
			Topic  string `bson:"topic"`
			Failed bool   `bson:"failed"`
		} `bson:"_id"`
		N      int64     `bson:"n"`
		Oldest time.Time `bson:"oldest"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return st, fmt.Errorf("outbox: read outbox backlog: %w", err)
	}
	byTopic := map[string]*TopicBacklog{}
	for _, g := range groups {
		b := byTopic[g.ID.Topic]
		if b == nil {
			b = &TopicBacklog{Topic: g.ID.Topic}
			byTopic[g.ID.Topic] = b
		}
		if g.ID.Failed {
			b.Failed += g.N
			st.Failed += g.N
			continue
		}
		b.Pending += g.N
		st.Pending += g.N
		if !g.Oldest.IsZero() {
			age := max(now.Sub(g.Oldest), 0)
			b.OldestPendingAge = max(b.OldestPendingAge, age)
			st.OldestPendingAge = max(st.OldestPendingAge, age)
		}
	}
	if st.Failed > 0 {
		if err := a.heldCounts(ctx, &st, byTopic); err != nil {
			return st, err
		}
	}
	for _, b := range byTopic {
		st.Topics = append(st.Topics, *b)
	}
	slices.SortFunc(st.Topics, func(x, y TopicBacklog) int { return cmp.Compare(x.Topic, y.Topic) })
	if st.Parked, err = a.inbox.CountDocuments(ctx, bson.D{{Key: "parked", Value: true}}); err != nil {
		return st, fmt.Errorf("outbox: count parked events: %w", err)
	}
	if st.Parked > 0 {
		st.Held, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: "parked", Value: true},
			{Key: "held_by", Value: bson.D{{Key: "$exists", Value: true}}},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count held events: %w", err)
		}
		st.RedriveRequested, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: "parked", Value: true},
			{Key: "redrive_requested_at", Value: bson.D{{Key: "$exists", Value: true}}},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count re-drive requests: %w", err)
		}
	}
	return st, nil
}

// FailedEvent is an outbox event Kafka refused for good, sent on its own
// (for example larger than the topic's maximum message size). It stays in
// the outbox, unpublished, until an operator retries (RetryFailed) or
// discards it (DiscardFailed); under Config.PoisonPolicy HoldKey the later
// events of its partition key wait behind it until then.
type FailedEvent struct {
	// ID is the outbox document's _id (hex ObjectID).
	ID             string    `json:"id"`
	Topic          string    `json:"topic"`
	Partition      int32     `json:"partition"`
	PartitionKey   string    `json:"partition_key"`
	ContentSchema  string    `json:"schema"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
	FailedAt       time.Time `json:"failed_at"`
	Attempts       int32     `json:"attempts"`
	Error          string    `json:"error"`
	// PayloadSize is the size of the event's JSON in bytes.
	PayloadSize int `json:"payload_size"`
}

// FailedFilter selects failed outbox events.
type FailedFilter struct {
	// Topic keeps the events of one topic. Defaults to every topic.
	Topic string
	// Limit caps the events returned. Defaults to no limit.
	Limit int
}

func (f FailedFilter) query() bson.D {
	q := bson.D{{Key: "failed", Value: true}}
	if f.Topic != "" {
		q = append(q, bson.E{Key: "topic", Value: f.Topic})
	}
	return q
}

// FailedEvents lists failed outbox events, oldest failure first.
func (a *Admin) FailedEvents(ctx context.Context, f FailedFilter) ([]FailedEvent, error) {
	opts := options.Find().SetSort(bson.D{{Key: "failed_at", Value: 1}, {Key: "_id", Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := a.outbox.Find(ctx, f.query(), opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	var docs []outboxDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("outbox: list failed events: %w", err)
	}
	out := make([]FailedEvent, 0, len(docs))
	for _, d := range docs {
		e := FailedEvent{ID: d.ID.Hex(), Topic: d.Topic, Partition: d.Partition, PartitionKey: d.Key,
			ContentSchema: d.Schema, IdempotencyKey: d.IdempotencyKey, CreatedAt: d.CreatedAt,
			Attempts: d.Attempts, Error: d.Error, PayloadSize: len(d.Payload)}
		if d.FailedAt != nil {
			e.FailedAt = *d.FailedAt
		}
		out = append(out, e)
	}
	return out, nil
}

// RetryFailed clears the failed mark of the selected failed events (those
// of f, Limit ignored, narrowed to ids when not empty), so that the
// publisher tries them again at its next scan of their partition (within
// seconds under Config.PoisonPolicy HoldKey, at most 30 s otherwise). Use it
// after the cause is fixed (for example the topic's maximum message size
// raised). Under HoldKey a retried event is published before the events of
// its key that waited behind it, in order; under SkipEvent after the events
// of its key published meanwhile. With dryRun it only counts them. It returns how many events were (or would be) retried.
func (a *Admin) RetryFailed(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return a.onFailed(ctx, f, ids, dryRun, func(q bson.D) (int64, error) {
		res, err := a.outbox.UpdateMany(ctx, q, bson.D{
			{Key: "$set", Value: bson.D{{Key: "failed", Value: false}}},
			{Key: "$unset", Value: bson.D{{Key: "failed_at", Value: ""}}},
		})
		if err != nil {
			return 0, fmt.Errorf("outbox: retry failed events: %w", err)
		}
		return res.ModifiedCount, nil
	})
}

package outbox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
)

// Admin inspects and repairs the outbox and inbox collections of a service
// directly in MongoDB: backlog, failed and parked events, re-drive requests.
// It needs no Kafka and no handlers, so tools (cmd/outboxctl) use it as well
// as services (Client.Admin). Its methods are safe for concurrent use.
type Admin struct {
	outbox, inbox *mongo.Collection
	// claims is the claim check's payload collection of the outbox's
	// producer, where DiscardFailed marks the payloads of the events it
	// discards: the Client's (Config.ClaimCheck.Database) for a producing
	// Client's Admin, else outbox_payloads of the outbox's database (its
	// default).
	claims *claimcheck.Store
}

// scheduled is the collection of the scheduled events of a's outbox
// (WithPublishAt).
func (a *Admin) scheduled() *mongo.Collection {
	return a.outbox.Database().Collection(a.outbox.Name() + store.ScheduledSuffix)
}

// NewAdmin returns an Admin for the collections of a service in db. Empty
// collection names default to "outbox" and "inbox", as in Config.
func NewAdmin(db *mongo.Database, outboxCollection, inboxCollection string) *Admin {
	return &Admin{
		outbox: db.Collection(cmp.Or(outboxCollection, "outbox")),
		inbox:  db.Collection(cmp.Or(inboxCollection, "inbox")),
		claims: &claimcheck.Store{Coll: db.Collection(store.PayloadsCollection)},
	}
}

// Admin returns an Admin on the Client's collections.
func (c *Client) Admin() *Admin {
	claims := &claimcheck.Store{Coll: c.outbox.Database().Collection(store.PayloadsCollection)}
	if c.claims != nil && len(c.cfg.PublishTopics) > 0 {
		claims = c.claims // a database of Config.Mongo (validateClaimCheck)
	}
	return &Admin{outbox: c.outbox, inbox: c.inbox, claims: claims}
}

// StoreStatus reads the backlog and the counts of failed and parked events.
//
// Cost: one aggregation over the outbox's unpublished documents (the
// partial index outbox_pending holds exactly those), grouped by topic, and
// up to four counts over the inbox's parked documents (partial index
// inbox_parked). The same aggregation sums the claim check's payloads of
// the pending events (StoreStatus.ClaimCheck); the payload collection
// itself is not read. When events failed, one more read of the failed events
// (partial index outbox_failed) and one count of the pending events of
// their partitions give the held keys and events. When a topic has pending
// events, its stored partition count is read (outbox_meta, by _id), and
// when one of them lies beyond it, one count (outbox_pending) gives
// TopicBacklog.Unroutable. Published and handled documents are never read.
// One more aggregation groups the scheduled events not yet promoted by
// topic (StoreStatus.Scheduled, NextDue): it reads each of them, so with a
// large schedule poll Status no more often than its one-second cache.
func (a *Admin) StoreStatus(ctx context.Context) (StoreStatus, error) {
	now := time.Now().UTC()
	st := StoreStatus{CheckedAt: now}
	cur, err := a.outbox.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: store.OutboxPublished, Value: false}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: "$" + store.OutboxTopic}, {Key: "failed", Value: "$" + store.OutboxFailed}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "oldest", Value: bson.D{{Key: "$min", Value: "$" + store.OutboxCreatedAt}}},
			{Key: "last", Value: bson.D{{Key: "$max", Value: "$" + store.OutboxPartition}}},
			// The claim check's payloads: only an event stored out of
			// band has a payload size.
			{Key: "oob", Value: bson.D{{Key: "$sum", Value: bson.D{{Key: "$cond", Value: bson.A{outOfBand, 1, 0}}}}}},
			{Key: "oob_bytes", Value: bson.D{{Key: "$sum", Value: "$" + store.OutboxPayloadSize}}},
			{Key: "oob_oldest", Value: bson.D{{Key: "$min", Value: bson.D{{Key: "$cond", Value: bson.A{outOfBand, "$" + store.OutboxCreatedAt, nil}}}}}},
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
		N         int64     `bson:"n"`
		Oldest    time.Time `bson:"oldest"`
		Last      int64     `bson:"last"` // the highest partition
		OOB       int64     `bson:"oob"`
		OOBBytes  int64     `bson:"oob_bytes"`
		OOBOldest time.Time `bson:"oob_oldest"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return st, fmt.Errorf("outbox: read outbox backlog: %w", err)
	}
	byTopic := map[string]*TopicBacklog{}
	lastPartition := map[string]int64{} // highest partition of a topic's pending events
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
		lastPartition[g.ID.Topic] = g.Last
		if g.OOB > 0 {
			cc := &st.ClaimCheck
			cc.Pending += g.OOB
			cc.PendingBytes += g.OOBBytes
			cc.OldestPendingAge = max(cc.OldestPendingAge, now.Sub(g.OOBOldest), 0)
		}
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
	if err := a.unroutable(ctx, &st, byTopic, lastPartition); err != nil {
		return st, err
	}
	if err := a.scheduledCounts(ctx, &st, byTopic); err != nil {
		return st, err
	}
	for _, b := range byTopic {
		st.Topics = append(st.Topics, *b)
	}
	slices.SortFunc(st.Topics, func(x, y TopicBacklog) int { return cmp.Compare(x.Topic, y.Topic) })
	if st.Parked, err = a.inbox.CountDocuments(ctx, bson.D{{Key: store.InboxParked, Value: true}}); err != nil {
		return st, fmt.Errorf("outbox: count parked events: %w", err)
	}
	if st.Parked > 0 {
		st.Held, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: store.InboxParked, Value: true},
			{Key: store.InboxHeldBy, Value: bson.D{{Key: "$exists", Value: true}}},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count held events: %w", err)
		}
		st.RedriveRequested, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: store.InboxParked, Value: true},
			{Key: store.InboxRedriveRequestedAt, Value: bson.D{{Key: "$exists", Value: true}}},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count re-drive requests: %w", err)
		}
		if st.RedriveRequested > 0 {
			st.RedriveDeferred, err = a.inbox.CountDocuments(ctx, bson.D{
				{Key: store.InboxParked, Value: true},
				{Key: store.InboxRedriveRequestedAt, Value: bson.D{{Key: "$exists", Value: true}}},
				{Key: store.InboxRedriveDeferred, Value: bson.D{{Key: "$exists", Value: true}}},
			})
			if err != nil {
				return st, fmt.Errorf("outbox: count deferred re-drive requests: %w", err)
			}
		}
		st.ParkedNoHandler, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: store.InboxParked, Value: true},
			{Key: store.InboxParkReason, Value: reasonNoHandler},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count events parked without a handler: %w", err)
		}
		// A payload stored out of band is in the inbox once resolved (and
		// decoded), and never empty: the claim check stores none.
		st.ClaimCheck.Unresolved, err = a.inbox.CountDocuments(ctx, bson.D{
			{Key: store.InboxParked, Value: true},
			{Key: store.InboxHeldBy, Value: bson.D{{Key: "$exists", Value: false}}},
			{Key: store.InboxPayloadRef, Value: bson.D{{Key: "$exists", Value: true}}},
			{Key: store.InboxPayload, Value: ""},
		})
		if err != nil {
			return st, fmt.Errorf("outbox: count parked events with unresolved payloads: %w", err)
		}
	}
	return st, nil
}

// outOfBand is true, in an aggregation, for an outbox event whose payload
// the claim check stored out of band (it has a payload size).
var outOfBand = bson.D{{Key: "$gt", Value: bson.A{"$" + store.OutboxPayloadSize, 0}}}

// unroutable fills the partition counts of the topics with pending events
// (as stored in outbox_meta by the services' reads of Kafka) and counts the
// pending events stored for a partition the topic does not have.
func (a *Admin) unroutable(ctx context.Context, st *StoreStatus, byTopic map[string]*TopicBacklog, lastPartition map[string]int64) error {
	if len(lastPartition) == 0 {
		return nil
	}
	docs, err := store.ReadTopicMetas(ctx, a.outbox.Database().Collection(metaCollection), a.outbox.Name(), slices.Collect(maps.Keys(lastPartition))...)
	if err != nil {
		return fmt.Errorf("outbox: read partition counts: %w", err)
	}
	for _, d := range docs {
		b := byTopic[d.Topic]
		if b == nil || d.Partitions <= 0 {
			continue
		}
		b.Partitions = d.Partitions
		if lastPartition[d.Topic] < int64(d.Partitions) {
			continue
		}
		// Served by outbox_pending (published false, topic, partition).
		n, err := a.outbox.CountDocuments(ctx, bson.D{
			{Key: store.OutboxPublished, Value: false},
			{Key: store.OutboxTopic, Value: d.Topic},
			{Key: store.OutboxPartition, Value: bson.D{{Key: "$gte", Value: d.Partitions}}},
			{Key: store.OutboxFailed, Value: false},
		})
		if err != nil {
			return fmt.Errorf("outbox: count events beyond the partition count: %w", err)
		}
		b.Unroutable = n
		st.Unroutable += n
	}
	return nil
}

// scheduledCounts counts the scheduled events not promoted yet, by topic,
// with the earliest due time of those waiting.
func (a *Admin) scheduledCounts(ctx context.Context, st *StoreStatus, byTopic map[string]*TopicBacklog) error {
	cur, err := a.scheduled().Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: store.ScheduledPromoted, Value: false}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: "$" + store.OutboxTopic}, {Key: "failed", Value: "$" + store.OutboxFailed}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "next", Value: bson.D{{Key: "$min", Value: "$" + store.ScheduledDueAt}}},
		}}},
	})
	if err != nil {
		return fmt.Errorf("outbox: read scheduled events: %w", err)
	}
	var groups []struct {
		ID struct {
			Topic  string `bson:"topic"`
			Failed bool   `bson:"failed"`
		} `bson:"_id"`
		N    int64     `bson:"n"`
		Next time.Time `bson:"next"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return fmt.Errorf("outbox: read scheduled events: %w", err)
	}
	for _, g := range groups {
		if g.ID.Failed {
			st.ScheduledFailed += g.N
			continue
		}
		b := byTopic[g.ID.Topic]
		if b == nil {
			b = &TopicBacklog{Topic: g.ID.Topic}
			byTopic[g.ID.Topic] = b
		}
		b.Scheduled += g.N
		st.Scheduled += g.N
		if !g.Next.IsZero() && (b.NextDue.IsZero() || g.Next.Before(b.NextDue)) {
			b.NextDue = g.Next.UTC()
		}
		if !b.NextDue.IsZero() && (st.NextDue.IsZero() || b.NextDue.Before(st.NextDue)) {
			st.NextDue = b.NextDue
		}
	}
	return nil
}

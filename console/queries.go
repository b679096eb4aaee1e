package console

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// The console's own reads, for what outbox.Admin does not offer. Each
// names the index that serves it. The field names are the framework's
// storage format, spelled once in internal/store.

// inboxDoc is an inbox document as the console shows it. HeldBy is set on a
// held event: parked behind the head of its key, which it names (written
// by the consumer's poison handling; absent in older data).
type inboxDoc struct {
	store.InboxRecord[outbox.InboxID] `bson:",inline"`
}

// NotRedrivable says why the event cannot be re-driven on its own, or ""
// when it can: the console offers no Re-drive button then, and shows this
// instead.
func (d *inboxDoc) NotRedrivable() string {
	switch {
	case !d.Parked:
		return ""
	case d.Unreadable || strings.HasPrefix(d.ID.IdempotencyKey, store.InventedKeyPrefix):
		return "This record's envelope could not be read (a malformed record): no handler can ever take it, so it cannot be re-driven. Purge it once you have kept what you need from its payload."
	case d.HeldBy != nil:
		return "This event is held behind an earlier parked event of its partition key: re-drive that event, and this one follows in order."
	}
	return ""
}

// outboxDoc is an outbox document as the console shows it.
type outboxDoc = store.OutboxRecord

// parkedTopic counts the parked events of a topic: heads (parked on their
// own account) and held events (parked behind a head), and the keys held.
type parkedTopic struct {
	Topic                  string
	Heads, Held, HeldHeads int64
}

// parkedByTopic groups the parked events by topic and head.
//
// Query: inbox aggregate [$match {parked: true}, $group by {_id.topic,
// held_by}]; the match is served by the partial index inbox_parked, so only
// parked documents are read.
func parkedByTopic(ctx context.Context, s *service) (map[string]*parkedTopic, error) {
	cur, err := s.inbox.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: store.InboxParked, Value: true}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "topic", Value: "$" + store.InboxIDTopic}, {Key: "head", Value: "$" + store.InboxHeldBy}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
		}}},
	})
	if err != nil {
		return nil, fmt.Errorf("count parked events: %w", err)
	}
	var groups []struct {
		ID struct {
			Topic string        `bson:"topic"`
			Head  bson.RawValue `bson:"head"`
		} `bson:"_id"`
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, fmt.Errorf("count parked events: %w", err)
	}
	out := map[string]*parkedTopic{}
	for _, g := range groups {
		t := out[g.ID.Topic]
		if t == nil {
			t = &parkedTopic{Topic: g.ID.Topic}
			out[g.ID.Topic] = t
		}
		if g.ID.Head.Type == 0 || g.ID.Head.Type == bson.TypeNull {
			t.Heads += g.N
		} else {
			t.Held += g.N
			t.HeldHeads++
		}
	}
	return out, nil
}

// perMinute counts the documents whose timeField falls in each of the last
// 60 minutes (oldest first, the current minute last).
//
// Query: aggregate [$match {flag: true, timeField: {$gte: an hour ago}},
// $group by $dateToString(minute)]. The match is served by the partial TTL
// index on timeField (outbox_published_ttl on published_at where
// published, inbox_handled_ttl on handled_at where handled): only the
// last hour's documents are read.
func perMinute(ctx context.Context, coll *mongo.Collection, flag, timeField string, now time.Time) ([]int64, error) {
	end := now.UTC().Truncate(time.Minute).Add(time.Minute)
	since := end.Add(-60 * time.Minute)
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: flag, Value: true}, {Key: timeField, Value: bson.D{{Key: "$gte", Value: since}}}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "$dateToString", Value: bson.D{{Key: "format", Value: "%Y-%m-%dT%H:%M"}, {Key: "date", Value: "$" + timeField}}}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
		}}},
	})
	if err != nil {
		return nil, fmt.Errorf("count %s per minute: %w", timeField, err)
	}
	var groups []struct {
		ID string `bson:"_id"`
		N  int64  `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, fmt.Errorf("count %s per minute: %w", timeField, err)
	}
	out := make([]int64, 60)
	for _, g := range groups {
		t, err := time.Parse("2006-01-02T15:04", g.ID)
		if err != nil {
			continue
		}
		i := int(t.Sub(since) / time.Minute)
		if i >= 0 && i < 60 {
			out[i] += g.N
		}
	}
	return out, nil
}

// parkedQuery selects parked events in the parked page.
type parkedQuery struct {
	Topic, Schema, Key string
	After, Before      time.Time
	// View is "all", "heads" (parked on their own) or "held" (behind a head).
	View string
	Page int
}

func (q parkedQuery) filter() bson.D {
	f := bson.D{{Key: store.InboxParked, Value: true}}
	if q.Topic != "" {
		f = append(f, bson.E{Key: store.InboxIDTopic, Value: q.Topic})
	}
	if q.Schema != "" {
		f = append(f, bson.E{Key: store.InboxIDContentSchema, Value: q.Schema})
	}
	if q.Key != "" {
		f = append(f, bson.E{Key: store.InboxPartitionKey, Value: q.Key})
	}
	if !q.After.IsZero() || !q.Before.IsZero() {
		r := bson.D{}
		if !q.After.IsZero() {
			r = append(r, bson.E{Key: "$gte", Value: q.After.UTC()})
		}
		if !q.Before.IsZero() {
			r = append(r, bson.E{Key: "$lt", Value: q.Before.UTC()})
		}
		f = append(f, bson.E{Key: store.InboxParkedAt, Value: r})
	}
	switch q.View {
	case "heads":
		f = append(f, bson.E{Key: store.InboxHeldBy, Value: bson.D{{Key: "$exists", Value: false}}})
	case "held":
		f = append(f, bson.E{Key: store.InboxHeldBy, Value: bson.D{{Key: "$exists", Value: true}}})
	}
	return f
}

// adminFilter is the outbox.ParkedFilter of q when Admin can express it
// (no key, no lower time bound, no view); ok is false otherwise.
func (q parkedQuery) adminFilter() (f outbox.ParkedFilter, ok bool) {
	if q.Key != "" || !q.After.IsZero() || (q.View != "" && q.View != "all") {
		return f, false
	}
	return outbox.ParkedFilter{Topic: q.Topic, ContentSchema: q.Schema, ParkedBefore: q.Before}, true
}

// listFields leaves the payload out of listings.
var listFields = bson.D{{Key: store.InboxPayload, Value: 0}}

// listParked returns a page of the parked events q selects, oldest first,
// and how many it selects.
//
// Queries: inbox find {parked: true, ...q} sort {parked_at, _id} skip
// limit, and count of the same filter; both are served by the partial
// index inbox_parked (parked documents only; the filters on topic, schema,
// key and held_by are applied to those).
func listParked(ctx context.Context, s *service, q parkedQuery, size int) ([]inboxDoc, int64, error) {
	f := q.filter()
	n, err := s.inbox.CountDocuments(ctx, f)
	if err != nil {
		return nil, 0, fmt.Errorf("count parked events: %w", err)
	}
	cur, err := s.inbox.Find(ctx, f, options.Find().
		SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}, {Key: store.InboxID, Value: 1}}).
		SetSkip(int64(q.Page*size)).SetLimit(int64(size)).SetProjection(listFields))
	if err != nil {
		return nil, 0, fmt.Errorf("list parked events: %w", err)
	}
	var docs []inboxDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, 0, fmt.Errorf("list parked events: %w", err)
	}
	return docs, n, nil
}

// eachParkedPage calls fn with the ids of the parked events q selects, at
// most size at a time (more only when more than size events share one
// parked_at millisecond), newest parked first, for an action on "all
// matching" that outbox.ParkedFilter cannot express (a key, a lower time
// bound or a view). Each page is read when the previous one was handled,
// below the parked_at of the previous page: the events it handled drop out
// and the events a purge releases (held behind a purged head, parked later
// than it) are never read. Newest first also purges held events before
// the heads they are held behind, so a purge releases nothing it is about
// to purge.
//
// Queries: inbox find {parked: true, ...q, parked_at < last} sort
// {parked_at: -1} limit size, and for a page that ends inside a
// millisecond, find {parked: true, ...q, parked_at: that millisecond};
// both served by the partial index inbox_parked (parked documents only,
// in parked_at order).
func eachParkedPage(ctx context.Context, s *service, q parkedQuery, size int, fn func([]outbox.InboxID) error) error {
	type idAt struct {
		ID       outbox.InboxID `bson:"_id"`
		ParkedAt time.Time      `bson:"parked_at"`
	}
	read := func(f bson.D, opts *options.FindOptionsBuilder) ([]idAt, error) {
		cur, err := s.inbox.Find(ctx, f, opts.SetProjection(bson.D{{Key: store.InboxID, Value: 1}, {Key: store.InboxParkedAt, Value: 1}}))
		if err != nil {
			return nil, fmt.Errorf("select parked events: %w", err)
		}
		var docs []idAt
		if err := cur.All(ctx, &docs); err != nil {
			return nil, fmt.Errorf("select parked events: %w", err)
		}
		return docs, nil
	}
	ids := func(docs []idAt) []outbox.InboxID {
		out := make([]outbox.InboxID, len(docs))
		for i, d := range docs {
			out[i] = d.ID
		}
		return out
	}
	match := q.filter()
	var below *time.Time
	for {
		f := match
		if below != nil {
			f = bson.D{{Key: "$and", Value: bson.A{match, bson.D{{Key: store.InboxParkedAt, Value: bson.D{{Key: "$lt", Value: *below}}}}}}}
		}
		page, err := read(f, options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: -1}}).SetLimit(int64(size)))
		if err != nil || len(page) == 0 {
			return err
		}
		if len(page) < size {
			return fn(ids(page))
		}
		// A full page may end inside a millisecond: handle the page up to
		// it, then that millisecond's events whole, then go on below it.
		last := page[len(page)-1].ParkedAt
		i := len(page)
		for i > 0 && page[i-1].ParkedAt.Equal(last) {
			i--
		}
		if i > 0 {
			if err := fn(ids(page[:i])); err != nil {
				return err
			}
		}
		tie, err := read(bson.D{{Key: "$and", Value: bson.A{match, bson.D{{Key: store.InboxParkedAt, Value: last}}}}}, options.Find())
		if err != nil {
			return err
		}
		for len(tie) > 0 {
			n := min(size, len(tie))
			if err := fn(ids(tie[:n])); err != nil {
				return err
			}
			tie = tie[n:]
		}
		below = &last
	}
}

// getInbox reads one inbox document. Query: find by _id (the _id index).
func getInbox(ctx context.Context, s *service, id outbox.InboxID) (*inboxDoc, error) {
	var d inboxDoc
	err := s.inbox.FindOne(ctx, bson.D{{Key: store.InboxID, Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read inbox event: %w", err)
	}
	return &d, nil
}

// heldBehind lists the events held behind head, oldest first, and counts
// them.
//
// Queries: inbox find and count {parked: true, held_by.topic,
// held_by.content_schema, held_by.idempotency_key}, served by the partial
// index inbox_parked.
func heldBehind(ctx context.Context, s *service, head outbox.InboxID, size int) ([]inboxDoc, int64, error) {
	f := bson.D{{Key: store.InboxParked, Value: true}, {Key: store.InboxHeldBy + "." + store.IDTopic, Value: head.Topic},
		{Key: store.InboxHeldBy + "." + store.IDContentSchema, Value: head.ContentSchema},
		{Key: store.InboxHeldBy + "." + store.IDIdempotencyKey, Value: head.IdempotencyKey}}
	n, err := s.inbox.CountDocuments(ctx, f)
	if err != nil {
		return nil, 0, fmt.Errorf("count held events: %w", err)
	}
	if n == 0 {
		return nil, 0, nil
	}
	cur, err := s.inbox.Find(ctx, f, options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}, {Key: store.InboxID, Value: 1}}).
		SetLimit(int64(size)).SetProjection(listFields))
	if err != nil {
		return nil, 0, fmt.Errorf("list held events: %w", err)
	}
	var docs []inboxDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, 0, fmt.Errorf("list held events: %w", err)
	}
	return docs, n, nil
}

// getOutbox reads one outbox document. Query: find by _id (the _id index).
func getOutbox(ctx context.Context, s *service, id bson.ObjectID) (*outboxDoc, error) {
	var d outboxDoc
	err := s.outbox.FindOne(ctx, bson.D{{Key: store.OutboxID, Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read outbox event: %w", err)
	}
	return &d, nil
}

// Find needs indexes the framework does not create: an event is looked up
// by its idempotency key or partition key in both collections. Scanning a
// collection from a page load is what the console promises not to do, so
// the find page refuses to run until EnsureFindIndexes created them.
const (
	indexOutboxIdem = "console_idempotency_key"
	indexOutboxKey  = "console_partition_key"
	indexInboxIdem  = "console_idempotency_key"
	indexInboxKey   = "console_partition_key"
)

// EnsureFindIndexes creates, on the service's outbox and inbox, the indexes
// the find page needs: outbox {idempotency_key}, {key}; inbox
// {_id.idempotency_key}, {partition_key}. It is idempotent. Each index
// costs a little on every insert, which is why the framework does not
// create them itself.
func EnsureFindIndexes(ctx context.Context, s Service) error {
	s = s.withDefaults()
	if s.Database == nil {
		return fmt.Errorf("%w: Service.Database is required", ErrOptions)
	}
	_, err := s.Database.Collection(s.OutboxCollection).Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: store.OutboxIdempotencyKey, Value: 1}}, Options: options.Index().SetName(indexOutboxIdem)},
		{Keys: bson.D{{Key: store.OutboxKey, Value: 1}}, Options: options.Index().SetName(indexOutboxKey)},
	})
	if err != nil {
		return fmt.Errorf("console: create find indexes on %s: %w", s.OutboxCollection, err)
	}
	_, err = s.Database.Collection(s.InboxCollection).Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: store.InboxIDIdempotencyKey, Value: 1}}, Options: options.Index().SetName(indexInboxIdem)},
		{Keys: bson.D{{Key: store.InboxPartitionKey, Value: 1}}, Options: options.Index().SetName(indexInboxKey)},
	})
	if err != nil {
		return fmt.Errorf("console: create find indexes on %s: %w", s.InboxCollection, err)
	}
	return nil
}

// indexCache remembers for a minute whether a service has the find
// indexes. Query: listIndexes on both collections.
type indexCache struct {
	mu      sync.Mutex
	checked time.Time
	missing []string
}

func (c *indexCache) missingIndexes(ctx context.Context, s *service) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < time.Minute {
		return c.missing, nil
	}
	var missing []string
	for _, x := range []struct {
		coll  *mongo.Collection
		names []string
	}{{s.outbox, []string{indexOutboxIdem, indexOutboxKey}}, {s.inbox, []string{indexInboxIdem, indexInboxKey}}} {
		specs, err := x.coll.Indexes().ListSpecifications(ctx)
		if err != nil {
			return nil, fmt.Errorf("list indexes of %s: %w", x.coll.Name(), err)
		}
		have := map[string]bool{}
		for _, sp := range specs {
			have[sp.Name] = true
		}
		for _, n := range x.names {
			if !have[n] {
				missing = append(missing, x.coll.Name()+"."+n)
			}
		}
	}
	if len(missing) == 0 { // remember only success: a fix shows at once
		c.checked = time.Now()
	}
	c.missing = missing
	return missing, nil
}

// journey is where one event is in a service: its outbox and inbox
// documents.
type journey struct {
	Service string
	Outbox  []outboxDoc
	Inbox   []inboxDoc
}

// findEvents looks an event up by idempotency key (by == "idempotency") or
// partition key, at most limit documents per collection.
//
// Queries: outbox find {idempotency_key: q} or {key: q}, inbox find
// {_id.idempotency_key: q} or {partition_key: q}, each hinted to the index
// EnsureFindIndexes creates, sorted by the index order, limited.
func findEvents(ctx context.Context, s *service, by, q string, limit int) (journey, error) {
	j := journey{Service: s.Name}
	of, oi, ifield, ii := store.OutboxIdempotencyKey, indexOutboxIdem, store.InboxIDIdempotencyKey, indexInboxIdem
	if by == "partition" {
		of, oi, ifield, ii = store.OutboxKey, indexOutboxKey, store.InboxPartitionKey, indexInboxKey
	}
	cur, err := s.outbox.Find(ctx, bson.D{{Key: of, Value: q}},
		options.Find().SetHint(oi).SetLimit(int64(limit)).SetProjection(listFields))
	if err != nil {
		return j, fmt.Errorf("find in outbox: %w", err)
	}
	if err := cur.All(ctx, &j.Outbox); err != nil {
		return j, fmt.Errorf("find in outbox: %w", err)
	}
	cur, err = s.inbox.Find(ctx, bson.D{{Key: ifield, Value: q}},
		options.Find().SetHint(ii).SetLimit(int64(limit)).SetProjection(listFields))
	if err != nil {
		return j, fmt.Errorf("find in inbox: %w", err)
	}
	if err := cur.All(ctx, &j.Inbox); err != nil {
		return j, fmt.Errorf("find in inbox: %w", err)
	}
	sort.SliceStable(j.Outbox, func(a, b int) bool { return j.Outbox[a].ID.Timestamp().Before(j.Outbox[b].ID.Timestamp()) })
	sort.SliceStable(j.Inbox, func(a, b int) bool { return strings.Compare(j.Inbox[a].ID.String(), j.Inbox[b].ID.String()) < 0 })
	return j, nil
}

// heldBehindFailed lists the pending events of a failed event's key, in
// publishing order, and counts them: under Config.PoisonPolicy HoldKey they
// wait until the failed event is retried or discarded.
//
// Queries: outbox count and find {published: false, topic, partition,
// failed: false, key} sorted by {seq, _id}, served by the partial index
// outbox_pending (topic, partition, seq, _id).
func heldBehindFailed(ctx context.Context, s *service, d *outboxDoc, size int) ([]outboxDoc, int64, error) {
	f := bson.D{{Key: store.OutboxPublished, Value: false}, {Key: store.OutboxTopic, Value: d.Topic}, {Key: store.OutboxPartition, Value: d.Partition},
		{Key: store.OutboxFailed, Value: false}, {Key: store.OutboxKey, Value: d.Key}}
	n, err := s.outbox.CountDocuments(ctx, f)
	if err != nil {
		return nil, 0, fmt.Errorf("count held outbox events: %w", err)
	}
	if n == 0 {
		return nil, 0, nil
	}
	cur, err := s.outbox.Find(ctx, f, options.Find().SetSort(bson.D{{Key: store.OutboxSeq, Value: 1}, {Key: store.OutboxID, Value: 1}}).
		SetLimit(int64(size)).SetProjection(listFields))
	if err != nil {
		return nil, 0, fmt.Errorf("list held outbox events: %w", err)
	}
	var docs []outboxDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, 0, fmt.Errorf("list held outbox events: %w", err)
	}
	return docs, n, nil
}

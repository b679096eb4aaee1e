package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// Scheduled events (outbox.WithPublishAt): the list of those waiting for
// their due time, and their cancellation (outbox.Admin.CancelScheduled).

// scheduledQuery is the scheduled page's filters: a topic, and a partition
// of it (-1: every partition).
type scheduledQuery struct {
	Topic     string
	Partition int32
	Page      int
}

// scheduledDoc is a scheduled event as the list shows it (no payload).
type scheduledDoc struct {
	ID             bson.ObjectID `bson:"_id"`
	Topic          string        `bson:"topic"`
	Partition      int32         `bson:"partition"`
	Key            string        `bson:"key"`
	Schema         string        `bson:"schema"`
	IdempotencyKey string        `bson:"idempotency_key"`
	CreatedAt      *time.Time    `bson:"created_at"`
	DueAt          time.Time     `bson:"due_at"`
}

// scheduledFields are the fields the list reads: never the payload.
var scheduledFields = bson.D{
	{Key: store.OutboxTopic, Value: 1}, {Key: store.OutboxPartition, Value: 1}, {Key: store.OutboxKey, Value: 1},
	{Key: store.OutboxSchema, Value: 1}, {Key: store.OutboxIdempotencyKey, Value: 1}, {Key: store.OutboxCreatedAt, Value: 1},
	{Key: store.ScheduledDueAt, Value: 1},
}

// listScheduled returns a page of the scheduled events q selects that wait
// for their due time, and how many there are.
//
// Query: count and find on the scheduled events' collection with {promoted:
// false, failed: false} (and the topic and partition), hinted to the
// partial index outbox_scheduled_due, which holds exactly those, sorted in
// its order (topic, partition, due time, commit order): only the page's
// index entries and documents are read, besides the skipped entries of the
// earlier pages.
func listScheduled(ctx context.Context, s *service, q scheduledQuery, size int) ([]scheduledDoc, int64, error) {
	f := bson.D{{Key: store.ScheduledPromoted, Value: false}, {Key: store.OutboxFailed, Value: false}}
	if q.Topic != "" {
		f = append(f, bson.E{Key: store.OutboxTopic, Value: q.Topic})
		if q.Partition >= 0 {
			f = append(f, bson.E{Key: store.OutboxPartition, Value: q.Partition})
		}
	}
	coll := s.scheduled()
	n, err := coll.CountDocuments(ctx, f, options.Count().SetHint(store.IndexScheduledDue))
	if err != nil {
		return nil, 0, fmt.Errorf("count scheduled events: %w", err)
	}
	sort := append(bson.D{{Key: store.OutboxTopic, Value: 1}, {Key: store.OutboxPartition, Value: 1}}, store.DueOrder()...)
	cur, err := coll.Find(ctx, f, options.Find().SetHint(store.IndexScheduledDue).SetSort(sort).
		SetSkip(int64(q.Page)*int64(size)).SetLimit(int64(size)).SetProjection(scheduledFields))
	if err != nil {
		return nil, 0, fmt.Errorf("list scheduled events: %w", err)
	}
	var docs []scheduledDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, 0, fmt.Errorf("list scheduled events: %w", err)
	}
	return docs, n, nil
}

// scheduled is the collection of the service's scheduled events.
func (s *service) scheduled() *mongo.Collection {
	return s.Database.Collection(s.OutboxCollection + store.ScheduledSuffix)
}

// scheduledPage is the scheduled page's data.
type scheduledPage struct {
	Q         scheduledQuery
	Partition string
	Events    []scheduledDoc
	Total     int64
	pager
	Now time.Time
}

// parseScheduledQuery reads the scheduled page's filters; a partition
// needs a topic.
func parseScheduledQuery(r *http.Request) (scheduledQuery, error) {
	q := scheduledQuery{Topic: strings.TrimSpace(r.FormValue("topic")), Partition: -1}
	if p := strings.TrimSpace(r.FormValue("partition")); p != "" {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return q, fmt.Errorf("partition must be a non-negative number, not %q", p)
		}
		if q.Topic == "" {
			return q, errors.New("a partition needs its topic")
		}
		q.Partition = int32(n)
	}
	if p := r.FormValue("page"); p != "" {
		var err error
		if q.Page, err = strconv.Atoi(p); err != nil || q.Page < 0 {
			return q, fmt.Errorf("page must be a non-negative number, not %q", p)
		}
	}
	return q, nil
}

// scheduledList lists the scheduled events waiting for their due time, by
// topic, partition and due time, with a Cancel button each when actions
// are allowed.
//
// Queries: listScheduled (count and find hinted to outbox_scheduled_due).
func (c *Console) scheduledList(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	q, err := parseScheduledQuery(r)
	if err == nil {
		err = c.checkPage(q.Page)
	}
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	docs, n, err := listScheduled(ctx, s, q, c.opts.PageSize)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	p := scheduledPage{Q: q, Events: docs, Total: n, Now: c.now().UTC(), pager: c.pagerOf(r, "scheduled", q.Page, len(docs), n)}
	if q.Partition >= 0 {
		p.Partition = strconv.Itoa(int(q.Partition))
	}
	c.render(w, r, "scheduled", s, p, start)
}

// cancelScheduled cancels the scheduled events of a topic with an
// idempotency key (form fields topic and idempotency_key), as the other
// actions: a first POST counts them and asks for confirmation, a POST with
// confirm=yes cancels them. Both go through outbox.Admin.CancelScheduled:
// an event already moved into the outbox is answered "too late" (409),
// never a silent success, and one that is not scheduled 404.
func (c *Console) cancelScheduled(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, operator, ok := c.actionOf(w, r, 1<<20)
	if !ok {
		return
	}
	topic, key := r.PostFormValue("topic"), r.PostFormValue("idempotency_key")
	if topic == "" || key == "" {
		c.fail(w, r, http.StatusBadRequest, errors.New("a cancellation needs the event's topic and idempotency key"))
		return
	}
	confirmed := r.PostFormValue("confirm") == "yes"
	ctx, cancel := c.ctx(r)
	defer cancel()
	n, err := s.admin.CancelScheduled(ctx, topic, key, !confirmed)
	switch {
	case errors.Is(err, outbox.ErrTooLate):
		c.fail(w, r, http.StatusConflict, err)
		return
	case errors.Is(err, outbox.ErrNotScheduled):
		c.fail(w, r, http.StatusNotFound, err)
		return
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if confirmed {
		c.opts.Logger.Info("console: action", "action", "cancel", "service", s.Name, "topic", topic, "idempotency_key", key,
			"events", n, "operator", operator)
	}
	back := url.Values{"svc": {s.Name}, "topic": {topic}}
	p := actionPage{Verb: "Cancel scheduled", Path: "cancel", Done: "cancelled", Count: n, Confirmed: confirmed,
		Back:   "scheduled?" + back.Encode(),
		Fields: []field{{"svc", s.Name}, {"topic", topic}, {"idempotency_key", key}}}
	c.render(w, r, "action", s, p, start)
}

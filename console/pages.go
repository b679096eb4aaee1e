package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// overviewService is one service's part of the overview.
type overviewService struct {
	Name       string
	Store      outbox.StoreStatus
	Topics     []overviewTopic
	Heads      int64
	Held       int64
	HeldKeys   int64
	Published  []int64
	Handled    []int64
	PublishedH int64
	HandledH   int64
	Err        string
}

type overviewTopic struct {
	Topic            string
	Pending          int64
	OldestPendingAge time.Duration
	Failed           int64
	// OutboxHeldKeys and OutboxHeldEvents wait behind failed events.
	OutboxHeldKeys, OutboxHeldEvents int64
	Heads, Held                      int64
	HeldKeys                         int64
	// Scheduled events wait for their due time, the earliest NextDue.
	Scheduled int64
	NextDue   time.Time
}

// overview shows each service's backlog, failed, parked and held events
// per topic, and published and handled events per minute over the last
// hour.
//
// Queries per service: Admin.StoreStatus (outbox aggregate over
// {published: false}, index outbox_pending; when events failed, a read of
// them, index outbox_failed, and a count of the pending events of their
// keys; inbox counts over {parked: true}, index inbox_parked; an aggregate
// of the scheduled events not promoted); parkedByTopic (index inbox_parked); perMinute
// on the outbox (index outbox_published_ttl) and on the inbox (index
// inbox_handled_ttl).
func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := c.ctx(r)
	defer cancel()
	var out []overviewService
	for _, s := range c.services {
		o := overviewService{Name: s.Name}
		if err := c.overviewOf(ctx, s, &o, start); err != nil {
			o.Err = redact(err.Error())
		}
		out = append(out, o)
	}
	c.render(w, r, "overview", nil, out, start)
}

func (c *Console) overviewOf(ctx context.Context, s *service, o *overviewService, now time.Time) error {
	st, err := s.admin.StoreStatus(ctx)
	if err != nil {
		return err
	}
	o.Store = st
	parked, err := parkedByTopic(ctx, s)
	if err != nil {
		return err
	}
	topics := map[string]*overviewTopic{}
	get := func(t string) *overviewTopic {
		if topics[t] == nil {
			topics[t] = &overviewTopic{Topic: t}
		}
		return topics[t]
	}
	for _, b := range st.Topics {
		t := get(b.Topic)
		t.Pending, t.OldestPendingAge, t.Failed = b.Pending, b.OldestPendingAge, b.Failed
		t.OutboxHeldKeys, t.OutboxHeldEvents = b.HeldKeys, b.HeldEvents
		t.Scheduled, t.NextDue = b.Scheduled, b.NextDue
	}
	for name, p := range parked {
		t := get(name)
		t.Heads, t.Held, t.HeldKeys = p.Heads, p.Held, p.HeldHeads
		o.Heads += p.Heads
		o.Held += p.Held
		o.HeldKeys += p.HeldHeads
	}
	for _, t := range topics {
		o.Topics = append(o.Topics, *t)
	}
	slices.SortFunc(o.Topics, func(a, b overviewTopic) int { return strings.Compare(a.Topic, b.Topic) })
	if o.Published, err = perMinute(ctx, s.outbox, store.OutboxPublished, store.OutboxPublishedAt, now); err != nil {
		return err
	}
	if o.Handled, err = perMinute(ctx, s.inbox, store.InboxHandled, store.InboxHandledAt, now); err != nil {
		return err
	}
	for i := range o.Published {
		o.PublishedH += o.Published[i]
		o.HandledH += o.Handled[i]
	}
	return nil
}

// parkedPage is the parked page's data.
type parkedPage struct {
	Q      parkedQuery
	Before string
	After  string
	Events []inboxDoc
	Total  int64
	pager
	Query string
}

// pager is the paging of a list page: the rows shown (First to Last,
// counted from 1) and the links to the neighbouring pages ("" for none).
type pager struct {
	First, Last        int
	PrevPage, NextPage string
}

// pagerOf pages the list at path, whose page of the request's query
// (page) shows shown of total rows; the links keep the request's query.
func (c *Console) pagerOf(r *http.Request, path string, page, shown int, total int64) pager {
	size := c.opts.PageSize
	p := pager{First: page*size + 1, Last: page*size + shown}
	vals := r.URL.Query()
	if page > 0 {
		vals.Set("page", strconv.Itoa(page-1))
		p.PrevPage = path + "?" + vals.Encode()
	}
	if int64(p.Last) < total {
		vals.Set("page", strconv.Itoa(page+1))
		p.NextPage = path + "?" + vals.Encode()
	}
	return p
}

// checkPage refuses a page number beyond maxPage.
func (c *Console) checkPage(page int) error {
	if page > maxPage(c.opts.PageSize) {
		return fmt.Errorf("page must be at most %d, not %d", maxPage(c.opts.PageSize), page)
	}
	return nil
}

// parked lists parked and held events with filters (topic, schema, key,
// parked time, view) and pages.
//
// Queries: listParked (count and find on the partial index inbox_parked).
func (c *Console) parked(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	q, err := parseParkedQuery(r)
	if err == nil {
		err = c.checkPage(q.Page)
	}
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	docs, n, err := listParked(ctx, s, q, c.opts.PageSize)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	p := parkedPage{Q: q, Events: docs, Total: n, Before: r.FormValue("before"), After: r.FormValue("after"),
		pager: c.pagerOf(r, "parked", q.Page, len(docs), n)}
	vals := r.URL.Query()
	vals.Del("page")
	p.Query = vals.Encode()
	c.render(w, r, "parked", s, p, start)
}

// maxPage is the last page number the parked page accepts: its skip,
// page × size, stays within an int32 (a larger number would overflow into
// a negative skip, which MongoDB refuses).
func maxPage(size int) int { return math.MaxInt32/size - 1 }

// parseParkedQuery reads the parked page's filters from a GET query or a
// POSTed form.
func parseParkedQuery(r *http.Request) (parkedQuery, error) {
	q := parkedQuery{Topic: strings.TrimSpace(r.FormValue("topic")), Schema: strings.TrimSpace(r.FormValue("schema")),
		Key: strings.TrimSpace(r.FormValue("key")), View: r.FormValue("view")}
	switch q.View {
	case "", "all", "heads", "held":
	default:
		return q, fmt.Errorf("view must be all, heads or held, not %q", q.View)
	}
	var err error
	if q.Before, err = parseTime(r.FormValue("before")); err != nil {
		return q, fmt.Errorf("before: %w", err)
	}
	if q.After, err = parseTime(r.FormValue("after")); err != nil {
		return q, fmt.Errorf("after: %w", err)
	}
	if p := r.FormValue("page"); p != "" {
		if q.Page, err = strconv.Atoi(p); err != nil || q.Page < 0 {
			return q, fmt.Errorf("page must be a non-negative number, not %q", p)
		}
	}
	return q, nil
}

// parseTime reads an RFC 3339 time, a datetime-local form value
// (2006-01-02T15:04, UTC) or a duration ago (24h).
func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().UTC().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want a time (2006-01-02T15:04, RFC 3339) or a duration ago (24h), not %q", s)
}

// inboxEventPage is the event page's data.
type inboxEventPage struct {
	Doc       *inboxDoc
	ID        string
	Payload   string
	TraceID   string
	Held      []inboxDoc
	HeldTotal int64
	// OutOfBand describes a payload the claim check stored, or is nil.
	OutOfBand *outOfBand
}

// inboxEvent shows one inbox event: payload, attempts, last error,
// delivery, trace id, its head when it is held, and the events held behind
// it.
//
// Queries: getInbox (the _id index), heldBehind (index inbox_parked), and
// for a payload stored out of band its first chunk (outboxOutOfBand).
func (c *Console) inboxEvent(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	id, err := outbox.ParseInboxID(r.FormValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	d, err := getInbox(ctx, s, id)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if d == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no inbox event %s in service %s", id, s.Name))
		return
	}
	p := inboxEventPage{Doc: d, ID: id.String(), Payload: prettyJSON(d.Payload), TraceID: traceID(d.TraceParent)}
	if p.Held, p.HeldTotal, err = heldBehind(ctx, s, id, c.opts.PageSize); err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if p.OutOfBand, err = inboxOutOfBand(ctx, s, d); err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "event", s, p, start)
}

// failedPage is the failed page's data.
type failedPage struct {
	Topic  string
	Events []outbox.FailedEvent
	Total  int64
}

// failed lists failed outbox events, oldest failure first.
//
// Queries: Admin.FailedEvents (find {failed: true} sort failed_at, index
// outbox_failed) and Admin.RetryFailed dry run for the count (same index).
func (c *Console) failed(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	f := outbox.FailedFilter{Topic: strings.TrimSpace(r.FormValue("topic")), Limit: c.opts.PageSize}
	evs, err := s.admin.FailedEvents(ctx, f)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	n, err := s.admin.RetryFailed(ctx, f, nil, true)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "failed", s, failedPage{Topic: f.Topic, Events: evs, Total: n}, start)
}

// outboxEventPage is the outbox event page's data.
type outboxEventPage struct {
	Doc       *outboxDoc
	Payload   string
	TraceID   string
	Held      []outboxDoc
	HeldTotal int64
	// OutOfBand describes a payload the claim check stored, or is nil.
	OutOfBand *outOfBand
}

// outboxEvent shows one outbox event and, when it failed, the pending
// events of its key that wait behind it.
//
// Queries: getOutbox (the _id index), heldBehindFailed (index
// outbox_pending), and for a payload stored out of band its first chunk
// (outboxOutOfBand).
func (c *Console) outboxEvent(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, err := c.service(r)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	oid, err := bson.ObjectIDFromHex(r.FormValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("id %q is not a hex ObjectID", r.FormValue("id")))
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	d, err := getOutbox(ctx, s, oid)
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if d == nil {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no outbox event %s in service %s", oid.Hex(), s.Name))
		return
	}
	p := outboxEventPage{Doc: d, Payload: prettyJSON(d.Payload), TraceID: traceID(d.TraceParent)}
	if p.OutOfBand, err = outboxOutOfBand(ctx, s, d); err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if d.Failed && !d.Published {
		if p.Held, p.HeldTotal, err = heldBehindFailed(ctx, s, d, c.opts.PageSize); err != nil {
			c.fail(w, r, http.StatusInternalServerError, err)
			return
		}
	}
	c.render(w, r, "outbox-event", s, p, start)
}

// findPage is the find page's data.
type findPage struct {
	Q, By    string
	Journeys []journey
	Missing  []string
	Errors   []string
}

// find shows where an event is, by idempotency key or partition key, in
// every service's outbox and inbox.
//
// Queries per service: listIndexes (cached), then findEvents (hinted to the
// indexes of EnsureFindIndexes).
func (c *Console) find(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	p := findPage{Q: strings.TrimSpace(r.FormValue("q")), By: r.FormValue("by")}
	if p.By != "partition" {
		p.By = "idempotency"
	}
	if p.Q != "" {
		ctx, cancel := c.ctx(r)
		defer cancel()
		for _, s := range c.services {
			missing, err := s.findIdx.missingIndexes(ctx, s)
			if err != nil {
				p.Errors = append(p.Errors, s.Name+": "+redact(err.Error()))
				continue
			}
			if len(missing) > 0 {
				p.Missing = append(p.Missing, s.Name+": "+strings.Join(missing, ", "))
				continue
			}
			j, err := findEvents(ctx, s, p.By, p.Q, c.opts.PageSize)
			if err != nil {
				p.Errors = append(p.Errors, s.Name+": "+redact(err.Error()))
				continue
			}
			p.Journeys = append(p.Journeys, j)
		}
	}
	c.render(w, r, "find", nil, p, start)
}

// prettyJSON indents a JSON payload; anything else is shown as it is.
func prettyJSON(s string) string {
	var b bytes.Buffer
	if json.Indent(&b, []byte(s), "", "  ") != nil {
		return s
	}
	return b.String()
}

// traceID is the trace id of a W3C traceparent ("00-<trace>-<span>-01").
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[1]
}

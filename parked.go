package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/attribute"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/internal/store"
)

// Parked events management.
//
// A parked event stays in the inbox with its payload and last error until
// an operator acts on it:
//
//   - Client.Redrive runs its handler at once, in the calling process (which
//     must have the handler registered).
//   - Admin.RequestRedrive marks it for re-drive (redrive_requested_at); a
//     running consumer of the service that has the handler picks the
//     request up within redriveInterval (a query on the parked documents
//     only, served by the partial index inbox_parked), claims it for a
//     lease with a conditional update so that one replica runs it, and
//     re-drives it as Client.Redrive does. The request stays until the
//     re-drive ran (see serveRedriveRequests). This is how tools without handlers (cmd/
//     outboxctl) re-drive.
//   - Admin.PurgeParked gives up on it: it is marked handled (discarded),
//     so a redelivery of the same event is skipped as a duplicate, and the
//     inbox TTL index deletes it after Config.InboxRetention.
//
// Why a request flag rather than putting the event back into a Kafka topic
// or into an outbox: the inbox holds the payload already and the consuming
// service is the only one with the handler; re-publishing would hand the
// event to every consumer group of the topic again (other services would
// see a duplicate and, if their inbox forgot it, handle it twice), and a
// consuming service need not publish that topic at all. The cost is a
// latency of up to redriveInterval and one small indexed query per replica
// per interval.

// redriveInterval is how often a running consumer looks for re-drive
// requests.
const redriveInterval = 5 * time.Second

// ParkedFilter selects parked events. The zero value selects all of them.
type ParkedFilter struct {
	// IDs keeps only these events. Defaults to any.
	IDs []InboxID
	// Topic keeps the events of one topic. Defaults to any.
	Topic string
	// ContentSchema keeps the events of one content schema. Defaults to any.
	ContentSchema string
	// ParkedBefore keeps the events parked before this time. Defaults to
	// any time.
	ParkedBefore time.Time
	// Limit caps the events listed (ParkedEvents only). Defaults to no
	// limit.
	Limit int

	// redrivable leaves out the events that can never be re-driven
	// (RequestRedrive; see redrive_unreadable.go).
	redrivable bool
	// headsOnly leaves out the held events: a re-drive of a selection
	// (no IDs) requests their heads', which release them in order; a
	// request for a held event alone would be dropped when served, and
	// counting it told an operator that more events would be re-driven
	// than are.
	headsOnly bool
}

func (f ParkedFilter) query() bson.D {
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
	if f.redrivable {
		q = append(q, bson.E{Key: "$nor", Value: unreadableConds()})
	}
	if f.headsOnly {
		q = append(q, bson.E{Key: store.InboxHeldBy, Value: nil})
	}
	return q
}

// parkedDoc is an inbox document as the parked-event tools read it.
type parkedDoc struct {
	Doc                inboxDoc   `bson:",inline"` // exported: the codec skips unexported fields
	RedriveRequestedAt *time.Time `bson:"redrive_requested_at,omitempty"`
	RedriveDeferred    string     `bson:"redrive_deferred,omitempty"`
	RedriveNotBefore   *time.Time `bson:"redrive_not_before,omitempty"`
}

func (d *parkedDoc) event() ParkedEvent {
	p := ParkedEvent{ID: d.Doc.ID, Partition: d.Doc.Partition, Offset: d.Doc.Offset, PartitionKey: d.Doc.PartitionKey,
		Attempts: d.Doc.Attempts, Failures: d.Doc.Failures, LastError: d.Doc.LastError, Payload: d.Doc.Payload, OccurredAt: d.Doc.OccurredAt,
		State: ParkedStateParked, HeldBy: d.Doc.HeldBy, PayloadTruncated: d.Doc.PayloadTruncated}
	if d.Doc.HeldBy != nil {
		p.State = ParkedStateHeld
	}
	if d.Doc.ParkedAt != nil {
		p.ParkedAt = *d.Doc.ParkedAt
	}
	if d.RedriveRequestedAt != nil {
		p.RedriveRequestedAt = *d.RedriveRequestedAt
		p.RedriveDeferred = d.RedriveDeferred
		if d.RedriveDeferred != "" && d.RedriveNotBefore != nil {
			p.RedriveNextTry = *d.RedriveNotBefore
		}
	}
	return p
}

// ParkedEvent is an event the consumer set aside: its handler failed
// Config.MaxAttempts times or asked to park it (Park), its record was
// malformed, or (State ParkedStateHeld) it waits behind an earlier parked
// event of its partition key (Config.PoisonPolicy HoldKey).
type ParkedEvent struct {
	ID           InboxID `json:"id"`
	Partition    int32   `json:"partition"`
	Offset       int64   `json:"offset"`
	PartitionKey string  `json:"partition_key"`
	// Attempts counts the event's runs: those whose handler failed
	// (Failures) and those that ended without a result (the process died
	// or lost the partition during them).
	Attempts  int32     `json:"attempts"`
	Failures  int32     `json:"failures"`
	LastError string    `json:"last_error"`
	ParkedAt  time.Time `json:"parked_at"`
	Payload   string    `json:"payload"`
	// OccurredAt is the event's occurred-at time, when it had one.
	OccurredAt time.Time `json:"occurred_at,omitzero"`
	// State is ParkedStateParked for an event parked on its own (the head
	// of its key under Config.PoisonPolicy HoldKey) and ParkedStateHeld for
	// an event held behind another one of its key.
	State string `json:"state"`
	// HeldBy is the event a held event waits for (the head of its key's
	// chain when the chain started); nil unless State is ParkedStateHeld.
	HeldBy *InboxID `json:"held_by,omitempty"`
	// PayloadTruncated is set when the payload was too large to store whole
	// (near MongoDB's 16 MiB document limit): Payload holds its first bytes
	// and the event cannot be re-driven.
	PayloadTruncated bool `json:"payload_truncated,omitempty"`
	// RedriveRequestedAt is when a re-drive was requested
	// (Admin.RequestRedrive) and not yet served; zero when none is pending.
	RedriveRequestedAt time.Time `json:"redrive_requested_at,omitzero"`
	// RedriveDeferred says why the last try of a pending re-drive request
	// could not run ("snoozed", "conflict", "locked" or "infra", then the
	// error): a reason that is not the handler's failure, so nothing was
	// counted and the request stays until it runs; "" when none.
	RedriveDeferred string `json:"redrive_deferred,omitempty"`
	// RedriveNextTry is when a deferred request is tried again (at the
	// latest); zero unless RedriveDeferred is set.
	RedriveNextTry time.Time `json:"redrive_next_try,omitzero"`
}

// States of a ParkedEvent.
const (
	// ParkedStateParked: parked on its own, after its attempts or at the
	// handler's request (Park), or malformed.
	ParkedStateParked = "parked"
	// ParkedStateHeld: parked behind an earlier parked event of its
	// partition key, to keep the key's order (Config.PoisonPolicy HoldKey).
	ParkedStateHeld = "held"
)

// Redrive runs the handler of a parked event now, in the calling process
// (which must have the handler registered), from the payload stored in the
// inbox, in one transaction that also takes it off its key's sequence. On
// success the event is handled (exactly once, as for a delivery), then the
// events held behind it (Config.PoisonPolicy HoldKey) are handled the same
// way, one transaction each, in order, with the usual retries; one that
// still fails after its attempts (counting its stored ones) or asks to
// park becomes the parked head of its key, the rest stay held behind it,
// and Redrive still returns nil (the failure is logged and listed by
// Admin.ParkedEvents). When ctx ends or MongoDB fails during that release,
// Redrive returns and the partition's consumer goes on with it within
// seconds: every step is one transaction, so nothing is left half done. On
// failure of the event itself it stays parked with the new error (and one
// more attempt), which Redrive returns. When the event could not run for a
// reason that is not its handler's failure (the handler snoozed, a write
// conflict, a lock still held after a few tries and a request to end the
// sessions of dead replicas, MongoDB failing), nothing is counted, the
// event stays parked as it was, and the error is a *RedriveDeferredError
// (ErrRedriveDeferred): try again later. With Config.SkipUnknownEvents, an
// event no handler takes is skipped (marked handled, skip_reason
// no_handler) and the events held behind it are released.
//
// Only the head of a key (its oldest parked event in the partition) can be
// re-driven: another one returns ErrHeld. A held event that became the head
// (the event it waited for was handled or purged) is released with the rest.
func (c *Client) Redrive(ctx context.Context, id InboxID) error {
	var d inboxDoc
	err := c.inbox.FindOne(ctx, bson.D{{Key: store.InboxID, Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !d.Parked) {
		return fmt.Errorf("%w: %+v", ErrNotParked, id)
	}
	if err != nil {
		return fmt.Errorf("outbox: redrive: %w", err)
	}
	if d.Unreadable {
		return fmt.Errorf("%w: %s", ErrNotRedrivable, id)
	}
	tp := consume.TopicPartition{Topic: id.Topic, Partition: d.Partition}
	key := d.PartitionKey
	if c.cfg.PoisonPolicy != HoldKey {
		key = "" // no sequences: the event alone
	}
	if d.HeldBy != nil && key != "" {
		head, ok, err := firstParked(ctx, c.inbox, tp, key)
		if err != nil {
			return fmt.Errorf("outbox: redrive: %w", err)
		}
		if !ok || head.ID != id {
			return fmt.Errorf("%w: %s is held behind %s", ErrHeld, id, head.ID)
		}
		c.releaseKey(ctx, tp, key)
		return nil
	}
	if c.handlerFor(id.Topic, id.ContentSchema) == nil && !c.cfg.SkipUnknownEvents {
		return fmt.Errorf("%w: topic %q, content schema %q", ErrNoHandler, id.Topic, id.ContentSchema)
	}
	// The partition's consumer may be adding events behind the head
	// meanwhile (a write conflict on the head), or a replica that died left
	// its transaction open on it (a lock, until its session is ended): try
	// again a few times, asking for a reap.
	e, res := c.releaseHead(ctx, tp, key, &id)
	for tries := 1; res.Kind == consume.Locked && tries <= redriveLockedTries; tries++ {
		c.host().Reap()
		if !retry.Sleep(ctx, nil, c.cfg.backoff().Delay(tries-1)) {
			break
		}
		e, res = c.releaseHead(ctx, tp, key, &id)
	}
	switch res.Kind {
	case consume.Handled:
		c.tel.handled.Add(ctx, 1, eventAttrs(&deliveryOf(e).env))
		if key != "" {
			c.releaseKey(ctx, tp, key)
		}
		return nil
	case consume.Skipped:
		c.tel.skipped.Add(ctx, 1, eventAttrs(&deliveryOf(e).env, attrReason.String(reasonNoHandler)))
		if key != "" {
			c.releaseKey(ctx, tp, key)
		}
		return nil
	case consume.Empty:
		return fmt.Errorf("%w: %+v", ErrNotParked, id)
	case consume.HeadParked:
		return res.Err
	case consume.Canceled:
		return fmt.Errorf("outbox: redrive %s: %w", id, cmp.Or(ctx.Err(), res.Err))
	case consume.Locked, consume.Infra:
		if res.Kind == consume.Locked {
			c.host().Reap()
		}
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: c.cfg.backoff().Delay(redriveLockedTries), Err: res.Err}
	case consume.Snoozed:
		// Not the handler's failure: the worker's own release does not
		// count a snooze either.
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: res.Snooze, Err: res.Err}
	case consume.Conflict:
		return &RedriveDeferredError{Reason: res.Kind.String(), RetryAfter: c.cfg.backoff().Delay(0), Err: res.Err}
	}
	// The handler failed (or its commit did): the event stays parked with
	// the new error.
	reason := "handler_error"
	if res.Park {
		reason = "handler_parked"
	}
	if _, err := c.host().NoteReleaseFailure(context.WithoutCancel(ctx), tp, e, res.Err, 1, true, reason); err != nil {
		c.cfg.Logger.Warn("outbox: noting a failed re-drive failed", "id", id.String(), "err", err)
	}
	return res.Err
}

// redriveLockedTries is how many times Redrive tries again a head whose
// inbox entry another transaction is writing.
const redriveLockedTries = 5

// releaseKey releases the held events of key inline (Redrive), until one
// fails for good, MongoDB fails or ctx ends: the partition's consumer goes
// on from there.
func (c *Client) releaseKey(ctx context.Context, tp consume.TopicPartition, key string) {
	h := c.host()
	consume.ReleaseKey(ctx, h, h, c.cfg.backoff(), tp, key)
}

// host is a consumeHost for work outside the consumer (Redrive).
func (c *Client) host() *consumeHost {
	if cons := c.tel.cons.Load(); cons != nil {
		return c.newConsumeHost(cons)
	}
	return c.newConsumeHost(&consumer{c: c, log: c.cfg.Logger.With("outbox.component", "consumer"), errLog: newRateLog(errorRelog)})
}

// firstParked reads the head of key's sequence (internal/inboxhost's
// keyseq.go); ok is false when the key holds nothing.
func firstParked(ctx context.Context, inbox *mongo.Collection, tp consume.TopicPartition, key string) (d headDoc, ok bool, err error) {
	err = inbox.FindOne(ctx, seqFilter(tp, key),
		options.FindOne().SetSort(firstInSeq).SetProjection(store.HeadProjection())).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("outbox: read the held events of key %q in %s: %w", key, tp, err)
	}
	return d, true, nil
}

// ParkedEvents lists the parked events f selects, oldest first.
func (a *Admin) ParkedEvents(ctx context.Context, f ParkedFilter) ([]ParkedEvent, error) {
	opts := options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}, {Key: store.InboxID, Value: 1}})
	if f.Limit > 0 {
		opts.SetLimit(int64(f.Limit))
	}
	cur, err := a.inbox.Find(ctx, f.query(), opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked events: %w", err)
	}
	var docs []parkedDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("outbox: list parked events: %w", err)
	}
	out := make([]ParkedEvent, 0, len(docs))
	heads := map[headKey]*InboxID{} // the head of each key met
	for i := range docs {
		p := docs[i].event()
		if p.State == ParkedStateHeld {
			k := headKey{p.ID.Topic, p.Partition, p.PartitionKey}
			head, ok := heads[k]
			if !ok {
				d, found, err := firstParked(ctx, a.inbox, consume.TopicPartition{Topic: k.topic, Partition: k.partition}, k.key)
				if err != nil {
					return nil, fmt.Errorf("outbox: list parked events: %w", err)
				}
				if found && d.ID != p.ID {
					head = &d.ID
				}
				heads[k] = head
			}
			p.HeldBy = head
			if head == nil || *head == p.ID {
				p.HeldBy = nil // the head itself: released next
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// headKey names a key's sequence.
type headKey struct {
	topic     string
	partition int32
	key       string
}

// RequestRedrive asks the service's running consumers to re-drive the
// parked events f selects (Limit ignored): one replica that has the
// event's handler runs it within a few seconds, as Client.Redrive does. An
// event whose handler no replica has keeps its request (it shows in
// StoreStatus.RedriveRequested). A request whose re-drive could not run for
// a reason that is not the handler's failure (it snoozed, a conflict, a
// lock, MongoDB failing: see ErrRedriveDeferred) stays too, with the reason
// (ParkedEvent.RedriveDeferred, StoreStatus.RedriveDeferred), and is tried
// again until it runs. A held event (Config.PoisonPolicy
// HoldKey) is re-driven after the event it is held behind, never alone: a
// request for it alone is dropped when served. A malformed record whose
// envelope could not be read can never be re-driven: when f names one, the
// request is refused with ErrNotRedrivable and nothing is marked; a
// selection without IDs leaves such records out, and the held events too
// (their heads' re-drive releases them). With dryRun nothing changes. It returns how many events were (or would be) marked; when f
// names IDs and none of them is parked, the error wraps ErrNotParked.
func (a *Admin) RequestRedrive(ctx context.Context, f ParkedFilter, dryRun bool) (int64, error) {
	if err := a.refuseUnreadable(ctx, f); err != nil {
		return 0, err
	}
	f.redrivable = true
	f.headsOnly = len(f.IDs) == 0
	return a.updateParked(ctx, f, dryRun, "request re-drive of", bson.D{
		{Key: "$set", Value: bson.D{{Key: store.InboxRedriveRequestedAt, Value: time.Now().UTC()}}},
		{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: ""}, {Key: store.InboxRedriveDeferred, Value: ""}}},
	})
}

// PurgeParked gives up on the parked events f selects (Limit ignored): each
// is marked handled and discarded (discarded_at), so a redelivery of the
// same event is skipped as a duplicate, and the inbox TTL index deletes it
// after Config.InboxRetention. The events held behind a purged event
// (Config.PoisonPolicy HoldKey) and not purged themselves go on in order:
// when the next one of its key only waited (held), the partition's running
// consumer releases it and the rest within seconds; when it was parked on
// its own, it is the key's head now.
// With dryRun nothing changes. It returns how many events were (or would
// be) purged; when f names IDs and none of them is parked, the error wraps
// ErrNotParked.
func (a *Admin) PurgeParked(ctx context.Context, f ParkedFilter, dryRun bool) (int64, error) {
	now := time.Now().UTC()
	return a.updateParked(ctx, f, dryRun, "purge", bson.D{
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

func (a *Admin) updateParked(ctx context.Context, f ParkedFilter, dryRun bool, what string, update bson.D) (int64, error) {
	q := f.query()
	var n int64
	if dryRun {
		c, err := a.inbox.CountDocuments(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("outbox: %s parked events: %w", what, err)
		}
		n = c
	} else {
		res, err := a.inbox.UpdateMany(ctx, q, update)
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

// startRedriveRequests runs the loop that serves re-drive requests until
// ctx ends; handlers run under ctx too: a shutdown cuts a re-drive short
// between two transactions, and the partition's consumer goes on with it.
// The returned function waits for the loop to end.
func (c *Client) startRedriveRequests(ctx context.Context) (wait func()) {
	every := c.test.redriveEvery
	if every <= 0 {
		every = redriveInterval
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := c.serveRedriveRequests(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("outbox: reading re-drive requests failed", "err", err)
				c.tel.setError(err)
			}
		}
	})
	return wg.Wait
}

// serveRedriveRequests re-drives the requested parked events this process
// has handlers for (or skips, Config.SkipUnknownEvents). A request stays
// until its re-drive ran (the handler ran to a result, or the event was
// skipped, handled or purged meanwhile): one that could not run for a
// reason that is not the handler's (RedriveDeferredError) keeps its
// request, with the reason (redrive_deferred) and the time of its next try
// (redrive_not_before). A replica claims a request by setting
// redrive_not_before a lease ahead (a conditional update), so that one
// replica runs it; one that dies after the claim leaves the request to
// another replica once the lease ends.
func (c *Client) serveRedriveRequests(ctx context.Context) error {
	now := time.Now().UTC()
	due := bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: store.InboxRedriveNotBefore, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: store.InboxRedriveNotBefore, Value: bson.D{{Key: "$lte", Value: now}}}},
	}}
	cur, err := c.inbox.Find(ctx, bson.D{
		{Key: store.InboxParked, Value: true},
		{Key: store.InboxRedriveRequestedAt, Value: bson.D{{Key: "$exists", Value: true}}},
		due,
	}, options.Find().SetSort(bson.D{{Key: store.InboxParkedAt, Value: 1}}).SetLimit(100))
	if err != nil {
		return fmt.Errorf("outbox: find re-drive requests: %w", err)
	}
	var docs []parkedDoc
	if err := cur.All(ctx, &docs); err != nil {
		return fmt.Errorf("outbox: read re-drive requests: %w", err)
	}
	for i := range docs {
		d, rr := &docs[i].Doc, docs[i].RedriveRequestedAt
		if ctx.Err() != nil {
			return nil
		}
		h := c.handlerFor(d.ID.Topic, d.ID.ContentSchema)
		if h == nil && !c.cfg.SkipUnknownEvents {
			continue // another replica or version of the service may have it
		}
		lease := redriveLease
		if h != nil {
			lease += h.timeout(c)
		}
		res, err := c.inbox.UpdateOne(ctx,
			bson.D{{Key: store.InboxID, Value: d.ID}, {Key: store.InboxParked, Value: true}, {Key: store.InboxRedriveRequestedAt, Value: *rr}, due},
			bson.D{{Key: "$set", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: time.Now().UTC().Add(lease)}}}})
		if err != nil {
			return fmt.Errorf("outbox: claim re-drive request: %w", err)
		}
		if res.ModifiedCount == 0 {
			continue // claimed by another replica, or purged meanwhile
		}
		env := Envelope{Topic: d.ID.Topic, ContentSchema: d.ID.ContentSchema, IdempotencyKey: d.ID.IdempotencyKey,
			PartitionKey: d.PartitionKey, Partition: d.Partition, TraceParent: d.TraceParent, TraceState: d.TraceState}
		meta := Metadata{Envelope: env, Offset: d.Offset, Attempt: int(d.Attempts) + 1}
		sctx, span := c.tel.startHandle(ctx, &meta)
		span.SetAttributes(attribute.Bool("outbox.redrive", true))
		err = c.Redrive(sctx, d.ID)
		if err != nil {
			span.RecordError(err)
		}
		span.End()
		c.settleRedriveRequest(ctx, d.ID, *rr, err)
		var deferred *RedriveDeferredError
		switch {
		case err == nil:
			c.cfg.Logger.Info("outbox: parked event re-driven", "id", d.ID.String())
		case errors.Is(err, ErrNotParked), errors.Is(err, ErrHeld), ctx.Err() != nil && errors.Is(err, ctx.Err()):
			// Handled or purged meanwhile, or held: re-driven with its
			// head; or stopping: the request stays for the next replica.
		case errors.As(err, &deferred):
			log := c.cfg.Logger.Info
			if deferred.Reason == consume.Locked.String() || deferred.Reason == consume.Infra.String() {
				log = c.cfg.Logger.Warn
				c.tel.setError(fmt.Errorf("re-drive %s: %w", d.ID, err))
			}
			log("outbox: re-drive could not run; the request stays and is tried again", "id", d.ID.String(),
				"reason", deferred.Reason, "retry_in", deferred.RetryAfter.Round(time.Millisecond).String(), "err", deferred.Err)
		default:
			c.cfg.Logger.Warn("outbox: re-drive failed; event stays parked", "id", d.ID.String(), "err", err)
			c.tel.setError(fmt.Errorf("re-drive %s: %w", d.ID, err))
			c.tel.parked.Add(ctx, 1, eventAttrs(&env, attrReason.String("redrive_failed")))
		}
	}
	return nil
}

// redriveLease is how long a claimed re-drive request is left to the
// replica that claimed it, beyond its handler's timeout, before another
// replica may serve it.
const redriveLease = time.Minute

// settleRedriveRequest writes what a re-drive served from a request (the
// request of requestedAt) left: after a deferral (RedriveDeferredError) the
// request stays, with the reason and the time of its next try; when the
// serving replica stops the request is left to another one at once;
// otherwise (it ran) the request is done. A request made again meanwhile
// (a new requestedAt) stays.
func (c *Client) settleRedriveRequest(ctx context.Context, id InboxID, requestedAt time.Time, err error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replicaWriteTimeout)
	defer cancel()
	filter := bson.D{{Key: store.InboxID, Value: id}, {Key: store.InboxRedriveRequestedAt, Value: requestedAt}}
	var update bson.D
	var deferred *RedriveDeferredError
	switch {
	case errors.As(err, &deferred):
		update = bson.D{{Key: "$set", Value: bson.D{
			{Key: store.InboxRedriveNotBefore, Value: time.Now().UTC().Add(deferred.RetryAfter)},
			{Key: store.InboxRedriveDeferred, Value: store.Truncate(deferred.Reason+": "+deferred.Err.Error(), 1024)},
		}}}
	case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
		update = bson.D{{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveNotBefore, Value: ""}}}}
	default:
		update = bson.D{{Key: "$unset", Value: bson.D{{Key: store.InboxRedriveRequestedAt, Value: ""},
			{Key: store.InboxRedriveNotBefore, Value: ""}, {Key: store.InboxRedriveDeferred, Value: ""}}}}
	}
	if _, err := c.inbox.UpdateOne(wctx, filter, update); err != nil {
		// The claim's lease ends: the request is served again.
		c.cfg.Logger.Warn("outbox: updating a re-drive request failed; it is served again when its claim ends",
			"id", id.String(), "err", err)
	}
}

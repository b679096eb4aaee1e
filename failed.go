package outbox

// Failed outbox events (Admin.FailedEvents, RetryFailed, DiscardFailed) and
// the keys they hold: the operator's side of the publisher's hold policy
// (Config.PoisonPolicy; the mechanics are in internal/publish, see its
// holds type).

import (
	"context"
	"errors"
	"time"

	"github.com/event-outbox/outbox/internal/operator"
)

// heldCounts fills the held keys and events of st and byTopic: the distinct
// (topic, partition, key) of the failed events, and the pending events of
// those keys (see operator.Outbox.Held).
func (a *Admin) heldCounts(ctx context.Context, st *StoreStatus, byTopic map[string]*TopicBacklog) error {
	all, topics, err := a.failed().Held(ctx)
	if err != nil {
		return err
	}
	st.OutboxHeldKeys += all.Keys
	st.OutboxHeldEvents += all.Events
	for topic, h := range topics {
		b := byTopic[topic]
		if b == nil {
			b = &TopicBacklog{Topic: topic}
			byTopic[topic] = b
		}
		b.HeldKeys += h.Keys
		b.HeldEvents += h.Events
	}
	return nil
}

// failed runs the operator's actions on the outbox.
func (a *Admin) failed() operator.Outbox { return operator.Outbox{Coll: a.outbox, Claims: a.claims} }

// failedOf runs the operator's actions on the failed events f selects: the
// outbox's, or with f.Scheduled the scheduled events' collection, whose
// failed documents are the events whose promotion was refused (their
// fields are an outbox document's).
func (a *Admin) failedOf(f FailedFilter) operator.Outbox {
	if f.Scheduled {
		return operator.Outbox{Coll: a.scheduled(), Claims: a.claims}
	}
	return a.failed()
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
	// PayloadSize is the size of the event's JSON in bytes, whether stored
	// in its outbox document or out of band (Config.ClaimCheck).
	PayloadSize int `json:"payload_size"`
}

// FailedFilter selects failed outbox events.
type FailedFilter struct {
	// Topic keeps the events of one topic. Defaults to every topic.
	Topic string
	// Limit caps the events returned. Defaults to no limit.
	Limit int
	// Scheduled selects, instead of the outbox's failed events, the
	// scheduled events (WithPublishAt, WithDelay) whose promotion was
	// refused for good (StoreStatus.ScheduledFailed: a duplicate
	// idempotency key under Config.UniqueIdempotencyKeys): FailedEvents
	// lists them and DiscardFailed deletes them; RetryFailed refuses them,
	// as their promotion would be refused again. Their IDs are the
	// scheduled documents' _id. Selecting them reads the whole scheduled
	// events' collection (no index serves failed there). Defaults to false.
	Scheduled bool
}

// FailedEvents lists failed outbox events, oldest failure first.
func (a *Admin) FailedEvents(ctx context.Context, f FailedFilter) ([]FailedEvent, error) {
	evs, err := a.failedOf(f).Failed(ctx, operator.FailedFilter(f))
	if err != nil {
		return nil, err
	}
	out := make([]FailedEvent, len(evs))
	for i, e := range evs {
		out[i] = FailedEvent(e)
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
	if f.Scheduled {
		return 0, errors.New("outbox: failed scheduled events cannot be retried: their promotion would be refused again; discard them (DiscardFailed)")
	}
	return a.failed().Retry(ctx, operator.FailedFilter(f), ids, dryRun)
}

// DiscardFailed deletes the selected failed events (those of f, Limit
// ignored, narrowed to ids when not empty) from the outbox: they are never
// published (with f.Scheduled: the scheduled events whose promotion was
// refused). The payloads of those stored out of band (Config.ClaimCheck)
// are marked in the same transaction to expire as a published event's
// (OutboxRetention plus ClaimCheck.Margin from now); an Admin from
// NewAdmin looks for them in the outbox_payloads collection of its
// database, the default ClaimCheck.Database. It deletes in transactions
// of at most 1000 events; a run that dies in one leaves its events locked
// until MongoDB aborts that transaction (transactionLifetimeLimitSeconds,
// 60 s by default), and a rerun waits for it. Under Config.PoisonPolicy HoldKey this releases their keys:
// the publisher publishes the events that waited behind them, in order,
// within seconds. With dryRun it only counts them. It returns how many
// events were (or would be) discarded.
func (a *Admin) DiscardFailed(ctx context.Context, f FailedFilter, ids []string, dryRun bool) (int64, error) {
	return a.failedOf(f).Discard(ctx, operator.FailedFilter(f), ids, dryRun)
}

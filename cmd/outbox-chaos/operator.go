package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// operator plays the on-call engineer: every operatorEvery it looks at
// the parked and the failed events (Admin.ParkedEvents, Admin.FailedEvents)
// and acts as the runbook says.
//
//   - A parked poison event (its handler always fails), and a parked
//     malformed record that carries a workload key, are purged once parked
//     for purgeAfter: under HoldKey that releases their key's held events,
//     in order.
//   - A parked step event is re-driven once its key's outage is over, by
//     turns with Admin.RequestRedrive (a replica serves the request) and
//     with Client.Redrive on a live replica; under HoldKey re-driving the
//     head releases the key's held events in order. Whether it should have
//     been parked at all is judged from the inbox history (judgeOrder).
//   - A held event is left alone: the framework releases it.
//   - An outbox event marked failed is expected only when it is too large
//     alone for the topic's limit (oversize); an innocent one (it fits
//     alone) is a violation. Once the small-limit window is closed, every
//     failed event is retried (Admin.RetryFailed).
//
// Malformed records with a unique key stay parked: they hold nothing.
// Every re-drive is recorded (redriveFact) and judged at the end. The
// operator's goroutine is owned by runHarness, which stops it (ctx) before
// the final check.
type operator struct {
	h     *harness
	admin *outbox.Admin
	rng   *rand.Rand

	mu       sync.Mutex
	innocent map[string]bool // innocent events seen failed in the outbox
	oversize map[string]bool // oversize events seen failed
	redrives []redriveFact   // re-drive requests and calls made
	purges   int             // poison events and malformed records purged
	retries  int64           // failed events retried
	// held are the load's keys with a parked head at the last look
	// (keyless-behind-held writes behind them).
	held []string
	// cancelled counts the Client.Redrive calls whose context was
	// cancelled while they ran (mid-release).
	cancelled int
	// ignored counts the events of schemaIgnored written (-skip-unknown).
	ignored int
	// cuts (the operator's goroutine only) counts the re-drives of each
	// mass-hold event cut short; after maxCuts its re-drive is requested
	// instead, so that a machine too loaded for any cut re-drive to get
	// through still ends the hold.
	cuts map[outbox.InboxID]int
	// loadOver stops the writes of schemaIgnored at the end of the load:
	// one written after the quiescence's last look would still be unread
	// when the final check reads the group's offsets.
	loadOver atomic.Bool
}

const operatorEvery = 500 * time.Millisecond

// maxCuts is how many re-drives of one mass-hold event the operator cuts
// short (each cancelled 1 to 11 ms in) before it requests its re-drive.
const maxCuts = 3

// purgeAfter is how long the operator leaves a poison event (or a keyed
// malformed record) parked before purging it.
const purgeAfter = 2 * time.Second

func newOperator(h *harness) *operator {
	return &operator{h: h, admin: outbox.NewAdmin(h.db, "outbox", "inbox"), rng: rand.New(rand.NewPCG(h.cfg.seed, 0x0e7)),
		innocent: map[string]bool{}, oversize: map[string]bool{}, cuts: map[outbox.InboxID]int{}}
}

// run ticks until ctx ends.
func (o *operator) run(ctx context.Context) {
	t := time.NewTicker(operatorEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := o.tick(ctx); err != nil && ctx.Err() == nil {
			o.h.logf("operator: %v", err)
		}
	}
}

func (o *operator) tick(ctx context.Context) error {
	if err := o.parkedEvents(ctx); err != nil {
		return err
	}
	return o.failedEvents(ctx)
}

// malformedKeyed reports whether a parked event is a malformed record that
// carries a workload key (see injector.writeMalformed).
func malformedKeyed(p *outbox.ParkedEvent) bool {
	return isMalformedID(p.ID) && !isMalformedKey(p.PartitionKey)
}

func (o *operator) parkedEvents(ctx context.Context) error {
	parked, err := o.h.parkedNow(ctx, o.admin)
	if err != nil {
		return err
	}
	var purge, request, call, cut []outbox.InboxID
	var held []string
	for i := range parked {
		p := &parked[i]
		if parkedIsHeld(p) {
			continue
		}
		if slices.Contains(o.h.work.keys, p.PartitionKey) {
			held = append(held, p.PartitionKey)
		}
		switch {
		case p.ID.ContentSchema == schemaIgnored:
			o.h.logf("operator: %s, of a type the replicas skip, is parked and holds its key", p.ID)
		case p.ID.ContentSchema == schemaNew:
			// No handler yet: the replicas that have it release it
			// (no-handler-deploy); nothing for the operator to do.
		case p.ID.ContentSchema == schemaPoison || malformedKeyed(p):
			// Not at once: the key's later events arriving meanwhile must
			// be held behind it (a purge within milliseconds would leave
			// no time to see a hold missing).
			if time.Since(p.ParkedAt) >= purgeAfter {
				purge = append(purge, p.ID)
			}
		case isMalformedID(p.ID) || isMalformedKey(p.PartitionKey):
		default:
			o.h.work.sawParked(p.PartitionKey)
			if o.h.work.isDown(p.PartitionKey) {
				continue
			}
			switch {
			case isMassKey(p.PartitionKey):
				// A thousand at once: requests, in one call, but for a few
				// calls per look (cut short, see below).
				switch {
				case len(cut) < 8 && p.RedriveRequestedAt.IsZero() && o.cuts[p.ID] < maxCuts:
					o.cuts[p.ID]++
					cut = append(cut, p.ID)
				case p.RedriveRequestedAt.IsZero() || time.Since(p.RedriveRequestedAt) > 20*time.Second:
					request = append(request, p.ID)
				}
			case o.rng.IntN(2) == 0:
				call = append(call, p.ID)
			case p.RedriveRequestedAt.IsZero() || time.Since(p.RedriveRequestedAt) > 20*time.Second:
				request = append(request, p.ID)
			}
		}
	}
	o.mu.Lock()
	o.held = held
	o.mu.Unlock()
	if o.h.cfg.skipUnknown && len(held) > 0 && !o.loadOver.Load() {
		if err := o.writeIgnored(ctx, held[o.rng.IntN(len(held))]); err != nil {
			o.h.logf("operator: write an event of an ignored type: %v", err)
		}
	}
	if len(purge) > 0 {
		n, err := o.admin.PurgeParked(ctx, outbox.ParkedFilter{IDs: purge}, false)
		if err != nil && !errors.Is(err, outbox.ErrNotParked) {
			return fmt.Errorf("purge: %w", err)
		}
		o.mu.Lock()
		o.purges += int(n)
		o.mu.Unlock()
	}
	if len(request) > 0 {
		_, err := o.admin.RequestRedrive(ctx, outbox.ParkedFilter{IDs: request}, false)
		if err != nil && !errors.Is(err, outbox.ErrNotParked) {
			return fmt.Errorf("request re-drive: %w", err)
		}
		if err == nil {
			o.mu.Lock()
			for _, id := range request {
				o.redrives = append(o.redrives, redriveFact{Ref: eventRef(id.Topic, id.IdempotencyKey), How: "request"})
			}
			o.mu.Unlock()
		}
	}
	for i, id := range append(call, cut...) {
		r := o.h.pick(o.rng)
		if r == nil {
			break
		}
		rctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		// A third of the calls are cancelled while they run, as a request
		// context ends when its client goes away: the release stops
		// between two transactions and must leave nothing parked that did
		// not fail (judgeOrder: parked-unexplained), the key's consumer
		// going on with it.
		var cutter *time.Timer
		if i >= len(call) || o.rng.IntN(3) == 0 {
			cutter = time.AfterFunc(time.Millisecond+time.Duration(o.rng.Int64N(int64(10*time.Millisecond))), cancel)
		}
		err := r.client.Redrive(rctx, id)
		cancelled := cutter != nil && !cutter.Stop() && errors.Is(rctx.Err(), context.Canceled)
		cancel()
		switch {
		case cancelled:
			o.mu.Lock()
			o.cancelled++
			o.redrives = append(o.redrives, redriveFact{Ref: eventRef(id.Topic, id.IdempotencyKey), How: "cancelled"})
			o.mu.Unlock()
		case err == nil:
			after, serr := o.h.inboxStateOf(ctx, id)
			if serr != nil {
				return fmt.Errorf("read %s after its re-drive: %w", id, serr)
			}
			o.mu.Lock()
			o.redrives = append(o.redrives, redriveFact{Ref: eventRef(id.Topic, id.IdempotencyKey), How: "call", After: after})
			o.mu.Unlock()
		case errors.Is(err, outbox.ErrNotParked), r.ctx.Err() != nil:
		default:
			o.h.logf("operator: re-drive %s on %s: %v", id, r.name, err)
		}
	}
	return nil
}

// schemaIgnored is the content schema no replica has a handler for
// (-skip-unknown): the replicas skip its events.
const schemaIgnored = "chaos.Ignored.v1"

// writeIgnored writes an event of schemaIgnored straight to the topic on
// key, held behind a parked event: under SkipUnknownEvents it must be
// skipped on arrival and never hold the key (it is in no ledger: nothing
// handles it).
func (o *operator) writeIgnored(ctx context.Context, key string) error {
	o.mu.Lock()
	o.ignored++
	id := fmt.Sprintf("ignored-%d", o.ignored)
	o.mu.Unlock()
	in := o.h.inj
	rec := &kgo.Record{Topic: in.topic, Partition: in.partitionOf(key), Key: []byte(key), Value: []byte(`{}`), Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderVersion, Value: []byte(outbox.WireVersion)},
		{Key: outbox.HeaderContentSchema, Value: []byte(schemaIgnored)},
		{Key: outbox.HeaderIdempotencyKey, Value: []byte(id)},
		{Key: outbox.HeaderOccurredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	}}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return in.raw.ProduceSync(pctx, rec).FirstErr()
}

// heldKey returns one of the load's keys held at the last look, chosen by
// pick; false when none is.
func (o *operator) heldKey(pick uint64) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.held) == 0 {
		return "", false
	}
	return o.held[pick%uint64(len(o.held))], true
}

func (o *operator) failedEvents(ctx context.Context) error {
	failed, err := o.admin.FailedEvents(ctx, outbox.FailedFilter{Topic: chaosTopic()})
	if err != nil {
		return err
	}
	if len(failed) == 0 {
		return nil
	}
	// An event held behind a failed one (publisher side, HoldKey) is not
	// refused by Kafka; should the framework mark it failed as well, its
	// hold marker tells it apart.
	var heldDocs []store.OutboxRecord
	if err := o.h.findAll(ctx, "outbox", bson.D{{Key: store.OutboxFailed, Value: true}, {Key: "$or", Value: bson.A{
		bson.D{{Key: store.InboxHeldBy, Value: bson.D{{Key: "$ne", Value: nil}}}},
		bson.D{{Key: inboxHeldFlag, Value: true}},
	}}}, bson.D{{Key: store.OutboxIdempotencyKey, Value: 1}}, &heldDocs); err != nil {
		return err
	}
	held := map[string]bool{}
	for _, d := range heldDocs {
		held[d.IdempotencyKey] = true
	}
	o.mu.Lock()
	for _, f := range failed {
		if held[f.IdempotencyKey] {
			continue
		}
		if f.PayloadSize < smallMaxMessageBytes {
			o.innocent[f.IdempotencyKey] = true
		} else {
			o.oversize[f.IdempotencyKey] = true
		}
	}
	o.mu.Unlock()
	if o.h.work.smallLimit.Load() != 0 {
		return nil // retried once the window closes
	}
	n, err := o.admin.RetryFailed(ctx, outbox.FailedFilter{Topic: chaosTopic()}, nil, false)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.retries += n
	o.mu.Unlock()
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// operator plays the on-call engineer: every operatorEvery it looks at
// the parked and the failed events and acts as the runbook says.
//
//   - A parked poison event (its handler always fails) is purged: under
//     HoldKey that releases its key's held events, in order.
//   - A parked step event is expected only on a key whose downstream had
//     an outage; once the outage is over it is re-driven, by turns with
//     Admin.RequestRedrive (a replica serves the request) and with
//     Client.Redrive on a live replica. Under HoldKey re-driving the head
//     releases the key's held events in order. A step event parked on a
//     key that never had an outage is a violation (it is re-driven all the
//     same, so that the run converges).
//   - A held event (parked, with held_by naming the head it waits for) is
//     left alone: the framework releases it. It is counted.
//   - An outbox event marked failed is expected only when it is too large
//     alone for the topic's limit (oversize); an innocent one (it fits
//     alone) is a violation. Once the small-limit window is closed, every
//     failed event is retried (Admin.RetryFailed).
//
// Malformed records stay parked: their keys are unique, they hold nothing.
// The operator's goroutine is owned by runHarness, which stops it (ctx)
// before the final check.
type operator struct {
	h     *harness
	admin *outbox.Admin
	rng   *rand.Rand

	mu         sync.Mutex
	parked     map[string]bool   // heads seen parked
	held       map[string]bool   // events seen held
	unexpected map[string]string // step events parked on keys without an outage or poison event: why they were parked
	innocent   map[string]bool   // innocent events seen failed in the outbox
	oversize   map[string]bool   // oversize events seen failed
	redrives   int               // re-drive requests and calls made
	purges     int               // poison events purged
	retries    int64             // failed events retried
}

const operatorEvery = 500 * time.Millisecond

func newOperator(h *harness) *operator {
	return &operator{h: h, admin: outbox.NewAdmin(h.db, "outbox", "inbox"), rng: rand.New(rand.NewPCG(h.cfg.seed, 0x0e7)),
		parked: map[string]bool{}, held: map[string]bool{}, unexpected: map[string]string{},
		innocent: map[string]bool{}, oversize: map[string]bool{}}
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

// parkedView is an inbox document as the operator reads it.
type parkedView struct {
	ID                 outbox.InboxID `bson:"_id"`
	Key                string         `bson:"partition_key"`
	HeldBy             bson.RawValue  `bson:"held_by"`
	RedriveRequestedAt *time.Time     `bson:"redrive_requested_at"`
	Attempts           int32          `bson:"attempts"`
	LastError          string         `bson:"last_error"`
}

func (v *parkedView) isHeld() bool {
	return v.HeldBy.Type != 0 && v.HeldBy.Type != bson.TypeNull
}

func (o *operator) tick(ctx context.Context) error {
	if err := o.parkedEvents(ctx); err != nil {
		return err
	}
	return o.failedEvents(ctx)
}

func (o *operator) parkedEvents(ctx context.Context) error {
	var docs []parkedView
	err := o.h.findAll(ctx, "inbox", bson.D{{Key: "parked", Value: true}},
		bson.D{{Key: "_id", Value: 1}, {Key: "partition_key", Value: 1}, {Key: "held_by", Value: 1}, {Key: "redrive_requested_at", Value: 1},
			{Key: "attempts", Value: 1}, {Key: "last_error", Value: 1}}, &docs)
	if err != nil {
		return err
	}
	var purge, request, call []outbox.InboxID
	o.mu.Lock()
	for i := range docs {
		d := &docs[i]
		id := d.ID.String()
		if d.isHeld() {
			o.held[id] = true
			continue
		}
		o.parked[id] = true
		switch d.ID.ContentSchema {
		case schemaPoison:
			purge = append(purge, d.ID)
		case schemaStep:
			if strings.HasPrefix(d.ID.IdempotencyKey, "malformed") || strings.HasPrefix(d.Key, "malformed") {
				continue
			}
			if !o.h.work.mayPark(d.Key) {
				o.unexpected[id] = fmt.Sprintf("attempts %d, last error %q", d.Attempts, d.LastError)
			}
			o.h.work.sawParked(d.Key)
			if o.h.work.isDown(d.Key) {
				continue
			}
			switch {
			case o.rng.IntN(2) == 0:
				call = append(call, d.ID)
			case d.RedriveRequestedAt == nil || time.Since(*d.RedriveRequestedAt) > 20*time.Second:
				request = append(request, d.ID)
			}
		}
	}
	o.mu.Unlock()
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
		n, err := o.admin.RequestRedrive(ctx, outbox.ParkedFilter{IDs: request}, false)
		if err != nil && !errors.Is(err, outbox.ErrNotParked) {
			return fmt.Errorf("request re-drive: %w", err)
		}
		o.mu.Lock()
		o.redrives += int(n)
		o.mu.Unlock()
	}
	for _, id := range call {
		r := o.h.pick(o.rng)
		if r == nil {
			break
		}
		rctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		err := r.client.Redrive(rctx, id)
		cancel()
		switch {
		case err == nil:
			o.mu.Lock()
			o.redrives++
			o.mu.Unlock()
		case errors.Is(err, outbox.ErrNotParked), r.ctx.Err() != nil:
		default:
			o.h.logf("operator: re-drive %s on %s: %v", id, r.name, err)
		}
	}
	return nil
}

func (o *operator) failedEvents(ctx context.Context) error {
	failed, err := o.admin.FailedEvents(ctx, outbox.FailedFilter{Topic: o.h.topic})
	if err != nil {
		return err
	}
	if len(failed) == 0 {
		return nil
	}
	// An event held behind a failed one (publisher side, HoldKey) is not
	// refused by Kafka; should the framework mark it failed as well, its
	// hold marker tells it apart.
	var heldDocs []struct {
		Key string `bson:"idempotency_key"`
	}
	if err := o.h.findAll(ctx, "outbox", bson.D{{Key: "failed", Value: true}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "held_by", Value: bson.D{{Key: "$ne", Value: nil}}}},
		bson.D{{Key: "held", Value: true}},
	}}}, bson.D{{Key: "idempotency_key", Value: 1}}, &heldDocs); err != nil {
		return err
	}
	held := map[string]bool{}
	for _, d := range heldDocs {
		held[d.Key] = true
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
	n, err := o.admin.RetryFailed(ctx, outbox.FailedFilter{Topic: o.h.topic}, nil, false)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.retries += n
	o.mu.Unlock()
	return nil
}

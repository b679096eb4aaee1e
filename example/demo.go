package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/event-outbox/outbox"
)

// An event Kafka refuses, on demand: POST /orders?too_large=1.
//
// Record refuses an event that cannot fit its topic's max.message.bytes
// (ErrEventTooLarge) once it knows the limit, so an event reaches the
// outbox and is refused by Kafka only when the limit shrank after the
// event was recorded. This demo makes that happen on purpose, so that
// `outboxctl outbox failed list` and the console's Failed page have an
// event to show: it lowers the orders topic's max.message.bytes to
// demoLimit, records an order whose OrderCreated carries an incompressible
// note larger than that, waits until the publisher marked it failed (Kafka
// refused it, sent alone and compressed), and sets the limit back. `outboxctl
// outbox failed retry <id>` then publishes it and the order is charged.
// Other orders' events are far smaller than demoLimit and go on meanwhile.

const (
	// demoLimit is the orders topic's max.message.bytes during the demo.
	demoLimit = 4096
	// demoNoteBytes random bytes, base64: about 8 KB that gzip cannot
	// bring under demoLimit.
	demoNoteBytes = 6 << 10
	// demoWait bounds the wait for the publisher's refusal.
	demoWait = 30 * time.Second
)

// demoMu serializes the demo within a process: two at once would restore
// each other's limit.
var demoMu sync.Mutex

// createRefusedOrder runs the demo and answers 201 with the order and the
// failed event's id, 413 when Record already knew the lowered limit and
// refused the event itself, or 503.
func (r *replica) createRefusedOrder(w http.ResponseWriter, req *http.Request, customer string, amount int64, opts orderOptions) {
	demoMu.Lock()
	defer demoMu.Unlock()
	// The demo outlives the request's deadline (requestTimeout): the
	// limit must be set back whatever happens.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), demoWait)
	defer cancel()
	adm := kadm.NewClient(r.consoleKafka)
	was, err := topicLimit(ctx, adm, ordersTopic)
	if err != nil {
		r.unavailable(w, req, "read the orders topic's max.message.bytes", err)
		return
	}
	if err := setTopicLimit(ctx, adm, ordersTopic, strconv.Itoa(demoLimit)); err != nil {
		r.unavailable(w, req, "lower the orders topic's max.message.bytes", err)
		return
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), 10*time.Second)
		defer cancel()
		if err := setTopicLimit(rctx, adm, ordersTopic, was); err != nil {
			r.log.Error("demo: setting the orders topic's max.message.bytes back failed; set it by hand", "max_message_bytes", was, "err", err)
		}
	}()

	note := make([]byte, demoNoteBytes)
	_, _ = rand.Read(note)
	opts.note = base64.StdEncoding.EncodeToString(note)
	o, _, err := r.orders.Create(ctx, customer, amount, opts)
	var tooLarge *outbox.EventTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "Record refused OrderCreated itself (it already knew the lowered limit): %v", err)
		return
	case err != nil:
		r.unavailable(w, req, "create the order", err)
		return
	}
	for {
		evs, err := r.orders.client.Admin().FailedEvents(ctx, outbox.FailedFilter{Topic: ordersTopic})
		if err == nil {
			for _, e := range evs {
				if e.PartitionKey == o.ID {
					w.Header().Set("Location", "/orders/"+o.ID)
					writeJSON(w, http.StatusCreated, map[string]any{
						"order": o, "failed_event_id": e.ID, "error": e.Error,
						"note": fmt.Sprintf("Kafka refused OrderCreated (%d bytes; the orders topic's max.message.bytes was %d for the demo, now %s again): "+
							"`outboxctl outbox failed list` and the console's Failed page show it; `outboxctl outbox failed retry %s` publishes it",
							e.PayloadSize, demoLimit, was, e.ID),
					})
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			writeError(w, http.StatusServiceUnavailable, "order %s recorded, but its event was not refused within %v (is the publisher running?)", o.ID, demoWait)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// topicLimit reads a topic's max.message.bytes.
func topicLimit(ctx context.Context, adm *kadm.Client, topic string) (string, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return "", err
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return "", err
	}
	if rc.Err != nil {
		return "", rc.Err
	}
	for _, c := range rc.Configs {
		if c.Key == "max.message.bytes" && c.Value != nil {
			return *c.Value, nil
		}
	}
	return "", fmt.Errorf("topic %s: no max.message.bytes in its configs", topic)
}

// setTopicLimit sets a topic's max.message.bytes.
func setTopicLimit(ctx context.Context, adm *kadm.Client, topic, v string) error {
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("topic %s: %w", r.Name, r.Err)
		}
	}
	return nil
}

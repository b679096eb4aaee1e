package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/event-outbox/outbox"
)

// replicaStatus is the body of GET /outbox/status: the framework's Status
// of both bounded contexts, and totals over them.
type replicaStatus struct {
	// Replica names this replica (-replica-id, REPLICA_ID, or host name
	// and process id).
	Replica string `json:"replica"`
	// Pending, Failed and Parked add up the contexts' counts. The
	// collections are shared by every replica, so the counts are the
	// service's, not this replica's.
	Pending int64 `json:"pending"`
	Failed  int64 `json:"failed"`
	Parked  int64 `json:"parked"`
	// OldestPendingAge is the largest of the contexts' oldest pending ages,
	// in seconds; 0 when nothing is pending. A growing value means
	// publishing is stuck.
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	// Contexts holds each context's outbox.Status: the partitions this
	// replica publishes ("publishing") and handles ("handling") by topic,
	// and the counts of its collections.
	Contexts map[string]outbox.Status `json:"contexts"`
	// Error is set when a context's collections could not be read (the
	// answer is then 503, with the runtime part still filled in).
	Error string `json:"error,omitempty"`
}

// status asks both contexts' clients for their Status. The counts come
// from a cache of at most a second, so health checks polling often cost
// little.
func (r *replica) status(ctx context.Context) (replicaStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := replicaStatus{Replica: r.name, Contexts: map[string]outbox.Status{}}
	var errs []error
	for name, c := range r.clients() {
		st, err := c.Status(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		out.Contexts[name] = st
		out.Pending += st.Store.Pending
		out.Failed += st.Store.Failed
		out.Parked += st.Store.Parked
		out.OldestPendingAge = max(out.OldestPendingAge, st.Store.OldestPendingAge.Seconds())
	}
	err := errors.Join(errs...)
	if err != nil {
		out.Error = err.Error()
	}
	return out, err
}

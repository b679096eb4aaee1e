package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// contextStatus is the outbox and inbox state of one bounded context. The
// collections are shared by every replica, so the counts are the service's,
// not this replica's.
type contextStatus struct {
	// Pending counts recorded events not yet published (and not failed).
	Pending int64 `json:"pending"`
	// OldestPendingAge is the age of the oldest pending event in seconds;
	// 0 when nothing is pending. A growing value means publishing is stuck.
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	// Failed counts events Kafka refused permanently (they need an
	// operator).
	Failed int64 `json:"failed"`
	// Parked counts received events whose handler gave up (see
	// GET /outbox/parked).
	Parked int64 `json:"parked"`
	// Publishing lists, by topic, the partitions this replica publishes
	// to: its assignment in the context's publisher group.
	Publishing map[string][]int32 `json:"publishing"`
	// Handling lists, by topic, the partitions whose events this replica
	// handles: its assignment in the context's consumer group.
	Handling map[string][]int32 `json:"handling"`
}

// replicaStatus is the body of GET /outbox/status.
type replicaStatus struct {
	Replica  int                      `json:"replica"`
	Contexts map[string]contextStatus `json:"contexts"`
}

// status reads the outbox and inbox collections directly, and this
// replica's partitions from the Kafka groups as their coordinator
// describes them (the framework does not export its publisher's status
// yet). During a rebalance the assignments may lag for a moment.
func (r *replica) status(ctx context.Context) (replicaStatus, error) {
	out := replicaStatus{Replica: r.id, Contexts: map[string]contextStatus{}}
	// Group names are the Config defaults: Service, Service + ".outbox-publisher".
	groups := map[string][2]string{} // context -> consumer group, publisher group
	var names []string
	for _, name := range []string{"orders", "payments"} {
		g := [2]string{name, name + ".outbox-publisher"}
		groups[name] = g
		names = append(names, g[0], g[1])
	}
	described, err := kadm.NewClient(r.admin).DescribeGroups(ctx, names...)
	if err != nil {
		return out, fmt.Errorf("describe Kafka groups: %w", err)
	}
	for name, db := range map[string]string{"orders": ordersDB, "payments": paymentsDB} {
		st, err := readStatus(ctx, r.stack.mongo.Database(db))
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		st.Handling = assignedTo(described[groups[name][0]], r.clientIDs[name])
		st.Publishing = assignedTo(described[groups[name][1]], r.clientIDs[name])
		out.Contexts[name] = st
	}
	return out, nil
}

// assignedTo returns the partitions a group assigns to the member with the
// given client id, by topic, sorted.
func assignedTo(g kadm.DescribedGroup, clientID string) map[string][]int32 {
	out := map[string][]int32{}
	for _, m := range g.Members {
		if m.ClientID != clientID {
			continue
		}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				out[t.Topic] = append(out[t.Topic], t.Partitions...)
			}
		}
	}
	for _, ps := range out {
		slices.Sort(ps)
	}
	return out
}

// readStatus counts with the same filters the framework's indexes serve
// (published/failed on the outbox, parked on the inbox). The collections
// have the framework's default names.
func readStatus(ctx context.Context, db *mongo.Database) (contextStatus, error) {
	var st contextStatus
	ob, ib := db.Collection("outbox"), db.Collection("inbox")
	pendingFilter := bson.D{{Key: "published", Value: false}, {Key: "failed", Value: false}}
	var err error
	if st.Pending, err = ob.CountDocuments(ctx, pendingFilter); err != nil {
		return st, fmt.Errorf("count pending: %w", err)
	}
	if st.Failed, err = ob.CountDocuments(ctx, bson.D{{Key: "failed", Value: true}}); err != nil {
		return st, fmt.Errorf("count failed: %w", err)
	}
	if st.Parked, err = ib.CountDocuments(ctx, bson.D{{Key: "parked", Value: true}}); err != nil {
		return st, fmt.Errorf("count parked: %w", err)
	}
	if st.Pending > 0 {
		var oldest struct {
			CreatedAt time.Time `bson:"created_at"`
		}
		err := ob.FindOne(ctx, pendingFilter,
			options.FindOne().SetSort(bson.D{{Key: "created_at", Value: 1}}).SetProjection(bson.D{{Key: "created_at", Value: 1}})).
			Decode(&oldest)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments): // published meanwhile
		case err != nil:
			return st, fmt.Errorf("oldest pending: %w", err)
		default:
			st.OldestPendingAge = max(0, time.Since(oldest.CreatedAt).Seconds())
		}
	}
	return st, nil
}

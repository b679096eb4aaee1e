package main

import (
	"context"
	"errors"
	"fmt"
	"time"

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
}

// replicaStatus is the body of GET /outbox/status.
type replicaStatus struct {
	Replica  int                      `json:"replica"`
	Contexts map[string]contextStatus `json:"contexts"`
}

// status reads the outbox and inbox collections directly. The framework
// keeps which partitions this replica publishes to itself (the publisher's
// status is not exported yet), so owned partitions are not shown.
func (r *replica) status(ctx context.Context) (replicaStatus, error) {
	out := replicaStatus{Replica: r.id, Contexts: map[string]contextStatus{}}
	for name, db := range map[string]string{"orders": ordersDB, "payments": paymentsDB} {
		st, err := readStatus(ctx, r.stack.mongo.Database(db))
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		out.Contexts[name] = st
	}
	return out, nil
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

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/console"
)

// newConsole returns the operations console of both contexts, for
// /outbox/ui/, and the Kafka client it reads the groups with (closed by
// the replica). Actions (re-drive, purge, retry, discard) are enabled only
// when the replica listens on a loopback address: the example has no
// authentication, and a service must put the console behind its own (see
// the README's Operations console section).
func (r *replica) newConsole() (*console.Console, *kgo.Client, error) {
	kc, err := kgo.NewClient(append(slices.Clone(r.stack.kafkaOpts), kgo.SeedBrokers(r.stack.brokers...),
		kgo.ClientID("outbox-example-"+r.name+"-console"))...)
	if err != nil {
		return nil, nil, fmt.Errorf("console kafka client: %w", err)
	}
	// The contexts' Config.Service names and databases (newReplica); the
	// groups and collections are the Config defaults.
	services := []console.Service{
		{Name: "orders", Database: r.stack.mongo.Database(ordersDB)},
		{Name: "payments", Database: r.stack.mongo.Database(paymentsDB)},
	}
	c, err := console.New(console.Options{
		Services:      services,
		Kafka:         kadm.NewClient(kc),
		EnableActions: isLoopback(r.ln.Addr()),
		Title:         "outbox example",
		Logger:        r.log,
	})
	if err != nil {
		kc.Close()
		return nil, nil, err
	}
	return c, kc, nil
}

func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// charges answers GET /outbox/charges: whether every order was charged
// exactly once, the claim the README makes after kill -9 of a replica.
//
//	{"orders": 120, "charged_once": 118, "not_charged_yet": 2, "charged_more_than_once": []}
//
// It counts the orders and groups the payments by order (a full read of
// both collections: a check for the example, not a page for production).
func (r *replica) charges(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 30*time.Second)
	defer cancel()
	orders, err := r.orders.orders.CountDocuments(ctx, bson.D{})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "count orders: %v", err)
		return
	}
	cur, err := r.payments.payments.Aggregate(ctx, []bson.D{
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$order_id"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "group payments: %v", err)
		return
	}
	var groups []struct {
		OrderID string `bson:"_id"`
		N       int64  `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		writeError(w, http.StatusServiceUnavailable, "group payments: %v", err)
		return
	}
	once, twice := int64(0), []string{}
	for _, g := range groups {
		if g.N == 1 {
			once++
		} else {
			twice = append(twice, g.OrderID)
		}
	}
	slices.Sort(twice)
	writeJSON(w, http.StatusOK, map[string]any{
		"orders": orders, "charged_once": once, "not_charged_yet": orders - int64(len(groups)),
		"charged_more_than_once": twice,
	})
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/console"
)

// Environment variables of the console.
const (
	// envConsolePassword enables the console's actions (re-drive, purge,
	// retry, discard) for operators who sign in with this password (at
	// least 8 characters). Unset, the console is read-only. An
	// environment variable rather than a flag: flags show in process
	// lists.
	envConsolePassword = "OUTBOX_CONSOLE_PASSWORD"
	// envConsoleHosts lists, comma-separated, the host names the console
	// answers to besides localhost and IP addresses (the name operators
	// open it by through a proxy or DNS); any other name gets 421, the
	// defence against DNS rebinding.
	envConsoleHosts = "OUTBOX_CONSOLE_HOSTS"
)

// consoleAccess is who may reach and drive the console.
type consoleAccess struct {
	password string   // operator password; "" leaves the console read-only
	hosts    []string // allowed host names beyond localhost and IP addresses
}

// consoleAccessFrom reads consoleAccess from the environment.
func consoleAccessFrom(getenv func(string) string) consoleAccess {
	a := consoleAccess{password: getenv(envConsolePassword)}
	for _, h := range strings.Split(getenv(envConsoleHosts), ",") {
		if h = strings.TrimSpace(h); h != "" {
			a.hosts = append(a.hosts, h)
		}
	}
	return a
}

// newConsole returns the operations console of both contexts, for
// /outbox/ui/, and the Kafka client it reads the groups with (closed by
// the replica). It is read-only unless OUTBOX_CONSOLE_PASSWORD is set:
// then operators sign in with that password before any action. Listening
// on loopback is not authentication (any local process, and any website
// through DNS rebinding, can reach 127.0.0.1); the console answers only to
// localhost, IP addresses and the names in OUTBOX_CONSOLE_HOSTS. A service
// of one's own may authenticate operators itself instead
// (console.Options.Authorize; see the README's Operations console
// section).
func (r *replica) newConsole() (*console.Console, *kgo.Client, error) {
	kc, err := kgo.NewClient(append(slices.Clone(r.stack.kafkaOpts), kgo.SeedBrokers(r.stack.brokers...),
		kgo.ClientID("outbox-example-"+r.name+"-console"))...)
	if err != nil {
		return nil, nil, fmt.Errorf("console kafka client: %w", err)
	}
	access := r.stack.console
	c, err := console.New(console.Options{
		Services:         r.consoleServices(),
		Kafka:            kadm.NewClient(kc),
		EnableActions:    access.password != "",
		OperatorPassword: access.password,
		AllowedHosts:     access.hosts,
		Title:            "outbox example",
		Logger:           r.log,
	})
	if err != nil {
		kc.Close()
		return nil, nil, err
	}
	return c, kc, nil
}

// consoleServices are the contexts as the console sees them: their
// Config.Service names and databases (newReplica); the groups and
// collections are the Config defaults.
func (r *replica) consoleServices() []console.Service {
	return []console.Service{
		{Name: "orders", Database: r.stack.mongo.Database(ordersDB)},
		{Name: "payments", Database: r.stack.mongo.Database(paymentsDB)},
	}
}

// charges answers GET /outbox/charges: whether every order was charged
// exactly once, the claim the README makes after kill -9 of a replica.
//
//	{"orders": 120, "charged_once": 118, "not_charged_yet": 2, "charged_more_than_once": []}
//
// Only payments of orders that exist count: the orders and payments live in
// two databases, and a payment whose order is gone (a database dropped by
// hand, an order deleted) says nothing about this claim. It reads the
// order ids and groups the payments by order (full reads of both
// collections: a check for the example, not a page for production).
func (r *replica) charges(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), 30*time.Second)
	defer cancel()
	cur, err := r.orders.orders.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "read orders: %v", err)
		return
	}
	var ids []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &ids); err != nil {
		writeError(w, http.StatusServiceUnavailable, "read orders: %v", err)
		return
	}
	orders := make(map[string]bool, len(ids))
	for _, o := range ids {
		orders[o.ID] = true
	}
	cur, err = r.payments.payments.Aggregate(ctx, []bson.D{
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
	charged, once, twice := int64(0), int64(0), []string{}
	for _, g := range groups {
		if !orders[g.OrderID] {
			continue
		}
		charged++
		if g.N == 1 {
			once++
		} else {
			twice = append(twice, g.OrderID)
		}
	}
	slices.Sort(twice)
	writeJSON(w, http.StatusOK, map[string]any{
		"orders": len(orders), "charged_once": once, "not_charged_yet": int64(len(orders)) - charged,
		"charged_more_than_once": twice,
	})
}

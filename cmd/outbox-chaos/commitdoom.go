package main

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// fCommitDoomed names the fault in -skip: handling transactions aborted
// after their handler returned (commitDoom).
const fCommitDoomed actionKind = "handling-commit-doomed"

// Doom rates: the chance that a handling transaction is aborted at its
// commit, by kind. A transaction whose handler recorded a follow-up is
// the one whose leak shows (a follow-up written outside the transaction
// survives the abort), so it is doomed more often; a release of a held
// key is rarer than the ordinary path, so its rate is higher still. Each
// event's handling is doomed at most once, so no event nears its retry
// budget by this fault alone.
var defaultDoomRates = doomRates{Chained: 0.08, Plain: 0.01, ReleaseChained: 0.6, ReleasePlain: 0.1}

// doomRates are the chances that a handling transaction is doomed, by
// kind: on the ordinary path with and without a follow-up, in a release
// with and without one.
type doomRates struct{ Chained, Plain, ReleaseChained, ReleasePlain float64 }

// commitDoom aborts handling transactions after their handler returned:
// the handler's writes and the events it recorded are done, the commit is
// on its way, and the transaction must take all of it with it. It watches
// each replica's MongoDB commands (a command monitor, called before a
// command is sent): a transaction that inserted a handler's effect is a
// handling transaction; one that also unparked an inbox entry (an update
// of an entry filtered on parked: true, handled: false) is a release of a
// held or parked key. When such a transaction sends commitTransaction,
// commitDoom may kill its session first, from the harness's own MongoDB
// client: the server aborts the transaction and the commit fails
// (NoSuchTransaction). Every other doomed commit on the embedded server
// also loses its connection (a fail point, scoped to the replica's
// application name), so the replica does not know whether it committed
// (UnknownTransactionCommitResult) and asks again.
//
// What escaped such a transaction stays: the checks count it as leaked.
type commitDoom struct {
	admin *mongo.Client     // kills sessions; never faulted
	srv   *mongofake.Server // drops the commit's connection; nil on a real MongoDB
	armed atomic.Bool       // during the load only

	rates doomRates

	mu     sync.Mutex
	rng    *rand.Rand
	txns   map[string]*doomTxn // by session: its open transaction
	doomed map[string]bool     // events whose handling was doomed once
	// Counts: doomed handlings on the ordinary path and in releases,
	// those whose commit also lost its connection, those whose handler
	// recorded a follow-up.
	ordinary, release, unknown, chained int
}

// doomTxn is what the monitor saw of one transaction.
type doomTxn struct {
	txnNumber int64
	release   bool
	chained   bool
	events    []string
}

func newCommitDoom(seed uint64, admin *mongo.Client, srv *mongofake.Server) *commitDoom {
	return &commitDoom{admin: admin, srv: srv, rates: defaultDoomRates, rng: rand.New(rand.NewPCG(seed, 0xd00d)),
		txns: map[string]*doomTxn{}, doomed: map[string]bool{}}
}

// doomCounts are commitDoom's counts.
type doomCounts struct{ Ordinary, Release, Unknown, Chained int }

func (d *commitDoom) counts() doomCounts {
	if d == nil {
		return doomCounts{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return doomCounts{d.ordinary, d.release, d.unknown, d.chained}
}

// monitor is the command monitor of a replica's MongoDB client, whose
// application name is appName. nil d: none.
func (d *commitDoom) monitor(appName string) *event.CommandMonitor {
	if d == nil {
		return nil
	}
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		d.started(appName, e)
	}}
}

// started notes a command of a transaction, and dooms its commit.
func (d *commitDoom) started(appName string, e *event.CommandStartedEvent) {
	switch e.CommandName {
	case "insert", "update", "commitTransaction", "abortTransaction":
	default:
		return
	}
	lsid, err := e.Command.LookupErr("lsid")
	if err != nil {
		return
	}
	txn, ok := e.Command.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return // not in a transaction
	}
	lsidDoc, ok := lsid.DocumentOK()
	if !ok {
		return
	}
	sess := hex.EncodeToString(lsidDoc)
	d.mu.Lock()
	t := d.txns[sess]
	if t == nil || t.txnNumber != txn {
		t = &doomTxn{txnNumber: txn}
		d.txns[sess] = t // a session runs one transaction at a time
	}
	switch e.CommandName {
	case "update":
		if coll, _ := e.Command.Lookup("update").StringValueOK(); coll == "inbox" && unparks(e.Command) {
			t.release = true
		}
		d.mu.Unlock()
		return
	case "insert":
		if coll, _ := e.Command.Lookup("insert").StringValueOK(); coll == collEffects {
			t.events, t.chained = appendEffects(e.Command, t.events, t.chained)
		}
		d.mu.Unlock()
		return
	case "abortTransaction":
		delete(d.txns, sess)
		d.mu.Unlock()
		return
	}
	// commitTransaction: a retried commit of a doomed transaction comes
	// here again and finds it gone.
	delete(d.txns, sess)
	doom := d.armed.Load() && len(t.events) > 0 && d.decide(t)
	closeConn := false
	if doom {
		for _, id := range t.events {
			d.doomed[id] = true
		}
		if t.release {
			d.release++
		} else {
			d.ordinary++
		}
		if t.chained {
			d.chained++
		}
		closeConn = d.srv != nil && d.rng.IntN(2) == 0
		if closeConn {
			d.unknown++
		}
	}
	d.mu.Unlock()
	if !doom {
		return
	}
	// Synchronous: the driver sends the commit once this returns.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = d.admin.Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: bson.A{bson.Raw(lsidDoc)}}}).Err()
	if closeConn {
		// Another commit of the replica may take it first: that one then
		// commits on its retry, as after any lost reply.
		d.srv.FailCommand(mongofake.FailPoint{Commands: []string{"commitTransaction"}, Times: 1, CloseConnection: true, AppName: appName})
	}
}

// appendEffects adds the events of an insert of effects to events, and
// whether one of them chained (the step handler's effects say; the
// follow-up handler's have no such field).
func appendEffects(cmd bson.Raw, events []string, chained bool) ([]string, bool) {
	docs, ok := cmd.Lookup("documents").ArrayOK()
	if !ok {
		return events, chained
	}
	vals, _ := docs.Values()
	for _, v := range vals {
		doc, ok := v.DocumentOK()
		if !ok {
			continue
		}
		if id, ok := doc.Lookup("event").StringValueOK(); ok {
			events = append(events, id)
		}
		c, _ := doc.Lookup("chained").BooleanOK()
		chained = chained || c
	}
	return events, chained
}

// decide draws whether a handling transaction is doomed (under d.mu).
func (d *commitDoom) decide(t *doomTxn) bool {
	for _, id := range t.events {
		if d.doomed[id] {
			return false
		}
	}
	rate := d.rates.Plain
	switch {
	case t.release && t.chained:
		rate = d.rates.ReleaseChained
	case t.release:
		rate = d.rates.ReleasePlain
	case t.chained:
		rate = d.rates.Chained
	}
	return d.rng.Float64() < rate
}

// unparks reports whether an update command unparks an inbox entry: its
// first statement's filter asks for parked: true and handled: false (the
// release of a held or parked key's head).
func unparks(cmd bson.Raw) bool {
	ups, ok := cmd.Lookup("updates").ArrayOK()
	if !ok {
		return false
	}
	first, err := ups.IndexErr(0)
	if err != nil {
		return false
	}
	stmt, ok := first.DocumentOK()
	if !ok {
		return false
	}
	q, ok := stmt.Lookup("q").DocumentOK()
	if !ok {
		return false
	}
	parked, ok1 := q.Lookup(store.InboxParked).BooleanOK()
	handled, ok2 := q.Lookup(store.InboxHandled).BooleanOK()
	return ok1 && ok2 && parked && !handled
}

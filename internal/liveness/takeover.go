package liveness

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"weak"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Takeover after a crash.
//
// A replica that dies in the middle of a transaction (kill -9, OOM, a lost
// node) leaves it open: MongoDB aborts it only when its
// transactionLifetimeLimitSeconds (60 s by default) runs out, and until
// then its locks stay on the inbox entries it was claiming. The replica
// that is assigned the dead one's partitions meets those locks (a write
// conflict: internal/inboxhost makes every write of the handling path fail at once on
// a lock instead of waiting) and would wait for the lifetime to end. So:
//
//   - every consumer transaction, and every promotion of scheduled events
//     (internal/schedule), runs in a session whose id the replica first
//     records in its liveness record (record.go; the driver pools sessions,
//     so the list settles at the replica's concurrency), and
//   - a worker (or an operator's re-drive) that meets a lock asks for a
//     reap (at most every reapEvery): the replica reads the records of its
//     consumer group (from the primary) and the group's members, and ends
//     (killSessions) the recorded sessions of every replica that is no
//     longer a member and has stopped refreshing its record. Ending a
//     session aborts its transaction and frees its locks; the keys it held
//     move on at the next retry. A promotion loop that meets a lock asks
//     for a reap of the publisher group the same way (Reaper.Publisher):
//     the records of that group, judged by their publisher member ids. A
//     record's sessions are one list whichever mechanism noted them: the
//     record is judged dead as a whole, and a dead process uses none.
//
// The driver pools sessions per mongo.Client and hands a session one
// Client used to whatever uses the mongo.Client next: another Client on it
// (a service running two, say orders and payments), Transact calls, this
// Client run again. So a session id is only ever ended while it cannot
// belong to someone else:
//
//   - never for a stopped record: a graceful stop leaves no transaction
//     open (the consumer drained, re-drives ended), and the stop's write
//     clears the record's ids;
//   - never while another record of the same session pool (session_pool:
//     the mongo.Client, named at random per process) is refreshed: that
//     mongo.Client lives, and its sessions may serve that record's Client
//     now;
//   - never while the record's replica is a member of either of its
//     groups (consumer and publisher): its sessions serve both groups'
//     transactions;
//   - only the ids read are removed from the record ($pullAll), so an id
//     recorded between the read and the kill is ended by a later reap.
//
// What remains: a process whose Run returned without marking its record
// stopped (MongoDB unreachable for the stop's write) and that goes on
// using the mongo.Client with no other Client running on it may see one of
// its transactions aborted once by a reap; the abort is a
// TransientTransactionError (NoSuchTransaction), which Transact retries
// (the driver's WithTransaction).
//
// A member that left the group but lives on (a zombie) has lost its
// partitions: aborting its transactions is what fencing wants. Its record's
// age keeps a replica that just rejoined (a new member id not yet in its
// record) from being taken for dead.

const (
	// reapEvery is the least time between two reaps of one replica.
	reapEvery = 2 * time.Second
	// reapTimeout bounds one reap.
	reapTimeout = 10 * time.Second
	// maxRecordedSessions bounds the session ids a replica record keeps.
	// The driver pools sessions, so a replica uses about as many as it runs
	// transactions at once: KeyConcurrency units on each owned partition,
	// plus parks, holds and re-drives. 8,192 covers KeyConcurrency 64 on
	// 128 partitions (about 330 KB of record); a replica that uses more
	// logs a warning, and the transactions of its oldest sessions then
	// last, after a crash, until MongoDB's transaction lifetime ends them.
	// A bound near the sessions a replica uses makes a takeover wait for
	// the lifetime of the sessions it could not end (BENCHMARKS.md,
	// "Takeover after a kill").
	maxRecordedSessions = 8192
)

// Sessions records the session ids the consumer runs transactions on in
// the running Run's replica record, and ends those of dead replicas. The
// zero value is ready.
type Sessions struct {
	mu    sync.Mutex
	rec   *Record // the running replica record; nil outside Run
	known map[string]bool

	reapMu sync.Mutex
	// reaps throttles the reaps of each group (0: the consumer group, 1:
	// the publisher group), so that one group's reaps never delay the
	// other's.
	reaps  [2]reapState
	reapWG sync.WaitGroup
	// reapCtx bounds the reaps of the running Run: stop cancels it, so a
	// stop never waits for a reap in flight (up to reapTimeout) on top of
	// its drain, its group leave and its record's write; nil outside Run.
	reapCtx    context.Context
	reapCancel context.CancelFunc
}

// reapState is whether a reap of one group runs and when the last began.
type reapState struct {
	reaping bool
	at      time.Time
}

// Start and Stop bracket a Run's replica record.
func (l *Sessions) Start(r *Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec, l.known = r, map[string]bool{}
	l.reapMu.Lock()
	l.reapCtx, l.reapCancel = context.WithCancel(context.Background())
	l.reapMu.Unlock()
}

// Stop cancels the reap in flight, if any, waits for it, and forgets the
// record.
func (l *Sessions) Stop() {
	l.reapMu.Lock()
	if l.reapCancel != nil {
		l.reapCancel()
	}
	l.reapMu.Unlock()
	l.reapWG.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec, l.known = nil, nil
}

// Note records lsid in the replica record unless it is there already. It
// is called before the session's first transaction; outside Run it does
// nothing (no partitions to take over).
func (l *Sessions) Note(ctx context.Context, lsid bson.Raw) error {
	l.mu.Lock()
	r := l.rec
	if r == nil || l.known[string(lsid)] {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	_, err := r.Meta.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{
		{Key: "$push", Value: bson.D{{Key: "lsids", Value: bson.D{{Key: "$each", Value: bson.A{lsid}}, {Key: "$slice", Value: -maxRecordedSessions}}}}},
		{Key: "$setOnInsert", Value: bson.D{{Key: "kind", Value: Kind}, {Key: "service", Value: r.Service},
			{Key: "consumer_group", Value: r.ConsumerGroup}}},
		{Key: "$currentDate", Value: bson.D{{Key: "last_seen", Value: true}}},
	}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("outbox: record session in %s: %w", r.Meta.Name(), err)
	}
	l.mu.Lock()
	if l.rec == r {
		l.known[string(lsid)] = true
		if len(l.known) == maxRecordedSessions+1 {
			r.Log.Warn("outbox: more sessions than a replica record keeps; after a crash the oldest sessions' transactions last until MongoDB's transaction lifetime ends them",
				"sessions", len(l.known), "kept", maxRecordedSessions)
		}
	}
	l.mu.Unlock()
	return nil
}

// Reaper is what a reap needs of the consumer that asks for it.
type Reaper struct {
	// Kafka is the consumer's group client, which reads the group's
	// members.
	Kafka *kadm.Client
	// Group is the consumer group; ConsumerProtocol is set when it asks
	// for KIP-848 (see GroupMembers).
	Group            string
	ConsumerProtocol bool
	// Publisher makes Group the publisher group: the reap judges the
	// records of that group (publisher_group) by their publisher member
	// ids. Kafka is then the publisher's group client.
	Publisher bool
	// Meta is the outbox_meta collection; Mongo the client whose admin
	// database ends the sessions.
	Meta  *mongo.Collection
	Mongo *mongo.Client
	// Reaped, when set, hears each replica record whose sessions a reap
	// ended, before the reap removes their ids from it (tests).
	Reaped func(ctx context.Context, replicaID string)
	// Log is the consumer's logger; Warn, rate-limited by the caller,
	// takes a failed reap.
	Log  *slog.Logger
	Warn func(msg string, args ...any)
}

// Reap ends, in the background, the recorded sessions of the group's
// replicas that died (see the top of the file), at most once per reapEvery
// for each group.
func (l *Sessions) Reap(rp Reaper) {
	st := &l.reaps[0]
	if rp.Publisher {
		st = &l.reaps[1]
	}
	l.reapMu.Lock()
	if st.reaping || time.Since(st.at) < reapEvery {
		l.reapMu.Unlock()
		return
	}
	st.reaping, st.at = true, time.Now()
	l.reapWG.Add(1)
	rctx := l.reapCtx
	l.reapMu.Unlock()
	if rctx == nil {
		rctx = context.Background()
	}
	go func() {
		defer l.reapWG.Done()
		defer func() {
			l.reapMu.Lock()
			st.reaping = false
			l.reapMu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(rctx, reapTimeout)
		defer cancel()
		if err := l.ReapNow(ctx, rp); err != nil && rctx.Err() == nil {
			rp.Warn("ending the sessions of dead replicas failed", "err", err)
		}
	}()
}

// sessionPools names the session pool of each mongo.Client of the process
// (random, so unique across processes), without keeping the client alive.
var sessionPools sync.Map // weak.Pointer[mongo.Client] -> string

// SessionPool returns the name of m's session pool: the driver hands a
// session that one Client used to anything else using m afterwards.
func SessionPool(m *mongo.Client) string {
	if m == nil {
		return ""
	}
	k := weak.Make(m)
	if v, ok := sessionPools.Load(k); ok {
		return v.(string)
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand doc)
	v, _ := sessionPools.LoadOrStore(k, hex.EncodeToString(b[:]))
	return v.(string)
}

// silent reports whether a running replica's record, read at now, has not
// been refreshed for two refresh periods (at least 2 s).
func silent(d Doc, now time.Time) bool {
	return max(now.Sub(d.LastSeen), 0) > 2*max(d.Refresh(), time.Second)
}

// ReapNow ends the sessions of the dead replicas of the group (the
// consumer group, or the publisher group with Reaper.Publisher), on the
// caller's goroutine.
func (l *Sessions) ReapNow(ctx context.Context, rp Reaper) error {
	l.mu.Lock()
	self := ""
	if l.rec != nil {
		self = l.rec.id
	}
	l.mu.Unlock()
	members, err := GroupMembers(ctx, rp.Kafka, rp.Group, rp.ConsumerProtocol)
	if err != nil {
		return err
	}
	now, replicas, err := Read(ctx, rp.Meta)
	if err != nil {
		return err
	}
	// A session pool (a mongo.Client) one of whose records is refreshed
	// lives: its sessions serve that record's Client (another one sharing
	// the mongo.Client, or this Client run again), whatever another record
	// of the pool says.
	live := map[string]bool{}
	for _, r := range replicas {
		if !r.Stopped() && !silent(r, now) && r.SessionPool != "" {
			live[r.SessionPool] = true
		}
	}
	for _, r := range replicas {
		group, member := r.ConsumerGroup, r.ConsumerMemberID
		if rp.Publisher {
			group, member = r.PublisherGroup, r.PublisherMemberID
		}
		if r.ID == self || group != rp.Group || len(r.LSIDs) == 0 {
			continue
		}
		// A stopped record's sessions are never ended: a graceful stop
		// leaves no transaction open, and the driver has handed its
		// sessions out again (a stopped record lists none, unless a
		// session was noted as it stopped).
		if r.Stopped() || members[member] || !silent(r, now) || live[r.SessionPool] {
			continue
		}
		// The record's sessions serve both of its groups' work (handling
		// transactions, promotions): a member of its other group lives,
		// silent as its record may be.
		otherGroup, otherMember := r.PublisherGroup, r.PublisherMemberID
		if rp.Publisher {
			otherGroup, otherMember = r.ConsumerGroup, r.ConsumerMemberID
		}
		if otherGroup != "" && otherMember != "" {
			others, err := GroupMembers(ctx, rp.Kafka, otherGroup, rp.ConsumerProtocol)
			if err != nil {
				return err
			}
			if others[otherMember] {
				continue
			}
		}
		id := r.ID[len(IDPrefix):]
		lsids := make(bson.A, len(r.LSIDs))
		for i, id := range r.LSIDs {
			lsids[i] = id
		}
		if err := rp.Mongo.Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: lsids}}).Err(); err != nil {
			return fmt.Errorf("end the sessions of replica %s: %w", id, err)
		}
		if rp.Reaped != nil {
			rp.Reaped(ctx, id)
		}
		// Only the ids ended: one recorded meanwhile (the record of a
		// replica that was merely slow) stays, to be ended by a later reap
		// if its replica is dead.
		if _, err := rp.Meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: r.ID}},
			bson.D{{Key: "$pullAll", Value: bson.D{{Key: "lsids", Value: lsids}}}}); err != nil {
			return fmt.Errorf("update the record of replica %s: %w", id, err)
		}
		rp.Log.Info("ended the sessions of a replica that left the group with transactions open",
			"replica", id, "host", r.Host, "pid", r.PID, "group", rp.Group, "member", member, "sessions", len(r.LSIDs),
			"silent_for", max(now.Sub(r.LastSeen), 0).Round(time.Second).String())
	}
	return nil
}

// GroupMembers returns the member ids of a consumer group. A KIP-848
// group's members (consumerProtocol, Config.GroupConsumer) are not classic
// members: Kafka refuses DescribeGroups for such a group
// (GROUP_ID_NOT_FOUND, "not a classic group"), so they are read with
// ConsumerGroupDescribe, and with DescribeGroups when that fails (kgo fell
// back to the classic protocol).
func GroupMembers(ctx context.Context, adm *kadm.Client, group string, consumerProtocol bool) (map[string]bool, error) {
	members := map[string]bool{}
	if consumerProtocol {
		described, err := adm.DescribeConsumerGroups(ctx, group)
		if err == nil {
			for _, g := range described {
				err = cmp.Or(err, g.Err)
				for _, m := range g.Members {
					members[m.MemberID] = true
				}
			}
		}
		if err == nil {
			return members, nil
		}
	}
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	for _, g := range described {
		if g.Err != nil {
			return nil, fmt.Errorf("describe group %s: %w", group, g.Err)
		}
		for _, m := range g.Members {
			members[m.MemberID] = true
		}
	}
	return members, nil
}

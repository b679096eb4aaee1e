package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
// conflict: txn.go makes every write of the handling path fail at once on
// a lock instead of waiting) and would wait for the lifetime to end. So:
//
//   - every consumer transaction runs in a session whose id the replica
//     first records in its liveness record (replicas.go; the driver pools
//     sessions, so the list settles at the replica's concurrency), and
//   - a worker (or an operator's re-drive) that meets a lock asks for a
//     reap (at most every reapEvery): the replica reads the records of its
//     consumer group (from the primary) and the group's members, and ends
//     (killSessions) the recorded sessions of every replica that is no
//     longer a member and has stopped refreshing its record. Ending a
//     session aborts its transaction and frees its locks; the keys it held
//     move on at the next retry.
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
	// (256 was too few: a takeover at KeyConcurrency 64 on 6 partitions
	// waited a minute for the 128 sessions it could not end;
	// BENCHMARKS.md, "Takeover after a kill".)
	maxRecordedSessions = 8192
)

// sessionLog records the session ids the consumer runs transactions on in
// this Run's replica record.
type sessionLog struct {
	mu    sync.Mutex
	rec   *replica // the running replica record; nil outside Run
	known map[string]bool

	reapMu   sync.Mutex
	reaping  bool
	reapedAt time.Time
	reapWG   sync.WaitGroup
	// reapCtx bounds the reaps of the running Run: stop cancels it, so a
	// stop never waits for a reap in flight (up to reapTimeout) on top of
	// its drain, its group leave and its record's write; nil outside Run.
	reapCtx    context.Context
	reapCancel context.CancelFunc
}

// start and stop bracket a Run's replica record.
func (l *sessionLog) start(r *replica) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec, l.known = r, map[string]bool{}
	l.reapMu.Lock()
	l.reapCtx, l.reapCancel = context.WithCancel(context.Background())
	l.reapMu.Unlock()
}

func (l *sessionLog) stop() {
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

// note records lsid in the replica record unless it is there already. It
// is called before the session's first transaction; outside Run it does
// nothing (no partitions to take over).
func (l *sessionLog) note(ctx context.Context, lsid bson.Raw) error {
	l.mu.Lock()
	r := l.rec
	if r == nil || l.known[string(lsid)] {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, replicaWriteTimeout)
	defer cancel()
	_, err := r.c.meta.UpdateOne(wctx, bson.D{{Key: "_id", Value: r.id}}, bson.D{
		{Key: "$push", Value: bson.D{{Key: "lsids", Value: bson.D{{Key: "$each", Value: bson.A{lsid}}, {Key: "$slice", Value: -maxRecordedSessions}}}}},
		{Key: "$setOnInsert", Value: bson.D{{Key: "kind", Value: replicaKind}, {Key: "service", Value: r.c.cfg.Service},
			{Key: "consumer_group", Value: r.c.cfg.ConsumerGroup}}},
		{Key: "$currentDate", Value: bson.D{{Key: "last_seen", Value: true}}},
	}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("outbox: record session in %s: %w", metaCollection, err)
	}
	l.mu.Lock()
	if l.rec == r {
		l.known[string(lsid)] = true
		if len(l.known) == maxRecordedSessions+1 {
			r.c.cfg.Logger.Warn("outbox: more sessions than a replica record keeps; after a crash the oldest sessions' transactions last until MongoDB's transaction lifetime ends them",
				"sessions", len(l.known), "kept", maxRecordedSessions)
		}
	}
	l.mu.Unlock()
	return nil
}

// reapDeadSessions ends, in the background, the recorded sessions of the
// consumer group's replicas that died (see the top of the file), at most
// once per reapEvery.
func (c *Client) reapDeadSessions(cons *consumer) {
	l := &c.sessions
	if cons == nil || cons.cl == nil {
		return
	}
	l.reapMu.Lock()
	if l.reaping || time.Since(l.reapedAt) < reapEvery {
		l.reapMu.Unlock()
		return
	}
	l.reaping, l.reapedAt = true, time.Now()
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
			l.reaping = false
			l.reapMu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(rctx, reapTimeout)
		defer cancel()
		if err := c.reap(ctx, cons); err != nil && rctx.Err() == nil {
			cons.errLog.warn(cons.log, "ending the sessions of dead replicas failed", "reap", "err", err)
		}
	}()
}

// sessionPools names the session pool of each mongo.Client of the process
// (random, so unique across processes), without keeping the client alive.
var sessionPools sync.Map // weak.Pointer[mongo.Client] -> string

// sessionPool returns the name of m's session pool: the driver hands a
// session that one Client used to anything else using m afterwards.
func sessionPool(m *mongo.Client) string {
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

// silent reports whether a running replica's record has not been refreshed
// for two refresh periods (at least 2 s).
func silent(r Replica) bool { return r.Silence > 2*max(r.RefreshInterval, time.Second) }

// reap ends the sessions of the dead replicas of the consumer group.
func (c *Client) reap(ctx context.Context, cons *consumer) error {
	l := &c.sessions
	l.mu.Lock()
	self := ""
	if l.rec != nil {
		self = l.rec.id
	}
	l.mu.Unlock()
	members, err := groupMembers(ctx, kadm.NewClient(cons.cl), c.cfg.ConsumerGroup, c.cfg.GroupProtocol)
	if err != nil {
		return err
	}
	replicas, err := c.Admin().Replicas(ctx)
	if err != nil {
		return err
	}
	// A session pool (a mongo.Client) one of whose records is refreshed
	// lives: its sessions serve that record's Client (another one sharing
	// the mongo.Client, or this Client run again), whatever another record
	// of the pool says.
	live := map[string]bool{}
	for _, r := range replicas {
		if !r.Stopped && !silent(r) && r.pool != "" {
			live[r.pool] = true
		}
	}
	for _, r := range replicas {
		if replicaIDPrefix+r.ID == self || r.ConsumerGroup != c.cfg.ConsumerGroup || len(r.lsids) == 0 {
			continue
		}
		// A stopped record's sessions are never ended: a graceful stop
		// leaves no transaction open, and the driver has handed its
		// sessions out again (a stopped record lists none, unless a
		// session was noted as it stopped).
		if r.Stopped || members[r.ConsumerMemberID] || !silent(r) || live[r.pool] {
			continue
		}
		lsids := make(bson.A, len(r.lsids))
		for i, id := range r.lsids {
			lsids[i] = id
		}
		if err := c.cfg.Mongo.Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: lsids}}).Err(); err != nil {
			return fmt.Errorf("end the sessions of replica %s: %w", r.ID, err)
		}
		if c.test.reapedHook != nil {
			c.test.reapedHook(ctx, r.ID)
		}
		// Only the ids ended: one recorded meanwhile (the record of a
		// replica that was merely slow) stays, to be ended by a later reap
		// if its replica is dead.
		if _, err := c.meta.UpdateOne(ctx, bson.D{{Key: "_id", Value: replicaIDPrefix + r.ID}},
			bson.D{{Key: "$pullAll", Value: bson.D{{Key: "lsids", Value: lsids}}}}); err != nil {
			return fmt.Errorf("update the record of replica %s: %w", r.ID, err)
		}
		cons.log.Info("ended the sessions of a replica that left the group with transactions open",
			"replica", r.ID, "host", r.Host, "pid", r.PID, "member", r.ConsumerMemberID, "sessions", len(r.lsids),
			"silent_for", r.Silence.Round(time.Second).String())
	}
	return nil
}

// groupMembers returns the member ids of a consumer group. A KIP-848
// group's members (Config.GroupConsumer) are not classic members: Kafka
// refuses DescribeGroups for such a group (GROUP_ID_NOT_FOUND, "not a
// classic group"), so they are read with ConsumerGroupDescribe, and with
// DescribeGroups when that fails (kgo fell back to the classic protocol).
func groupMembers(ctx context.Context, adm *kadm.Client, group string, proto GroupProtocol) (map[string]bool, error) {
	members := map[string]bool{}
	if proto == GroupConsumer {
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

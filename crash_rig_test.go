package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// The rig of the crash harness (crash_test.go): simulated processes, each
// a Client on a mongo.Client of its own (told apart by its application
// name, which is how mongofake.Server.Crash kills it), an in-memory offset
// commit log and an in-memory Kafka partition that outlive the processes,
// and the steps the scenarios are made of: the partition owner's consumer
// worker, its publisher worker, operator calls.

// crashWrites are the commands that change data; each one an operation
// sends is a crash point. abortTransaction counts: a process that dies
// before it leaves its transaction open, with its locks, for the next
// owner to get past.
var crashWrites = []string{"insert", "update", "delete", "findAndModify", "commitTransaction", "abortTransaction", "dropIndexes", "createIndexes"}

// writeCmd is a write command as the command monitor saw it.
type writeCmd struct {
	name   string
	target string // the collection, or "" for commitTransaction / abortTransaction
	inTxn  bool   // sent in a transaction: its effect shows only at the commit
	// events are the events its statements name (space-separated; for a
	// commit or an abort, those of its transaction): see commandEvents.
	events string
}

func (w writeCmd) String() string {
	if w.events != "" {
		return w.events + ": " + w.kind()
	}
	return w.kind()
}

// kind is the command, its collection, and whether it is in a transaction.
func (w writeCmd) kind() string {
	s := w.name
	if w.target != "" {
		s += " " + w.target
	}
	if w.inTxn && w.name != "commitTransaction" && w.name != "abortTransaction" {
		s += " (in txn)"
	}
	return s
}

// afterMatters reports whether a crash right after w ran differs from a
// crash before the next write: it does for a commit and for a write
// outside a transaction (its effect is visible). A statement of a
// transaction that ran is only a lock until the commit, which the next
// write's crash point covers.
func (w writeCmd) afterMatters() bool {
	return w.name == "commitTransaction" || (!w.inTxn && w.name != "abortTransaction")
}

// crashRec is a record of the consumer scenarios' partition (topic
// ordersTopic, partition 0): its name is its idempotency key.
type crashRec struct {
	name, key string
	schema    string // crashEventSchema when empty
	mode      string // crashEvent.Mode
	malformed bool   // a payload that is not JSON
}

const (
	crashEventSchema = "CrashEvent.v1"
	crashAuditSchema = "CrashAudit.v1" // handled only by a process with the audit handler
	crashEffects     = "crash_effects"
	crashMaxAttempts = 10
)

// crashEvent is the event of the scenarios. Its handler pushes its name to
// its key's effect document, in the handling transaction.
type crashEvent struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Mode: "" succeeds; "flaky" fails its first attempt; "poison" parks
	// (Park) in a poisoned process.
	Mode string `json:"mode,omitempty"`
	Pad  string `json:"pad,omitempty"`
}

func (crashEvent) Topic() string          { return ordersTopic }
func (crashEvent) ContentSchema() string  { return crashEventSchema }
func (e crashEvent) PartitionKey() string { return e.Key }

// crashAudit is an event of the same topic that only some processes handle.
type crashAudit struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

func (crashAudit) Topic() string          { return ordersTopic }
func (crashAudit) ContentSchema() string  { return crashAuditSchema }
func (e crashAudit) PartitionKey() string { return e.Key }

// crashRole is what a process has.
type crashRole struct {
	poisoned bool // "poison" events park
	audit    bool // has the crashAudit handler
}

// crashRig is one run of a scenario: a database of its own on the
// scenario's server, the processes that ran on it, the offset commit log
// and the Kafka partition.
type crashRig struct {
	t       *testing.T
	srv     *mongofake.Server
	uri     string
	db      string
	sc      *crashScenario
	commits commitLog
	kafka   kafkaLog
	checker *crashProc        // reads the state; never dies
	libIDs  map[string]string // the library outbox documents seeded: their idempotency keys by _id (migration)

	mu    sync.Mutex
	procs []*crashProc
}

func newCrashRig(t *testing.T, srv *mongofake.Server, sc *crashScenario, db string) *crashRig {
	r := &crashRig{t: t, srv: srv, uri: srv.URI(), db: db, sc: sc}
	r.kafka.limit = crashKafkaLimit
	r.checker = r.proc(db+"-checker", sc.main, nil)
	ctx := context.Background()
	if sc.indexes {
		require.NoError(t, r.checker.c.EnsureIndexes(ctx))
	}
	require.NoError(t, r.checker.mc.Database(db).CreateCollection(ctx, crashEffects))
	return r
}

// close disconnects every process and drops the database, after ending
// the dead processes' transactions (a drop waits for them, as on mongod).
func (r *crashRig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.reap()
	if err := r.checker.mc.Database(r.db).Drop(ctx); err != nil {
		r.t.Errorf("drop the database %s: %v", r.db, err)
	}
	r.mu.Lock()
	procs := r.procs
	r.mu.Unlock()
	for _, p := range procs {
		p.cancel()
		_ = p.mc.Disconnect(ctx)
		if p.crash != nil {
			p.crash.Disarm()
		}
		p.mu.Lock()
		if p.armed != nil {
			p.armed.Disarm()
		}
		p.mu.Unlock()
	}
}

// crashProc is a simulated process.
type crashProc struct {
	r      *crashRig
	name   string // its application name
	role   crashRole
	mc     *mongo.Client
	db     *mongo.Database
	c      *Client
	crash  *mongofake.Crashed // nil: it never dies at a counted write
	ctx    context.Context    // ends when it dies
	cancel context.CancelFunc
	// gate, when set, runs before each of its handlers; bug changes its
	// consumer (crashScenario.gate, bug; set by crashable).
	gate    func(ctx context.Context, name string) error
	bug     func(p *crashProc, cfg *consume.Config)
	died    chan struct{} // closed when it dies at its labelled crash point
	dieOnce sync.Once

	mu     sync.Mutex
	writes []writeCmd
	lsids  map[string]bson.Raw
	// The labelled crash point (crash_concurrent_test.go): target, when
	// set, is the crash point; seen counts the labels met; afterReq is the
	// request whose reply ends the process (a crash after the write);
	// armed is the server's crash that refuses what it sends after.
	target   *crashPoint
	seen     map[string]int
	afterReq int64
	armed    *mongofake.Crashed
	// Transactions: the events each one's statements name, the open ones
	// (from their first statement to the reply of their commit or abort)
	// and the most open at once; the open ones when it died.
	txnEvents map[string][]string
	open      map[string]bool
	closing   map[int64]string
	maxOpen   int
	openAtEnd int
}

// proc starts a process with role; with crash, it dies at crash's point
// (AppName is set here).
func (r *crashRig) proc(name string, role crashRole, crash *mongofake.Crash) *crashProc {
	t := r.t
	p := &crashProc{r: r, name: name, role: role, lsids: map[string]bson.Raw{}, died: make(chan struct{}),
		seen: map[string]int{}, afterReq: -1, txnEvents: map[string][]string{}, open: map[string]bool{}, closing: map[int64]string{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if crash != nil {
		// This goroutine ends the process's context at its crash point, so
		// that its steps stop; it returns then, or when the rig closes.
		crash.AppName = name
		cr, err := r.srv.Crash(*crash)
		require.NoError(t, err)
		p.crash = cr
		go func() {
			select {
			case <-cr.Fired():
				p.cancel()
			case <-p.ctx.Done():
			}
		}()
	}
	mon := &event.CommandMonitor{
		Started:   p.started,
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) { p.finished(e.RequestID) },
		Failed:    func(_ context.Context, e *event.CommandFailedEvent) { p.finished(e.RequestID) },
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(r.uri).SetAppName(name).SetMonitor(mon).
		SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	p.mc, p.db = mc, mc.Database(r.db)
	c, err := New(Config{
		Mongo:           mc,
		Database:        r.db,
		Brokers:         []string{"127.0.0.1:1"}, // never dialled: the harness drives the workers
		Service:         "crash",
		PublishTopics:   []string{ordersTopic},
		RetryMinBackoff: time.Millisecond,
		RetryMaxBackoff: 20 * time.Millisecond,
		MaxAttempts:     crashMaxAttempts,
		// One unit at a time unless the scenario says otherwise: the
		// writes come in one order (crashPoint).
		KeyConcurrency:  cmp.Or(r.sc.keyConcurrency, 1),
		HandleBatchSize: cmp.Or(r.sc.batch, 10),
		ClaimCheck:      r.sc.claimCheck,
		Logger:          debugLogger,
	})
	require.NoError(t, err)
	c.topics.Set(ordersTopic, 1)
	p.c = c
	handle := func(ctx context.Context, name, key, mode string, m Metadata) error {
		if p.gate != nil {
			if err := p.gate(ctx, name); err != nil {
				return err
			}
		}
		switch {
		case mode == "poison" && p.role.poisoned:
			return Park(errors.New("poisoned"))
		case mode == "flaky" && m.Attempt == 1:
			return errors.New("flaky: fails its first attempt")
		}
		_, err := p.db.Collection(crashEffects).UpdateOne(ctx, bson.D{{Key: "_id", Value: key}},
			bson.D{{Key: "$push", Value: bson.D{{Key: "handled", Value: name}}}}, options.UpdateOne().SetUpsert(true))
		return err
	}
	MustHandle(c, func(ctx context.Context, e crashEvent, m Metadata) error {
		return handle(ctx, e.Name, e.Key, e.Mode, m)
	})
	if role.audit {
		MustHandle(c, func(ctx context.Context, e crashAudit, m Metadata) error { return handle(ctx, e.Name, e.Key, "", m) })
	}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p
}

// dead reports whether the process reached its crash point.
func (p *crashProc) dead() bool {
	select {
	case <-p.died:
		return true
	default:
	}
	if p.crash == nil {
		return false
	}
	select {
	case <-p.crash.Fired():
		return true
	default:
		return false
	}
}

// recorded returns the write commands the process sent.
func (p *crashProc) recorded() []writeCmd {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.writes)
}

// reap ends the sessions of the dead processes, as the next owner of their
// partitions does when it meets their locks (internal/liveness/takeover.go).
func (r *crashRig) reap() {
	r.mu.Lock()
	var ids bson.A
	for _, p := range r.procs {
		if !p.dead() {
			continue
		}
		p.mu.Lock()
		for _, id := range p.lsids {
			ids = append(ids, id)
		}
		p.mu.Unlock()
	}
	r.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.checker.mc.Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: ids}}).Err(); err != nil {
		r.t.Logf("reap: %v", err)
	}
}

// errCrashed ends a step whose process died.
var errCrashed = errors.New("the process crashed")

// quiet polls done until it holds, the process dies, or the deadline.
func (r *crashRig) quiet(p *crashProc, what string, done func() bool) error {
	deadline := time.Now().Add(crashQuietTimeout)
	for {
		if p.dead() {
			return errCrashed
		}
		if done() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not quiescent after %v: %s", what, crashQuietTimeout, r.dump())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// crashQuietTimeout bounds a step. A dead process's transactions live for
// the server's default 60 s: a recovery that waits for them instead of
// ending them (internal/liveness/takeover.go) runs into this bound.
const crashQuietTimeout = 20 * time.Second

// commitLog is the partition's committed offset in Kafka.
type commitLog struct {
	mu      sync.Mutex
	offsets []int64
}

func (l *commitLog) commit(p *crashProc, offset int64) error {
	if p.dead() {
		return errCrashed // a dead process commits nothing
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.offsets = append(l.offsets, offset)
	return nil
}

// next returns the committed offset: where a new owner starts (0 before
// any commit).
func (l *commitLog) next() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := int64(0)
	for _, o := range l.offsets {
		n = max(n, o)
	}
	return n
}

// crashHost is the root package's consume.Host with the harness's offset
// commits and takeover.
type crashHost struct {
	consume.Host
	p *crashProc
}

func (h crashHost) Commit(_ context.Context, _ consume.TopicPartition, offset int64, _ int32) error {
	return h.p.r.commits.commit(h.p, offset)
}

func (h crashHost) Reap() { h.p.r.reap() }

type nopPauser struct{}

func (nopPauser) Pause(consume.TopicPartition)  {}
func (nopPauser) Resume(consume.TopicPartition) {}

// crashTP is the partition of the consumer scenarios.
var crashTP = consume.TopicPartition{Topic: ordersTopic, Partition: 0}

// kafkaRecord is the record of r at offset i, as the publisher writes it.
func (r crashRec) kafkaRecord(i int) *kgo.Record {
	schema := r.schema
	if schema == "" {
		schema = crashEventSchema
	}
	env := Envelope{Topic: ordersTopic, ContentSchema: schema, IdempotencyKey: r.name, PartitionKey: r.key,
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	payload, _ := json.Marshal(crashEvent{Name: r.name, Key: r.key, Mode: r.mode})
	if r.malformed {
		payload = []byte(`{"name": not json`)
	}
	rec := encodeRecord(&env, payload)
	rec.Offset = int64(i)
	return rec
}

// consume is the partition owner's consumer: a worker of p fed the
// records from the committed offset on, until the partition is quiescent
// (every record settled and committed, nothing running, no releasable
// key) or p dies.
func (r *crashRig) consume(p *crashProc) error {
	host := p.c.host()
	cfg := p.c.consumeConfig(host, nopPauser{})
	cfg.Host = crashHost{Host: host, p: p}
	if p.bug != nil {
		p.bug(p, cfg)
	}
	cfg.Recheck = time.Hour // no timer-driven unit: the writes come in one order
	cfg.DrainTimeout = 5 * time.Second
	work, cancel := context.WithCancel(p.ctx)
	defer cancel()
	w := consume.NewWorker(crashTP, cfg, work)
	end := int64(len(r.sc.records))
	var recs []*kgo.Record
	for i := r.commits.next(); i < end; i++ {
		recs = append(recs, r.sc.records[i].kafkaRecord(int(i)))
	}
	if len(recs) > 0 {
		w.Enqueue(recs)
	}
	w.Start()
	err := r.quiet(p, "consume", func() bool {
		st := w.Stats()
		return st.InFlight == 0 && st.Unsettled == 0 && r.commits.next() >= end && !r.releasable(p)
	})
	if err != nil {
		w.Lose()
		return err
	}
	w.Stop()
	return nil
}

// releasable reports whether a key of the partition has a head that p,
// its owner, would release now.
func (r *crashRig) releasable(p *crashProc) bool {
	heads, err := p.c.host().Sequences(context.Background(), crashTP)
	if err != nil {
		return true // p died: quiet sees it
	}
	for _, h := range heads {
		if h.Releasable {
			return true
		}
	}
	return false
}

// operator runs an operator's call: a call that meets a dead process's
// lock is tried again after the dead sessions are ended (standing for the
// partition owner's takeover, which ends them when it meets them).
func (r *crashRig) operator(p *crashProc, call func(ctx context.Context) error) error {
	var err error
	for range 20 {
		if err = call(p.ctx); err == nil || p.dead() || !errors.Is(err, consume.ErrLocked) {
			return err
		}
		r.reap()
	}
	return err
}

// crashKafkaLimit is the largest record value the fake Kafka takes until
// an operator raises it.
const crashKafkaLimit = 1000

// kafkaLog is the fake Kafka's partition.
type kafkaLog struct {
	mu    sync.Mutex
	recs  []kafkaRec
	limit int // 0: no limit
}

func (l *kafkaLog) accepts(size int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit == 0 || size <= l.limit
}

func (l *kafkaLog) raise() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limit = 0
}

func (l *kafkaLog) log() []kafkaRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs)
}

// crashProducer is a process's producer to the fake Kafka: it refuses a
// record over the limit (MESSAGE_TOO_LARGE) and, as kgo does, fails the
// records handed to it after a failed one of the same call (their context
// is canceled); a dead process sends nothing.
type crashProducer struct{ p *crashProc }

func (f crashProducer) Produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	l := &f.p.r.kafka
	var e crashEvent
	err := json.Unmarshal(rec.Value, &e)
	switch {
	case f.p.dead():
		err = errCrashed
	case ctx.Err() != nil:
		err = ctx.Err()
	case err != nil:
	case !l.accepts(len(rec.Value)):
		err = kerr.MessageTooLarge
	default:
		l.mu.Lock()
		l.recs = append(l.recs, kafkaRec{name: e.Name, key: string(rec.Key)})
		l.mu.Unlock()
	}
	promise(rec, err)
}

// publish is the partition owner's publisher: a worker of p on the outbox
// with the fake Kafka, until every event is published, failed, or held
// behind a failed one of its key, or p dies.
func (r *crashRig) publish(p *crashProc) error {
	lease := publish.NewLease(time.Hour, nil)
	lease.Renew(time.Now())
	w := publish.NewWorker(publish.TopicPartition{Topic: ordersTopic, Partition: 0}, &publish.WorkerConfig{
		Store:       outboxStore{coll: p.c.outbox},
		Producer:    crashProducer{p},
		Lease:       lease,
		BatchSize:   10,
		Backoff:     p.c.cfg.backoff(),
		Rescan:      time.Hour,
		Hold:        true,
		HoldRecheck: 5 * time.Millisecond,
		MarkTimeout: 5 * time.Second,
		StopTimeout: 10 * time.Second,
		Logger:      p.c.cfg.Logger,
		Stats:       &publish.Stats{},
	})
	w.Start()
	err := r.quiet(p, "publish", func() bool {
		w := r.publisherWorld(false)
		return len(w.violations()) == 0
	})
	if err != nil {
		w.Kill()
		return err
	}
	w.Stop()
	return nil
}

// consumerWorld reads the consumer's state.
func (r *crashRig) consumerWorld() consumerWorld {
	ctx := context.Background()
	c := r.checker.c
	w := consumerWorld{records: r.sc.records, inbox: map[string]crashInbox{}, effects: map[string][]string{},
		committed: r.commits.next(), handles: func(schema string) bool { return c.handlerFor(ordersTopic, schema) != nil }}
	cur, err := c.inbox.Find(ctx, bson.D{})
	require.NoError(r.t, err)
	var docs []struct {
		Doc         inboxDoc   `bson:",inline"` // exported: the codec skips unexported fields
		DiscardedAt *time.Time `bson:"discarded_at"`
	}
	require.NoError(r.t, cur.All(ctx, &docs))
	for _, x := range docs {
		d := &x.Doc
		w.inbox[d.ID.IdempotencyKey] = crashInbox{name: d.ID.IdempotencyKey, key: d.PartitionKey, schema: d.ID.ContentSchema,
			reason: d.ParkReason, offset: d.Offset, handled: d.Handled, parked: d.Parked, held: d.HeldBy != nil, discarded: x.DiscardedAt != nil}
	}
	cur, err = r.checker.db.Collection(crashEffects).Find(ctx, bson.D{})
	require.NoError(r.t, err)
	var effects []struct {
		Key     string   `bson:"_id"`
		Handled []string `bson:"handled"`
	}
	require.NoError(r.t, cur.All(ctx, &effects))
	for _, e := range effects {
		w.effects[e.Key] = e.Handled
	}
	return w
}

// publisherWorld reads the publisher's state.
func (r *crashRig) publisherWorld(final bool) publisherWorld {
	ctx := context.Background()
	w := publisherWorld{recorded: r.sc.events, outbox: map[string]crashOutbox{}, discarded: r.sc.discards,
		kafka: r.kafka.log(), final: final}
	size := map[string]int{}
	cur, err := r.checker.c.outbox.Find(ctx, bson.D{})
	require.NoError(r.t, err)
	var docs []outboxDoc
	require.NoError(r.t, cur.All(ctx, &docs))
	for _, d := range docs {
		var e crashEvent
		require.NoError(r.t, json.Unmarshal([]byte(d.Payload), &e))
		w.outbox[e.Name] = crashOutbox{name: e.Name, key: d.Key, seq: uint64(d.Seq.T)<<32 | uint64(d.Seq.I), published: d.Published, failed: d.Failed}
		size[e.Name] = len(d.Payload)
	}
	w.accepts = func(name string) bool { return r.kafka.accepts(size[name]) }
	return w
}

// dump describes the state for a failure message.
func (r *crashRig) dump() string {
	switch {
	case r.sc.records != nil:
		w := r.consumerWorld()
		return fmt.Sprintf("%s; committed %d; violations %v", w.outcome(), w.committed, w.violations())
	case r.sc.events != nil:
		w := r.publisherWorld(false)
		return fmt.Sprintf("%s; violations %v", w.outcome(), w.violations())
	}
	return ""
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// mongoCounter counts the commands a monitored MongoDB client sends, and
// notes when the relay under test first reads and how many documents it
// marked.
type mongoCounter struct {
	total atomic.Int64
	// firstFind is the time (UnixNano) of the first find command since the
	// last reset, 0 if none.
	firstFind atomic.Int64
	// marked sums nModified of successful update commands; lastMark is the
	// time of the last one.
	marked   atomic.Int64
	lastMark atomic.Int64
	// lastCommit is the time of the last successful commitTransaction.
	lastCommit atomic.Int64
	// txnEnd, when set, hears each commitTransaction and abortTransaction
	// that ends: its session id (see sessionID) and whether it was a
	// commit that succeeded. ends maps the request ids of those under way
	// to their session ids.
	txnEnd atomic.Pointer[func(lsid string, committed bool)]
	ends   sync.Map

	mu     sync.Mutex
	byName map[string]int64
	// codes counts the error codes of failed commands and of the write
	// errors of successful ones.
	codes map[int32]int64
}

func (c *mongoCounter) reset() {
	c.total.Store(0)
	c.firstFind.Store(0)
	c.marked.Store(0)
	c.lastMark.Store(0)
	c.lastCommit.Store(0)
	c.mu.Lock()
	c.byName = map[string]int64{}
	c.codes = map[int32]int64{}
	c.mu.Unlock()
}

func (c *mongoCounter) errorCodes() map[int32]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.codes)
}

func (c *mongoCounter) countCode(code int32) {
	c.mu.Lock()
	if c.codes == nil {
		c.codes = map[int32]int64{}
	}
	c.codes[code]++
	c.mu.Unlock()
}

func (c *mongoCounter) names() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.byName)
}

func (c *mongoCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			c.total.Add(1)
			if e.CommandName == "find" {
				c.firstFind.CompareAndSwap(0, time.Now().UnixNano())
			}
			if (e.CommandName == "commitTransaction" || e.CommandName == "abortTransaction") && c.txnEnd.Load() != nil {
				if _, id, ok := e.Command.Lookup("lsid", "id").BinaryOK(); ok {
					c.ends.Store(e.RequestID, string(id))
				}
			}
			c.mu.Lock()
			if c.byName == nil {
				c.byName = map[string]int64{}
			}
			c.byName[e.CommandName]++
			c.mu.Unlock()
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
			if e.CommandName == "commitTransaction" {
				c.lastCommit.Store(time.Now().UnixNano())
			}
			c.ended(e.RequestID, e.CommandName == "commitTransaction")
			if we, err := e.Reply.LookupErr("writeErrors"); err == nil {
				if vals, err := we.Array().Values(); err == nil {
					for _, v := range vals {
						if code, ok := v.Document().Lookup("code").AsInt64OK(); ok {
							c.countCode(int32(code))
						}
					}
				}
			}
			if e.CommandName != "update" {
				return
			}
			if n, ok := e.Reply.Lookup("nModified").AsInt64OK(); ok && n > 0 {
				c.marked.Add(n)
				c.lastMark.Store(time.Now().UnixNano())
			}
		},
		Failed: func(_ context.Context, e *event.CommandFailedEvent) {
			c.ended(e.RequestID, false)
			var de driver.Error
			if errors.As(e.Failure, &de) {
				c.countCode(de.Code)
			}
		},
	}
}

// ended tells txnEnd of a commitTransaction or abortTransaction that ended.
func (c *mongoCounter) ended(requestID int64, committed bool) {
	lsid, ok := c.ends.LoadAndDelete(requestID)
	if !ok {
		return
	}
	if f := c.txnEnd.Load(); f != nil {
		(*f)(lsid.(string), committed)
	}
}

// sessionID returns the id of the session of ctx (the transaction a
// handler runs in), as txnEnd names it; "" without one.
func sessionID(ctx context.Context) string {
	s := mongo.SessionFromContext(ctx)
	if s == nil {
		return ""
	}
	_, id, _ := s.ID().Lookup("id").BinaryOK()
	return string(id)
}

// kafkaCounter counts the requests Kafka clients write, and the records
// the producers got acknowledged.
type kafkaCounter struct {
	requests atomic.Int64
	acked    atomic.Int64
	bytes    atomic.Int64 // written, every request
}

var (
	_ kgo.HookBrokerWrite             = (*kafkaCounter)(nil)
	_ kgo.HookProduceRecordUnbuffered = (*kafkaCounter)(nil)
)

// OnBrokerWrite counts one request.
func (k *kafkaCounter) OnBrokerWrite(_ kgo.BrokerMetadata, _ int16, written int, _, _ time.Duration, err error) {
	if err == nil {
		k.requests.Add(1)
		k.bytes.Add(int64(written))
	}
}

// OnProduceRecordUnbuffered counts acknowledged records.
func (k *kafkaCounter) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err == nil {
		k.acked.Add(1)
	}
}

func (k *kafkaCounter) reset() {
	k.requests.Store(0)
	k.acked.Store(0)
	k.bytes.Store(0)
}

// env is what every phase uses: the servers, an unmonitored MongoDB client
// for set-up and checks, and monitored clients for the code under test.
type env struct {
	opts    options_
	brokers []string
	uri     string
	run     string // unique per run: database and group names

	setup *mongo.Client // unmonitored
	// pubMongo and conMongo are the monitored clients of the publisher and
	// consumer roles; pubCount and conCount their counters.
	pubMongo, conMongo *mongo.Client
	pubCount, conCount *mongoCounter
	kafka              *kafkaCounter // every framework Kafka client
	admin              *kadm.Client
	adminCl            *kgo.Client
	// codec, when set, is the framework clients' Config.Compression (the
	// compression phase); "": the framework's default.
	codec outbox.Compression

	closers []func()
}

// options_ are the command-line settings.
type options_ struct {
	duration      time.Duration
	publishLinger time.Duration
	eventSize     int
	partitions    int
	replicas      int
	events        int
	backlog       int
	rate          int
	latencyRuns   int
	kcRate        int
	takeoverKC    []int
	mongoURI      string
	brokers       string
	servers       string
	// kafkaName is the backend of a run of -kafka; "" without -kafka.
	kafkaName string
	// brokerPid is the broker's JVM when this run started it; 0 otherwise.
	brokerPid int
	phases    map[string]bool
	jsonOut   bool
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

func newEnv(ctx context.Context, o options_) (_ *env, err error) {
	e := &env{opts: o, run: fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	setTopics(e.run)
	e.uri, e.brokers = o.mongoURI, nil
	if o.brokers != "" {
		e.brokers = strings.Split(o.brokers, ",")
	}
	if e.uri == "" || len(e.brokers) == 0 {
		switch o.servers {
		case "inproc":
			if e.uri == "" {
				srv, err := mongofake.NewServer()
				if err != nil {
					return nil, fmt.Errorf("start mongofake: %w", err)
				}
				e.closers = append(e.closers, func() { srv.Close() })
				e.uri = srv.URI()
			}
			if len(e.brokers) == 0 {
				cl, err := kfake.NewCluster(kfake.NumBrokers(1))
				if err != nil {
					return nil, fmt.Errorf("start kfake: %w", err)
				}
				e.closers = append(e.closers, cl.Close)
				e.brokers = cl.ListenAddrs()
			}
		case "subprocess":
			uri, brokers, stop, err := startChild(ctx)
			if err != nil {
				return nil, err
			}
			e.closers = append(e.closers, stop)
			if e.uri == "" {
				e.uri = uri
			}
			if len(e.brokers) == 0 {
				e.brokers = brokers
			}
		default:
			return nil, fmt.Errorf("-servers must be inproc or subprocess, not %q", o.servers)
		}
	}
	connect := func(m *event.CommandMonitor) (*mongo.Client, error) {
		co := options.Client().ApplyURI(e.uri)
		if m != nil {
			co.SetMonitor(m)
		}
		cl, err := mongo.Connect(co)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, func() { _ = cl.Disconnect(context.Background()) })
		return cl, nil
	}
	e.pubCount, e.conCount, e.kafka = &mongoCounter{}, &mongoCounter{}, &kafkaCounter{}
	if e.setup, err = connect(nil); err != nil {
		return nil, err
	}
	if err := e.setup.Ping(ctx, nil); err != nil {
		return nil, fmt.Errorf("ping MongoDB at %s: %w", e.uri, err)
	}
	if e.pubMongo, err = connect(e.pubCount.monitor()); err != nil {
		return nil, err
	}
	if e.conMongo, err = connect(e.conCount.monitor()); err != nil {
		return nil, err
	}
	e.adminCl, err = kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, e.adminCl.Close)
	e.admin = kadm.NewClient(e.adminCl)
	resp, err := e.admin.CreateTopics(ctx, int32(o.partitions), 1, nil, allTopics()...)
	if err != nil {
		return nil, fmt.Errorf("create topics: %w", err)
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil {
			return nil, fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	e.closers = append(e.closers, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = e.admin.DeleteTopics(dctx, allTopics()...)
	})
	return e, nil
}

// db names a database of this run.
func (e *env) db(phase string) string { return "bench_" + phase + "_" + e.run }

// phaseTopics names the topics each phase writes.
func phaseTopics(phase string) []string {
	switch phase {
	case "raw":
		return []string{topics.raw}
	case "relay":
		return []string{topics.relay}
	case "floor":
		return []string{topics.floor}
	case "naive":
		return []string{topics.naive}
	case "polling":
		return []string{topics.poll}
	case "latency":
		return []string{topics.latency, topics.pollLatency}
	case "consume":
		return []string{topics.consume}
	case "memory":
		return []string{topics.memory}
	case "keyconc":
		return []string{topics.kcSlow, topics.kcLat1, topics.kcLatHigh, topics.kcTrivial}
	case "takeover":
		return []string{topics.takeover}
	}
	return nil
}

// release frees what a finished phase stored: every database of this run
// (phases share none) and the phase's topics. With the embedded servers in
// this process, later phases would otherwise pay for collecting gigabytes
// of earlier phases' documents and records; a real cluster is left clean.
func (e *env) release(phase string) {
	e.dropDatabases()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ts := phaseTopics(phase); len(ts) > 0 {
		_, _ = e.admin.DeleteTopics(ctx, ts...)
	}
	runtime.GC()
}

// dropDatabases drops every database of this run (a phase that measures
// several things one after the other drops them between, so that the
// embedded server's state does not weigh on the later ones).
func (e *env) dropDatabases() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, err := e.setup.ListDatabaseNames(ctx, bson.D{})
	if err == nil {
		for _, n := range names {
			if strings.HasPrefix(n, "bench_") && strings.HasSuffix(n, "_"+e.run) {
				_ = e.setup.Database(n).Drop(ctx)
			}
		}
	}
	runtime.GC()
}

// config returns a framework config for a phase. mongo picks the client;
// service names the groups.
func (e *env) config(m *mongo.Client, phase, service string, publish ...string) outbox.Config {
	return outbox.Config{
		Mongo:             m,
		Database:          e.db(phase),
		Brokers:           e.brokers,
		KafkaOptions:      []kgo.Opt{kgo.WithHooks(e.kafka)},
		Compression:       e.codec,
		Service:           service + "-" + e.run,
		PublishTopics:     publish,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		FenceMargin:       2 * time.Second,
		RetryMinBackoff:   10 * time.Millisecond,
		RetryMaxBackoff:   time.Second,
		PublishLinger:     e.opts.publishLinger,
	}
}

// fill records n events (mk builds event i) through the framework, perTxn
// per transaction, with a few writers in parallel.
func fill(ctx context.Context, c *outbox.Client, n, perTxn int, mk func(i int) outbox.Event) error {
	const writers = 4
	next := atomic.Int64{}
	errs := make(chan error, writers)
	for range writers {
		go func() {
			for {
				from := int(next.Add(int64(perTxn))) - perTxn
				if from >= n {
					errs <- nil
					return
				}
				to := min(from+perTxn, n)
				err := c.Transact(ctx, func(ctx context.Context) error {
					for i := from; i < to; i++ {
						if err := outbox.Record(ctx, mk(i)); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for range writers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// runClients runs clients until stop is called; stop returns Run's first
// error.
func runClients(cs ...*outbox.Client) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, len(cs))
	for _, c := range cs {
		go func() { errs <- c.Run(ctx) }()
	}
	return func() error {
		cancel()
		var first error
		for range cs {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}

// waitSettled waits until the running clients' group assignments cover
// every partition of the phase's topics and have not changed for a second,
// so that a timed measurement does not include the rebalances of replicas
// joining one after the other. Publishers are the clients with publish
// topics; every client handles.
func waitSettled(ctx context.Context, e *env, pubs, cons []*outbox.Client) error {
	snapshot := func() (string, bool) {
		var b strings.Builder
		complete := true
		for _, role := range []struct {
			cs  []*outbox.Client
			get func(outbox.Status) []outbox.TopicPartition
		}{
			{pubs, func(s outbox.Status) []outbox.TopicPartition { return s.Publishing }},
			{cons, func(s outbox.Status) []outbox.TopicPartition { return s.Handling }},
		} {
			n := 0
			for _, c := range role.cs {
				st, _ := c.Status(ctx) // the runtime part is there even when the counts fail
				tps := role.get(st)
				n += len(tps)
				fmt.Fprintf(&b, "%v;", tps)
			}
			if len(role.cs) > 0 && n != e.opts.partitions {
				complete = false
			}
		}
		return b.String(), complete
	}
	last, since := "", time.Now()
	return waitFor(ctx, 2*time.Minute, "group assignments to settle", func() bool {
		cur, complete := snapshot()
		if cur != last || !complete {
			last, since = cur, time.Now()
			return false
		}
		return time.Since(since) >= time.Second
	})
}

// waitFor polls cond every few milliseconds until it holds or timeout.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	return waitForEvery(ctx, timeout, 2*time.Millisecond, what, cond)
}

// waitForEvery polls cond every interval until it holds or timeout.
func waitForEvery(ctx context.Context, timeout, interval time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// storedEvent is the part of an outbox document the baselines read.
type storedEvent struct {
	ID             bson.ObjectID `bson:"_id"`
	Topic          string        `bson:"topic"`
	Partition      int32         `bson:"partition"`
	Key            string        `bson:"key"`
	Schema         string        `bson:"schema"`
	IdempotencyKey string        `bson:"idempotency_key"`
	OccurredAt     time.Time     `bson:"occurred_at"`
	Payload        string        `bson:"payload"`
}

// record builds the Kafka record of an event in the framework's wire format
// (version 1, see the outbox package docs).
func record(topic string, partition int32, key, schema, idemKey string, occurred time.Time, value []byte) *kgo.Record {
	return &kgo.Record{
		Topic:     topic,
		Partition: partition,
		Key:       []byte(key),
		Value:     value,
		Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderVersion, Value: []byte(outbox.WireVersion)},
			{Key: outbox.HeaderContentSchema, Value: []byte(schema)},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte(idemKey)},
			{Key: outbox.HeaderOccurredAt, Value: []byte(occurred.UTC().Format("2006-01-02T15:04:05.000Z07:00"))},
			{Key: outbox.HeaderContentType, Value: []byte("application/json")},
		},
	}
}

func (s *storedEvent) record() *kgo.Record {
	return record(s.Topic, s.Partition, s.Key, s.Schema, s.IdempotencyKey, s.OccurredAt, []byte(s.Payload))
}

// startChild runs the servers in a child process (this binary with -serve),
// so that the benchmark process holds only the framework's memory.
func startChild(ctx context.Context) (uri string, brokers []string, stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "-serve")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, nil, fmt.Errorf("start server process: %w", err)
	}
	stop = func() {
		_ = stdin.Close() // the child exits when its stdin closes
		_ = cmd.Wait()
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "mongo "):
			uri = strings.TrimPrefix(line, "mongo ")
		case strings.HasPrefix(line, "kafka "):
			brokers = strings.Split(strings.TrimPrefix(line, "kafka "), ",")
		case line == "ready":
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return uri, brokers, stop, nil
		}
	}
	stop()
	return "", nil, nil, errors.New("server process exited before it was ready")
}

// serve is the child process: both servers until stdin closes.
func serve() error {
	srv, err := mongofake.NewServer()
	if err != nil {
		return err
	}
	defer srv.Close()
	cl, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Printf("mongo %s\nkafka %s\nready\n", srv.URI(), strings.Join(cl.ListenAddrs(), ","))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

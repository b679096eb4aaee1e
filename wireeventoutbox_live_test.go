package outbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/testkit"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// The live interop tests run the Python event-outbox library itself
// (v0.4.0, installed by .ci/install-eventoutbox) as a service beside ours:
// testdata/eventoutbox/service.py. The library knows no topic prefix, so
// these tests use fixed topic names without Config.TopicPrefix (each run
// tells its events apart by their "run" field, for shared real brokers),
// and the library's services keep their documents in a database of their
// own, as a separate service would.
const (
	pyLiveTopic = "eventoutbox-live-py" // the Python service publishes here
	goLiveTopic = "eventoutbox-live-go" // our service publishes here
)

// pyLiveEvent is an event the Python service records: the library's Event
// with the fields run and seq. Our handler's type reads partition_key from
// the flat body too.
type pyLiveEvent struct {
	Run string `json:"run"`
	Seq int    `json:"seq"`
	Key int    `json:"partition_key"`
}

func (pyLiveEvent) Topic() string          { return pyLiveTopic }
func (pyLiveEvent) ContentSchema() string  { return "PyLiveEvent" }
func (e pyLiveEvent) PartitionKey() string { return itoa(e.Key) }

// goLiveEvent is an event our service records for the Python service, in
// the event-outbox format; its integer key becomes the body's partition_key.
type goLiveEvent struct {
	Run string `json:"run"`
	Seq int    `json:"seq"`
	Key int    `json:"key"`
}

func (goLiveEvent) Topic() string          { return goLiveTopic }
func (goLiveEvent) ContentSchema() string  { return "GoLiveEvent" }
func (e goLiveEvent) PartitionKey() string { return itoa(e.Key) }

var eventOutboxSkipOnce sync.Once

// eventOutboxPython returns the Python interpreter of the virtualenv that
// .ci/install-eventoutbox fills (OUTBOX_EVENTOUTBOX_VENV, else
// ~/.cache/outbox-eventoutbox/venv). Without it the test is skipped, and
// the skip is printed on stderr even without -v, with the command that
// installs the library.
func eventOutboxPython(t *testing.T) string {
	t.Helper()
	venv := os.Getenv("OUTBOX_EVENTOUTBOX_VENV")
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skipf("event-outbox: no home directory (%v): set OUTBOX_EVENTOUTBOX_VENV", err)
		}
		venv = filepath.Join(home, ".cache", "outbox-eventoutbox", "venv")
	}
	py := filepath.Join(venv, "bin", "python")
	err := exec.Command(py, "-c", "import event_outbox, aiokafka, motor").Run()
	if err != nil {
		msg := fmt.Sprintf("the Python event-outbox library is not installed in %s (%v): "+
			"run `bash .ci/install-eventoutbox` (OUTBOX_EVENTOUTBOX_VENV names another virtualenv)", venv, err)
		eventOutboxSkipOnce.Do(func() { fmt.Fprintln(os.Stderr, "SKIP live event-outbox tests:", msg) })
		t.Skip(msg)
	}
	return py
}

// pyFact is one line the Python service prints.
type pyFact struct {
	Ready    bool      `json:"ready"`
	Done     bool      `json:"done"`
	Recorded *int      `json:"recorded"`
	Handled  *pyHandle `json:"handled"`
}

type pyHandle struct {
	Topic          string         `json:"topic"`
	ContentSchema  string         `json:"content_schema"`
	IdempotencyKey string         `json:"idempotency_key"`
	PartitionKey   int            `json:"partition_key"`
	Extra          map[string]any `json:"extra"`
}

// pyService is one process of testdata/eventoutbox/service.py.
type pyService struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	stderr *testkit.Buffer

	mu      sync.Mutex
	ready   bool
	done    bool
	handled []pyHandle
}

// pyConfig is the service's configuration (see service.py).
type pyConfig struct {
	MongoURI  string     `json:"mongo_uri"`
	DB        string     `json:"db"`
	Brokers   string     `json:"brokers"`
	Group     string     `json:"group"`
	Subscribe []string   `json:"subscribe"`
	Outbox    string     `json:"outbox,omitempty"`
	Inbox     string     `json:"inbox,omitempty"`
	Publish   *pyPublish `json:"publish,omitempty"`
}

type pyPublish struct {
	Start   int    `json:"start"`
	End     int    `json:"end"`
	Topic   string `json:"topic"`
	Schema  string `json:"schema"`
	Keys    int    `json:"keys"`
	Run     string `json:"run"`
	PauseMS int    `json:"pause_ms,omitempty"`
}

// startPy starts the Python service and waits until its relay and consumer
// run. It is killed at the end of the test if it still runs.
func startPy(t *testing.T, py string, cfg pyConfig) *pyService {
	t.Helper()
	s := launchPy(t, py, cfg)
	s.wait("ready", func() bool { return s.ready })
	return s
}

// launchPy starts the Python service (see startPy) without waiting.
func launchPy(t *testing.T, py string, cfg pyConfig) *pyService {
	t.Helper()
	arg, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(py, filepath.Join("testdata", "eventoutbox", "service.py"), string(arg))
	s := &pyService{t: t, cmd: cmd, exited: make(chan struct{}), stderr: &testkit.Buffer{}}
	cmd.Stderr = s.stderr
	s.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		defer close(s.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var f pyFact
			if json.Unmarshal(sc.Bytes(), &f) != nil {
				continue
			}
			s.mu.Lock()
			s.ready = s.ready || f.Ready
			s.done = s.done || f.Done
			if f.Handled != nil {
				s.handled = append(s.handled, *f.Handled)
			}
			s.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { s.kill() })
	return s
}

// wait polls cond (under the service's lock) until it holds, failing the
// test with the service's stderr when the service exits or a minute passes.
func (s *pyService) wait(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s.mu.Lock()
		ok := cond()
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-s.exited:
			s.t.Fatalf("python service exited before %s:\n%s", what, s.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("python service: timed out waiting for %s:\n%s", what, tail(s.stderr.String(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handledFacts returns what the service's handler reported.
func (s *pyService) handledFacts() []pyHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]pyHandle(nil), s.handled...)
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *pyService) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// stop closes the service's stdin, which makes it leave its group and
// exit; it is killed if it has not within 30 s.
func (s *pyService) stop() {
	s.t.Helper()
	_ = s.stdin.Close()
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.t.Errorf("python service did not stop within 30s of closing stdin:\n%s", tail(s.stderr.String(), 4000))
		s.kill()
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// liveSetup starts MongoDB and Kafka for a live interop test: topics
// without prefix (see above), 3 partitions each; transactions that a
// killed process leaves open are aborted after 5 s on the embedded server
// (the library never ends a dead replica's sessions, so it waits for
// transactionLifetimeLimitSeconds).
func liveSetup(t *testing.T) *bundle {
	t.Helper()
	m := mongotest.Start(t, mongotest.ServerOptions(mongofake.TransactionLifetime(5*time.Second)))
	k := kafkatest.Start(t, kafkatest.SeedTopics(3, pyLiveTopic, goLiveTopic), kafkatest.ClusterOptions(kip848Settings...))
	return &bundle{mongo: m, kafka: k, db: m.DB(t), run: kafkatest.UniqueName(t), protocol: groupProtocolOf(t)}
}

func (b *bundle) pyConfig(group string, subscribe ...string) pyConfig {
	return pyConfig{
		MongoURI: b.mongo.URI, DB: b.db.Name() + "_py", Brokers: strings.Join(b.kafka.Seeds, ","),
		Group: group + "-" + b.run, Subscribe: subscribe,
	}
}

// liveGoConfig is our service's configuration for the live tests.
func (b *bundle) liveGoConfig(service string) Config {
	cfg := b.config(service)
	cfg.TopicPrefix = ""
	cfg.PublishTopics = nil
	return cfg
}

// pyOutbox is the Python service's outbox collection.
func (b *bundle) pyDB() *mongo.Database { return b.mongo.Client.Database(b.db.Name() + "_py") }

// maxRecordedSeq returns the largest seq of the Python service's outbox
// documents of this run: what a killed service had committed.
func (b *bundle) maxRecordedSeq(t *testing.T) int {
	t.Helper()
	cur, err := b.pyDB().Collection("transactional-outbox").Find(context.Background(),
		bson.D{{Key: "payload.run", Value: b.run}})
	require.NoError(t, err)
	var docs []struct {
		Payload struct {
			Seq int `bson:"seq"`
		} `bson:"payload"`
	}
	require.NoError(t, cur.All(context.Background(), &docs))
	top := -1
	for _, d := range docs {
		top = max(top, d.Payload.Seq)
	}
	return top
}

// TestEventOutboxLivePythonPublishesGoHandles: a Python service built on
// the library records events in motor transactions and publishes them with
// the library's own relay (keyless records, partition_key % partitions);
// our consumer handles each exactly once, in per-key order, under the
// inbox _id the library writes. The Python service is killed with SIGKILL
// mid-stream and restarted: nothing is lost and nothing handled twice.
func TestEventOutboxLivePythonPublishesGoHandles(t *testing.T) {
	t.Parallel()
	py := eventOutboxPython(t)
	b := liveSetup(t)
	const total, keys = 150, 5

	c := b.client(t, b.liveGoConfig("consumer"))
	effects := b.db.Collection("effects")
	var mu sync.Mutex
	lastSeq := map[string]int{}
	var outOfOrder []string
	MustHandle(c, func(ctx context.Context, e pyLiveEvent, m Metadata) error {
		if e.Run != b.run {
			return nil
		}
		mu.Lock()
		// A retried attempt (a commit that failed) sees its own seq again.
		if last, ok := lastSeq[m.PartitionKey]; ok && e.Seq < last {
			outOfOrder = append(outOfOrder, fmt.Sprintf("key %s: seq %d after %d", m.PartitionKey, e.Seq, last))
		}
		lastSeq[m.PartitionKey] = max(lastSeq[m.PartitionKey], e.Seq)
		mu.Unlock()
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}, {Key: "seq", Value: e.Seq},
			{Key: "partition_key", Value: m.PartitionKey}})
		return err
	})
	start(t, c)

	cfg := b.pyConfig("py-publisher", pyLiveTopic)
	cfg.Publish = &pyPublish{Start: 0, End: total, Topic: pyLiveTopic, Schema: "PyLiveEvent", Keys: keys, Run: b.run, PauseMS: 5}
	first := startPy(t, py, cfg)
	eventually(t, "a third of the events recorded", func() bool { return b.maxRecordedSeq(t) >= total/3 })
	first.kill()
	recorded := b.maxRecordedSeq(t)
	t.Logf("killed the Python service after it recorded %d of %d events", recorded+1, total)
	cfg.Publish.Start = recorded + 1
	second := startPy(t, py, cfg)
	second.wait("every event recorded", func() bool { return second.done })

	deadline := time.Now().Add(90 * time.Second)
	for count(t, effects, bson.D{}) < total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	require.EqualValues(t, total, count(t, effects, bson.D{}), "events handled; python stderr:\n%s", tail(second.stderr.String(), 3000))
	// Every record the library published is consumed and committed, so a
	// late duplicate would have been seen.
	published := b.waitAllCommitted(t, c.cfg.ConsumerGroup, pyLiveTopic)
	second.stop()

	cur, err := b.pyDB().Collection("transactional-outbox").Find(context.Background(), bson.D{{Key: "payload.run", Value: b.run}})
	require.NoError(t, err)
	var docs []struct {
		Published bool `bson:"published"`
		Payload   struct {
			Topic          string `bson:"topic"`
			ContentSchema  string `bson:"content_schema"`
			IdempotencyKey string `bson:"idempotency_key"`
			PartitionKey   int    `bson:"partition_key"`
			Seq            int    `bson:"seq"`
		} `bson:"payload"`
	}
	require.NoError(t, cur.All(context.Background(), &docs))
	require.Len(t, docs, total, "one outbox document per event")
	seqs := map[int]bool{}
	for _, d := range docs {
		require.True(t, d.Published, "seq %d published by the library", d.Payload.Seq)
		seqs[d.Payload.Seq] = true
		id := bson.D{{Key: "topic", Value: d.Payload.Topic}, {Key: "content_schema", Value: d.Payload.ContentSchema},
			{Key: "idempotency_key", Value: d.Payload.IdempotencyKey}}
		require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: id}, {Key: "handled", Value: true}}),
			"our inbox holds the library's _id %v", id)
		require.EqualValues(t, 1, count(t, effects, bson.D{{Key: "key", Value: d.Payload.IdempotencyKey},
			{Key: "partition_key", Value: itoa(d.Payload.PartitionKey)}}), "seq %d handled once, under its body's partition_key", d.Payload.Seq)
	}
	require.Len(t, seqs, total, "every seq recorded once")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, outOfOrder)
	t.Logf("events %d, records the library published %d (duplicates %d), handled once each, out of order 0",
		total, published, published-total)
}

// waitAllCommitted waits until group has committed the end offset of every
// partition of topic, and returns the number of records in the topic.
func (b *bundle) waitAllCommitted(t *testing.T, group, topic string) int64 {
	t.Helper()
	ctx := context.Background()
	var total int64
	eventually(t, "every record of "+topic+" committed by "+group, func() bool {
		ends, err := b.kafka.Admin().ListEndOffsets(ctx, topic)
		if err != nil {
			return false
		}
		offs, err := b.kafka.Admin().FetchOffsets(ctx, group)
		if err != nil {
			return false
		}
		total = 0
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			total += o.Offset
			c, found := offs.Lookup(topic, o.Partition)
			if o.Offset > 0 && (!found || c.At < o.Offset) {
				ok = false
			}
		})
		return ok
	})
	return total
}

// TestEventOutboxLiveGoPublishesPythonHandles: our publisher writes events
// in the event-outbox format; the library's own consumer (run by
// run_event_handler) handles each once, in per-key order, and writes the
// inbox documents it expects. Rewinding its group's offsets to the start
// redelivers every record: a no-op on its side.
func TestEventOutboxLiveGoPublishesPythonHandles(t *testing.T) {
	t.Parallel()
	py := eventOutboxPython(t)
	b := liveSetup(t)
	const total, keys = 60, 4

	cfg := b.liveGoConfig("producer")
	cfg.PublishTopics = []string{goLiveTopic}
	cfg.WireFormats = map[string]Format{goLiveTopic: FormatEventOutbox}
	cfg.EventOutboxPartitioning = []string{goLiveTopic}
	producer := b.client(t, cfg)
	ctx := context.Background()
	for seq := range total {
		require.NoError(t, producer.Transact(ctx, func(ctx context.Context) error {
			return Record(ctx, goLiveEvent{Run: b.run, Seq: seq, Key: seq % keys})
		}))
	}
	start(t, producer)

	pcfg := b.pyConfig("py-consumer", goLiveTopic)
	mine := func(hs []pyHandle) []pyHandle {
		var out []pyHandle
		for _, h := range hs {
			if h.Extra["run"] == b.run {
				out = append(out, h)
			}
		}
		return out
	}
	svc := startPy(t, py, pcfg)
	svc.wait("every event handled", func() bool { return len(mine(svc.handled)) >= total })
	b.waitAllCommitted(t, pcfg.Group, goLiveTopic)
	svc.stop()

	handled := mine(svc.handledFacts())
	require.Len(t, handled, total, "handled once each")
	lastSeq := map[int]int{}
	keysSeen := map[string]bool{}
	for _, h := range handled {
		seq := int(h.Extra["seq"].(float64))
		require.Equal(t, seq%keys, h.PartitionKey, "the body's partition_key is our partition key")
		require.EqualValues(t, seq%keys, h.Extra["key"])
		require.Equal(t, goLiveTopic, h.Topic)
		require.Equal(t, "GoLiveEvent", h.ContentSchema)
		if last, ok := lastSeq[h.PartitionKey]; ok {
			require.Greater(t, seq, last, "key %d in order", h.PartitionKey)
		}
		lastSeq[h.PartitionKey] = seq
		require.False(t, keysSeen[h.IdempotencyKey], "%s handled once", h.IdempotencyKey)
		keysSeen[h.IdempotencyKey] = true
	}
	// The library's inbox documents, as it writes them: its _id, handled
	// with a handled_at, and nothing else.
	inbox := b.pyDB().Collection("transactional-inbox")
	var ours []struct {
		ID string `bson:"idempotency_key"`
	}
	cur, err := producer.outbox.Find(ctx, bson.D{})
	require.NoError(t, err)
	require.NoError(t, cur.All(ctx, &ours))
	require.Len(t, ours, total)
	for _, o := range ours {
		require.True(t, keysSeen[o.ID], "event %s handled by the library", o.ID)
		var doc bson.D
		require.NoError(t, inbox.FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "topic", Value: goLiveTopic},
			{Key: "content_schema", Value: "GoLiveEvent"}, {Key: "idempotency_key", Value: o.ID}}}}).Decode(&doc))
		require.Len(t, doc, 3, "%v", doc)
		require.Equal(t, "handled", doc[1].Key)
		require.Equal(t, true, doc[1].Value)
		require.Equal(t, "handled_at", doc[2].Key)
	}

	// Rewind the library's group to the start: every record is delivered
	// again, and its inbox makes each a no-op.
	rewind := kadm.Offsets{}
	for p := range int32(3) {
		rewind.Add(kadm.Offset{Topic: goLiveTopic, Partition: p, At: 0, LeaderEpoch: -1})
	}
	resp, err := b.kafka.Admin().CommitOffsets(ctx, pcfg.Group, rewind)
	require.NoError(t, err)
	require.NoError(t, resp.Error())
	again := startPy(t, py, pcfg)
	b.waitAllCommitted(t, pcfg.Group, goLiveTopic)
	again.stop()
	require.Empty(t, mine(again.handledFacts()), "a redelivery is a no-op for the library")
	require.GreaterOrEqual(t, strings.Count(again.stderr.String(), "Skipped already handled event"), total,
		"the library saw every record again and skipped it")
	n, err := b.pyDB().Collection("py_handled").CountDocuments(ctx, bson.D{{Key: "extra.run", Value: b.run}})
	require.NoError(t, err)
	require.EqualValues(t, total, n, "the handler's effects, once each")
}

// TestEventOutboxLiveMixedGroupRefused: a Go replica joining the consumer
// group of running Python replicas is refused by the broker (aiokafka
// offers "roundrobin", we "cooperative-sticky"): Run returns that at once
// with the supported order of steps, rather than idling in the group. The
// other way round, the broker refuses the Python replica while Go holds the
// group: aiokafka's consumer.start() raises InconsistentGroupProtocolError.
func TestEventOutboxLiveMixedGroupRefused(t *testing.T) {
	t.Parallel()
	py := eventOutboxPython(t)
	b := liveSetup(t)
	pcfg := b.pyConfig("mixed", goLiveTopic)
	svc := startPy(t, py, pcfg)
	eventually(t, "the Python replica holds the group", func() bool {
		gs, err := b.kafka.Admin().DescribeGroups(context.Background(), pcfg.Group)
		return err == nil && gs[pcfg.Group].State == "Stable"
	})
	cfg := b.liveGoConfig("mixed")
	cfg.ConsumerGroup = pcfg.Group
	// INCONSISTENT_GROUP_PROTOCOL is the classic protocol's refusal;
	// TestRunRefusesAGroupOfAnotherAssignor covers KIP-848's.
	cfg.GroupProtocol = GroupClassic
	c := b.client(t, cfg)
	MustHandle(c, func(context.Context, goLiveEvent, Metadata) error { return nil })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Run(ctx)
	require.ErrorIs(t, err, ErrKafkaGroup)
	require.ErrorIs(t, err, kerr.InconsistentGroupProtocol)
	require.ErrorContains(t, err, "stop every member of the other client")
	require.NoError(t, ctx.Err(), "Run returned because of the error, not the deadline")
	svc.stop()

	// Go first: the Python replica is the one refused.
	g := b.client(t, cfg)
	MustHandle(g, func(context.Context, goLiveEvent, Metadata) error { return nil })
	start(t, g)
	eventually(t, "the Go replica holds the group", func() bool {
		gs, err := b.kafka.Admin().DescribeGroups(context.Background(), pcfg.Group)
		return err == nil && gs[pcfg.Group].State == "Stable"
	})
	late := launchPy(t, py, pcfg)
	select {
	case <-late.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the Python replica still runs in a group that Go holds:\n%s", tail(late.stderr.String(), 3000))
	}
	require.Contains(t, late.stderr.String(), "InconsistentGroupProtocolError", "aiokafka's consumer.start() fails")
	require.False(t, late.ready)
}

// svcEvent is what the migrated service records where its Python replicas
// recorded the library's Event with run, seq and partition_key: the same
// topic, content schema and body (the integer key becomes partition_key).
type svcEvent struct {
	Run string `json:"run"`
	Seq int    `json:"seq"`
	Key int    `json:"-"`
}

func (svcEvent) Topic() string          { return pyLiveTopic }
func (svcEvent) ContentSchema() string  { return "PyLiveEvent" }
func (e svcEvent) PartitionKey() string { return itoa(e.Key) }

// maxStreamSeq returns the largest seq that the Python service recorded
// for stream (its events' run field), or -1.
func (b *bundle) maxStreamSeq(t *testing.T, stream string) int {
	t.Helper()
	var doc struct {
		Payload struct {
			Seq int `bson:"seq"`
		} `bson:"payload"`
	}
	err := b.pyDB().Collection("transactional-outbox").FindOne(context.Background(), bson.D{{Key: "payload.run", Value: stream}},
		options.FindOne().SetSort(bson.D{{Key: "payload.seq", Value: -1}})).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return -1
	}
	require.NoError(t, err)
	return doc.Payload.Seq
}

// TestEventOutboxLiveMigrationInPlace measures the supported migration of
// a Python event-outbox service with two replicas to this framework, under
// load: the service consumes a feed (our upstream service publishes in the
// event-outbox format) and publishes two streams of events (one per
// replica) that our downstream service consumes. One Python replica is
// killed with SIGKILL, the other stopped; the collections are migrated in
// place (Admin.MigrateEventOutbox, what `outboxctl migrate event-outbox`
// runs); two Go replicas take over the database, collections, topics and
// consumer group and continue both streams while the feed goes on. Nothing
// is lost, nothing handled twice, nothing out of order, on either side.
func TestEventOutboxLiveMigrationInPlace(t *testing.T) {
	t.Parallel()
	py := eventOutboxPython(t)
	b := liveSetup(t)
	ctx := context.Background()
	const keys, goEvents = 5, 40
	streams := []string{b.run + "-A", b.run + "-B"}

	// Downstream: handles both streams, whoever publishes them.
	down := b.client(t, b.liveGoConfig("downstream"))
	effects := b.db.Collection("effects")
	var mu sync.Mutex
	last := map[string]int{}
	var outOfOrder []string
	MustHandle(down, func(ctx context.Context, e pyLiveEvent, m Metadata) error {
		if !strings.HasPrefix(e.Run, b.run) {
			return nil
		}
		mu.Lock()
		k := e.Run + "/" + m.PartitionKey
		// A retried attempt (a commit that failed) sees its own seq again.
		if l, ok := last[k]; ok && e.Seq < l {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s: seq %d after %d", k, e.Seq, l))
		}
		last[k] = max(last[k], e.Seq)
		mu.Unlock()
		_, err := effects.InsertOne(ctx, bson.D{{Key: "stream", Value: e.Run}, {Key: "seq", Value: e.Seq}, {Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	start(t, down)

	// Upstream: a feed the service consumes, recorded all along.
	ucfg := b.liveGoConfig("upstream")
	ucfg.PublishTopics = []string{goLiveTopic}
	ucfg.WireFormats = map[string]Format{goLiveTopic: FormatEventOutbox}
	ucfg.EventOutboxPartitioning = []string{goLiveTopic}
	up := b.client(t, ucfg)
	start(t, up)
	stopFeed := make(chan struct{})
	feedDone := make(chan int)
	go func() {
		seq := 0
		defer func() { feedDone <- seq }()
		for {
			select {
			case <-stopFeed:
				return
			case <-time.After(30 * time.Millisecond):
			}
			if up.Transact(ctx, func(ctx context.Context) error {
				return Record(ctx, goLiveEvent{Run: b.run, Seq: seq, Key: seq % 4})
			}) == nil {
				seq++
			}
		}
	}()
	var fed int
	defer func() {
		if stopFeed != nil {
			close(stopFeed)
			<-feedDone
		}
	}()

	// The Python service: two replicas in one group, each recording a
	// stream. The library's relay publishes only to partitions its
	// consumer is assigned, so the service subscribes to its own topic too.
	pcfg := b.pyConfig("svc", goLiveTopic, pyLiveTopic)
	replicas := make([]*pyService, 2)
	for i, s := range streams {
		c := pcfg
		c.Publish = &pyPublish{Start: 0, End: 1 << 30, Topic: pyLiveTopic, Schema: "PyLiveEvent", Keys: keys, Run: s, PauseMS: 20}
		replicas[i] = startPy(t, py, c)
	}
	eventually(t, "both replicas recording", func() bool { return b.maxStreamSeq(t, streams[0]) >= 30 && b.maxStreamSeq(t, streams[1]) >= 30 })
	replicas[0].kill()
	replicas[1].stop()
	pyRecorded := []int{b.maxStreamSeq(t, streams[0]) + 1, b.maxStreamSeq(t, streams[1]) + 1}

	// Migrate in place. The killed replica's relay transaction (an outbox
	// document marked published, its record perhaps sent) stays open until
	// the server's transactionLifetimeLimitSeconds: the conversion meets
	// its write lock until then, and is run again.
	admin := NewAdmin(b.pyDB(), "transactional-outbox", "transactional-inbox")
	var rep EventOutboxMigration
	var attempts int
	deadline := time.Now().Add(90 * time.Second)
	for {
		attempts++
		var err error
		rep, err = admin.MigrateEventOutbox(ctx, map[string]int{pyLiveTopic: 3, goLiveTopic: 3}, false)
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "migration: %v", err)
		t.Logf("migration attempt %d: %v", attempts, err)
		time.Sleep(500 * time.Millisecond)
	}
	require.Empty(t, rep.Refused)

	// The killed replica stays a member of the group until its session
	// times out; a Go replica joining before that is refused
	// (INCONSISTENT_GROUP_PROTOCOL), so the operator waits for an empty group.
	eventually(t, "the Python replicas out of the group", func() bool {
		gs, err := b.kafka.Admin().DescribeGroups(ctx, pcfg.Group)
		return err == nil && len(gs[pcfg.Group].Members) == 0
	})
	// Two Go replicas of the service take over and continue both streams.
	scfg := b.liveGoConfig("svc")
	scfg.Database = b.pyDB().Name()
	scfg.OutboxCollection, scfg.InboxCollection = "transactional-outbox", "transactional-inbox"
	scfg.ConsumerGroup = pcfg.Group
	scfg.PublishTopics = []string{pyLiveTopic}
	scfg.WireFormats = map[string]Format{pyLiveTopic: FormatEventOutbox}
	scfg.EventOutboxPartitioning = []string{pyLiveTopic}
	handledColl := b.pyDB().Collection("py_handled")
	goReplicas := make([]*Client, 2)
	for i := range goReplicas {
		goReplicas[i] = b.client(t, scfg)
		MustHandle(goReplicas[i], func(ctx context.Context, e goLiveEvent, m Metadata) error {
			_, err := handledColl.InsertOne(ctx, bson.D{{Key: "topic", Value: goLiveTopic}, {Key: "content_schema", Value: "GoLiveEvent"},
				{Key: "idempotency_key", Value: m.IdempotencyKey}, {Key: "extra", Value: bson.D{{Key: "run", Value: e.Run}, {Key: "seq", Value: e.Seq}}},
				{Key: "impl", Value: "go"}})
			return err
		})
		start(t, goReplicas[i])
	}
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := pyRecorded[i]; seq < pyRecorded[i]+goEvents; seq++ {
				err := goReplicas[i].Transact(ctx, func(ctx context.Context) error {
					return Record(ctx, svcEvent{Run: s, Seq: seq, Key: seq % keys})
				})
				if err != nil {
					t.Errorf("record %s/%d: %v", s, seq, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stopFeed)
	fed = <-feedDone
	stopFeed = nil

	want := pyRecorded[0] + pyRecorded[1] + 2*goEvents
	eventually(t, "every event of both streams handled downstream", func() bool {
		n, _ := effects.EstimatedDocumentCount(ctx)
		return int(n) >= want
	})
	b.waitAllCommitted(t, down.cfg.ConsumerGroup, pyLiveTopic)
	b.waitAllCommitted(t, pcfg.Group, goLiveTopic)

	// Downstream: each event of each stream once.
	lostDown, doubleDown := 0, 0
	for i, s := range streams {
		for seq := range pyRecorded[i] + goEvents {
			switch n := count(t, effects, bson.D{{Key: "stream", Value: s}, {Key: "seq", Value: seq}}); {
			case n == 0:
				lostDown++
			case n > 1:
				doubleDown += int(n - 1)
			}
		}
	}
	// The service: each event of the feed once, by Python or Go.
	lostFeed, doubleFeed := 0, 0
	for seq := range fed {
		switch n := count(t, handledColl, bson.D{{Key: "extra.run", Value: b.run}, {Key: "extra.seq", Value: seq}}); {
		case n == 0:
			lostFeed++
		case n > 1:
			doubleFeed += int(n - 1)
		}
	}
	byGo := count(t, handledColl, bson.D{{Key: "extra.run", Value: b.run}, {Key: "impl", Value: "go"}})
	mu.Lock()
	disorder := len(outOfOrder)
	mu.Unlock()
	t.Logf("migration: streams %d events (Python %d+%d, Go %d+%d), feed %d events (Python %d, Go %d); "+
		"1 SIGKILL; migration converted %v in %d attempt(s); lost %d/%d, handled twice %d/%d, out of order %d",
		want, pyRecorded[0], pyRecorded[1], goEvents, goEvents, fed, int64(fed)-byGo, byGo,
		rep.Converted, attempts, lostDown, lostFeed, doubleDown, doubleFeed, disorder)
	require.Zero(t, lostDown+lostFeed, "lost")
	require.Zero(t, doubleDown+doubleFeed, "handled twice")
	require.Empty(t, outOfOrder)
}

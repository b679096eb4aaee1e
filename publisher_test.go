package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/internal/publish"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// pubConfig is a publisher-only config (orders topic, 3 partitions).
func pubConfig(b *bundle) Config {
	cfg := b.config("pub")
	cfg.PublishTopics = []string{ordersTopic}
	// The size tests pad events with random hex (pad), which snappy
	// cannot compress and gzip, the default, would halve.
	cfg.Compression = CompressionSnappy
	return cfg
}

// runPub runs c's publisher with test options until stop is called (or the
// test ends) and checks that it returned nil.
func runPub(t *testing.T, c *Client, o publisherOptions) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.runPublisherWith(ctx, o) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("publisher did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// recorder records orderPlaced events, numbering them per key.
type recorder struct {
	b    *bundle
	c    *Client
	mu   sync.Mutex
	next map[string]int
	all  int
}

func newRecorder(b *bundle, c *Client) *recorder {
	return &recorder{b: b, c: c, next: map[string]int{}}
}

// record records one transaction with one event per key.
func (r *recorder) record(t *testing.T, keys ...string) {
	t.Helper()
	require.NoError(t, r.tryRecord(keys...))
}

// tryRecord is record for goroutines other than the test's.
func (r *recorder) tryRecord(keys ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.c.Transact(context.Background(), func(ctx context.Context) error {
		for _, k := range keys {
			if err := Record(ctx, orderPlaced{Run: r.b.run, OrderID: k, Amount: 1, Seq: r.next[k]}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		r.next[k]++
	}
	r.all += len(keys)
	return nil
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.all
}

func keysN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "order-" + itoa(i)
	}
	return out
}

// published returns how many outbox documents are marked published.
func (b *bundle) published(t *testing.T, _ Config) int64 {
	return countFind(t, b.db.Collection("outbox"), bson.D{{Key: "published", Value: true}})
}

// countFind counts with a find (the embedded server's aggregate support
// does not matter here).
func countFind(t *testing.T, coll *mongo.Collection, filter bson.D) int64 {
	t.Helper()
	cur, err := coll.Find(context.Background(), filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(100000))
	require.NoError(t, err)
	var docs []bson.Raw
	require.NoError(t, cur.All(context.Background(), &docs))
	return int64(len(docs))
}

// kafkaEvents reads every record of the test's Kafka topic of topic from
// the start until at least want records were read, and returns them with
// their topic bare, as a consumer sees them.
func (b *bundle) kafkaEvents(t *testing.T, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := b.kafka.Client(t, kgo.ConsumeTopics(b.kafkaTopic(topic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %d of %d records", len(out), want)
		fs.EachRecord(func(r *kgo.Record) {
			r.Topic = strings.TrimPrefix(r.Topic, b.prefix)
			out = append(out, r)
		})
	}
	return out
}

// checkDelivery asserts that every recorded event reached Kafka and that,
// per key, first deliveries follow the recording order.
func checkDelivery(t *testing.T, r *recorder, recs []*kgo.Record) (duplicates int) {
	t.Helper()
	type id struct {
		key string
		seq int
	}
	seen := map[id]bool{}
	nextSeq := map[string]int{}
	for _, rec := range recs {
		var e orderPlaced
		require.NoError(t, json.Unmarshal(rec.Value, &e))
		if e.Run != r.b.run {
			continue
		}
		require.Equal(t, e.OrderID, string(rec.Key))
		k := id{e.OrderID, e.Seq}
		if seen[k] {
			duplicates++
			continue
		}
		seen[k] = true
		require.Equal(t, nextSeq[e.OrderID], e.Seq, "key %s: first delivery of seq %d out of order", e.OrderID, e.Seq)
		nextSeq[e.OrderID]++
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Equal(t, r.next, nextSeq, "events missing in Kafka")
	return duplicates
}

func TestPublisherBacklogThenLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	keys := keysN(12)
	for range 10 {
		r.record(t, keys...) // 120 events of backlog, 10 per key
	}
	runPub(t, c, publisherOptions{})
	eventually(t, "backlog published", func() bool { return b.published(t, cfg) == 120 })

	st := c.publisherStatus()
	require.True(t, st.Running)
	require.True(t, st.LeaseValid)
	require.Len(t, st.Owned, 3)
	// The counter is bumped after the marking write returns, so it may
	// trail what MongoDB already shows.
	eventually(t, "publish counter caught up", func() bool { return c.publisherStatus().Published == 120 })

	// Live events: published promptly through the change stream (the
	// safety rescan is 30 s away).
	start := time.Now()
	r.record(t, "live-a", "live-b")
	eventually(t, "live events published", func() bool { return b.published(t, cfg) == 122 })
	lat := time.Since(start)
	t.Logf("live event latency (record to marked published): %v", lat)
	require.Less(t, lat, 5*time.Second)

	recs := b.kafkaEvents(t, ordersTopic, r.total())
	require.Zero(t, checkDelivery(t, r, recs))
	// Records carry the wire format and their stored partition.
	for _, rec := range recs {
		env, _, err := decodeRecord(rec)
		require.NoError(t, err)
		require.Equal(t, rec.Partition, env.Partition)
	}
	doc := bson.M{}
	require.NoError(t, b.db.Collection("outbox").FindOne(context.Background(), bson.D{}).Decode(&doc))
	require.Equal(t, true, doc["published"])
	require.NotNil(t, doc["published_at"])
}

// ownershipLog records which publisher produced which partition when.
type ownershipLog struct {
	mu   sync.Mutex
	ints map[publish.TopicPartition][]interval
}

type interval struct {
	who        string
	start, end time.Time
}

func (l *ownershipLog) hooks(who string) publish.Hooks {
	return publish.Hooks{Produced: func(tp publish.TopicPartition, _ []publish.Item, start, end time.Time, _ int) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.ints == nil {
			l.ints = map[publish.TopicPartition][]interval{}
		}
		l.ints[tp] = append(l.ints[tp], interval{who, start, end})
	}}
}

// checkNoOverlap asserts that no two publishers produced to one partition
// at the same time.
func (l *ownershipLog) checkNoOverlap(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for tp, ints := range l.ints {
		for i, a := range ints {
			for _, b := range ints[i+1:] {
				if a.who != b.who && a.start.Before(b.end) && b.start.Before(a.end) {
					t.Fatalf("%s produced by %s and %s at once: %v-%v and %v-%v", tp, a.who, b.who,
						a.start.Format(time.StampMicro), a.end.Format(time.StampMicro),
						b.start.Format(time.StampMicro), b.end.Format(time.StampMicro))
				}
			}
		}
	}
}

func ownedBy(cs ...*Client) map[TopicPartition]int {
	out := map[TopicPartition]int{}
	for _, c := range cs {
		for _, tp := range c.publisherStatus().Owned {
			out[tp]++
		}
	}
	return out
}

// splitEvenly reports whether every partition of orders is owned by
// exactly one of cs and every one of cs owns at least one.
func splitEvenly(cs ...*Client) bool {
	own := ownedBy(cs...)
	if len(own) != 3 {
		return false
	}
	for _, n := range own {
		if n != 1 {
			return false
		}
	}
	for _, c := range cs {
		if len(c.publisherStatus().Owned) == 0 {
			return false
		}
	}
	return true
}

func TestPublishersSplitPartitionsAndHandOver(t *testing.T) {
	t.Parallel()
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Parallel()
		testPublishersSplitAndHandOver(t)
	})
}

func testPublishersSplitAndHandOver(t *testing.T) {
	b := setup(t)
	cfg := pubConfig(b)
	cfg.PublishBatchSize = 7 // many small batches: more interleaving
	var log ownershipLog
	cs := make([]*Client, 3)
	stops := make([]func(), 3)
	for i := range cs {
		cs[i] = b.client(t, cfg)
	}
	r := newRecorder(b, cs[0])
	keys := keysN(9)

	// Record continuously while publishers join and leave.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if err := r.tryRecord(keys[r.total()%len(keys)], keys[(r.total()+4)%len(keys)]); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	defer func() { cancel(); wg.Wait() }()

	stops[0] = runPub(t, cs[0], publisherOptions{hooks: log.hooks("p0")})
	eventually(t, "p0 owns all", func() bool { return len(ownedBy(cs[0])) == 3 })
	joined := time.Now()
	stops[1] = runPub(t, cs[1], publisherOptions{hooks: log.hooks("p1")})
	eventually(t, "two split", func() bool { return splitEvenly(cs[0], cs[1]) })
	t.Logf("second publisher joined and split in %v", time.Since(joined))
	stops[2] = runPub(t, cs[2], publisherOptions{hooks: log.hooks("p2")})
	eventually(t, "three split", func() bool { return splitEvenly(cs[0], cs[1], cs[2]) })

	left := time.Now()
	stops[0]() // leaves the group: the others take over
	eventually(t, "p1 and p2 cover all", func() bool { return len(ownedBy(cs[1], cs[2])) == 3 })
	t.Logf("hand-over after a graceful leave took %v", time.Since(left))
	stops[1]()
	eventually(t, "p2 owns all", func() bool { return len(ownedBy(cs[2])) == 3 })

	cancel()
	wg.Wait()
	total := r.total()
	eventually(t, "everything published", func() bool { return b.published(t, cfg) == int64(total) })
	log.checkNoOverlap(t)
	recs := b.kafkaEvents(t, ordersTopic, total)
	dups := checkDelivery(t, r, recs)
	t.Logf("%d events, %d duplicates in Kafka", total, dups)
}

func TestPublisherKafkaOutageAndRecovery(t *testing.T) {
	t.Parallel()
	// refused: the brokers answer every produce with NOT_ENOUGH_REPLICAS.
	// unreachable: the producer's connections are dropped and refused.
	for _, mode := range []string{"refused", "unreachable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := pubConfig(b)
			c := b.client(t, cfg)
			r := newRecorder(b, c)

			dialer := &cuttableDialer{}
			var outage *kfake.FaultHandle
			heal := func() {}
			if mode == "refused" {
				// Kafka 4 takes min(min.insync.replicas, replication
				// factor) as the minimum in sync, so no topic setting makes
				// a healthy broker refuse.
				outage = b.cluster(t, "refuse every produce with NOT_ENOUGH_REPLICAS").Fault(kfake.Fault{
					Keys:  []kmsg.Key{kmsg.Produce},
					Topic: b.kafkaTopic(ordersTopic),
					Err:   kerr.NotEnoughReplicas,
					Count: -1,
				})
				heal = outage.Remove
			}
			runPub(t, c, publisherOptions{producerOpts: []kgo.Opt{kgo.Dialer(dialer.dial)}})
			eventually(t, "owns all", func() bool { return len(c.publisherStatus().Owned) == 3 })
			if mode == "unreachable" {
				dialer.setCut(true)
			}
			r.record(t, keysN(20)...)
			if outage != nil {
				eventually(t, "produce attempts refused", func() bool { return outage.Hits() >= 3 })
			}
			eventually(t, "error visible in status", func() bool { return c.publisherStatus().LastError != "" })
			require.False(t, c.publisherStatus().LastErrorAt.IsZero(), "the error's time is kept")
			require.Zero(t, b.published(t, cfg), "published during the outage")
			t.Logf("status during outage: %+v", c.publisherStatus())

			healed := time.Now()
			heal()
			dialer.setCut(false)
			eventually(t, "published after recovery", func() bool { return b.published(t, cfg) == 20 })
			t.Logf("published %v after Kafka came back", time.Since(healed))
			checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, 20))
		})
	}
}

func TestPublisherCrashBeforeMarkRepublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	r.record(t, keysN(30)...)

	crashed := make(chan struct{})
	var once sync.Once
	stop := runPub(t, c, publisherOptions{hooks: publish.Hooks{
		BeforeMark: func(publish.TopicPartition, []any) bool {
			once.Do(func() { close(crashed) })
			return false // "crash" after the Kafka ack, before the mark
		},
	}})
	<-crashed
	stop()
	require.Zero(t, b.published(t, cfg))

	c2 := b.client(t, cfg)
	runPub(t, c2, publisherOptions{})
	eventually(t, "published after restart", func() bool { return b.published(t, cfg) == 30 })
	recs := b.kafkaEvents(t, ordersTopic, 31)
	dups := checkDelivery(t, r, recs)
	require.Positive(t, dups, "the crashed batch should have been published twice")
	t.Logf("%d duplicates after the crash", dups)
}

// Under SkipEvent a refused event does not hold its key: the later events
// of the key are published without it.
func TestPublisherPermanentFailureMarksEventFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	cfg.PublishTopics = []string{ordersTopic}
	cfg.PoisonPolicy = SkipEvent
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	r.record(t, "k")
	r.recordPadded(t, 24<<10, "k") // incompressible: refused even compressed
	r.record(t, "k")
	b.setMaxMessageBytes(t, 16<<10) // lowered after the events were recorded

	runPub(t, c, publisherOptions{})
	coll := b.db.Collection("outbox")
	eventually(t, "others published", func() bool { return b.published(t, cfg) == 2 })
	eventually(t, "big one failed", func() bool { return countFind(t, coll, bson.D{{Key: "failed", Value: true}}) == 1 })
	var doc outboxDoc
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: "failed", Value: true}}).Decode(&doc))
	require.Contains(t, doc.Error, "MESSAGE_TOO_LARGE")
	require.False(t, doc.Published)
	eventually(t, "failure counted", func() bool { return c.publisherStatus().Failed == 1 })
}

// cuttableDialer dials normally until cut. A cut either drops every
// connection it made and refuses new ones (the member notices at once), or,
// in blackhole mode, leaves connections open but silent: writes vanish and
// reads block until the connection is closed (the member notices only by
// timeouts).
type cuttableDialer struct {
	blackhole bool

	mu    sync.Mutex
	cut   bool
	conns []*holeConn
}

type holeConn struct {
	net.Conn
	d      *cuttableDialer
	closed chan struct{}
	once   sync.Once
}

func (c *holeConn) silent() bool {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return c.d.cut && c.d.blackhole
}

func (c *holeConn) Write(b []byte) (int, error) {
	if c.silent() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *holeConn) Read(b []byte) (int, error) {
	if c.silent() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Read(b)
}

func (c *holeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func (d *cuttableDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	d.mu.Lock()
	refuse := d.cut && !d.blackhole
	d.mu.Unlock()
	if refuse {
		return nil, errors.New("test: network cut")
	}
	var nd net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := nd.DialContext(dctx, network, host)
	if err != nil {
		return nil, err
	}
	hc := &holeConn{Conn: conn, d: d, closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, hc)
	d.mu.Unlock()
	return hc, nil
}

func (d *cuttableDialer) setCut(cut bool) {
	d.mu.Lock()
	d.cut = cut
	conns := d.conns
	if cut && !d.blackhole {
		d.conns = nil
	}
	d.mu.Unlock()
	if cut && !d.blackhole {
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

func TestPublisherFencesZombieMember(t *testing.T) {
	t.Parallel()
	for _, blackhole := range []bool{false, true} {
		name := "dropped"
		if blackhole {
			name = "blackholed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachGroupProtocol(t, func(t *testing.T) {
				t.Parallel()
				testFencing(t, blackhole)
			})
		})
	}
}

func testFencing(t *testing.T, blackhole bool) {
	b := setup(t)
	cfg := pubConfig(b)
	cfg.PublishBatchSize = 5
	var log ownershipLog
	ca, cb := b.client(t, cfg), b.client(t, cfg)
	r := newRecorder(b, ca)
	keys := keysN(9)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if err := r.tryRecord(keys[i%len(keys)]); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(3 * time.Millisecond)
		}
	})
	defer func() { cancel(); wg.Wait() }()

	dialer := &cuttableDialer{blackhole: blackhole}
	stopA := runPub(t, ca, publisherOptions{hooks: log.hooks("A"), groupOpts: []kgo.Opt{kgo.Dialer(dialer.dial)}})
	runPub(t, cb, publisherOptions{hooks: log.hooks("B")})
	eventually(t, "split", func() bool { return splitEvenly(ca, cb) })
	aOwned := ca.publisherStatus().Owned

	// Cut A's group connections; its producer stays connected.
	cut := time.Now()
	dialer.setCut(true)
	eventually(t, "B takes over A's partitions", func() bool { return len(ownedBy(cb)) == 3 })
	takeover := time.Since(cut)
	// Keep recording a while after the takeover: a zombie would publish now.
	time.Sleep(time.Second)

	log.mu.Lock()
	var lastA time.Time
	firstB := map[TopicPartition]time.Time{}
	for tp, ints := range log.ints {
		for _, in := range ints {
			if in.who == "A" && in.start.After(lastA) {
				lastA = in.start
			}
			key := TopicPartition{tp.Topic, tp.Partition}
			if in.who == "B" && slices.Contains(aOwned, key) && in.start.After(cut) {
				if f, ok := firstB[key]; !ok || in.start.Before(f) {
					firstB[key] = in.start
				}
			}
		}
	}
	log.mu.Unlock()
	leaseTTL := cfg.SessionTimeout - cfg.FenceMargin
	t.Logf("A's last batch started %v after the cut (lease %v); B took over after %v", lastA.Sub(cut), leaseTTL, takeover)
	require.Less(t, lastA.Sub(cut), leaseTTL+500*time.Millisecond, "A published after its lease must have lapsed")
	require.False(t, ca.publisherStatus().LeaseValid)
	for tp, f := range firstB {
		require.True(t, lastA.Before(f), "%s: A published after B took over", tp)
	}
	log.checkNoOverlap(t)

	cancel()
	wg.Wait()
	dialer.setCut(false) // let A leave cleanly
	stopA()
	total := r.total()
	eventually(t, "everything published", func() bool { return b.published(t, cfg) == int64(total) })
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, total))
}

func TestPublisherChangeStreamLossFallsBackToScan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Server == nil {
		t.Skip("needs the embedded server's fail points")
	}
	cfg := pubConfig(b)
	cfg.PublishBatchSize = 50 // one find batch: every getMore is the stream's
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	var opened atomic.Int64
	runPub(t, c, publisherOptions{rescan: time.Hour, streamOpened: func() { opened.Add(1) }})
	eventually(t, "stream open", func() bool { return opened.Load() >= 1 && len(c.publisherStatus().Owned) == 3 })

	for round := range 3 {
		n := opened.Load()
		// Every getMore fails until the outbox stream was reopened: the
		// publisher's other change stream (of the scheduled events) sends
		// getMores on the same client, and one failure could be its.
		cancel := b.mongo.Server.FailCommand(mongofake.FailPoint{
			Commands: []string{"getMore"}, ErrorCode: 286,
			ErrorMessage: "ChangeStreamHistoryLost (test)",
		})
		r.record(t, keysN(10)...)
		eventually(t, "stream reopened", func() bool { return opened.Load() > n })
		cancel()
		want := int64(10 * (round + 1))
		eventually(t, "published without the stream's event", func() bool { return b.published(t, cfg) == want })
	}
	checkDelivery(t, r, b.kafkaEvents(t, ordersTopic, r.total()))
}

func TestPublisherStatusWhenNotRunning(t *testing.T) {
	t.Parallel()
	c, err := New(validConfig(t))
	require.NoError(t, err)
	require.Equal(t, publisherSnapshot{}, c.publisherStatus())
}

// TestPublisherThroughput measures the backlog rate (logged, not asserted:
// it depends on the machine and on -race).
func TestPublisherThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	t.Parallel()
	b := setup(t)
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	keys := keysN(500)
	const txns = 10
	for range txns {
		r.record(t, keys...)
	}
	start := time.Now()
	runPub(t, c, publisherOptions{})
	eventually(t, "backlog published", func() bool { return b.published(t, cfg) == txns*500 })
	el := time.Since(start)
	t.Logf("published a backlog of %d events in %v (%.0f events/s, batch %d)", txns*500, el, float64(txns*500)/el.Seconds(), c.cfg.PublishBatchSize)
}

func TestPublisherStopsPromptlyWithCoordinatorUnreachable(t *testing.T) {
	t.Parallel()
	for _, blackhole := range []bool{false, true} {
		t.Run(map[bool]string{false: "dropped", true: "blackholed"}[blackhole], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := pubConfig(b)
			c := b.client(t, cfg)
			dialer := &cuttableDialer{blackhole: blackhole}
			stop := runPub(t, c, publisherOptions{groupOpts: []kgo.Opt{kgo.Dialer(dialer.dial)}})
			eventually(t, "owns all", func() bool { return len(c.publisherStatus().Owned) == 3 })
			dialer.setCut(true)
			began := time.Now()
			stop()
			el := time.Since(began)
			t.Logf("stopped in %v with the coordinator unreachable", el)
			require.Less(t, el, 15*time.Second)
			dialer.setCut(false)
		})
	}
}

// TestPublisherProducesStreamedEventsWithoutReading checks the steady state
// of the relay: once caught up, the publisher produces what the change
// stream delivers and writes marks in batches, instead of reading the
// outbox for every wake-up.
func TestPublisherProducesStreamedEventsWithoutReading(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var finds, marks atomic.Int64
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if coll, _ := e.Command.Lookup(e.CommandName).StringValueOK(); coll != "outbox" {
			return
		}
		switch e.CommandName {
		case "find":
			finds.Add(1)
		case "update":
			marks.Add(1)
		}
	}}
	cfg := pubConfig(b)
	cfg.Mongo = b.mongo.NewClient(t, options.Client().SetMonitor(mon))
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	r.record(t, keysN(6)...)
	runPub(t, c, publisherOptions{rescan: time.Hour})
	eventually(t, "backlog published", func() bool { return b.published(t, cfg) == 6 })
	p := c.pub.Load()
	require.NotNil(t, p)
	eventually(t, "every worker follows the stream", func() bool { return p.Following() == 3 })

	before := finds.Load()
	const live = 60
	for i := range live {
		r.record(t, "live-"+itoa(i%7))
	}
	eventually(t, "live events published", func() bool { return b.published(t, cfg) == 6+live })
	require.Equal(t, before, finds.Load(), "streamed events must not be read from the outbox again")
	t.Logf("%d live events marked with %d updates", live, marks.Load())

	recs := b.kafkaEvents(t, ordersTopic, r.total())
	require.Zero(t, checkDelivery(t, r, recs), "duplicates")
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/tuning"
)

// The takeover phase: a replica killed under load, and the replica that
// takes its partitions over, which is redelivered what the dead one
// handled after its last offset commit. Measured with the consumer's
// duplicate look-up (the default) and without it (tuning knob), at each
// key concurrency of -takeover-kc: rollbacks per redelivered event.

// takeoverRun is one kill and takeover.
type takeoverRun struct {
	KeyConcurrency int `json:"key_concurrency"`
	// Lookup: the consumer reads the inbox before its transactions after
	// it met a duplicate (the default); false: tuning's knob turned it off,
	// as before the look-up existed.
	Lookup bool `json:"duplicate_lookup"`
	Events int  `json:"events"`
	// HandledByDead counts the events the killed replica handled (inbox);
	// Redelivered those of them at or past its partitions' committed
	// offsets, which the survivor is delivered again.
	HandledByDead int `json:"handled_by_killed"`
	Redelivered   int `json:"redelivered"`
	// SkippedDuplicates is what the survivor counted in
	// outbox.events.skipped with reason duplicate.
	SkippedDuplicates int64 `json:"skipped_duplicates"`
	// Rollbacks counts the survivor's abortTransaction commands;
	// DuplicateRollbacks those of its claims that met an event handled
	// already (duplicate key, code 11000), LockedRollbacks those that met a
	// lock of the dead replica's open transactions (WriteConflict, 112).
	Rollbacks          int64   `json:"rollbacks"`
	DuplicateRollbacks int64   `json:"duplicate_rollbacks"`
	LockedRollbacks    int64   `json:"locked_rollbacks"`
	PerRedelivered     float64 `json:"duplicate_rollbacks_per_redelivered_event"`
	// TakeoverSeconds: from the kill to the survivor's first handler
	// start; SettleSeconds: to every event handled. SurvivorStartSeconds:
	// from the kill to the survivor's Run called (the survivor starts once
	// what remains of the killed replica has stopped). The killed
	// replica's group membership ends when its session times out, so that
	// TakeoverSeconds is at least the session timeout whatever the broker.
	TakeoverSeconds      float64          `json:"takeover_seconds"`
	SurvivorStartSeconds float64          `json:"survivor_start_seconds"`
	SettleSeconds        float64          `json:"settle_seconds"`
	MongoCommands        map[string]int64 `json:"survivor_mongo_commands"`
}

// killSwitch dials connections for a client until killed; killing closes
// them all and refuses new ones: to the servers, the client is a process
// that died (its transactions stay open, its group membership lives until
// its session times out).
type killSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

var errKilled = errors.New("killed")

// DialContext dials unless killed.
func (k *killSwitch) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		_ = c.Close()
		return nil, errKilled
	}
	k.conns = append(k.conns, c)
	return c, nil
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
	k.conns = nil
}

func runTakeover(ctx context.Context, e *env, progress func(string)) ([]takeoverRun, error) {
	n := e.opts.events
	if err := produceBacklog(ctx, e, topics.takeover, takeoverEvent{}.ContentSchema(), n, keyOf); err != nil {
		return nil, err
	}
	defer tuning.ConsumerNoDuplicateLookup.Store(false)
	var out []takeoverRun
	for _, kc := range e.opts.takeoverKC {
		for _, lookup := range []bool{true, false} {
			progress(fmt.Sprintf("takeover: KeyConcurrency %d, duplicate look-up %v", kc, lookup))
			tuning.ConsumerNoDuplicateLookup.Store(!lookup)
			r, err := takeover(ctx, e, n, kc, lookup)
			tuning.ConsumerNoDuplicateLookup.Store(false)
			if err != nil {
				return out, fmt.Errorf("KeyConcurrency %d, look-up %v: %w", kc, lookup, err)
			}
			out = append(out, r)
			e.dropDatabases()
		}
	}
	return out, nil
}

// takeover runs one replica on the takeover backlog, kills it once it has
// handled a quarter of it, and lets a second replica of the same group
// take its partitions over and handle the rest.
func takeover(ctx context.Context, e *env, n, kc int, lookup bool) (takeoverRun, error) {
	r := takeoverRun{KeyConcurrency: kc, Lookup: lookup, Events: n}
	phase := fmt.Sprintf("takeover%d%v", kc, lookup)
	service := fmt.Sprintf("takeover-%d-%v", kc, lookup)
	inbox := e.setup.Database(e.db(phase)).Collection("inbox")
	countHandled := func(filter bson.D) (int64, error) {
		return inbox.CountDocuments(ctx, append(bson.D{{Key: "handled", Value: true}}, filter...))
	}

	// The replica to kill: every connection through the kill switch.
	ks := &killSwitch{}
	am, err := mongo.Connect(options.Client().ApplyURI(e.uri).SetDialer(ks).SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		return r, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = am.Disconnect(dctx)
	}()
	cfg := e.config(am, phase, service)
	cfg.KeyConcurrency = kc
	cfg.DrainTimeout = 2 * time.Second
	cfg.KafkaOptions = append(cfg.KafkaOptions, kgo.Dialer(ks.DialContext))
	a, err := outbox.New(cfg)
	if err != nil {
		return r, err
	}
	var handledA atomic.Int64
	outbox.MustHandle(a, func(context.Context, takeoverEvent, outbox.Metadata) error {
		handledA.Add(1)
		return nil
	})
	if err := a.EnsureIndexes(ctx); err != nil {
		return r, err
	}
	stopA := runClients(a)
	if err := waitFor(ctx, 5*time.Minute, "the first replica to handle a quarter of the backlog", func() bool {
		return handledA.Load() >= int64(n/4)
	}); err != nil {
		_ = stopA()
		return r, err
	}
	killed := time.Now()
	ks.kill()
	// What remains of the process stops; its errors are those of a
	// process without a network.
	stopped := make(chan struct{})
	go func() { _ = stopA(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Minute):
		return r, errors.New("the killed replica's Run did not return within 2 minutes")
	}

	// What the survivor will be redelivered: events handled at or past
	// the committed offsets.
	offs, err := e.admin.FetchOffsets(ctx, cfg.Service)
	if err != nil {
		return r, fmt.Errorf("fetch the group's offsets: %w", err)
	}
	byA, err := countHandled(nil)
	if err != nil {
		return r, err
	}
	r.HandledByDead = int(byA)
	for p := range int32(e.opts.partitions) {
		from := int64(0)
		if o, ok := offs.Lookup(topics.takeover, p); ok && o.Err == nil && o.At >= 0 {
			from = o.At
		}
		c, err := countHandled(bson.D{{Key: "partition", Value: p}, {Key: "offset", Value: bson.D{{Key: "$gte", Value: from}}}})
		if err != nil {
			return r, err
		}
		r.Redelivered += int(c)
	}

	// The survivor.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	cfgB := e.config(e.conMongo, phase, service)
	cfgB.KeyConcurrency = kc
	cfgB.MeterProvider = mp
	b, err := outbox.New(cfgB)
	if err != nil {
		return r, err
	}
	var firstB atomic.Int64
	outbox.MustHandle(b, func(context.Context, takeoverEvent, outbox.Metadata) error {
		firstB.CompareAndSwap(0, time.Now().UnixNano())
		return nil
	})
	e.conCount.reset()
	r.SurvivorStartSeconds = time.Since(killed).Seconds()
	stopB := runClients(b)
	werr := waitForEvery(ctx, 5*time.Minute, 20*time.Millisecond, "the survivor to handle the rest", func() bool {
		c, err := countHandled(nil)
		return err == nil && c >= int64(n)
	})
	settled := time.Now()
	names, codes := e.conCount.names(), e.conCount.errorCodes()
	if err := stopB(); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return r, werr
	}
	r.Rollbacks, r.DuplicateRollbacks, r.LockedRollbacks = names["abortTransaction"], codes[11000], codes[112]
	if r.Redelivered > 0 {
		r.PerRedelivered = float64(r.DuplicateRollbacks) / float64(r.Redelivered)
	}
	r.TakeoverSeconds = time.Duration(firstB.Load() - killed.UnixNano()).Seconds()
	r.SettleSeconds = settled.Sub(killed).Seconds()
	r.MongoCommands = names
	r.SkippedDuplicates = sumCounter(ctx, reader, "outbox.events.skipped", attribute.String("outbox.reason", "duplicate"))
	return r, nil
}

// sumCounter sums the data points of an int64 counter that carry attr.
func sumCounter(ctx context.Context, reader sdkmetric.Reader, name string, attr attribute.KeyValue) int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return -1
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, ok := dp.Attributes.Value(attr.Key); ok && v == attr.Value {
					total += dp.Value
				}
			}
		}
	}
	return total
}

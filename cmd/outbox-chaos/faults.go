package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/mongox/mongofake"
)

// actionKind is one kind of scheduled disturbance.
type actionKind string

const (
	actKill    actionKind = "kill"    // a replica dies abruptly
	actRestart actionKind = "restart" // the slot of a killed replica starts again
	actJoin    actionKind = "join"    // an extra replica joins (rebalance)
	actLeave   actionKind = "leave"   // an extra replica leaves gracefully (rebalance)

	// MongoDB faults (embedded server only).
	fMongoCommitConflict actionKind = "mongo-commit-write-conflict"
	fMongoCommitClose    actionKind = "mongo-commit-close-connection"
	fMongoCommitStall    actionKind = "mongo-commit-stall"
	fMongoWriteConflict  actionKind = "mongo-write-conflict"
	fMongoWriteError     actionKind = "mongo-write-error-outside-txn"
	fMongoDrop           actionKind = "mongo-drop-connections"
	fMongoStreamError    actionKind = "mongo-change-stream-error"
	fMongoStreamFatal    actionKind = "mongo-change-stream-fatal"
	fMongoStreamClose    actionKind = "mongo-change-stream-close"
	fMongoFindError      actionKind = "mongo-find-error"

	// Kafka faults (embedded cluster only).
	fKafkaProduceError actionKind = "kafka-produce-error"
	fKafkaProduceStall actionKind = "kafka-produce-stall"
	fKafkaFetchError   actionKind = "kafka-fetch-error"
	fKafkaFetchStall   actionKind = "kafka-fetch-stall"
	fKafkaCommitError  actionKind = "kafka-offset-commit-error"
	// kafka-heartbeat-rebalance: one heartbeat of a group answered
	// REBALANCE_IN_PROGRESS (the member rejoins); in a KIP-848 group,
	// which has no such answer, FENCED_MEMBER_EPOCH (the member loses its
	// partitions without a revoke and joins again).
	fKafkaHeartbeat actionKind = "kafka-heartbeat-rebalance"
	// kafka-fetch-forget: the broker leaves one partition of the main
	// topic out of the next fetch session a consumer opens with it. The
	// client counts the partition in its session and the broker never
	// serves it: nothing fetches it (the stall the chaos loop found at
	// stops 34 and 35) until the consumer's fetch watch restarts it. On a
	// stream of its own (scheduleStorms).
	fKafkaFetchForget actionKind = "kafka-fetch-forget"

	// Bad records written straight to Kafka (any backend).
	fMalformed actionKind = "malformed-record"

	// event-outbox-record: the Python library's records, produced
	// throughout the load (eventoutbox.go); a kind only so that -skip can
	// leave them out.
	fEventOutbox actionKind = "event-outbox-record"

	// Scenarios: longer disturbances that the issue-12 bugs need, scheduled
	// on their own cadence, round-robin so that every kind occurs.
	//
	// slow-handler: the next n step events' first handling attempt outlasts
	// the MongoDB transaction lifetime (embedded server only).
	fSlowHandler actionKind = "slow-handler"
	// downstream-outage: the handlers of a few keys fail for d, longer than
	// the retry budget, so their events are parked (and, under HoldKey,
	// their later events held); the operator re-drives them afterwards.
	fOutage actionKind = "downstream-outage"
	// small-max-message-bytes: the topic's max.message.bytes drops to
	// smallMaxMessageBytes for d while transactions mix in innocent padded
	// events (two do not fit one batch) and oversize ones; afterwards the
	// limit is restored and the operator retries the failed events.
	fSmallMaxBytes actionKind = "small-max-message-bytes"
	// kafka-down-start: a replica restarts (a deploy) with Kafka
	// unreachable for d (refused or black-holed) and records meanwhile.
	fKafkaDownStart actionKind = "kafka-down-start"
	// pause-storm: about 10 MiB of large events on the keys of one
	// partition, handled slowly, so its consumer queue fills and its
	// fetching pauses and resumes again and again.
	fPauseStorm actionKind = "pause-storm"

	// Replays: deliveries of events already handled, by the thousand, on
	// their own cadence, the kinds in turn (replay.go).
	//
	// kafka-offset-rewind: a replica is killed and the consumer group's
	// committed offsets of the partitions it consumed are moved back by up
	// to n records, so their next owners deliver them all again.
	fOffsetRewind actionKind = "kafka-offset-rewind"
	// rogue-producer: n records the publishers produced lately are
	// produced again, as a misbehaving producer (or a replicated cluster
	// failing over) would.
	fRogueProducer actionKind = "rogue-producer"
)

// smallMaxMessageBytes is the topic's max.message.bytes during a
// small-max-message-bytes window; defaultMaxMessageBytes is restored.
const (
	smallMaxMessageBytes   = 4096
	defaultMaxMessageBytes = 1048588
)

var (
	mongoFaults = []actionKind{fMongoCommitConflict, fMongoCommitClose, fMongoCommitStall, fMongoWriteConflict,
		fMongoWriteError, fMongoDrop, fMongoStreamError, fMongoStreamFatal, fMongoStreamClose, fMongoFindError}
	kafkaFaults = []actionKind{fKafkaProduceError, fKafkaProduceStall, fKafkaFetchError, fKafkaFetchStall,
		fKafkaCommitError, fKafkaHeartbeat}
	scenarios = []actionKind{fOutage, fSlowHandler, fSmallMaxBytes, fKafkaDownStart, fPauseStorm}
	replays   = []actionKind{fOffsetRewind, fRogueProducer}
)

// fetchForgetEvery spaces the kafka-fetch-forget faults.
const fetchForgetEvery = time.Minute

// action is one entry of the fault schedule.
type action struct {
	at   time.Duration // since the start of the run
	kind actionKind
	slot int           // replica slot (kill, restart, leave)
	n    int           // how many requests a fault hits
	d    time.Duration // stall length
	pick uint64        // free randomness for the executor (partition, group...)
}

func (a action) String() string {
	return fmt.Sprintf("%8.3fs %-30s slot=%d n=%d d=%s", a.at.Seconds(), a.kind, a.slot, a.n, a.d)
}

// schedule draws the whole fault schedule from the seed, before the run
// starts, so that a seed always gives the same schedule.
//
// Scenarios come every scenarioEvery on average (0: none), round-robin
// over the scenario kinds from a seed-drawn start, so a run with at least
// len(scenarios) of them has every kind.
//
// Replays come every replayEvery on average (0: none), the kinds in turn.
func schedule(seed uint64, duration time.Duration, replicas int, killEvery, faultEvery, scenarioEvery, replayEvery time.Duration, mongoOK, kafkaOK bool) []action {
	return scheduleStorms(seed, duration, replicas, killEvery, faultEvery, scenarioEvery, replayEvery, mongoOK, kafkaOK, 10)
}

// scheduleStorms is schedule with pause storms of stormMiB MiB.
func scheduleStorms(seed uint64, duration time.Duration, replicas int, killEvery, faultEvery, scenarioEvery, replayEvery time.Duration, mongoOK, kafkaOK bool, stormMiB int) []action {
	rng := rand.New(rand.NewPCG(seed, 0x0c4a05))
	var acts []action
	exp := func(mean time.Duration) time.Duration {
		return time.Duration(rng.ExpFloat64() * float64(mean))
	}
	// Kills, each followed by a restart of the same slot.
	if killEvery > 0 {
		for t := exp(killEvery); t < duration; t += exp(killEvery) {
			slot := rng.IntN(replicas)
			acts = append(acts, action{at: t, kind: actKill, slot: slot})
			acts = append(acts, action{at: t + 200*time.Millisecond + time.Duration(rng.Int64N(int64(1800*time.Millisecond))), kind: actRestart, slot: slot})
		}
	}
	// An extra replica joins about every sixth of the run and leaves a few
	// seconds later.
	for t := duration / 7; t < duration; t += duration/7 + exp(duration/20) {
		slot := replicas + rng.IntN(2)
		acts = append(acts, action{at: t, kind: actJoin, slot: slot})
		acts = append(acts, action{at: t + 2*time.Second + exp(3*time.Second), kind: actLeave, slot: slot})
	}
	var kinds []actionKind
	if mongoOK {
		kinds = append(kinds, mongoFaults...)
	}
	if kafkaOK {
		kinds = append(kinds, kafkaFaults...)
	}
	kinds = append(kinds, fMalformed, fKeylessHeld)
	if faultEvery > 0 {
		for t := exp(faultEvery); t < duration; t += exp(faultEvery) {
			acts = append(acts, action{
				at:   t,
				kind: kinds[rng.IntN(len(kinds))],
				n:    1 + rng.IntN(3),
				d:    100*time.Millisecond + time.Duration(rng.Int64N(int64(900*time.Millisecond))),
				pick: rng.Uint64(),
			})
		}
	}
	if scenarioEvery > 0 {
		var kinds []actionKind
		for _, k := range scenarios {
			if k != fSlowHandler || mongoOK {
				kinds = append(kinds, k)
			}
		}
		// A separate stream, so that adding scenarios keeps the rest of a
		// seed's schedule.
		srng := rand.New(rand.NewPCG(seed, 0x5ce4a))
		next := srng.IntN(len(kinds))
		// The first scenario comes early, the rest spaced by at least a
		// third of the mean; none starts in the last tenth of the run, so
		// that windows close before the load ends.
		for t := min(scenarioEvery/3, 2*time.Second); t < duration*9/10; t += scenarioEvery/3 + time.Duration(srng.ExpFloat64()*float64(scenarioEvery*2/3)) {
			a := action{at: t, kind: kinds[next%len(kinds)], pick: srng.Uint64(), slot: srng.IntN(replicas)}
			next++
			switch a.kind {
			case fSlowHandler:
				a.n = 1 + srng.IntN(2)
			case fOutage:
				a.n = 1 + srng.IntN(3) // keys
				a.d = 2*time.Second + time.Duration(srng.Int64N(int64(3*time.Second)))
			case fSmallMaxBytes:
				a.d = 3*time.Second + time.Duration(srng.Int64N(int64(4*time.Second)))
			case fKafkaDownStart:
				a.d = 3*time.Second + time.Duration(srng.Int64N(int64(4*time.Second)))
			case fPauseStorm:
				a.n = max(4, (stormMiB<<20)/stormPad/4*4) // events of stormPad bytes, four per transaction
			}
			acts = append(acts, a)
		}
	}
	if replayEvery > 0 {
		// A stream of its own, so that the rest of a seed's schedule stays.
		rrng := rand.New(rand.NewPCG(seed, 0x4e91a7))
		next := rrng.IntN(len(replays))
		for t := replayEvery / 2; t < duration*9/10; t += replayEvery/3 + time.Duration(rrng.ExpFloat64()*float64(replayEvery*2/3)) {
			a := action{at: t, kind: replays[next%len(replays)], pick: rrng.Uint64(), slot: rrng.IntN(replicas)}
			next++
			switch a.kind {
			case fOffsetRewind:
				a.n = 100 + rrng.IntN(300) // records back per partition
				// The killed replica's slot starts again after d, as after a kill.
				a.d = 200*time.Millisecond + time.Duration(rrng.Int64N(int64(1800*time.Millisecond)))
			case fRogueProducer:
				a.n = 100 + rrng.IntN(200) // records produced again
			}
			acts = append(acts, a)
		}
	}
	if kafkaOK && faultEvery > 0 && duration >= 2*fetchForgetEvery {
		// kafka-fetch-forget: from a fifth of the run, every
		// fetchForgetEvery, none in the last fifth (the watch takes
		// about 20 s to restart the partition). A stream of its own, so
		// that the rest of a seed's schedule stays. Long runs only: in a
		// short one a partition unfetched for 20 s takes the events of a
		// scenario past its window (a downstream outage over before they
		// are fetched parks nothing); the short run has the one at
		// quiescence (forgetAtQuiescence).
		frng := rand.New(rand.NewPCG(seed, 0xf06e7))
		for t := duration / 5; t < duration*8/10; t += fetchForgetEvery {
			acts = append(acts, action{at: t + time.Duration(frng.Int64N(int64(time.Second))), kind: fKafkaFetchForget, pick: frng.Uint64()})
		}
	}
	acts = append(acts, scheduleExtras(seed, duration, scenarioEvery)...)
	slices.SortStableFunc(acts, func(a, b action) int { return int(a.at - b.at) })
	return acts
}

// fetchForget is one armed kafka-fetch-forget.
type fetchForget struct {
	fired     atomic.Bool // it left a partition out, or it was disarmed
	done      chan struct{}
	partition int32 // the partition left out, once done is closed
}

// disarm makes an armed kafka-fetch-forget leave every fetch alone: its
// control drops itself at the next fetch.
func (f *fetchForget) disarm() { f.fired.Store(true) }

// forgetInFetchSession arms kafka-fetch-forget: the next fetch that opens
// a session (epoch 0) and names partitions of the main topic loses one of
// them (a.pick among those it names) before the broker reads it. Only the
// partition's owner names it, and only when it opens a session: kgo then
// counts the partition in, and its incremental fetches never name it
// again. Armed until such a fetch comes or the faults are cleared.
func (in *injector) forgetInFetchSession(ctx context.Context, a action) (*fetchForget, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	details, err := kadm.NewClient(in.raw).ListTopics(lctx, in.topic)
	if err != nil {
		return nil, fmt.Errorf("kafka-fetch-forget: listing %s: %w", in.topic, err)
	}
	id := [16]byte(details[in.topic].ID)
	k := in.kafka
	f := &fetchForget{done: make(chan struct{})}
	in.mu.Lock()
	in.forgets = append(in.forgets, f)
	in.mu.Unlock()
	k.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		req := r.(*kmsg.FetchRequest)
		if f.fired.Load() {
			k.DropControl() // disarmed by clear
			return nil, nil, false
		}
		if req.SessionEpoch != 0 {
			return nil, nil, false // no session opened (the fetch watch's probe is one), or an incremental fetch
		}
		for i := range req.Topics {
			rt := &req.Topics[i]
			if (rt.Topic != in.topic && rt.TopicID != id) || len(rt.Partitions) == 0 {
				continue
			}
			drop := int(a.pick % uint64(len(rt.Partitions)))
			f.partition = rt.Partitions[drop].Partition
			rt.Partitions = slices.Delete(rt.Partitions, drop, drop+1)
			f.fired.Store(true)
			close(f.done)
			k.DropControl()
			in.mu.Lock()
			in.forgot = append(in.forgot, fmt.Sprintf("%s/%d", in.topic, f.partition))
			in.mu.Unlock()
			return nil, nil, false
		}
		return nil, nil, false
	})
	return f, nil
}

// injector applies faults to the embedded servers.
type injector struct {
	mongo  *mongofake.Server // nil against a real MongoDB
	kafka  *kfake.Cluster    // nil against real brokers
	groups []string
	// protocol is the replicas' Config.GroupProtocol: which heartbeat a
	// heartbeat fault fails.
	protocol outbox.GroupProtocol
	topic    string
	raw      *kgo.Client // writes malformed records
	parts    int32
	// keys are the workload's partition keys and partitionOf their
	// partition: half the malformed records carry one of them, so they take
	// a place in that key's sequence.
	keys        []string
	partitionOf func(key string) int32
	mu          sync.Mutex
	handles     []*kfake.FaultHandle
	// forgets are the armed kafka-fetch-forget faults (clear disarms
	// them); forgot the partitions they left out of a fetch session.
	forgets []*fetchForget
	forgot  []string
	// malformed counts the malformed records written (each must end
	// parked); uncertain counts those whose write failed (they may or may
	// not be in the topic).
	malformed, uncertain int
}

// apply injects one fault. It returns false when the fault needs a server
// that is not embedded.
func (in *injector) apply(ctx context.Context, a action) (bool, error) {
	m, k := in.mongo, in.kafka
	switch a.kind {
	case fMongoCommitConflict:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"commitTransaction"}, Times: a.n, ErrorCode: 112,
			ErrorLabels: []string{"TransientTransactionError"}, ErrorMessage: "chaos: write conflict at commit"})
	case fMongoCommitClose:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"commitTransaction"}, Times: a.n, CloseConnection: true})
	case fMongoCommitStall:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"commitTransaction"}, Times: a.n, BlockTime: a.d})
	case fMongoWriteConflict:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"insert", "update", "findAndModify"}, Times: a.n, ErrorCode: 112,
			ErrorMessage: "chaos: write conflict"})
	case fMongoWriteError:
		// HostUnreachable: retryable; outside transactions the driver
		// retries once, the framework's loops retry the rest.
		m.FailCommand(mongofake.FailPoint{Commands: []string{"update", "insert"}, Times: a.n, ErrorCode: 6,
			ErrorMessage: "chaos: host unreachable"})
	case fMongoDrop:
		m.DropConnections()
	case fMongoStreamError:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"getMore"}, Times: a.n, ErrorCode: 6,
			ErrorMessage: "chaos: change stream interrupted"})
	case fMongoStreamFatal:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"aggregate"}, Times: a.n, ErrorCode: 280,
			ErrorMessage: "chaos: change stream fatal error", ErrorLabels: []string{}})
	case fMongoStreamClose:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"getMore"}, Times: a.n, CloseConnection: true})
	case fMongoFindError:
		m.FailCommand(mongofake.FailPoint{Commands: []string{"find"}, Times: a.n, ErrorCode: 91,
			ErrorMessage: "chaos: shutdown in progress"})

	case fKafkaProduceError:
		in.track(k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: in.topic, Err: kerr.NotLeaderForPartition, Count: a.n}))
	case fKafkaFetchError:
		in.track(k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Topic: in.topic, Err: kerr.NotLeaderForPartition, Count: a.n}))
	case fKafkaCommitError:
		in.track(k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.UnknownServerError, Count: a.n}))
	case fKafkaHeartbeat:
		g := in.groups[a.pick%uint64(len(in.groups))]
		if in.protocol == outbox.GroupConsumer {
			in.track(k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ConsumerGroupHeartbeat}, Err: kerr.FencedMemberEpoch, TopLevel: true, Count: 1,
				When: func(r kmsg.Request) bool {
					req, ok := r.(*kmsg.ConsumerGroupHeartbeatRequest)
					return ok && req.Group == g && req.MemberEpoch > 0
				}}))
			break
		}
		in.track(k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: g, Err: kerr.RebalanceInProgress, TopLevel: true, Count: 1}))
	case fKafkaFetchForget:
		if _, err := in.forgetInFetchSession(ctx, a); err != nil {
			return true, err
		}
	case fKafkaProduceStall, fKafkaFetchStall:
		key := kmsg.Produce
		if a.kind == fKafkaFetchStall {
			key = kmsg.Fetch
		}
		d := a.d
		k.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			k.DropControl()
			k.SleepControl(func() {
				t := time.NewTimer(d)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
				}
			})
			return nil, nil, false
		})

	case fMalformed:
		if err := in.writeMalformed(ctx, a); err != nil {
			return true, err
		}
	default:
		return false, fmt.Errorf("unknown fault %q", a.kind)
	}
	return true, nil
}

func (in *injector) track(h *kfake.FaultHandle) {
	in.mu.Lock()
	in.handles = append(in.handles, h)
	in.mu.Unlock()
}

// clear removes every fault still armed.
func (in *injector) clear() {
	if in.mongo != nil {
		in.mongo.ClearFailPoints()
	}
	in.mu.Lock()
	hs := in.handles
	in.handles = nil
	for _, f := range in.forgets {
		f.disarm()
	}
	in.forgets = nil
	in.mu.Unlock()
	for _, h := range hs {
		h.Remove()
	}
}

// headerMalformed marks the harness's malformed records, whatever their
// key and idempotency key (the framework ignores headers it does not
// know).
const headerMalformed = "chaos-malformed"

// malformedHeaders are the headers of a malformed record: the native
// envelope of a step event, with an idempotency key header (to be set)
// when withID, and the harness's mark.
func malformedHeaders(withID bool) []kgo.RecordHeader {
	hs := []kgo.RecordHeader{
		{Key: outbox.HeaderVersion, Value: []byte(outbox.WireVersion)},
		{Key: outbox.HeaderContentSchema, Value: []byte(schemaStep)},
	}
	if withID {
		hs = append(hs, kgo.RecordHeader{Key: outbox.HeaderIdempotencyKey})
	}
	return append(hs, kgo.RecordHeader{Key: outbox.HeaderOccurredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: headerMalformed, Value: []byte("1")})
}

// writeMalformed writes one bad record straight to the topic; the
// consumer must park it at once. The variants: invalid JSON, a payload that
// fails validation, a missing idempotency key, an unknown wire version.
//
// Half the records of the variants that keep an idempotency key carry a
// workload key instead of a unique one, on that key's partition: they take
// their place in the key's sequence, whose later events must be held
// behind them until the operator purges them. (A keyed record without an
// idempotency key is left out: the framework handles it under an invented
// key once released, issue 20's first defect.)
func (in *injector) writeMalformed(ctx context.Context, a action) error {
	in.mu.Lock()
	n := in.malformed + in.uncertain + 1
	in.mu.Unlock()
	key := fmt.Sprintf("malformed-%d", n)
	recKey, partition := key, int32((a.pick>>8)%uint64(in.parts))
	if a.pick%4 != 2 && (a.pick>>4)&1 == 1 && len(in.keys) > 0 {
		recKey = in.keys[(a.pick>>12)%uint64(len(in.keys))]
		partition = in.partitionOf(recKey)
	}
	headers := malformedHeaders(true)
	headers[2].Value = []byte(key)
	var value []byte
	switch a.pick % 4 {
	case 0:
		value = []byte(`{"key": "x", "seq": `)
	case 1:
		value = []byte(`{"key": "x", "seq": 0, "id": "` + key + `"}`)
	case 2:
		headers = malformedHeaders(false)
		value = []byte(`{"key": "x", "seq": 1, "id": "` + key + `"}`)
	case 3:
		headers[0].Value = []byte("99")
		value = []byte(`{}`)
	}
	return in.produceMalformed(ctx, &kgo.Record{Topic: in.topic, Partition: partition, Key: []byte(recKey), Value: value, Headers: headers})
}

// produceMalformed writes a malformed record and counts it: written, or
// uncertain when its write failed (it may be in the topic all the same).
func (in *injector) produceMalformed(ctx context.Context, rec *kgo.Record) error {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := in.raw.ProduceSync(pctx, rec).FirstErr()
	in.mu.Lock()
	if err == nil {
		in.malformed++
	} else {
		in.uncertain++
	}
	in.mu.Unlock()
	return err
}

// forgetAtQuiescence runs kafka-fetch-forget once more where only the
// consumer's fetch watch can help. Armed once the load is done, it fires in
// the fetch session a member opens when an extra replica joins (the member
// revokes partitions for the newcomer); no kill or rebalance follows that
// would open another session naming the partition. A malformed record is
// then written to that partition: it must be fetched and parked like any
// other (the malformed check), and the partition caught up (the catch-up
// check). With the watch off (OUTBOX_CHAOS_NO_FETCH_WATCH) neither
// happens.
func (h *harness) forgetAtQuiescence(ctx context.Context, cfg config) error {
	f, err := h.inj.forgetInFetchSession(ctx, action{kind: fKafkaFetchForget, pick: cfg.seed})
	if err != nil {
		return err
	}
	// A slot of its own, after the two the schedule's joins use (both
	// may be up when the load ends).
	slot := cfg.replicas + 2
	if _, err := h.startIfDown(slot); err != nil {
		return err
	}
	select {
	case <-f.done:
	case <-time.After(20 * time.Second):
		// Disarmed: armed, it would take a partition from the next client
		// that opens a session, replica or not, at any time until the end.
		f.disarm()
		h.logf("kafka-fetch-forget at quiescence: no fetch session opened within 20s of the join; disarmed")
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	// pick: no workload key (bit 4 clear), bad JSON (pick%4 == 0), on the
	// partition left out (bits 8 and up).
	a := action{kind: fMalformed, pick: uint64(f.partition) << 8}
	if err := h.inj.writeMalformed(ctx, a); err != nil {
		return fmt.Errorf("kafka-fetch-forget at quiescence: %w", err)
	}
	h.logf("kafka-fetch-forget at quiescence: %s/%d left out of a fetch session when an extra replica joined; a malformed record written to it",
		h.inj.topic, f.partition)
	return nil
}

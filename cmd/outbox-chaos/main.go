// Command outbox-chaos is a fault-injection run of the outbox framework: it
// drives a workload through several replicas of one service, kills and
// restarts replicas, makes replicas join and leave, injects MongoDB and Kafka
// faults, replays thousands of handled events, and at the end checks every
// promise the framework makes (check.go lists them): no committed event
// lost, none handled twice, every key's events handled in order over every
// kind, held exactly when they must be, parked only for a reason, no record
// published outside its publisher's ownership, follow-ups recorded by
// handlers published and handled exactly once.
//
// Usage:
//
//	go run ./cmd/outbox-chaos [-duration 60s] [-replicas 3] [-rate 300] [-seed 1]
//	    [-keys 200] [-partitions 12] [-kill-every 3s] [-fault-every 500ms]
//	    [-scenario-every 5s] [-replay-every 4s] [-chain 25] [-stall 60s]
//	    [-txn-lifetime 3s] [-slow-for 4s] [-same-key 0.5] [-key-concurrency 1] [-topic-prefix chaos.]
//	    [-mass-keys 1100] [-migrated=true] [-skip kind,...] [-skip-unknown] [-scheduled] [-stacks file] [-cpuprofile file]
//	    [-mongo-uri URI] [-kafka-brokers host:port,...] [-group-protocol classic|consumer] [-v]
//	    [-kafka apache [-kafka-nodes 3] [-broker-kill-every 45s] [-broker-pause-every 4m] [-broker-refuse-every 4m]]
//
// It prints one summary line on stdout,
//
//	events=N handled=N lost=N double_effects=N order_violations=N parked=N held=N redriven=N
//	    redelivered=N double_handled=N unknown_effects=N chained=N duplicate_publications=N
//	    unexplained_duplicates=N fence_violations=N stalled_partitions=N leaked=N kafka_record_failures=N failed_innocent=N kills=N rebalances=N faults=N
//	    key_concurrency=N event_outbox_keyed=N event_outbox_keyless=N event_outbox_no_id=N keyless_behind_held=N
//	    redrives_cancelled=N mass_holds=N max_held_keys=N duplicates_refused=N
//	    no_handler_released=N retry_isolated=N takeovers=N takeover_max=Ns
//	    topics_recreated=N recreated_handled=N waits_seen=N fetch_forgotten=N
//	    commits_doomed=N doomed_in_releases=N doomed_unknown=N doomed_chained=N
//	    ignored_skipped=N group_protocol=classic|consumer padded_judged=N
//	    scheduled=N past_due=N cancelled=N too_late=N max_late=Ns max_promote_late=Ns scheduled_padded=N
//	    fetch_restarts=N fetch_resubscribes=N
//	    [kafka_nodes=N broker_kills=N controller_kills=N broker_pauses=N broker_refusals=N produce_refused=N broker_faults_skipped=N]
//
// (parked and held count the distinct events parked on their own, and held
// behind an earlier event of their key, at some point, from the inbox's
// history; redelivered the deliveries of events to a consumer after they
// were handled or purged; chained the follow-ups handled once;
// duplicate_publications the publications of events published before,
// unexplained_duplicates those no kill, stop, revoke or failed produce
// explains; fence_violations the records produced outside their producer's
// ownership of the partition or by no replica; double_handled the events
// with more than one effect, unknown_effects the effects of no committed
// event; leaked the events of aborted transactions found in the outbox,
// the topics, the inbox or the effects, and the follow-ups that escaped an
// aborted handling transaction; commits_doomed the handling transactions
// aborted at their commit (commitdoom.go), in releases of held keys, with
// the commit's result unknown, with a follow-up recorded; ignored_skipped
// the events of a type no handler takes written on held keys under
// -skip-unknown, each judged skipped, never parked or held; group_protocol
// the replicas' Config.GroupProtocol (-group-protocol; under consumer,
// Kafka 4's KIP-848 groups, the broker's group.consumer.* settings give the
// session timeout, on kfake the classic groups' 4 s, and the
// kafka-heartbeat-rebalance fault answers a heartbeat FENCED_MEMBER_EPOCH);
// stalled_partitions the partitions whose consumer
// group offset had not reached the partition's end when the run ended), each
// broken invariant on stderr (at most ten lines per kind) with the number of
// scenarios and replays run of each kind, and exits 1 when any invariant
// fails (2 on a setup error).
//
// # The workload
//
// Each replica is a separate outbox.Client with its own MongoDB client and
// Kafka clients and the same service name, so the replicas share the
// publisher group and the consumer group. Load generators run transactions
// on random replicas; each transaction records one to three "step" events of
// random keys (in half of the multi-event transactions, -same-key,
// consecutive events of one key, so that a reordering inside a batch shows),
// the Seq of each taken from the key's counter document
// incremented in the same transaction (so per key the commit order is
// 1, 2, 3...), and writes each event to a ledger collection, also in the
// transaction: the ledger is the ground truth of what committed. Some
// transactions also record a poison event (its handler always fails), which
// takes its place in its key's sequence like the step events; some abort on
// purpose after recording. The step handler checks the key's "last handled
// seq" document, records an order violation when the event is not the next
// one, advances it and inserts an effect document, all in the handling
// transaction; for a quarter of the step events (-chain) it also records a
// follow-up event on a second topic, with its ledger entry, which a second
// handler handles the same way. A deterministic share of step events fails
// its first attempt, after all its writes.
//
// # Faults
//
// The schedule is drawn from -seed before the run starts: kills (each
// followed by a restart of the same slot 0.2-2 s later), extra replicas
// joining and leaving (rebalances), and faults: MongoDB commit write
// conflicts, commits that lose their connection or stall, write conflicts,
// write errors outside transactions, dropped connections, change-stream
// errors (resumable, fatal, closed connections) and find errors through the
// embedded server's fault API; Kafka produce and fetch errors and stalls,
// offset-commit errors and heartbeat errors that force a rebalance through
// kfake's fault hooks; a partition left out of the next fetch session a
// consumer opens (kafka-fetch-forget, on a stream of its own: its client
// never fetches it again until the consumer's fetch watch restarts it;
// fetch_forgotten counts them, and the catch-up check judges them);
// malformed records written straight to the topic; handling transactions
// aborted after their handler returned, at their commit
// (handling-commit-doomed, on the ordinary path and in releases of held
// keys: whatever the handler wrote outside its transaction stays, and is
// counted in leaked).
// Half the malformed records carry a workload key: they take their place
// in that key's sequence and hold its later events until purged. Against
// real servers (-mongo-uri, -kafka-brokers) the server faults are skipped;
// kills, rebalances, poison and malformed records, and replays remain.
//
// With -kafka apache the run starts a real Apache Kafka cluster of its own
// (internal/apachekafka: -kafka-nodes nodes, three by default, each a
// broker and a KRaft controller; replication factor 3 and
// min.insync.replicas=2) instead of kfake, and breaks it (broker.go), one
// fault at a time, each followed by a wait until every replica is in sync
// again: kill -9 of the broker leading the most partitions, of a
// partition's leader, and of the active controller, in turn, every
// -broker-kill-every, each restarted 2-10 s later (replica kills and
// replays then come every 30 s and 20 s unless -kill-every and
// -replay-every are given: a killed member holds its partitions and
// every rebalance for its session timeout); every
// -broker-pause-every, the consumer group's coordinator paused (SIGSTOP)
// past the session timeout and the broker's controller session; and every
// -broker-refuse-every, the main topic refusing acks=all writes for
// seconds: its min.insync.replicas raised to its replication factor (3)
// and a broker paused until the controller fences it and every
// partition's ISR is one short, so every leader answers
// NOT_ENOUGH_REPLICAS (refuse.go; min.insync.replicas above the
// replication factor refuses nothing on Kafka 3.7 and later, which cap it
// at the replica count). The summary line then ends with kafka_nodes=N
// broker_kills=N controller_kills=N broker_pauses=N broker_refusals=N
// produce_refused=N broker_faults_skipped=N: produce_refused counts the
// partitions of the replicas' Produce responses that carried
// NOT_ENOUGH_REPLICAS or NOT_ENOUGH_REPLICAS_AFTER_APPEND, read off their
// connections (producewatch.go), and a run whose refusals met none fails;
// a fault that comes while the previous one is still in progress is
// skipped. Every run also counts the consumer fetch watch's restarts
// (fetch_restarts=N fetch_resubscribes=N, each logged with its partition
// under -v): on a real broker, where kafka-fetch-forget cannot run, each
// is a partition its Kafka client stopped fetching on its own.
//
// # Replays
//
// Every -replay-every on average comes a replay, the kinds in turn
// (replay.go): kafka-offset-rewind (a replica is killed and the consumer
// group's committed offsets of its partitions are moved back by hundreds of
// records, so their next owners deliver them again) and rogue-producer
// (hundreds of records the publishers produced lately are produced again).
// Every one of those deliveries must be skipped: 0 double effects.
//
// # Scenarios
//
// Every -scenario-every on average comes a scenario, the kinds in turn (see
// faults.go): slow-handler (the first handling attempt of a few step events
// outlasts the embedded MongoDB's transaction lifetime, -txn-lifetime; it
// must fail, count as an attempt and leave the next attempt to succeed;
// with -slow-for 6s or more each run must also show as a "running" wait
// in its replica's Status while it lasts: waits_seen, waitsvisible.go),
// downstream-outage (a few keys' handlers fail for seconds, longer than the
// retry budget, until one of their events is parked), small-max-message-bytes
// (the topic's max.message.bytes drops to 4 KiB for seconds while
// transactions mix in events of 55% and 150% of it), kafka-down-start (a
// replica restarts with Kafka refused or black-holed for seconds and
// records meanwhile) and pause-storm (about 10 MiB of 200 KiB events on one
// partition, handled slowly, so its consumer queue passes its byte bound
// again and again).
//
// # Issues 20 and 31
//
// Every replica runs with Config.KeyConcurrency -key-concurrency (the
// order checks judge each key's order, which holds whatever the
// concurrency) and Config.TopicPrefix -topic-prefix (the harness
// translates names at the Kafka boundary: the checks compare bare
// topics). Throughout the load a producer plays a service on the Python
// event-outbox library (eventoutbox.go): step events in the library's
// flat body, naming the prefixed topic, with and without a Kafka key, on
// keys of their own (event_outbox_keyed, event_outbox_keyless: handled);
// every tenth has no idempotency_key and must be parked, holding its key
// (from the Kafka key or the body's partition_key), until the operator
// purges it (event_outbox_no_id).
// With -migrated (the default) the run starts on a Python event-outbox
// dataset migrated in place, every replica with
// Config.UniqueIdempotencyKeys, and the load now and then records an
// event again, which must be refused (duplicates_refused; migrated.go).
// The fault keyless-behind-held writes a record without idempotency key
// on a key held now (keyless_behind_held: those the history saw held); a
// third of the operator's Client.Redrive calls are cancelled while they
// run (redrives_cancelled). On a stream of their own (extras.go):
// mass-hold (an outage over -mass-keys keys of their own, each key's
// first event parked at once, its second held: max_held_keys, the most
// keys held at once, from the history), no-handler-deploy (events of a
// type no replica handles, then a rolling deploy of its handler:
// no_handler_released), retry-isolation (a retrying key must not hold
// back the other keys of its partition: retry_isolated) and
// kill-open-txns (a replica killed while its handlers hold transactions
// open on many keys; takeover_max is the longest time from such a kill
// to the settling of one of those events; with a lifetime of 30 s or more
// (-txn-lifetime 60s, MongoDB's default) it must stay under three quarters
// of the lifetime, which fails a takeover that waits for the dead
// replica's transactions to expire; slow-handler is left out with a
// lifetime above 10 s), and topic-recreated (a topic of its own deleted
// under the running replicas once its events are handled, events recorded
// while it is gone, then created again and more recorded: each must be
// published to the new topic and handled once, in order per key:
// topics_recreated, and recreated_handled the events recorded while it
// was gone or after, handled; recreate.go).
//
// An operator goroutine acts on the outcome as an on-call engineer would
// (operator.go): it purges parked poison events and keyed malformed
// records, re-drives parked step events once their key's outage is over
// (Admin.RequestRedrive or Client.Redrive, in turns), leaves held events to
// the framework, and retries failed outbox events once the small-limit
// window has closed. Violation it sees: an outbox event marked failed
// although it fits the limit alone. Transactions that start on a replica
// whose Kafka is down must neither fail because of Kafka nor hang until
// their 20 s deadline.
//
// # Delayed publication
//
// With -scheduled a generator of its own (scheduled.go) records four
// events a second with WithPublishAt, each alone in its transaction on a
// random replica and on a key of its own, due 0.5-20 s later (never after
// the load), a tenth due already (recorded for immediate publication:
// past_due), and cancels about 30% of the scheduled ones by
// CancelScheduled in a later transaction, at a time drawn up to 3 s past
// the due time, so that some cancellations meet ErrTooLate (too_late);
// the transaction marks the event's ledger entry cancelled or too late.
// The faults go on meanwhile. Each event not cancelled must be published
// and handled once (scheduled-lost, counted in lost), none may reach the
// topic or be promoted before its due time (scheduled-early), each must
// be promoted within a bound (1 s, plus the transaction lifetime, plus the
// slowest transaction of the load, at least 2 s) after the first time at
// or after its due time and its recording transaction's return from which
// one live publisher owned its partition that long (scheduled-late: a
// kill or a rebalance moves that time), a
// cancelled one never promoted, published or handled
// (scheduled-cancelled-published), ErrTooLate never met before the due
// time (scheduled-too-late-early). max_late is the longest time from a
// due time to the event's first record in the topic, max_promote_late to
// its promotion.
//
// # What is judged, and from what
//
// The checks judge recorded facts: the ledger; the topics, read whole; the
// inbox's history, a change stream on the run's database opened before the
// first replica (history.go; every read of the inbox's parked and held
// state goes through inboxview.go); what each replica's Kafka clients did,
// through hooks passed in Config.KafkaOptions (kafkalog.go: every record
// its producer finished, every record its consumer polled) and the
// publisher's partition assignments (internal/tuning.PublisherOwnership).
// The judges are pure functions of those facts (judge_*.go), each proven by
// a unit test on a hand-made history it must fail (judge_test.go).
//
// After the load the run waits until everything is settled, for as long as
// work progresses; it fails when nothing progressed for -stall, printing
// what is unsettled (-stacks also writes the goroutine stacks).
//
// A kill is abrupt: every connection of the replica (MongoDB and Kafka, all
// dialled through a per-replica switch) is closed at once and new dials are
// refused, then the replica's context is cancelled. The servers see what a
// crashed process leaves: requests in flight without replies, open
// transactions that only expire, a group member that stays until its session
// times out. The killed replica's goroutines can reach nothing, so its
// attempt to drain changes nothing; they wind down in the background.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/event-outbox/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses the flags, runs the harness and prints the summary. It returns
// the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outbox-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.DurationVar(&cfg.duration, "duration", 60*time.Second, "how long load and faults last")
	fs.IntVar(&cfg.replicas, "replicas", 3, "service replicas (extra ones join and leave during the run)")
	fs.IntVar(&cfg.rate, "rate", 300, "target step events per second")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed of the fault schedule")
	fs.IntVar(&cfg.keys, "keys", 200, "partition keys")
	fs.IntVar(&cfg.partitions, "partitions", 12, "partitions of the topic")
	fs.DurationVar(&cfg.killEvery, "kill-every", 3*time.Second, "mean time between replica kills (0: none; 30s by default with -kafka apache)")
	fs.DurationVar(&cfg.faultEvery, "fault-every", 500*time.Millisecond, "mean time between injected faults (0: none)")
	fs.DurationVar(&cfg.stall, "stall", 60*time.Second, "after the load, fail when nothing progressed for this long before everything settled")
	fs.StringVar(&cfg.stacks, "stacks", "", "write every goroutine's stack to this file once nothing progressed for 10s after the load (to explain a stall)")
	fs.DurationVar(&cfg.replayEvery, "replay-every", 4*time.Second, "mean time between replays: consumer offsets rewound, records produced again by a rogue producer (0: none; 20s by default with -kafka apache)")
	fs.IntVar(&cfg.chainPct, "chain", 25, "percent of step events whose handler records a follow-up event on the second topic")
	fs.IntVar(&cfg.transient, "transient", 5, "percent of step events whose first handling attempt fails")
	fs.Float64Var(&cfg.poison, "poison", 0.01, "probability that a transaction also records a poison event")
	fs.Float64Var(&cfg.abort, "abort", 0.05, "probability that a transaction aborts on purpose")
	fs.DurationVar(&cfg.scenarioEvery, "scenario-every", 5*time.Second, "mean time between scenarios: slow handlers, downstream outages, small max.message.bytes windows, Kafka down at start, pause storms (0: none)")
	fs.IntVar(&cfg.stormMiB, "storm-mib", 10, "MiB of 200 KiB events per pause storm")
	fs.IntVar(&cfg.queueRecords, "queue-records", 64, "consumer queue bound per partition in records: fetching pauses at it, so a small bound makes pause storms (0: the framework's 5000)")
	fs.IntVar(&cfg.queueBytes, "queue-bytes", 1<<20, "consumer queue bound per partition in bytes (0: the framework's 8 MiB)")
	fs.DurationVar(&cfg.txnLifetime, "txn-lifetime", 3*time.Second, "the embedded MongoDB's transaction lifetime (slow handlers outlast it)")
	fs.DurationVar(&cfg.slowFor, "slow-for", 0, "how long a slow handler runs (at least -txn-lifetime plus 1s); 6s or more lets the check that Status shows the run judge it")
	fs.StringVar(&cfg.topicPrefix, "topic-prefix", "chaos.", "Config.TopicPrefix of every replica (the Python library's records name the prefixed topic)")
	fs.IntVar(&cfg.massKeys, "mass-keys", 1100, "keys a mass hold holds at once (scenario mass-hold)")
	fs.BoolVar(&cfg.skipUnknown, "skip-unknown", false, "run the replicas with Config.SkipUnknownEvents; the operator writes events of a type no handler takes on keys held behind a parked event (they must be skipped, never hold the key); leaves out no-handler-deploy, which needs such events kept")
	fs.BoolVar(&cfg.claimCheck, "claim-check", false, "run the replicas with Config.ClaimCheck: about 5% of step transactions record an event whose payload goes out of band; every padded event must be handled with the payload recorded; leaves out small-max-message-bytes, whose oversize events would go out of band instead of being refused")
	fs.BoolVar(&cfg.scheduled, "scheduled", false, "also record scheduled events (WithPublishAt, due 0.5-20 s later, a tenth already due) and cancel about 30% of them in later transactions, some in time and some too late; each must be published once, not before its due time, promoted within a bound after it, never once cancelled")
	fs.BoolVar(&cfg.migrated, "migrated", true, "start on a migrated Python event-outbox dataset, with Config.UniqueIdempotencyKeys")
	fs.IntVar(&cfg.keyConcurrency, "key-concurrency", 1, "Config.KeyConcurrency of every replica: events of different keys of one partition handled at once")
	fs.Float64Var(&cfg.sameKey, "same-key", 0.5, "probability that a multi-event transaction records consecutive events of one key")
	fs.StringVar(&cfg.mongoURI, "mongo-uri", "", "real MongoDB replica set (default: embedded server)")
	fs.StringVar(&cfg.brokers, "kafka-brokers", "", "real Kafka brokers, comma-separated (default: embedded kfake)")
	fs.StringVar(&cfg.kafka, "kafka", "kfake", "kfake (embedded), or apache: a real Apache Kafka cluster the run starts (Java 17 and Maven) and breaks with broker faults")
	fs.IntVar(&cfg.kafkaNodes, "kafka-nodes", 3, "with -kafka apache: the cluster's nodes (replication factor min(nodes, 3), min.insync.replicas=2 from three)")
	fs.DurationVar(&cfg.brokerKillEvery, "broker-kill-every", 45*time.Second, "with -kafka apache: mean time between kill -9 of a broker (the one leading the most partitions, a partition's leader, the active controller, in turn), each restarted 2-10 s later (0: none)")
	fs.DurationVar(&cfg.brokerPauseEvery, "broker-pause-every", 4*time.Minute, "with -kafka apache: mean time between pauses (SIGSTOP) of the consumer group's coordinator past the session timeout (0: none)")
	fs.DurationVar(&cfg.brokerRefuseEvery, "broker-refuse-every", 4*time.Minute, "with -kafka apache: mean time between windows of the main topic refusing acks=all writes with NOT_ENOUGH_REPLICAS (its min.insync.replicas raised to its replication factor, a broker paused until it leaves the ISR) (0: none)")
	fs.TextVar(&cfg.groupProtocol, "group-protocol", outbox.GroupClassic, "Config.GroupProtocol of every replica: classic, or consumer (Kafka 4's KIP-848 groups; the broker's group.consumer.* settings give the session timeout)")
	skip := fs.String("skip", "", "comma-separated action kinds to leave out of the schedule (kill, join, kafka-produce-stall...)")
	verbose := fs.Bool("v", false, "progress lines and framework warnings on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case cfg.replicas < 1:
		fmt.Fprintln(stderr, "outbox-chaos: -replicas must be at least 1")
		return 2
	case cfg.rate < 1 || cfg.keys < 1 || cfg.partitions < 1:
		fmt.Fprintln(stderr, "outbox-chaos: -rate, -keys and -partitions must be positive")
		return 2
	case cfg.keyConcurrency < 1:
		fmt.Fprintln(stderr, "outbox-chaos: -key-concurrency must be at least 1")
		return 2
	case cfg.kafka != "kfake" && cfg.kafka != kafkaApache:
		fmt.Fprintln(stderr, "outbox-chaos: -kafka must be kfake or apache")
		return 2
	case cfg.kafka == kafkaApache && cfg.brokers != "":
		fmt.Fprintln(stderr, "outbox-chaos: -kafka apache starts its own cluster: leave -kafka-brokers out")
		return 2
	case cfg.kafka == kafkaApache && cfg.kafkaNodes < 1:
		fmt.Fprintln(stderr, "outbox-chaos: -kafka-nodes must be at least 1")
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.spaceKillsForRealKafka(set)
	cfg.skip = map[actionKind]bool{}
	for _, k := range splitList(*skip) {
		cfg.skip[actionKind(k)] = true
	}
	if cfg.claimCheck {
		cfg.skip[fSmallMaxBytes] = true
	}
	if cfg.skipUnknown {
		// no-handler-deploy needs the default that SkipUnknownEvents
		// turns off: replicas without a type's handler keep its events
		// (parked, no_handler) for the replicas deployed with it. Under
		// the option they skip them, as documented, and those events are
		// never handled.
		cfg.skip[fNoHandler] = true
	}
	if *verbose {
		cfg.progress = stderr
		cfg.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// Without -v the harness is silent until its verdict, a minute or more
	// away: say what runs now.
	fmt.Fprintf(stderr, "outbox-chaos: %v of load and faults (seed %d, %d replicas, %d events/s, %s group protocol), then settling and judging; -v prints progress\n",
		cfg.duration, cfg.seed, cfg.replicas, cfg.rate, cfg.groupProtocol)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "outbox-chaos:", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "outbox-chaos:", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	res, err := runHarness(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "outbox-chaos:", err)
		return 2
	}
	fmt.Fprintln(stdout, res.summary()+res.Broker.summary())
	fmt.Fprintln(stderr, "outbox-chaos: scenarios run:", res.scenarioLine())
	for _, f := range res.Failures {
		fmt.Fprintln(stderr, "FAIL:", f)
	}
	if len(res.Failures) > 0 {
		return 1
	}
	return 0
}

// Replica kills on a real broker: a killed replica's group member keeps its
// partitions, unconsumed, until its session times out (6 s), and every
// rebalance begun meanwhile waits for it (Apache Kafka's coordinator holds
// the group in PreparingRebalance until each member has rejoined or
// expired). At kfake's cadence (a kill every 3 s, an offset-rewind replay,
// which kills too, every 8 s) kills come faster than the group drops the
// dead: it rebalanced most of the time with half its members dead, and
// consumption fell to a few events a second. Spaced by five session
// timeouts, each kill costs its own partitions one session timeout, as a
// crash costs a real service.
const (
	apacheKillEvery   = 30 * time.Second
	apacheReplayEvery = 20 * time.Second
)

// spaceKillsForRealKafka sets, with -kafka apache, the real broker's
// cadence of replica kills and replays in place of kfake's defaults; set
// names the flags given on the command line, which are kept.
func (c *config) spaceKillsForRealKafka(set map[string]bool) {
	if c.kafka != kafkaApache {
		return
	}
	if !set["kill-every"] {
		c.killEvery = apacheKillEvery
	}
	if !set["replay-every"] {
		c.replayEvery = apacheReplayEvery
	}
}

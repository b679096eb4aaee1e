// Command outbox-chaos is a fault-injection run of the outbox framework: it
// drives a workload through several replicas of one service, kills and
// restarts replicas, makes replicas join and leave, injects MongoDB and Kafka
// faults, and at the end checks against the database and the Kafka topic
// that no committed event was lost, none was handled twice, every key's
// events were handled in commit order, and poison events were parked.
//
// Usage:
//
//	go run ./cmd/outbox-chaos [-duration 60s] [-replicas 3] [-rate 300] [-seed 1]
//	    [-keys 200] [-partitions 12] [-kill-every 3s] [-fault-every 500ms]
//	    [-scenario-every 5s] [-txn-lifetime 3s] [-same-key 0.5] [-skip kind,...]
//	    [-mongo-uri URI] [-kafka-brokers host:port,...] [-v]
//
// It prints one summary line on stdout,
//
//	events=N handled=N lost=N double_effects=N order_violations=N parked=N held=N redriven=N
//	    stalled_partitions=N leaked=N kafka_record_failures=N failed_innocent=N kills=N rebalances=N faults=N
//
// (parked and held count the distinct events seen parked or held during the
// run; leaked the events of aborted transactions found in the outbox, the
// topic, the inbox or the effects; stalled_partitions the partitions whose
// consumer group offset had not reached the partition's end when the quiesce
// ended), each broken invariant on stderr (at most ten lines per kind) with
// the number of scenarios run of each kind, and exits 1 when any invariant
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
// transactions also record a poison event (its handler always fails), some
// abort on purpose after recording. The step handler checks the key's "last
// handled seq" document, records an order violation when the event is not
// the next one, advances it and inserts an effect document, all in the
// handling transaction. A deterministic share of step events fails its first
// attempt.
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
// kfake's fault hooks; malformed records written straight to the topic.
// Against real servers (-mongo-uri, -kafka-brokers) the server faults are
// skipped; kills, rebalances, poison and malformed records remain.
//
// # Scenarios
//
// Every -scenario-every on average comes a scenario, the kinds in turn (see
// faults.go): slow-handler (the first handling attempt of a few step events
// outlasts the embedded MongoDB's transaction lifetime, -txn-lifetime; it
// must fail, count as an attempt and leave the next attempt to succeed),
// downstream-outage (a few keys' handlers fail for seconds, longer than the
// retry budget, until one of their events is parked), small-max-message-bytes
// (the topic's max.message.bytes drops to 4 KiB for seconds while
// transactions mix in events of 55% and 150% of it), kafka-down-start (a
// replica restarts with Kafka refused or black-holed for seconds and
// records meanwhile) and pause-storm (about 10 MiB of 200 KiB events on one
// partition, handled slowly, so its consumer queue passes its byte bound
// again and again).
//
// An operator goroutine acts on the outcome as an on-call engineer would
// (operator.go): it purges parked poison events, re-drives parked step
// events once their key's outage is over (Admin.RequestRedrive or
// Client.Redrive, in turns), leaves held events (parked with held_by) to
// the framework, and retries failed outbox events once the small-limit
// window has closed. Violations it sees: a step event parked on a key that
// never had an outage, an outbox event marked failed although it fits the
// limit alone. Transactions that start on a replica whose Kafka is down
// must neither fail because of Kafka nor hang until their 20 s deadline.
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
	"syscall"
	"time"
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
	fs.DurationVar(&cfg.killEvery, "kill-every", 3*time.Second, "mean time between replica kills (0: none)")
	fs.DurationVar(&cfg.faultEvery, "fault-every", 500*time.Millisecond, "mean time between injected faults (0: none)")
	fs.DurationVar(&cfg.quiesce, "quiesce", 3*time.Minute, "how long to wait for every event to be handled after the load")
	fs.IntVar(&cfg.transient, "transient", 5, "percent of step events whose first handling attempt fails")
	fs.Float64Var(&cfg.poison, "poison", 0.01, "probability that a transaction also records a poison event")
	fs.Float64Var(&cfg.abort, "abort", 0.05, "probability that a transaction aborts on purpose")
	fs.DurationVar(&cfg.scenarioEvery, "scenario-every", 5*time.Second, "mean time between scenarios: slow handlers, downstream outages, small max.message.bytes windows, Kafka down at start, pause storms (0: none)")
	fs.IntVar(&cfg.stormMiB, "storm-mib", 10, "MiB of 200 KiB events per pause storm")
	fs.IntVar(&cfg.queueRecords, "queue-records", 64, "consumer queue bound per partition in records: fetching pauses at it, so a small bound makes pause storms (0: the framework's 5000)")
	fs.IntVar(&cfg.queueBytes, "queue-bytes", 1<<20, "consumer queue bound per partition in bytes (0: the framework's 8 MiB)")
	fs.DurationVar(&cfg.txnLifetime, "txn-lifetime", 3*time.Second, "the embedded MongoDB's transaction lifetime (slow handlers outlast it)")
	fs.Float64Var(&cfg.sameKey, "same-key", 0.5, "probability that a multi-event transaction records consecutive events of one key")
	fs.StringVar(&cfg.mongoURI, "mongo-uri", "", "real MongoDB replica set (default: embedded server)")
	fs.StringVar(&cfg.brokers, "kafka-brokers", "", "real Kafka brokers, comma-separated (default: embedded kfake)")
	skip := fs.String("skip", "", "comma-separated action kinds to leave out of the schedule (kill, join, kafka-produce-stall...)")
	verbose := fs.Bool("v", false, "progress lines and framework warnings on stderr")
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
	}
	cfg.skip = map[actionKind]bool{}
	for _, k := range splitList(*skip) {
		cfg.skip[actionKind(k)] = true
	}
	if *verbose {
		cfg.progress = stderr
		cfg.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	res, err := runHarness(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "outbox-chaos:", err)
		return 2
	}
	fmt.Fprintln(stdout, res.summary())
	fmt.Fprintln(stderr, "outbox-chaos: scenarios run:", res.scenarioLine())
	for _, f := range res.Failures {
		fmt.Fprintln(stderr, "FAIL:", f)
	}
	if len(res.Failures) > 0 {
		return 1
	}
	return 0
}

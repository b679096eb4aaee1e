// Command outbox-bench measures the outbox framework against baselines
// measured in the same run, on the embedded servers (mongofake and kfake)
// or on real MongoDB and Kafka.
//
// Usage:
//
//	go run ./cmd/outbox-bench [-duration 10s] [-event-size 1024] [-partitions 6]
//	    [-replicas 1] [-events 50000] [-backlog 200000] [-rate 1000]
//	    [-servers inproc|subprocess] [-mongo-uri URI -kafka-brokers HOST:PORT,...]
//	    [-kafka kfake,apache,brokers]
//	    [-latency-runs 3] [-keyconc-rate 200] [-takeover-kc 1,64]
//	    [-phases relay,floor,raw,naive,polling,latency,consume,bare,memory,compression,keyconc,takeover]
//	    [-codecs none,gzip,snappy] [-json]
//	    [-cpuprofile FILE]
//
// Phases:
//
//   - raw: the records of the relay phase produced straight to Kafka with
//     the publisher's producer settings (the relay's ceiling).
//   - relay: a backlog of -events committed outbox events, published by the
//     framework; from its first read to the last event marked published.
//   - floor: the relay's own MongoDB work on the same backlog (the same
//     reads and marks, batches of 500) with Kafka replaced by an immediate
//     acknowledgement: the relay's floor.
//   - naive: one transaction and one synchronous send per event, for
//     -duration.
//   - polling: poll every 100 ms, batches of 100, on a backlog of -events.
//   - latency: commit → handler start at -rate events/s for -duration,
//     through the framework's publisher and consumer, and through the
//     polling relay and the framework's consumer; -latency-runs times,
//     reporting each run's p99 ratio, their median and the worst.
//   - consume: -events records handled by a handler that does nothing.
//   - bare: one-document transactions for -duration from as many goroutines
//     as there are partitions (the consumer's ceiling).
//   - memory: peak memory while publishing a backlog of -backlog events.
//   - compression (not run by default): the relay once per producer codec
//     of -codecs, each on a topic of its own, with order-like JSON events:
//     events/s and bytes written to Kafka per event. The figures behind
//     the publisher's default codec.
//   - keyconc (not run by default): Config.KeyConcurrency 1 against 64 on
//     events of 1,000 keys. A handler that waits 20 ms (an external call)
//     and writes one document: events/s on a backlog of -events records
//     for -duration, MongoDB commands and transactions per event; and
//     commit → handled latency (the recording transaction's commit to the
//     handler's transaction's commit) at -keyconc-rate events/s through
//     the framework's publisher. Then the consume phase's trivial handler
//     at both settings. Ratios 64 / 1 of each.
//   - takeover (not run by default): a replica handling a backlog of
//     -events records (trivial handler) is killed (its connections cut:
//     its transactions stay open, its group membership times out) after a
//     quarter of them; a second replica of the group takes its partitions
//     over and is redelivered what the first handled after its last
//     offset commit. Rollbacks of the survivor per redelivered event, with
//     the consumer's duplicate look-up and without it (as before it
//     existed), at each KeyConcurrency of -takeover-kc.
//
// It prints a table (or JSON with -json) with every figure, the ratios,
// the targets and the CPU time of each phase.
//
// With -kafka the chosen phases run once per Kafka named, one after the
// other, each on a fresh embedded MongoDB (or -mongo-uri): kfake; apache,
// a real Apache Kafka broker (one KRaft node, internal/apachekafka) that
// the run starts before its phases and stops, its JVM killed and its data
// removed, before the next; brokers, the cluster of -kafka-brokers. The
// output is each run's table, then the headline figures side by side (with
// -json: {"runs": [...], "figures": [...]}). A mistake in the command line
// exits with status 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	outbox "github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/apachekafka"
)

func main() {
	for _, a := range os.Args[1:] {
		if a == "-serve" {
			if err := serve(); err != nil {
				fmt.Fprintln(os.Stderr, "outbox-bench -serve:", err)
				os.Exit(1)
			}
			return
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "outbox-bench:", err)
		os.Exit(exitCode(err))
	}
}

// usageError is a mistake in the command line: exit status 2, as the flag
// package's own errors.
type usageError struct{ error }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func (u usageError) Unwrap() error { return u.error }

// exitCode is the exit status of a failed run: 2 for a mistake in the
// command line, 1 for anything else.
func exitCode(err error) int {
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

const allPhases = "raw,relay,floor,naive,polling,latency,consume,bare,memory"

// optPhases are run only when -phases names them.
const optPhases = "compression,keyconc,takeover"

// results holds every measured figure; absent phases stay nil.
type results struct {
	Machine machine `json:"machine"`
	// Kafka names the backend of a run of -kafka (kfake, apache,
	// brokers); empty without -kafka.
	Kafka   string          `json:"kafka,omitempty"`
	Options map[string]any  `json:"options"`
	Raw     *rawResult      `json:"raw_produce,omitempty"`
	Relay   *relayResult    `json:"relay,omitempty"`
	Floor   *baselineResult `json:"floor_relay,omitempty"`
	Naive   *baselineResult `json:"naive_relay,omitempty"`
	Polling *baselineResult `json:"polling_relay,omitempty"`
	Latency *latencyResult  `json:"latency,omitempty"`
	PollLat *latencyResult  `json:"polling_latency,omitempty"`
	// LatencyRuns has one entry per run of the latency phase
	// (-latency-runs); Latency and PollLat are the run whose ratio is the
	// median.
	LatencyRuns []latencyRun        `json:"latency_runs,omitempty"`
	Consume     *consumeResult      `json:"consume,omitempty"`
	Bare        *baselineResult     `json:"bare_transactions,omitempty"`
	Memory      *memoryResult       `json:"memory,omitempty"`
	Compression []compressionResult `json:"compression,omitempty"`
	KeyConc     *keyconcResult      `json:"keyconc,omitempty"`
	Takeover    []takeoverRun       `json:"takeover,omitempty"`
	// CPU is the CPU time of each phase run (see phaseCPU).
	CPU     map[string]phaseCPU `json:"cpu,omitempty"`
	Targets []target            `json:"targets"`
}

type machine struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	MemoryMB  int    `json:"memory_mb,omitempty"`
}

// target is one goal of issue 7 with its measured value.
type target struct {
	Name     string  `json:"name"`
	Goal     string  `json:"goal"`
	Measured float64 `json:"measured"`
	Met      bool    `json:"met"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options_
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of the timed phases (latency, naive, bare)")
	fs.IntVar(&o.eventSize, "event-size", 1024, "JSON payload size of an event in bytes")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of every benchmark topic")
	fs.IntVar(&o.replicas, "replicas", 1, "framework replicas (clients sharing the groups) in the relay, latency and consume phases")
	fs.IntVar(&o.events, "events", 50000, "events of the backlog phases (raw, relay, polling, consume)")
	fs.IntVar(&o.backlog, "backlog", 200000, "events of the memory phase's backlog")
	fs.IntVar(&o.rate, "rate", 1000, "offered load of the latency phases, events/s")
	fs.IntVar(&o.latencyRuns, "latency-runs", 3, "runs of the latency phase (relay, then polling, each time); the table reports the median and the worst ratio")
	fs.IntVar(&o.kcRate, "keyconc-rate", 200, "keyconc phase: offered load of its latency runs, events/s")
	takeoverKC := fs.String("takeover-kc", "1,64", "takeover phase: the KeyConcurrency settings to measure, comma-separated")
	fs.DurationVar(&o.publishLinger, "publish-linger", 0, "Config.PublishLinger of the framework clients (least time between two change-stream reads)")
	fs.StringVar(&o.mongoURI, "mongo-uri", "", "MongoDB URI (a replica set); empty: the embedded server")
	fs.StringVar(&o.brokers, "kafka-brokers", "", "Kafka seed brokers, comma-separated; empty: kfake")
	kafka := fs.String("kafka", "", "run the phases once per Kafka named, comma-separated, and print their figures side by side: kfake, apache (a real Apache Kafka "+apachekafka.Version+" broker, one KRaft node, started and stopped by this run; needs Java), brokers (-kafka-brokers); empty: -kafka-brokers, else kfake")
	fs.StringVar(&o.servers, "servers", "inproc", "where the embedded servers run: inproc, or subprocess (this binary with -serve) so that memory figures hold the framework alone")
	phases := fs.String("phases", allPhases, "comma-separated phases to run (also "+optPhases+", which are not run by default)")
	codecs := fs.String("codecs", "none,gzip,snappy", "compression phase: producer codecs to measure (none, gzip, snappy, lz4, zstd)")
	fs.BoolVar(&o.jsonOut, "json", false, "print JSON instead of a table")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if o.servers != "inproc" && o.servers != "subprocess" {
		return usageErrorf("-servers must be inproc or subprocess, not %q", o.servers)
	}
	if o.partitions < 1 || o.replicas < 1 || o.events < 1 || o.backlog < 1 || o.rate < 1 || o.eventSize < 1 || o.latencyRuns < 1 || o.kcRate < 1 {
		return usageErrorf("-partitions, -replicas, -events, -backlog, -rate, -event-size, -latency-runs and -keyconc-rate must be positive")
	}
	if o.publishLinger < 0 {
		return usageErrorf("-publish-linger must not be negative")
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.Contains(","+allPhases+","+optPhases+",", ","+p+",") {
			return usageErrorf("unknown phase %q (phases: %s, %s)", p, allPhases, optPhases)
		}
		o.phases[p] = true
	}
	for _, v := range strings.Split(*takeoverKC, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		kc, err := strconv.Atoi(v)
		if err != nil || kc < 1 {
			return usageErrorf("-takeover-kc: %q is not a positive KeyConcurrency", v)
		}
		o.takeoverKC = append(o.takeoverKC, kc)
	}
	var codecList []string
	for _, c := range strings.Split(*codecs, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		if !slices.Contains(compressionCodecs, outbox.Compression(c)) {
			return usageErrorf("-codecs: unknown codec %q (none, gzip, snappy, lz4, zstd)", c)
		}
		codecList = append(codecList, c)
	}
	backends, err := parseBackends(*kafka, o.brokers)
	if err != nil {
		return usageError{err}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if len(backends) == 0 {
		r, err := runPhases(ctx, o, codecList, stderr)
		if err != nil {
			return err
		}
		return output(stdout, o.jsonOut, r)
	}
	var runs []*results
	for _, b := range backends {
		r, err := runBackend(ctx, o, b, codecList, stderr)
		if err != nil {
			return fmt.Errorf("kafka %s: %w", b, err)
		}
		runs = append(runs, r)
	}
	if len(runs) == 1 {
		return output(stdout, o.jsonOut, runs[0])
	}
	return outputCompared(stdout, o.jsonOut, runs)
}

// output prints one run's figures: JSON or a table.
func output(w io.Writer, jsonOut bool, r *results) error {
	if jsonOut {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printTable(w, r)
	return nil
}

// runPhases runs the chosen phases once on the servers o names and
// returns their figures.
func runPhases(ctx context.Context, o options_, codecList []string, stderr io.Writer) (*results, error) {
	e, err := newEnv(ctx, o)
	if err != nil {
		return nil, err
	}
	defer e.close()

	r := &results{
		Machine: machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, MemoryMB: memTotalMB()},
		Kafka:   o.kafkaName,
		CPU:     map[string]phaseCPU{},
		Options: map[string]any{"duration": o.duration.String(), "event_size": o.eventSize, "partitions": o.partitions,
			"replicas": o.replicas, "events": o.events, "backlog": o.backlog, "rate": o.rate, "servers": serversName(o),
			"publish_linger": o.publishLinger.String(), "latency_runs": o.latencyRuns, "keyconc_rate": o.kcRate, "takeover_kc": o.takeoverKC,
			"kafka_brokers": e.brokers},
	}
	progress := func(phase string) {
		if !o.jsonOut {
			if o.kafkaName != "" {
				phase = "[" + o.kafkaName + "] " + phase
			}
			fmt.Fprintf(stderr, "outbox-bench: %s...\n", phase)
		}
	}
	step := func(name string, fn func() error) error {
		if !o.phases[name] {
			return nil
		}
		progress(name)
		meter := cpuMeter{brokerPid: o.brokerPid}
		start := meter.read()
		// The goroutines the phase starts inherit the label: -cpuprofile
		// splits by phase (pprof -tagfocus phase=relay).
		var err error
		pprof.Do(ctx, pprof.Labels("phase", name), func(context.Context) { err = fn() })
		if err != nil {
			return fmt.Errorf("phase %s: %w", name, err)
		}
		r.CPU[name] = meter.since(start)
		e.release(name)
		return nil
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{"raw", func() error { v, err := runRaw(ctx, e, o.events); r.Raw = &v; return err }},
		{"relay", func() error {
			v, err := runRelay(ctx, e, o.events, topics.relay, "relay", func(i int) outbox.Event {
				return relayEvent{newPayload(i, o.eventSize)}
			}, nil)
			r.Relay = &v
			return err
		}},
		{"floor", func() error { v, err := runFloor(ctx, e, o.events); r.Floor = &v; return err }},
		{"naive", func() error { v, err := runNaive(ctx, e, o.events); r.Naive = &v; return err }},
		{"polling", func() error { v, err := runPolling(ctx, e, o.events); r.Polling = &v; return err }},
		{"latency", func() error {
			// The runs share the databases, topics and groups: each run's
			// clients join the groups the previous run's left, at its
			// committed offsets, and its probe counts only its own events.
			var ours, polling []latencyResult
			for i := range o.latencyRuns {
				if o.latencyRuns > 1 {
					progress(fmt.Sprintf("latency run %d of %d", i+1, o.latencyRuns))
				}
				v, err := runLatencyOurs(ctx, e)
				if err != nil {
					return err
				}
				w, err := runLatencyPolling(ctx, e)
				if err != nil {
					return err
				}
				ours, polling = append(ours, v), append(polling, w)
			}
			r.LatencyRuns = latencyRuns(ours, polling)
			m := medianRun(r.LatencyRuns)
			r.Latency, r.PollLat = &ours[m], &polling[m]
			return nil
		}},
		{"consume", func() error { v, err := runConsume(ctx, e, o.events); r.Consume = &v; return err }},
		{"bare", func() error { v, err := runBare(ctx, e); r.Bare = &v; return err }},
		{"memory", func() error { v, err := runMemory(ctx, e, o.backlog); r.Memory = &v; return err }},
		{"compression", func() error { v, err := runCompression(ctx, e, o.events, codecList); r.Compression = v; return err }},
		{"keyconc", func() error { v, err := runKeyConc(ctx, e, progress); r.KeyConc = &v; return err }},
		{"takeover", func() error { v, err := runTakeover(ctx, e, progress); r.Takeover = v; return err }},
	}
	for _, s := range steps {
		if err := step(s.name, s.fn); err != nil {
			return nil, err
		}
	}
	r.Targets = targets(r)
	return r, nil
}

// phaseOrder lists every phase in the order a run takes them.
func phaseOrder() []string {
	return strings.Split(allPhases+","+optPhases, ",")
}

func serversName(o options_) string {
	switch {
	case o.mongoURI != "" && o.brokers != "":
		return "real"
	case o.mongoURI != "" || o.brokers != "":
		return "mixed (" + o.servers + " for the missing one)"
	}
	return o.servers
}

func memTotalMB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int
	for _, line := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
			return kb / 1024
		}
	}
	return 0
}

// targets compares the figures with the goals of issue 7.
func targets(r *results) []target {
	var ts []target
	add := func(name, goal string, v float64, met bool) {
		ts = append(ts, target{Name: name, Goal: goal, Measured: v, Met: met})
	}
	if r.Relay != nil && r.Raw != nil && r.Raw.Rate > 0 {
		v := r.Relay.Rate / r.Raw.Rate
		add("relay / raw produce", ">= 0.7", v, v >= 0.7)
	}
	if r.Relay != nil && r.Naive != nil && r.Naive.Rate > 0 {
		v := r.Relay.Rate / r.Naive.Rate
		add("relay / naive relay", ">= 20", v, v >= 20)
	}
	if r.Relay != nil && r.Floor != nil && r.Floor.Rate > 0 {
		v := r.Relay.Rate / r.Floor.Rate
		add("relay / its MongoDB work alone (floor)", ">= 0.7", v, v >= 0.7)
	}
	if len(r.LatencyRuns) > 0 {
		// The worst run decides: a goal met only by the median is met
		// half of the time.
		v := worstRatio(r.LatencyRuns)
		name := "polling p99 / relay p99"
		if len(r.LatencyRuns) > 1 {
			name = fmt.Sprintf("polling p99 / relay p99, worst of %d runs", len(r.LatencyRuns))
		}
		add(name, ">= 10", v, v >= 10)
	}
	if r.Relay != nil {
		add("Mongo commands per published event (backlog)", "<= 0.05", r.Relay.MongoPerEvent, r.Relay.MongoPerEvent <= 0.05)
	}
	if r.Latency != nil {
		add(fmt.Sprintf("Mongo commands per published event (%d/s)", r.Latency.Offered), "<= 0.05", r.Latency.MongoPerEvent, r.Latency.MongoPerEvent <= 0.05)
	}
	if r.Consume != nil {
		// Rounded as printed: a run also sends a few commands of its own
		// (endSessions), which are not per event.
		add("Mongo commands per handled event", "<= 2", r.Consume.MongoPerEvent, math.Round(r.Consume.MongoPerEvent*1000)/1000 <= 2)
	}
	if r.Consume != nil && r.Bare != nil && r.Bare.Rate > 0 {
		v := r.Consume.Rate / r.Bare.Rate
		add("consumer / bare transactions", ">= 0.5", v, v >= 0.5)
	}
	if k := r.KeyConc; k != nil {
		add(fmt.Sprintf("%v handler: events/s at KeyConcurrency %d / at 1", kcWait, kcHigh), ">= 20", k.SlowRatio, k.SlowRatio >= 20)
		add(fmt.Sprintf("trivial handler: events/s at KeyConcurrency %d / at 1", kcHigh), ">= 0.8", k.TrivialRatio, k.TrivialRatio >= 0.8)
	}
	if r.Memory != nil {
		v := r.Memory.PeakGrowthMB
		name := "memory growth publishing the backlog, MB"
		if r.Memory.Servers != "inproc" {
			v = r.Memory.PeakHeapMB
			name = "peak heap publishing the backlog, MB"
		}
		add(name, "< 200", v, v < 200)
	}
	return ts
}

func printTable(w io.Writer, r *results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "machine\t%d CPUs, %d MB, %s, %s\n", r.Machine.CPUs, r.Machine.MemoryMB, r.Machine.GoVersion, r.Machine.OS)
	fmt.Fprintf(tw, "options\tevent %v B, %v partitions, %v replicas, servers %v", r.Options["event_size"], r.Options["partitions"], r.Options["replicas"], r.Options["servers"])
	if r.Kafka != "" {
		fmt.Fprintf(tw, ", kafka %s", r.Kafka)
	}
	fmt.Fprint(tw, "\n\n")
	fmt.Fprintln(tw, "measurement\tevents\tevents/s\tMongo cmds/event\tKafka reqs/event")
	row := func(name string, n int, rate, mongo, kafka float64) {
		f := func(v float64) string {
			if v < 0 {
				return "-"
			}
			return fmt.Sprintf("%.3f", v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\n", name, n, rate, f(mongo), f(kafka))
	}
	if r.Raw != nil {
		row("raw franz-go produce (ceiling)", r.Raw.Events, r.Raw.Rate, -1, r.Raw.KafkaPerEvent)
	}
	if r.Relay != nil {
		row("outbox relay (backlog)", r.Relay.Events, r.Relay.Rate, r.Relay.MongoPerEvent, r.Relay.KafkaPerEvent)
	}
	if r.Floor != nil {
		row("floor: the relay's MongoDB work, Kafka acks at once", r.Floor.Events, r.Floor.Rate, r.Floor.MongoPerEvent, -1)
	}
	if r.Naive != nil {
		row("naive relay (txn + sync send per event)", r.Naive.Events, r.Naive.Rate, r.Naive.MongoPerEvent, -1)
	}
	if r.Polling != nil {
		row("polling relay (100 ms, batch 100)", r.Polling.Events, r.Polling.Rate, r.Polling.MongoPerEvent, -1)
	}
	if r.Consume != nil {
		row("outbox consumer (trivial handler)", r.Consume.Events, r.Consume.Rate, r.Consume.MongoPerEvent, r.Consume.KafkaPerEvent)
	}
	if r.Bare != nil {
		row("bare one-document transactions (ceiling)", r.Bare.Events, r.Bare.Rate, r.Bare.MongoPerEvent, -1)
	}
	if r.Latency != nil || r.PollLat != nil {
		fmt.Fprintln(tw, "\nlatency commit → handler start\tevents\tp50 ms\tp95 ms\tp99 ms\tmax ms\trelay Mongo cmds/event")
		lat := func(name string, l *latencyResult) {
			fmt.Fprintf(tw, "%s at %d/s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.3f\n", name, l.Offered, l.Events, l.P50ms, l.P95ms, l.P99ms, l.Maxms, l.MongoPerEvent)
			b := l.Breakdown
			fmt.Fprintf(tw, "  p50/p99: commit→produce %.1f/%.1f, produce→fetch %.1f/%.1f, fetch→handler %.1f/%.1f ms\n",
				b["commit_to_produce_p50_ms"], b["commit_to_produce_p99_ms"], b["produce_to_fetch_p50_ms"], b["produce_to_fetch_p99_ms"],
				b["fetch_to_handler_p50_ms"], b["fetch_to_handler_p99_ms"])
		}
		if r.Latency != nil {
			lat("outbox relay", r.Latency)
		}
		if r.PollLat != nil {
			lat("polling relay", r.PollLat)
		}
	}
	if len(r.LatencyRuns) > 1 {
		fmt.Fprintf(tw, "\nlatency runs (above: the median run)\trelay p50 ms\trelay p99 ms\tpolling p99 ms\tpolling p99 / relay p99\n")
		for i, l := range r.LatencyRuns {
			fmt.Fprintf(tw, "run %d\t%.1f\t%.1f\t%.1f\t%.1f\n", i+1, l.RelayP50ms, l.RelayP99ms, l.PollingP99ms, l.Ratio)
		}
		fmt.Fprintf(tw, "ratio median / worst\t\t\t\t%.1f / %.1f\n", r.LatencyRuns[medianRun(r.LatencyRuns)].Ratio, worstRatio(r.LatencyRuns))
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(tw, "\nmemory, backlog of %d events (servers %s)\tbaseline heap %.0f MB\tpeak heap %.0f MB\tgrowth %.0f MB", m.Events, m.Servers, m.BaselineHeapMB, m.PeakHeapMB, m.PeakGrowthMB)
		if m.PeakRSSMB > 0 {
			fmt.Fprintf(tw, "\tpeak RSS %.0f MB", m.PeakRSSMB)
		}
		fmt.Fprintf(tw, "\t%.0f events/s\n", m.Rate)
	}
	if len(r.Compression) > 0 {
		fmt.Fprintln(tw, "\nrelay by producer codec\tevents\tevents/s\tbytes written/event\tKafka reqs/event")
		for _, c := range r.Compression {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.3f\n", c.Codec, c.Events, c.Rate, c.BytesPerEvent, c.KafkaPerEvent)
		}
	}
	if k := r.KeyConc; k != nil {
		fmt.Fprintf(tw, "\n%v handler + one insert, %d keys\tevents\tevents/s\tMongo cmds/event\ttxns/event\tp50 ms at %d/s\tp99 ms\tmax ms\n",
			kcWait, k.Keys, e0(k.Slow).Offered)
		for _, s := range k.Slow {
			fmt.Fprintf(tw, "KeyConcurrency %d\t%d\t%.0f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\n", s.KeyConcurrency, s.Events, s.Rate, s.MongoPerEvent, s.TxnsPerEvent, s.P50ms, s.P99ms, s.Maxms)
		}
		fmt.Fprintf(tw, "ratio %d / 1\t\t%.1f\n", kcHigh, k.SlowRatio)
		fmt.Fprintln(tw, "\ntrivial handler (consume phase)\tevents\tevents/s\tMongo cmds/event")
		for _, t := range k.Trivial {
			fmt.Fprintf(tw, "KeyConcurrency %d\t%d\t%.0f\t%.3f\n", t.KeyConcurrency, t.Events, t.Rate, t.MongoPerEvent)
		}
		fmt.Fprintf(tw, "ratio %d / 1\t\t%.2f\n", kcHigh, k.TrivialRatio)
	}
	if len(r.Takeover) > 0 {
		fmt.Fprintln(tw, "\ntakeover after a kill\thandled by killed\tredelivered\tskipped dup\trollbacks\tdup rollbacks\tlocked\tdup rollbacks/redelivered\tsurvivor start s\ttakeover s\tsettle s")
		for _, t := range r.Takeover {
			look := "look-up on"
			if !t.Lookup {
				look = "look-up off (before)"
			}
			fmt.Fprintf(tw, "KeyConcurrency %d, %s\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.1f\t%.1f\t%.1f\n", t.KeyConcurrency, look, t.HandledByDead, t.Redelivered,
				t.SkippedDuplicates, t.Rollbacks, t.DuplicateRollbacks, t.LockedRollbacks, t.PerRedelivered, t.SurvivorStartSeconds, t.TakeoverSeconds, t.SettleSeconds)
		}
	}
	if len(r.CPU) > 0 {
		fmt.Fprintln(tw, "\nCPU time by phase\tthis process s\tbroker JVM s")
		for _, p := range phaseOrder() {
			c, ok := r.CPU[p]
			if !ok {
				continue
			}
			broker := "-"
			if c.BrokerSeconds != nil {
				broker = fmt.Sprintf("%.1f", *c.BrokerSeconds)
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%s\n", p, c.ProcessSeconds, broker)
		}
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(tw, "\ntarget\tgoal\tmeasured\tmet")
		for _, t := range r.Targets {
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%v\n", t.Name, t.Goal, t.Measured, t.Met)
		}
	}
	tw.Flush()
}

// e0 returns the first run, or a zero one.
func e0(runs []keyconcRun) keyconcRun {
	if len(runs) == 0 {
		return keyconcRun{}
	}
	return runs[0]
}

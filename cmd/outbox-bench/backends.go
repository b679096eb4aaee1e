package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// The Kafka backends of -kafka: the phases run once per backend, each on
// a fresh embedded MongoDB (or -mongo-uri) and its own topics, one backend
// after the other, so that no backend's servers take CPU from another's
// run.
const (
	backendKfake   = "kfake"
	backendApache  = "apache"
	backendBrokers = "brokers"
)

// apacheStartTimeout bounds the start of the real broker (a JVM on a
// loaded machine; the jars are resolved with Maven the first time).
const apacheStartTimeout = 10 * time.Minute

// parseBackends reads -kafka: the backends in the order given, none when
// it is empty (the single run of -kafka-brokers, else kfake).
func parseBackends(list, brokers string) ([]string, error) {
	var out []string
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
		switch b {
		case backendKfake, backendApache, backendBrokers:
		default:
			return nil, fmt.Errorf("-kafka: unknown Kafka %q (kfake, apache, brokers)", b)
		}
		if slices.Contains(out, b) {
			return nil, fmt.Errorf("-kafka: %q named twice", b)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, nil
	}
	has := slices.Contains(out, backendBrokers)
	if has && brokers == "" {
		return nil, errors.New("-kafka: brokers needs -kafka-brokers")
	}
	if !has && brokers != "" {
		// A flag that would be silently ignored is a mistake.
		return nil, errors.New("-kafka-brokers is set but -kafka does not name brokers")
	}
	return out, nil
}

// runBackend runs the phases on one backend of -kafka. For apache it
// starts a one-node KRaft broker (the settings of apachekafka.BrokerProps)
// and stops it, its JVM killed and its data removed, before it returns.
func runBackend(ctx context.Context, o options_, backend string, codecList []string, stderr io.Writer) (r *results, err error) {
	// Every goroutine of this backend's run (its servers in this process
	// too) carries the label: -cpuprofile splits by backend (pprof
	// -tagfocus kafka=apache).
	pprof.Do(ctx, pprof.Labels("kafka", backend), func(ctx context.Context) {
		r, err = runBackendLabelled(ctx, o, backend, codecList, stderr)
	})
	return r, err
}

func runBackendLabelled(ctx context.Context, o options_, backend string, codecList []string, stderr io.Writer) (*results, error) {
	o.kafkaName = backend
	switch backend {
	case backendKfake:
		o.brokers = ""
	case backendApache:
		progress := stderr
		if o.jsonOut {
			progress = io.Discard
		}
		fmt.Fprintf(progress, "outbox-bench: [apache] starting Apache Kafka %s...\n", apachekafka.Version)
		sctx, cancel := context.WithTimeout(ctx, apacheStartTimeout)
		c, err := apachekafka.Start(sctx, apachekafka.Options{Nodes: 1, Progress: progress})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start Apache Kafka: %w", err)
		}
		defer func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintln(stderr, "outbox-bench: stop Apache Kafka:", err)
			}
		}()
		o.brokers = strings.Join(c.Brokers(), ",")
		o.brokerPid = c.Node(0).Pid()
	}
	return runPhases(ctx, o, codecList, stderr)
}

// comparison is the -json output of several backends: each run's figures
// and the headline figures side by side.
type comparison struct {
	Runs []*results `json:"runs"`
	// Figures has one entry per headline figure; Values maps each
	// backend to its value (absent when its run has no such figure).
	Figures []comparedFigure `json:"figures"`
}

// comparedFigure is one headline figure of every backend.
type comparedFigure struct {
	Name   string             `json:"name"`
	Unit   string             `json:"unit"`
	Values map[string]float64 `json:"values"`
}

// compare picks the headline figures of each run: the relay's and the
// consumer's throughput, the framework's commit → handler latency (the
// median latency run) and its parts, the raw produce ceiling, and the
// takeover times; then each phase's CPU time.
func compare(runs []*results) []comparedFigure {
	var figs []comparedFigure
	add := func(name, unit string, get func(r *results) (float64, bool)) {
		f := comparedFigure{Name: name, Unit: unit, Values: map[string]float64{}}
		for _, r := range runs {
			if v, ok := get(r); ok {
				f.Values[r.Kafka] = v
			}
		}
		if len(f.Values) > 0 {
			figs = append(figs, f)
		}
	}
	add("raw franz-go produce (ceiling)", "events/s", func(r *results) (float64, bool) {
		if r.Raw == nil {
			return 0, false
		}
		return r.Raw.Rate, true
	})
	add("outbox relay (backlog)", "events/s", func(r *results) (float64, bool) {
		if r.Relay == nil {
			return 0, false
		}
		return r.Relay.Rate, true
	})
	add("outbox relay Kafka requests/event", "", func(r *results) (float64, bool) {
		if r.Relay == nil {
			return 0, false
		}
		return r.Relay.KafkaPerEvent, true
	})
	for _, q := range []struct{ name, key string }{
		{"p50", ""}, {"p99", ""},
		{"commit → produce p50", "commit_to_produce_p50_ms"}, {"commit → produce p99", "commit_to_produce_p99_ms"},
		{"produce → fetch p50", "produce_to_fetch_p50_ms"}, {"produce → fetch p99", "produce_to_fetch_p99_ms"},
		{"fetch → handler p50", "fetch_to_handler_p50_ms"}, {"fetch → handler p99", "fetch_to_handler_p99_ms"},
	} {
		add("latency commit → handler start, "+q.name, "ms", func(r *results) (float64, bool) {
			l := r.Latency
			if l == nil {
				return 0, false
			}
			switch q.name {
			case "p50":
				return l.P50ms, true
			case "p99":
				return l.P99ms, true
			}
			v, ok := l.Breakdown[q.key]
			return v, ok
		})
	}
	add("polling relay latency p99", "ms", func(r *results) (float64, bool) {
		if r.PollLat == nil {
			return 0, false
		}
		return r.PollLat.P99ms, true
	})
	add("outbox consumer (trivial handler)", "events/s", func(r *results) (float64, bool) {
		if r.Consume == nil {
			return 0, false
		}
		return r.Consume.Rate, true
	})
	// Every run measures the same takeover settings (-takeover-kc, look-up
	// on and off), in the same order.
	if len(runs) > 0 {
		for i, t := range runs[0].Takeover {
			look := "look-up on"
			if !t.Lookup {
				look = "look-up off"
			}
			for _, m := range []struct {
				what string
				get  func(takeoverRun) float64
			}{
				{"kill → survivor started", func(t takeoverRun) float64 { return t.SurvivorStartSeconds }},
				{"kill → first handler start", func(t takeoverRun) float64 { return t.TakeoverSeconds }},
				{"kill → every event handled", func(t takeoverRun) float64 { return t.SettleSeconds }},
			} {
				add(fmt.Sprintf("takeover, KeyConcurrency %d, %s: %s", t.KeyConcurrency, look, m.what), "s", func(r *results) (float64, bool) {
					if i >= len(r.Takeover) {
						return 0, false
					}
					return m.get(r.Takeover[i]), true
				})
			}
		}
	}
	for _, p := range phaseOrder() {
		add("CPU, phase "+p+": this process", "s", func(r *results) (float64, bool) {
			c, ok := r.CPU[p]
			return c.ProcessSeconds, ok
		})
		add("CPU, phase "+p+": broker JVM", "s", func(r *results) (float64, bool) {
			c, ok := r.CPU[p]
			if !ok || c.BrokerSeconds == nil {
				return 0, false
			}
			return *c.BrokerSeconds, true
		})
	}
	return figs
}

// outputCompared prints several backends' runs: with -json one document
// (comparison); else each run's table, then the headline figures side by
// side.
func outputCompared(w io.Writer, jsonOut bool, runs []*results) error {
	figs := compare(runs)
	if jsonOut {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(comparison{Runs: runs, Figures: figs})
	}
	for _, r := range runs {
		fmt.Fprintf(w, "=== Kafka: %s ===\n", r.Kafka)
		printTable(w, r)
		fmt.Fprintln(w)
	}
	printCompared(w, runs, figs)
	return nil
}

// printCompared prints the headline figures, one column per backend.
func printCompared(w io.Writer, runs []*results, figs []comparedFigure) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "=== side by side ===\nfigure\tunit")
	for _, r := range runs {
		fmt.Fprintf(tw, "\t%s", r.Kafka)
	}
	fmt.Fprintln(tw)
	for _, f := range figs {
		fmt.Fprintf(tw, "%s\t%s", f.Name, f.Unit)
		for _, r := range runs {
			v, ok := f.Values[r.Kafka]
			switch {
			case !ok:
				fmt.Fprint(tw, "\t-")
			case f.Unit == "events/s":
				fmt.Fprintf(tw, "\t%.0f", v)
			case f.Unit == "":
				fmt.Fprintf(tw, "\t%.3f", v)
			default:
				fmt.Fprintf(tw, "\t%.1f", v)
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

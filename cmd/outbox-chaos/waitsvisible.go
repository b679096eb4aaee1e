package main

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Waits visible (issue 31 item 2): a worker that waits on anything for
// longer than a few seconds shows it in Status.Waiting. With -slow-for of
// slowVisibleFor or more, the slow-handler fault's runs last long enough,
// inside their unit's transaction: while one runs, past the framework's
// visibility delay, the replica running it must list a "running" wait on
// its partition. (Not by default: runs that long make a revoke wait for
// them past the harness's short rebalance timeout on the embedded Kafka,
// and one short run in seven so configured left a partition behind; see
// the closing note of the stop that added it.) A
// poller reads each live replica's Status a few times a second; the check
// judges each slow run against the polls of its replica in its window.

// waitVisibleAfter is the framework's delay before a wait shows
// (consumer.go, waitVisible), and slowVisibleFor how long a slow run must
// last to show for a few seconds before it ends.
const (
	waitVisibleAfter = 3 * time.Second
	slowVisibleFor   = 6 * time.Second
)

// pollEvery spaces the Status polls of each replica.
const pollEvery = 250 * time.Millisecond

// slowRun is one run of a slow handler.
type slowRun struct {
	ID, Key, Replica string
	Start, End       time.Time
}

// statusSample is one Status poll of a replica: the partitions it listed
// a "running" wait on.
type statusSample struct {
	At      time.Time
	Running map[topicPartition]bool
}

// statusPoller keeps the samples of each replica.
type statusPoller struct {
	mu      sync.Mutex
	samples map[string][]statusSample
	// slowest is the longest Status call: Status must answer at once.
	slowest time.Duration
}

// pollStatus polls every live replica's Status until ctx ends. Owned by
// runHarness, which cancels ctx before the final check and waits for it.
func (h *harness) pollStatus(ctx context.Context, p *statusPoller) {
	// The runtime part only: the collections' counts would cost an
	// aggregation per replica and poll, and Status returns the runtime
	// part when they cannot be read.
	noCounts, cancel := context.WithCancel(context.Background())
	cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		live := make([]*replica, 0, len(h.slots))
		for _, r := range h.slots {
			live = append(live, r)
		}
		h.mu.Unlock()
		for _, r := range live {
			began := time.Now()
			st, _ := r.client.Status(noCounts)
			s := statusSample{At: time.Now(), Running: map[topicPartition]bool{}}
			took := s.At.Sub(began)
			for _, w := range st.Waiting {
				if w.What == "running" {
					s.Running[topicPartition{w.Topic, w.Partition}] = true
				}
			}
			p.mu.Lock()
			if p.samples == nil {
				p.samples = map[string][]statusSample{}
			}
			p.samples[r.name] = append(p.samples[r.name], s)
			p.slowest = max(p.slowest, took)
			p.mu.Unlock()
		}
	}
}

// visibleVerdict counts the slow runs judged.
type visibleVerdict struct {
	// Undecided counts runs without a poll of their replica in their
	// window, Unknown those whose event's partition is unknown.
	Seen, Undecided, Unknown int
}

// judgeWaitsVisible fails (wait-invisible) on a slow run that lasted past
// the visibility delay by 1.5 s or more while no poll of its replica in
// that part of the run listed a "running" wait on its partition; a run
// without a poll of its replica then (a loaded machine, a replica killed
// meanwhile) is undecided, and a shorter run (cut by a kill or a revoke)
// is not judged.
//
// tp is the partition the run's event was delivered on (false when
// unknown: undecided).
func judgeWaitsVisible(runs []slowRun, samples map[string][]statusSample, tp func(slowRun) (topicPartition, bool), v *verdict) visibleVerdict {
	var out visibleVerdict
	sorted := append([]slowRun(nil), runs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Start.Before(sorted[j].Start) })
	for _, r := range sorted {
		// The unit began before the handler's sleep; the end keeps a margin
		// for a run cut by a revoke or a kill.
		from, to := r.Start.Add(waitVisibleAfter+500*time.Millisecond), r.End.Add(-500*time.Millisecond)
		if to.Sub(from) < 500*time.Millisecond {
			continue
		}
		p, ok := tp(r)
		if !ok {
			out.Unknown++
			continue
		}
		polled, seen := 0, false
		for _, s := range samples[r.Replica] {
			if s.At.Before(from) || s.At.After(to) {
				continue
			}
			polled++
			seen = seen || s.Running[p]
		}
		switch {
		case seen:
			out.Seen++
		case polled == 0:
			out.Undecided++
		default:
			v.fail("wait-invisible", "a run of key %s on %s lasted %s (from %s), and %d polls of its Status after %s showed no wait on %s/%d",
				r.Key, r.Replica, r.End.Sub(r.Start).Round(time.Millisecond), r.Start.Format(tsFormat), polled, waitVisibleAfter,
				p.Topic, p.Partition)
		}
	}
	return out
}

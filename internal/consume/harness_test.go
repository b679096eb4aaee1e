package consume

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
)

// testPolicy is the retry policy of the fake's events: short backoffs, so
// that retries take milliseconds.
var testPolicy = Policy{MaxAttempts: 3, Backoff: retry.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}, MaxSnoozes: 2}

// testConfig is a worker configuration on the fakes: HoldKey, short
// backoffs and rechecks, a drain bound no test reaches unless it means to,
// and waits shown only when a test asks.
func testConfig(f *fakeHost, obs *recObserver, p *fakePauser, slots int) *Config {
	return &Config{Host: f, Observer: obs, Pauser: p, Log: slog.New(slog.DiscardHandler),
		Slots: slots, BatchSize: 8, Hold: true, QueueRecords: 1000, QueueBytes: 1 << 20,
		Backoff: retry.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond},
		Recheck: 5 * time.Millisecond, DrainTimeout: time.Minute, WaitVisible: time.Hour}
}

// harness is one Worker on the fakes, fed by the test as the poll loop
// would feed it.
type harness struct {
	t    *testing.T
	f    *fakeHost
	obs  *recObserver
	p    *fakePauser
	cfg  *Config
	tp   TopicPartition
	w    *Worker
	next int64 // offset of the next record
}

// ev is a record to enqueue: its partition key and its script.
type ev struct{ key, script string }

// newHarness starts a worker with slots units at once; mod adjusts the
// configuration first. The worker is stopped at the end of the test, and
// the test fails if the fake met a violation.
func newHarness(t *testing.T, slots int, mod func(*Config)) *harness {
	t.Helper()
	return newHarnessWith(t, slots, mod, nil)
}

// newHarnessWith is newHarness; before, when set, runs before the worker
// starts (to seed the inbox as an earlier owner left it).
func newHarnessWith(t *testing.T, slots int, mod func(*Config), before func(*harness)) *harness {
	t.Helper()
	obs := newRecObserver()
	f := newFakeHost(obs, testPolicy)
	p := newFakePauser()
	cfg := testConfig(f, obs, p, slots)
	if mod != nil {
		mod(cfg)
	}
	h := &harness{t: t, f: f, obs: obs, p: p, cfg: cfg, tp: TopicPartition{"orders", 0}}
	if before != nil {
		before(h)
	}
	work, cancel := context.WithCancel(context.Background())
	h.w = NewWorker(h.tp, cfg, work)
	h.w.Start()
	t.Cleanup(func() {
		h.w.Stop()
		cancel()
		if v := f.Violations(); len(v) > 0 {
			t.Errorf("violations:\n%s", strings.Join(v, "\n"))
			if k := violationKey(v[0]); k != "" {
				t.Logf("trace of key %s:\n%s", k, strings.Join(f.traceOf(k), "\n"))
			}
		}
	})
	return h
}

// id is the inbox id of the record at offset.
func (h *harness) id(offset int64) string { return fmt.Sprintf("%s@%d", h.tp, offset) }

// records builds the next records, without enqueuing them.
func (h *harness) records(evs ...ev) ([]*kgo.Record, []string) {
	recs := make([]*kgo.Record, len(evs))
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = h.id(h.next)
		recs[i] = fakeRecord(h.tp, h.next, e.key, ids[i], e.script)
		h.next++
	}
	return recs, ids
}

// enqueue hands the next records to the worker in one call and returns
// their ids.
func (h *harness) enqueue(evs ...ev) []string {
	recs, ids := h.records(evs...)
	h.w.Enqueue(recs)
	return ids
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitExplained(t, what, cond, nil)
}

// waitExplained is waitFor; on a timeout, the failure says what explain
// returns.
func waitExplained(t *testing.T, what string, cond func() bool, explain func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !cond(); i++ {
		if i < 100 {
			runtime.Gosched() // most waits are short: a few turns of other goroutines
			continue
		}
		if time.Now().After(deadline) {
			msg := ""
			if explain != nil {
				msg = "\n" + explain()
			}
			t.Fatalf("timed out waiting for %s%s", what, msg)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// quiet reports whether every record enqueued is settled, nothing runs
// and the end offset is committed.
func (h *harness) quiet() bool {
	st := h.w.Stats()
	return st.Unsettled == 0 && st.InFlight == 0 && st.LowestUnsettled == h.next &&
		st.Committed == h.next && h.f.lastCommit(h.tp) == h.next
}

func (h *harness) waitQuiet() {
	h.t.Helper()
	waitFor(h.t, "every record settled and committed", h.quiet)
}

// handled reports whether the event id was handled.
func (h *harness) handled(id string) bool { return h.f.get(id).handled }

func TestHarnessSmoke(t *testing.T) {
	h := newHarness(t, 1, nil)
	ids := h.enqueue(ev{"a", "ok"}, ev{"b", "ok"}, ev{"a", "ok"})
	h.waitQuiet()
	require.Equal(t, ids, h.f.handledIDs())
}

// violationKey returns the "[key]" a violation is about, or "".
func violationKey(v string) string {
	_, rest, ok := strings.Cut(v, "of key \"")
	if !ok {
		return ""
	}
	k, _, _ := strings.Cut(rest, "\"")
	return "[" + k + "]"
}

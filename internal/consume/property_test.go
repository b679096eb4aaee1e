package consume

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// seeds is how many random partitions the property test runs per
// KeyConcurrency: go test -run Property ./internal/consume -args -seeds=200
// looks harder.
var seeds = flag.Int("seeds", 3, "random partitions per KeyConcurrency in TestWorkerPropertyRandomPartition")

// A random partition: keys, key-less events, and handlers that succeed,
// fail for a while or for good, ask to park or to snooze, meet write
// conflicts, locks and MongoDB failures; events handled by an earlier
// owner, attempts counted by one, events without a handler until it is
// deployed mid-run (their keys are released then). Fed in random chunks
// that respect the worker's pause, it must end with every event handled
// exactly once in its key's order, or parked (the first event of a key
// that cannot be handled) with the key's later events held behind it; no
// two units on a key at once; and no commit past an unsettled event, the
// last commit at the end of the partition. Then an operator re-drives the
// parked heads while more records arrive, until every event is handled.
//
// The seed fixes the partition and the scripts; the interleaving of the
// units is the scheduler's, so each run also tries a new one.
func TestWorkerPropertyRandomPartition(t *testing.T) {
	for _, slots := range []int{1, 4, 64} {
		for seed := range uint64(*seeds) {
			t.Run(fmt.Sprintf("slots=%d/seed=%d", slots, seed+1), func(t *testing.T) {
				t.Parallel()
				runRandomPartition(t, slots, seed+1)
			})
		}
	}
}

// expectation is what becomes of an event in the end.
type expectation uint8

const (
	expectHandled expectation = iota // handled by this worker
	expectDup                        // handled by an earlier owner, never run here
	expectParked                     // parked for good, heading its key
	expectHeld                       // held behind its key's parked event
)

func runRandomPartition(t *testing.T, slots int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(slots)))
	h := newHarness(t, slots, func(c *Config) { c.QueueRecords = 48 })
	const n = 240
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	evs := make([]ev, n)
	want := make([]expectation, n)
	blocked := map[string]bool{}
	dupPrefix := map[string]bool{} // keys still in their prefix of duplicates
	for _, k := range keys {
		dupPrefix[k] = rng.IntN(2) == 0
	}
	for i := range evs {
		key := ""
		if rng.IntN(10) > 0 {
			key = keys[rng.IntN(len(keys))]
		}
		if key != "" && dupPrefix[key] && i < n/4 && rng.IntN(3) > 0 {
			h.f.seedHandled(h.tp, h.id(int64(i)), key, int64(i))
			evs[i], want[i] = ev{key, "ok"}, expectDup
			continue
		}
		dupPrefix[key] = false
		script, parks := randomScript(rng, key != "")
		if !strings.HasPrefix(script, "fail") && rng.IntN(15) == 0 {
			// An earlier owner ran it (MaxAttempts-1 at most: the attempt
			// counted before the first run here does not exhaust it). Not
			// for failing handlers: a run here knows of the earlier
			// attempts only when it was counted first (a suspect unit) or
			// once its failure is stored, so how many more runs fail
			// before it parks depends on the units it fell into.
			h.f.seedAttempts(h.tp, h.id(int64(i)), key, int64(i), 1+rng.IntN(testPolicy.MaxAttempts-1), 0)
		}
		evs[i] = ev{key, script}
		switch {
		case key != "" && blocked[key]:
			want[i] = expectHeld
		case parks:
			want[i] = expectParked
			if key != "" {
				blocked[key] = true
			}
		default:
			want[i] = expectHandled
		}
	}

	deployAt := n/2 + rng.IntN(n/2)
	for i := 0; i < n; {
		waitFor(t, "the partition resumed", func() bool { return !h.p.isPaused(h.tp) })
		m := min(1+rng.IntN(12), n-i)
		if deployAt >= i && deployAt < i+m {
			h.f.deploy()
		}
		h.enqueue(evs[i : i+m]...)
		i += m
	}

	ids := make([]string, n)
	for i := range ids {
		ids[i] = h.id(int64(i))
	}
	mismatch := func() []string {
		var out []string
		for i, w := range want {
			id := ids[i]
			d := h.f.get(id)
			var ok bool
			switch w {
			case expectHandled, expectDup:
				ok = d.handled
			case expectParked:
				ok = d.parked && d.heldBy == ""
			case expectHeld:
				ok = d.parked && d.heldBy != ""
			}
			if !ok {
				out = append(out, fmt.Sprintf("%s key %q script %s: want %d, have %+v", id, evs[i].key, evs[i].script, w, d))
			}
		}
		return out
	}
	waitExplained(t, "the expected end state", func() bool { return h.quiet() && len(mismatch()) == 0 }, func() string {
		return fmt.Sprintf("stats %+v, commits %v, violations %v\n%s", h.w.Stats(), h.f.committed(h.tp), h.f.Violations(), strings.Join(mismatch(), "\n"))
	})
	require.Empty(t, h.f.Violations())

	// Each event handled once at most, each key's in offset order; the
	// earlier owner's never run here.
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, r := range h.f.orderLog() {
		require.False(t, seen[r.ID], "%s handled twice", r.ID)
		seen[r.ID] = true
		if r.Key != "" {
			if prev, ok := last[r.Key]; ok {
				require.Greater(t, r.Offset, prev, "key %q out of order", r.Key)
			}
			last[r.Key] = r.Offset
		}
	}
	for i, w := range want {
		id := h.id(int64(i))
		if w == expectDup {
			require.False(t, seen[id], "%s handled again", id)
			require.Empty(t, h.f.attemptsSeen(id), "%s run again", id)
		}
		if w == expectHandled {
			require.True(t, seen[id], "%s", id)
		}
		if w == expectHeld {
			require.Empty(t, h.f.attemptsSeen(id), "%s run while held", id)
		}
		// A handler sees its attempt numbers never go back.
		att := h.f.attemptsSeen(id)
		require.True(t, slices.IsSorted(att), "%s attempts %v", id, att)
	}
	cs := h.f.committed(h.tp)
	require.True(t, slices.IsSorted(cs), "commits %v", cs)
	require.Equal(t, int64(n), cs[len(cs)-1])

	// Then an operator re-drives each parked head, again and again, while
	// more records arrive: each re-drive makes the key's held events
	// releasable, which the worker finds and releases in order (a
	// released event that fails is retried, then parked as the new head),
	// racing with the deliveries of the same keys, which join the held
	// sequences. In the end every event is handled, once, in its key's
	// order.
	tail := make([]ev, n/2)
	for i := range tail {
		key := ""
		if rng.IntN(10) > 0 {
			key = keys[rng.IntN(len(keys))]
		}
		script, _ := randomScript(rng, key != "")
		tail[i] = ev{key, script}
	}
	fed := 0
	waitExplained(t, "every event handled", func() bool {
		h.f.redriveStuck()
		if fed < len(tail) && !h.p.isPaused(h.tp) {
			m := min(1+rng.IntN(8), len(tail)-fed)
			h.enqueue(tail[fed : fed+m]...)
			fed += m
		}
		return fed == len(tail) && h.f.parkedCount() == 0 && h.quiet()
	}, func() string {
		return fmt.Sprintf("fed %d/%d, parked %d, stats %+v, violations %v", fed, len(tail), h.f.parkedCount(), h.w.Stats(), h.f.Violations())
	})
	require.Empty(t, h.f.Violations())
	handledOnce := map[string]int{}
	last = map[string]int64{}
	for _, r := range h.f.orderLog() {
		handledOnce[r.ID]++
		if r.Key != "" {
			if prev, ok := last[r.Key]; ok {
				require.Greater(t, r.Offset, prev, "key %q out of order", r.Key)
			}
			last[r.Key] = r.Offset
		}
	}
	for off := range h.next {
		id := h.id(off)
		if off < n && want[off] == expectDup {
			require.Zero(t, handledOnce[id], "%s handled again", id)
			continue
		}
		require.Equal(t, 1, handledOnce[id], "%s", id)
	}

	// The run went through the paths it is meant to: parks, holds,
	// releases, retries of each kind, pauses.
	h.obs.mu.Lock()
	reasons := map[string]int{}
	for _, r := range h.obs.retries {
		reasons[r.Reason]++
	}
	hows := map[string]int{}
	for _, r := range h.obs.settled {
		hows[r.How]++
	}
	released := len(h.obs.released)
	h.obs.mu.Unlock()
	pauses, _ := h.p.calls()
	t.Logf("released %d, retries %v, settled %v, pauses %d", released, reasons, hows, pauses)
	require.Positive(t, released)
	require.Positive(t, hows[SettledHeld])
	require.Positive(t, hows[SettledParked])
	require.Positive(t, reasons["error"])
	require.Positive(t, reasons["locked"]+reasons["infra"])
	require.Positive(t, pauses)
}

// randomScript draws an event's script, and whether it ends parked.
func randomScript(rng *rand.Rand, keyed bool) (string, bool) {
	switch r := rng.IntN(100); {
	case r < 56:
		return "ok", false
	case r < 66:
		return fmt.Sprintf("failto:%d", 1+rng.IntN(testPolicy.MaxAttempts-1)), false
	case r < 67:
		return "failto:99", true
	case r < 68:
		return "park", true
	case r < 73:
		return fmt.Sprintf("snooze:%d", 1+rng.IntN(testPolicy.MaxSnoozes)), false
	case r < 78:
		return fmt.Sprintf("conflict:%d", 1+rng.IntN(3)), false
	case r < 83:
		return fmt.Sprintf("locked:%d", 1+rng.IntN(2)), false
	case r < 88:
		return fmt.Sprintf("infra:%d", 1+rng.IntN(2)), false
	case r < 89:
		return "malformed", true
	case keyed:
		// No handler until deploy: parked (holding its key) and released
		// once deployed, or handled when delivered after.
		return "nohandler", false
	default:
		return "ok", false
	}
}

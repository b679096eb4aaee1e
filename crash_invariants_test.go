package outbox

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The invariants the crash harness (crash_test.go) checks after each
// recovery. Each checker is a pure function of a snapshot (a world), so
// that the tests below can prove it on hand-made bad states first.

// crashInbox is an inbox document as the consumer invariants read it.
type crashInbox struct {
	name, key, schema, reason string
	offset                    int64
	handled, parked, held     bool
	discarded                 bool // purged by an operator
}

// consumerWorld is a snapshot of one partition's consumption.
type consumerWorld struct {
	// records are the partition's records; record i has offset i and
	// idempotency key records[i].name.
	records []crashRec
	// inbox holds the inbox documents by idempotency key.
	inbox map[string]crashInbox
	// effects are the events each partition key's handler effects name,
	// in the order their transactions committed.
	effects map[string][]string
	// committed is the partition's committed offset (0: none).
	committed int64
	// handles reports whether the recovering process has a handler for a
	// content schema.
	handles func(schema string) bool
}

// violations returns the broken invariants of w, once the partition is
// quiescent (every record fed, nothing running):
//
//   - exactly once: every record is handled (one effect, claimed in the
//     inbox), parked or held (no effect), or purged; never two effects;
//   - per-key order: a key's effects follow offset order, and no event is
//     handled while an earlier one of its key waits;
//   - no key held with nothing to wait for: a key's sequence (its parked
//     documents by offset) never starts with a held event, nor with an
//     event parked for want of a handler that is there now;
//   - no event held behind a handled or missing one: every held event has
//     an event parked for cause before it in its sequence;
//   - the committed offset never passes an unsettled event.
func (w consumerWorld) violations() []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	offsetOf := map[string]int64{}
	for i, r := range w.records {
		offsetOf[r.name] = int64(i)
	}
	// Exactly once.
	times := map[string]int{}
	for key, names := range w.effects {
		for _, n := range names {
			times[n]++
			if r, ok := offsetOf[n]; ok && w.records[r].key != key {
				bad("%s: its effect is written under key %q, not its own %q", n, key, w.records[r].key)
			}
		}
	}
	for i, r := range w.records {
		d, ok := w.inbox[r.name]
		n := times[r.name]
		switch {
		case n > 1:
			bad("%s (offset %d): handled %d times", r.name, i, n)
		case n == 1 && (!ok || !d.handled || d.discarded):
			bad("%s (offset %d): its handler's effect is there but the inbox does not say handled (%+v)", r.name, i, d)
		case n == 0 && ok && d.handled && !d.discarded:
			bad("%s (offset %d): claimed handled in the inbox without its handler's effect", r.name, i)
		case !ok || !(d.handled || d.parked):
			bad("%s (offset %d): neither handled, parked, held nor purged", r.name, i)
		}
		if ok && d.parked && d.handled {
			bad("%s (offset %d): both parked and handled", r.name, i)
		}
	}
	// Per-key order.
	for key, names := range w.effects {
		last := int64(-1)
		for _, n := range names {
			off, ok := offsetOf[n]
			if !ok {
				bad("key %q: effect of an unknown event %s", key, n)
				continue
			}
			if off <= last {
				bad("key %q: %s (offset %d) handled after an event at offset %d", key, n, off, last)
			}
			last = max(last, off)
		}
	}
	for j, r := range w.records {
		if d := w.inbox[r.name]; !d.handled || d.discarded {
			continue
		}
		for i := range j {
			e := w.records[i]
			if e.key != r.key {
				continue
			}
			if d := w.inbox[e.name]; !d.handled {
				bad("key %q: %s (offset %d) handled while the earlier %s (offset %d) waits (%+v)", r.key, r.name, j, e.name, i, d)
			}
		}
	}
	// Sequences.
	seqs := map[string][]crashInbox{}
	for _, d := range w.inbox {
		if d.parked && !d.handled {
			seqs[d.key] = append(seqs[d.key], d)
		}
	}
	keys := make([]string, 0, len(seqs))
	for k := range seqs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		seq := seqs[k]
		slices.SortFunc(seq, func(a, b crashInbox) int { return cmp.Compare(a.offset, b.offset) })
		head := seq[0]
		switch {
		case head.held:
			bad("key %q held with nothing to wait for: its first event %s (offset %d) is held", k, head.name, head.offset)
		case head.reason == reasonNoHandler && w.handles != nil && w.handles(head.schema):
			bad("key %q held with nothing to wait for: its head %s waits for a handler that is there", k, head.name)
		}
		cause := false
		for _, d := range seq {
			if !d.held {
				cause = true
				continue
			}
			if !cause {
				bad("%s (offset %d) held behind a handled or missing event: no event of key %q is parked before it", d.name, d.offset, k)
			}
		}
	}
	// Offsets.
	for i := int64(0); i < w.committed && i < int64(len(w.records)); i++ {
		r := w.records[i]
		if d, ok := w.inbox[r.name]; !ok || !(d.handled || d.parked) {
			bad("offset %d committed past %s (offset %d), which is not settled", w.committed, r.name, i)
		}
	}
	if w.committed > int64(len(w.records)) {
		bad("offset %d committed past the last record (%d)", w.committed, len(w.records)-1)
	}
	return out
}

// outcome is the final state of every event, for comparing a recovered run
// with the uncrashed one.
func (w consumerWorld) outcome() string {
	var b strings.Builder
	for _, r := range w.records {
		d, ok := w.inbox[r.name]
		state := "absent"
		switch {
		case !ok:
		case d.discarded:
			state = "purged"
		case d.handled:
			state = "handled"
		case d.held:
			state = "held"
		case d.parked:
			state = "parked:" + d.reason
		default:
			state = "unsettled"
		}
		fmt.Fprintf(&b, "%s=%s ", r.name, state)
	}
	keys := make([]string, 0, len(w.effects))
	for k := range w.effects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s:%v ", k, w.effects[k])
	}
	return b.String()
}

// crashOutbox is an outbox document as the publisher invariants read it.
type crashOutbox struct {
	name, key         string
	seq               uint64 // publishing order
	published, failed bool
}

// kafkaRec is a record the fake Kafka took: the event's name and key.
type kafkaRec struct{ name, key string }

// publisherWorld is a snapshot of one partition's publishing.
type publisherWorld struct {
	// recorded are the events recorded, in order.
	recorded []crashEvent
	// outbox holds the outbox documents by event name; a discarded event
	// has none.
	outbox map[string]crashOutbox
	// discarded are the events an operator discarded.
	discarded map[string]bool
	// kafka is the topic partition's log.
	kafka []kafkaRec
	// accepts reports whether Kafka takes the event now.
	accepts func(name string) bool
	// final: every step ran, so every event Kafka takes must be published.
	final bool
}

// violations returns the broken invariants of w, once the publisher is
// quiescent:
//
//   - at least once: an event marked published is in Kafka; when final,
//     every recorded event not discarded is published;
//   - per-key order: the first publications of a key's events follow their
//     recording order, and none comes before an earlier event of its key
//     (unless that one was discarded);
//   - nothing stuck: no unpublished event that is neither failed nor
//     behind a failed event of its key; when final, nothing failed that
//     Kafka takes.
func (w publisherWorld) violations() []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	first := map[string]int{}
	for i, r := range w.kafka {
		if _, ok := first[r.name]; !ok {
			first[r.name] = i
		}
	}
	for i, e := range w.recorded {
		d, ok := w.outbox[e.Name]
		switch {
		case !ok && !w.discarded[e.Name]:
			bad("%s: its outbox document is gone and no operator discarded it", e.Name)
		case ok && d.published:
			if _, in := first[e.Name]; !in {
				bad("%s: marked published but not in Kafka", e.Name)
			}
		case ok && d.failed:
			if w.final && w.accepts(e.Name) {
				bad("%s: failed although Kafka takes it", e.Name)
			}
		case ok:
			held := false
			for _, x := range w.recorded[:i] {
				if p, in := w.outbox[x.Name]; in && x.Key == e.Key && p.failed {
					held = true
				}
			}
			if !held {
				bad("%s: pending with nothing to wait for (no failed event of key %q before it)", e.Name, e.Key)
			}
		}
		if w.final && ok && !d.published {
			bad("%s: not published at the end (published=%v failed=%v)", e.Name, d.published, d.failed)
		}
	}
	for i, e := range w.recorded {
		at, in := first[e.Name]
		if !in {
			continue
		}
		for _, x := range w.recorded[:i] {
			if x.Key != e.Key || w.discarded[x.Name] {
				continue
			}
			if xat, xin := first[x.Name]; !xin || xat > at {
				bad("key %q: %s published before the earlier %s", e.Key, e.Name, x.Name)
			}
		}
	}
	var seqs []crashOutbox
	for _, d := range w.outbox {
		seqs = append(seqs, d)
	}
	slices.SortFunc(seqs, func(a, b crashOutbox) int { return cmp.Compare(a.seq, b.seq) })
	order := map[string]int{}
	for i, e := range w.recorded {
		order[e.Name] = i
	}
	for i := 1; i < len(seqs); i++ {
		if order[seqs[i-1].name] > order[seqs[i].name] {
			bad("publishing order (seq) puts %s before %s, against their recording order", seqs[i-1].name, seqs[i].name)
		}
	}
	return out
}

// outcome is the final state of every event and the order of their first
// publications, for comparing a recovered run with the uncrashed one.
func (w publisherWorld) outcome() string {
	var b strings.Builder
	for _, e := range w.recorded {
		d, ok := w.outbox[e.Name]
		state := "gone"
		switch {
		case !ok:
		case d.published:
			state = "published"
		case d.failed:
			state = "failed"
		default:
			state = "pending"
		}
		fmt.Fprintf(&b, "%s=%s ", e.Name, state)
	}
	seen := map[string]bool{}
	b.WriteString("| first publications:")
	for _, r := range w.kafka {
		if !seen[r.name] {
			seen[r.name] = true
			b.WriteString(" " + r.name)
		}
	}
	return b.String()
}

// The checkers, each first shown to catch a hand-made bad state.

// goodConsumerWorld is a quiescent partition: a1 handled; p1 parked, p2
// held behind it; b1 handled.
func goodConsumerWorld() consumerWorld {
	return consumerWorld{
		records: []crashRec{{name: "a1", key: "a"}, {name: "p1", key: "p"}, {name: "p2", key: "p"}, {name: "b1", key: "b"}},
		inbox: map[string]crashInbox{
			"a1": {name: "a1", key: "a", offset: 0, handled: true},
			"p1": {name: "p1", key: "p", offset: 1, parked: true, reason: "handler_parked"},
			"p2": {name: "p2", key: "p", offset: 2, parked: true, held: true},
			"b1": {name: "b1", key: "b", offset: 3, handled: true},
		},
		effects:   map[string][]string{"a": {"a1"}, "b": {"b1"}},
		committed: 4,
		handles:   func(string) bool { return true },
	}
}

func TestCrashConsumerInvariantsCatchBadStates(t *testing.T) {
	t.Parallel()
	require.Empty(t, goodConsumerWorld().violations(), "the good state passes")
	cases := []struct {
		name  string
		spoil func(w *consumerWorld)
		want  string
	}{
		{"handled twice", func(w *consumerWorld) { w.effects["a"] = []string{"a1", "a1"} }, "handled 2 times"},
		{"claimed without effect", func(w *consumerWorld) { w.effects["a"] = nil }, "without its handler's effect"},
		{"effect without claim", func(w *consumerWorld) {
			d := w.inbox["b1"]
			d.handled = false
			w.inbox["b1"] = d
		}, "inbox does not say handled"},
		{"lost", func(w *consumerWorld) { delete(w.inbox, "p2") }, "neither handled, parked, held nor purged"},
		{"order of effects", func(w *consumerWorld) {
			w.records = append(w.records, crashRec{name: "a2", key: "a"})
			w.inbox["a2"] = crashInbox{name: "a2", key: "a", offset: 4, handled: true}
			w.effects["a"] = []string{"a2", "a1"}
			w.committed = 5
		}, "handled after an event at offset"},
		{"handled while an earlier one waits", func(w *consumerWorld) {
			w.records = append(w.records, crashRec{name: "p3", key: "p"})
			w.inbox["p3"] = crashInbox{name: "p3", key: "p", offset: 4, handled: true}
			w.effects["p"] = []string{"p3"}
			w.committed = 5
		}, "while the earlier p1"},
		{"held head", func(w *consumerWorld) { delete(w.inbox, "p1") }, "held with nothing to wait for"},
		{"releasable head left", func(w *consumerWorld) {
			d := w.inbox["p1"]
			d.reason = reasonNoHandler
			w.inbox["p1"] = d
		}, "waits for a handler that is there"},
		{"held behind a handled one", func(w *consumerWorld) {
			d := w.inbox["p1"]
			d.parked, d.handled = false, true
			w.inbox["p1"] = d
			w.effects["p"] = []string{"p1"}
		}, "held behind a handled or missing event"},
		{"committed past unsettled", func(w *consumerWorld) {
			w.inbox["p2"] = crashInbox{name: "p2", key: "p", offset: 2}
		}, "committed past p2"},
	}
	for _, tc := range cases {
		w := goodConsumerWorld()
		tc.spoil(&w)
		require.Contains(t, strings.Join(w.violations(), "\n"), tc.want, tc.name)
	}
}

// goodPublisherWorld: A1, A2 published; C1 failed, C2 held behind it.
func goodPublisherWorld() publisherWorld {
	return publisherWorld{
		recorded: []crashEvent{{Name: "A1", Key: "a"}, {Name: "C1", Key: "c"}, {Name: "A2", Key: "a"}, {Name: "C2", Key: "c"}},
		outbox: map[string]crashOutbox{
			"A1": {name: "A1", key: "a", seq: 1, published: true},
			"C1": {name: "C1", key: "c", seq: 2, failed: true},
			"A2": {name: "A2", key: "a", seq: 3, published: true},
			"C2": {name: "C2", key: "c", seq: 4},
		},
		discarded: map[string]bool{},
		kafka:     []kafkaRec{{"A1", "a"}, {"A2", "a"}, {"A1", "a"}},
		accepts:   func(name string) bool { return name != "C1" },
	}
}

func TestCrashPublisherInvariantsCatchBadStates(t *testing.T) {
	t.Parallel()
	require.Empty(t, goodPublisherWorld().violations(), "the good state passes")
	cases := []struct {
		name  string
		spoil func(w *publisherWorld)
		want  string
	}{
		{"marked but not in Kafka", func(w *publisherWorld) { w.kafka = w.kafka[:1] }, "A2: marked published but not in Kafka"},
		{"first publications reordered", func(w *publisherWorld) {
			w.kafka = []kafkaRec{{"A2", "a"}, {"A1", "a"}}
		}, "A2 published before the earlier A1"},
		{"published past a failed one", func(w *publisherWorld) {
			w.kafka = append(w.kafka, kafkaRec{"C2", "c"})
			d := w.outbox["C2"]
			d.published = true
			w.outbox["C2"] = d
		}, "C2 published before the earlier C1"},
		{"pending with nothing to wait for", func(w *publisherWorld) {
			d := w.outbox["C1"]
			d.failed, d.published = false, true
			w.outbox["C1"] = d
			w.kafka = append(w.kafka, kafkaRec{"C1", "c"})
		}, "C2: pending with nothing to wait for"},
		{"failed although Kafka takes it", func(w *publisherWorld) {
			w.accepts = func(string) bool { return true }
			w.final = true
		}, "C1: failed although Kafka takes it"},
		{"lost", func(w *publisherWorld) { delete(w.outbox, "A2") }, "A2: its outbox document is gone"},
		{"seq against recording order", func(w *publisherWorld) {
			d := w.outbox["A2"]
			d.seq = 0
			w.outbox["A2"] = d
		}, "puts A2 before A1"},
	}
	for _, tc := range cases {
		w := goodPublisherWorld()
		tc.spoil(&w)
		require.Contains(t, strings.Join(w.violations(), "\n"), tc.want, tc.name)
	}
}

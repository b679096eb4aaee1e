package publish

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// clientProducer behaves like kgo towards a record larger than its limit:
// the record is refused on the client, at once, while the records handed
// over after it are sent and acknowledged (after a random delay, so that
// the timing varies). It checks that no two records of one key are ever in
// flight together.
type clientProducer struct {
	limit int

	mu       sync.Mutex
	inFlight map[string]int // key -> records in flight
	overlaps []string
	log      []int
	calls    int
	wg       sync.WaitGroup
}

func (p *clientProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	var id int
	fmt.Sscan(string(r.Value), &id)
	key := string(r.Key)
	p.mu.Lock()
	p.calls++
	if RecordBatchBytes(r) > p.limit {
		p.mu.Unlock()
		promise(r, fmt.Errorf("%w (uncompressed_bytes=%d)", kerr.MessageTooLarge, len(r.Value)))
		return
	}
	if p.inFlight == nil {
		p.inFlight = map[string]int{}
	}
	if key != "" && p.inFlight[key] > 0 {
		p.overlaps = append(p.overlaps, fmt.Sprintf("%s: %d produced while an earlier event was in flight", key, id))
	}
	p.inFlight[key]++
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		time.Sleep(time.Duration(rand.N(200)) * time.Microsecond)
		p.mu.Lock()
		p.inFlight[key]--
		p.log = append(p.log, id)
		p.mu.Unlock()
		promise(r, nil)
	}()
}

func (p *clientProducer) delivered() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// A record refused on the client (kgo refuses a record above its batch limit
// at once, and still sends the records after it) must not be overtaken by
// later events of its key while it stands failed and holds the key. Whatever
// the timing, no later event of a key may be produced while an earlier one is
// unsettled.
func TestWorkerKeyNeverOvertakesAnUnsettledEvent(t *testing.T) {
	t.Parallel()
	for round := range 5 {
		store := &memStore{sizes: map[int]int{0: 5000}}
		store.add(testTP, 40, "k", "x", "y", "k") // k: 0 3 4 7 8 ...
		prod := &clientProducer{limit: 4000}
		w, _ := newTestWorker(store, prod, validLease(), 100)
		w.cfg.Hold = true
		w.cfg.HoldRecheck = time.Hour
		w.Start()
		eventually(t, func() bool { p, f := store.counts(); return p == 20 && f == 1 }, "round %d: want x's and y's 20 events published, 0 failed", round)
		w.Stop()
		prod.wg.Wait()
		require.True(t, store.isFailed(0))
		for _, id := range prod.delivered() {
			require.NotEqual(t, "k", store.events[id].key, "round %d: event %d of the held key k was published", round, id)
		}
		require.Empty(t, prod.overlaps)
		require.EqualValues(t, 1, w.HeldKeys())
	}
}

// Under SkipEvent the key's later events go on, still one at a time and
// in order.
func TestWorkerSkipEventKeepsKeyOrderAfterAClientRefusal(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{0: 5000}}
	store.add(testTP, 12, "k", "x")
	prod := &clientProducer{limit: 4000}
	w, _ := newTestWorker(store, prod, validLease(), 100)
	w.Start()
	eventually(t, func() bool { p, f := store.counts(); return p == 11 && f == 1 }, "want 11 published, 1 failed")
	w.Stop()
	prod.wg.Wait()
	require.Equal(t, map[string][]int{"k": {2, 4, 6, 8, 10}, "x": {1, 3, 5, 7, 9, 11}}, keyOrder(store, prod.delivered()))
	require.Empty(t, prod.overlaps)
}

func TestWaves(t *testing.T) {
	t.Parallel()
	var items []Item
	for i, k := range []string{"a", "b", "a", "", "c", "a", "", "b"} {
		items = append(items, memItem(testTP, memEvent{id: i, key: k}))
	}
	var got [][]int
	for _, wave := range waves(items) {
		var ids []int
		for _, it := range wave {
			ids = append(ids, it.ID.(int))
		}
		got = append(got, ids)
	}
	require.Equal(t, [][]int{{0, 1, 3, 4, 6}, {2, 7}, {5}}, got)
}

// A refused keyless event holds nothing: keyless events promise no order, so
// the key "" must not hold every keyless event of its partition.
func TestWorkerRefusedKeylessEventHoldsNothing(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{2: 6000}}
	store.add(testTP, 8, "")
	prod := &refusingProducer{limit: 4000, released: true}
	w, _ := newTestWorker(store, prod, validLease(), 10)
	w.cfg.Hold = true
	w.cfg.HoldRecheck = time.Millisecond
	w.Start()
	eventually(t, func() bool { p, f := store.counts(); return p == 7 && f == 1 }, "want the 7 other keyless events published")
	require.True(t, store.isFailed(2))
	require.NotContains(t, prod.delivered(), 2)
	store.add(testTP, 2, "")
	w.Wake()
	eventually(t, func() bool { p, _ := store.counts(); return p == 9 }, "later keyless events held")
	require.Zero(t, w.HeldKeys())
	w.Stop()

	// A new owner reads the failed keys from the store: the failed keyless
	// event still holds nothing.
	store.add(testTP, 2, "")
	w2, _ := newTestWorker(store, prod, validLease(), 10)
	w2.cfg.Hold = true
	w2.Start()
	defer w2.Stop()
	eventually(t, func() bool { p, _ := store.counts(); return p == 11 }, "keyless events held by a new owner")
	require.Zero(t, w2.HeldKeys())
}

// A record too large for the producer's batches is not handed to the producer
// (which would refuse it on the client): it is sent alone through Solo, whose
// limit is what the broker accepts, so Kafka judges it.
func TestWorkerSendsOversizeRecordsAlone(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{1: 3000, 4: 9000}}
	store.add(testTP, 6, "a", "b", "c")
	main := &clientProducer{limit: 2000}
	solo := &refusingProducer{limit: 8000, released: true}
	w, _ := newTestWorker(store, main, validLease(), 100)
	w.cfg.Solo = solo
	w.cfg.MaxBatchBytes = func(string) int { return 2000 }
	var refused []string
	var mu sync.Mutex
	w.cfg.SizeRefused = func(topic string) { mu.Lock(); refused = append(refused, topic); mu.Unlock() }
	w.cfg.Hold = true
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, f := store.counts(); return p == 5 && f == 1 }, "want 5 published, event 4 failed")
	require.Equal(t, []int{1}, solo.delivered(), "the 3000-byte event goes alone, and the broker takes it")
	require.True(t, store.isFailed(4), "the 9000-byte event is refused by the broker, alone")
	require.Equal(t, 2, solo.produced())
	main.wg.Wait()
	require.NotContains(t, main.delivered(), 1)
	require.NotContains(t, main.delivered(), 4)
	mu.Lock()
	require.Equal(t, []string{testTP.Topic}, refused, "a refusal naming the size asks for the limit again")
	mu.Unlock()
}

// A document that cannot be read is marked failed with the reason, in its
// place; the rest of the partition goes on, and under the hold policy its key
// waits behind it.
func TestWorkerMarksUnreadableDocumentFailed(t *testing.T) {
	t.Parallel()
	store := &memStore{}
	store.add(testTP, 9, "a", "b", "c") // a: 0 3 6
	store.events[3].unreadable = true
	prod := &fakeProducer{}
	w, stats := newTestWorker(store, prod, validLease(), 100)
	w.cfg.Hold = true
	w.cfg.HoldRecheck = time.Hour
	var failed []any
	w.cfg.Hooks.Failed = func(_ TopicPartition, it Item, _ error) { failed = append(failed, it.ID) }
	w.Start()
	defer w.Stop()
	eventually(t, func() bool { p, f := store.counts(); return p == 7 && f == 1 }, "want the other keys and a's first event published")
	require.True(t, store.isFailed(3))
	require.Contains(t, store.events[3].cause, "cannot decode")
	require.Equal(t, map[string][]int{"a": {0}, "b": {1, 4, 7}, "c": {2, 5, 8}}, keyOrder(store, prod.delivered()))
	require.EqualValues(t, 1, stats.Failed())
	require.Equal(t, []any{3}, failed)
}

// A scan reads at most BatchBytes of documents (past the first), and a backlog
// of large events still drains at once, not at the next periodic rescan.
func TestWorkerScanIsCappedByBytesAndDrains(t *testing.T) {
	t.Parallel()
	store := &memStore{sizes: map[int]int{}}
	store.add(testTP, 20, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	for i := range 20 {
		store.sizes[i] = 1000
	}
	store.sizes[7] = 5000 // larger than the cap: read alone
	prod := &fakeProducer{}
	w, _ := newTestWorker(store, prod, validLease(), 100)
	w.cfg.BatchBytes = 3000
	var mu sync.Mutex
	var rounds []int
	w.cfg.Hooks.Produced = func(_ TopicPartition, items []Item, _, _ time.Time, _ int) {
		n := 0
		for _, it := range items {
			n += len(it.Record.Value)
		}
		mu.Lock()
		rounds = append(rounds, n)
		mu.Unlock()
	}
	w.Start() // Rescan is an hour: only the worker's own loop drains
	defer w.Stop()
	eventually(t, func() bool { p, _ := store.counts(); return p == 20 }, "the backlog did not drain")
	mu.Lock()
	defer mu.Unlock()
	for _, n := range rounds {
		require.True(t, n <= 3000 || n == 5000, "a round read %d bytes", n)
	}
	require.Equal(t, seq(0, 20), firstDeliveries(prod.delivered()))
}

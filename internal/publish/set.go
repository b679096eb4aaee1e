package publish

import (
	"cmp"
	"slices"
	"sync"
)

// Set holds the workers of the partitions a publisher owns. It follows
// the group's rebalance callbacks, which pass deltas (possibly empty or
// repeating what is already known), so every method is idempotent.
type Set struct {
	newWorker func(TopicPartition) *Worker

	mu      sync.Mutex
	workers map[TopicPartition]*Worker
	// stopping are the workers removed from workers and not exited yet. A
	// Revoke or Lose waits for the workers of its partitions that another
	// call is stopping: Close runs on the publisher's goroutine while the
	// group's rebalance callbacks still run, and a callback that returned
	// while Close was still finishing the partition's batch would let the
	// group hand the partition to another member with this one still
	// producing to it.
	stopping map[*Worker]bool
	gen      uint64
	changed  chan struct{} // closed and replaced when the owned set changes
	closed   bool
	streams  uint64 // last stream id given by Attach
}

// NewSet returns an empty set; newWorker makes the worker of a newly
// assigned partition (not started).
func NewSet(newWorker func(TopicPartition) *Worker) *Set {
	return &Set{newWorker: newWorker, workers: map[TopicPartition]*Worker{}, stopping: map[*Worker]bool{},
		changed: make(chan struct{})}
}

func (s *Set) bump() {
	s.gen++
	close(s.changed)
	s.changed = make(chan struct{})
}

// Assign starts a worker for every partition not owned yet. After Close it
// does nothing.
func (s *Set) Assign(tps []TopicPartition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	added := false
	for _, tp := range tps {
		if _, ok := s.workers[tp]; ok {
			continue
		}
		w := s.newWorker(tp)
		s.workers[tp] = w
		w.Start()
		added = true
	}
	if added {
		s.bump()
	}
}

// remove takes the workers of tps out of the owned set into stopping and
// returns them with the workers of tps that earlier calls are stopping.
func (s *Set) remove(tps []TopicPartition) []*Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	removed := false
	for _, tp := range tps {
		if w, ok := s.workers[tp]; ok {
			delete(s.workers, tp)
			s.stopping[w] = true
			removed = true
		}
	}
	if removed {
		s.bump()
	}
	var ws []*Worker
	for w := range s.stopping {
		if slices.Contains(tps, w.tp) {
			ws = append(ws, w)
		}
	}
	return ws
}

// stop stops the workers of tps with stop (Stop and Kill may be called
// again on a worker another call is stopping: each returns once it
// exited), in parallel, and returns when all have exited.
func (s *Set) stop(tps []TopicPartition, stop func(*Worker)) {
	ws := s.remove(tps)
	stopAll(ws, stop)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		delete(s.stopping, w)
	}
}

// Revoke stops the workers of tps gracefully, in parallel, and returns
// when all have exited, also those another call (Close) was stopping: no
// record is produced for them afterwards.
func (s *Set) Revoke(tps []TopicPartition) { s.stop(tps, (*Worker).Stop) }

// Lose stops the workers of tps at once (no mark of batches in flight;
// one that Close is stopping gracefully is killed) and returns when all
// have exited.
func (s *Set) Lose(tps []TopicPartition) { s.stop(tps, (*Worker).Kill) }

// Close stops every worker gracefully and refuses later assignments.
func (s *Set) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.Revoke(s.Owned())
}

func stopAll(ws []*Worker, stop func(*Worker)) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); stop(w) }()
	}
	wg.Wait()
}

// Owned returns the owned partitions, sorted.
func (s *Set) Owned() []TopicPartition {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TopicPartition, 0, len(s.workers))
	for tp := range s.workers {
		out = append(out, tp)
	}
	slices.SortFunc(out, func(a, b TopicPartition) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// Changed returns the generation of the owned set and a channel closed at
// its next change.
func (s *Set) Changed() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen, s.changed
}

// WakeAll wakes every worker.
func (s *Set) WakeAll() {
	for _, w := range s.all() {
		w.Wake()
	}
}

// Attach records that a change stream, just opened, covers the partitions
// tps (the owned partitions its pipeline names) and returns its id. Their
// workers reset: they scan, then follow the stream.
func (s *Set) Attach(tps []TopicPartition) uint64 {
	s.mu.Lock()
	s.streams++
	id := s.streams
	var ws []*Worker
	for _, tp := range tps {
		if w := s.workers[tp]; w != nil {
			ws = append(ws, w)
		}
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.attach(id)
	}
	return id
}

// Detach records that stream id ended: the workers it covered scan until
// another stream covers them.
func (s *Set) Detach(id uint64) {
	for _, w := range s.all() {
		w.detach(id)
	}
}

// Push hands the worker of tp an event that stream id delivered.
func (s *Set) Push(id uint64, tp TopicPartition, it Item) {
	s.mu.Lock()
	w := s.workers[tp]
	s.mu.Unlock()
	if w != nil {
		w.push(id, it)
	}
}

// Reset makes the worker of tp scan before following stream id again (the
// stream delivered something it could not read). A zero tp resets every
// worker.
func (s *Set) Reset(id uint64, tp TopicPartition) {
	if tp == (TopicPartition{}) {
		for _, w := range s.all() {
			w.reset(id)
		}
		return
	}
	s.mu.Lock()
	w := s.workers[tp]
	s.mu.Unlock()
	if w != nil {
		w.reset(id)
	}
}

func (s *Set) all() []*Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := make([]*Worker, 0, len(s.workers))
	for _, w := range s.workers {
		ws = append(ws, w)
	}
	return ws
}

// Following returns how many workers follow the change stream.
func (s *Set) Following() int {
	n := 0
	for _, w := range s.all() {
		if w.Following() {
			n++
		}
	}
	return n
}

// HeldKeys returns how many partition keys the workers hold (see holds).
func (s *Set) HeldKeys() int64 {
	var n int64
	for _, w := range s.all() {
		n += w.HeldKeys()
	}
	return n
}

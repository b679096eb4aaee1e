package consume

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Set is the workers of the partitions a consumer owns. The rebalance
// callbacks call Assign, Revoke and Lose (one at a time); the poll loop
// calls Enqueue; status and metrics read Owned, Stats and Waits.
type Set struct {
	cfg  *Config
	work context.Context

	mu      sync.Mutex
	workers map[TopicPartition]*Worker
	// stopping are the workers of revoked or lost partitions until they
	// have stopped: a drain waits for the units in hand, and what they wait
	// on must show (Waits) while the group's rebalance waits for them.
	stopping map[*Worker]bool
	// started counts the workers started; each worker keeps the count at
	// its start (Worker.born), which Polled and EnqueuePolled compare.
	started uint64
}

// NewSet returns an empty set whose workers run their handlers under work.
func NewSet(cfg *Config, work context.Context) *Set {
	return &Set{cfg: cfg, work: work, workers: map[TopicPartition]*Worker{}, stopping: map[*Worker]bool{}}
}

// Assign starts the workers of newly assigned partitions (partitions it
// already has are left alone: callbacks may repeat).
func (s *Set) Assign(tps []TopicPartition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tp := range tps {
		if s.workers[tp] != nil {
			continue
		}
		s.started++
		w := NewWorker(tp, s.cfg, s.work)
		w.born = s.started
		s.workers[tp] = w
		w.Start()
	}
}

// Revoke stops the workers of revoked partitions, each after its running
// units and its last commit, and returns when all have stopped, also
// those another call (Close) was stopping: the group must not hand a
// partition on while its worker still runs or commits.
func (s *Set) Revoke(tps []TopicPartition) { s.stop(s.remove(tps), false) }

// Lose stops the workers of lost partitions at once, without committing
// (one that Close is draining stops committing too), and returns when all
// have stopped.
func (s *Set) Lose(tps []TopicPartition) { s.stop(s.remove(tps), true) }

// LoseTopic stops, as Lose does, every worker of topic: those of its owned
// partitions and those a Revoke, Lose or Close is stopping already, and
// returns when all have stopped. A worker being stopped may still have a
// commit in flight; whoever drops the client's state of the topic (a purge
// of a recreated topic) must wait for it, or the commit, built after the
// purge, would name the topic's new incarnation with an offset of the old.
func (s *Set) LoseTopic(topic string) {
	s.mu.Lock()
	var tps []TopicPartition
	for tp := range s.workers {
		if tp.Topic == topic {
			tps = append(tps, tp)
		}
	}
	for w := range s.stopping {
		if w.tp.Topic == topic && !slices.Contains(tps, w.tp) {
			tps = append(tps, w.tp)
		}
	}
	s.mu.Unlock()
	s.Lose(tps)
}

// Close stops every worker as Revoke does.
func (s *Set) Close() {
	s.mu.Lock()
	ws := make([]*Worker, 0, len(s.workers))
	for tp, w := range s.workers {
		ws = append(ws, w)
		delete(s.workers, tp)
		s.stopping[w] = true
	}
	s.mu.Unlock()
	s.stop(ws, false)
}

// remove takes the workers of tps out of the owned set into stopping and
// returns them with the workers of tps that earlier calls are stopping.
func (s *Set) remove(tps []TopicPartition) []*Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ws []*Worker
	for _, tp := range tps {
		if w := s.workers[tp]; w != nil {
			delete(s.workers, tp)
			s.stopping[w] = true
		}
	}
	for w := range s.stopping {
		if slices.Contains(tps, w.tp) {
			ws = append(ws, w)
		}
	}
	return ws
}

// stop stops workers side by side and waits for all of them; each leaves
// stopping once it has stopped.
func (s *Set) stop(ws []*Worker, lost bool) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			if lost {
				w.Lose()
			} else {
				w.Stop()
			}
			s.mu.Lock()
			delete(s.stopping, w)
			s.mu.Unlock()
		})
	}
	wg.Wait()
}

// Enqueue hands fetched records to the partition's worker; records of a
// partition not owned any more are dropped.
func (s *Set) Enqueue(tp TopicPartition, recs []*kgo.Record) {
	s.EnqueuePolled(tp, recs, math.MaxUint64)
}

// Polled returns the mark of a poll, to be taken as soon as the poll
// returns and handed to EnqueuePolled with its records.
func (s *Set) Polled() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// EnqueuePolled is Enqueue for the records of a poll that returned at mark
// (Polled): records of a partition whose worker started after the mark are
// dropped too. They were fetched for an earlier assignment of the
// partition, revoked or lost and assigned again while the poll loop held
// them, and they may lie past the offset the new assignment's fetching
// starts from (the earlier worker fetched ahead of its commits): taken
// first, they would let the new worker drop the records before them as
// already seen, and commit past them unhandled. kgo gives a new
// assignment's records only to polls that return after
// OnPartitionsAssigned, so none of them is dropped.
func (s *Set) EnqueuePolled(tp TopicPartition, recs []*kgo.Record, mark uint64) {
	s.mu.Lock()
	w := s.workers[tp]
	s.mu.Unlock()
	if w != nil && w.born <= mark {
		w.Enqueue(recs)
	}
}

// Owned returns the owned partitions, sorted.
func (s *Set) Owned() []TopicPartition {
	s.mu.Lock()
	out := make([]TopicPartition, 0, len(s.workers))
	for tp := range s.workers {
		out = append(out, tp)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b TopicPartition) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// Stats returns a snapshot of each owned partition's worker.
func (s *Set) Stats() map[TopicPartition]Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[TopicPartition]Stats, len(s.workers))
	for tp, w := range s.workers {
		out[tp] = w.Stats()
	}
	return out
}

// Waits returns the visible waits of every owned partition, oldest first.
//
// Workers of revoked and lost partitions count until they have stopped: a
// revoke waits for the units in hand (up to the drain timeout), and the
// group's rebalance waits for the revoke.
func (s *Set) Waits() []Wait {
	s.mu.Lock()
	ws := make([]*Worker, 0, len(s.workers)+len(s.stopping))
	for _, w := range s.workers {
		ws = append(ws, w)
	}
	for w := range s.stopping {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	var out []Wait
	for _, w := range ws {
		out = append(out, w.Waits()...)
	}
	slices.SortFunc(out, func(a, b Wait) int { return a.Since.Compare(b.Since) })
	return out
}

// Fetching is what the poll loop handed a partition's worker, for the
// watch of the partition's fetching (the root package's fetch watch).
type Fetching struct {
	// Next is the offset after the last record handed over; -1 before any.
	Next int64
	// Quiet is since when nothing new was handed over while fetching ran:
	// the last records past Next's earlier value, the worker's start, or
	// the last resume of the partition's fetching, whichever is latest.
	Quiet time.Time
	// Paused is whether the worker paused the partition's fetching.
	Paused bool
}

// Fetching returns the Fetching of each owned partition.
func (s *Set) Fetching() map[TopicPartition]Fetching {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[TopicPartition]Fetching, len(s.workers))
	for tp, w := range s.workers {
		out[tp] = w.fetching()
	}
	return out
}

// SetFetchWait sets (nil: clears) the wait on fetching of an owned
// partition, which Waits lists once it is older than Config.WaitVisible
// and the worker logs as it logs its own. Its Since must be the Quiet of
// the partition's Fetching it was judged on: a wait set after records
// came meanwhile is dropped (records clear the wait). A partition not
// owned is left alone.
func (s *Set) SetFetchWait(tp TopicPartition, wt *Wait) {
	s.mu.Lock()
	w := s.workers[tp]
	s.mu.Unlock()
	if w == nil {
		return
	}
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	if wt != nil && !wt.Since.Equal(w.quiet()) {
		return
	}
	w.fetchWait = wt
}

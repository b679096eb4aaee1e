package schedule

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
)

// Store reads and promotes the scheduled events of a partition.
type Store interface {
	// Upcoming returns the due times of tp's events waiting for their
	// time, earliest first, at most n.
	Upcoming(ctx context.Context, tp TopicPartition, n int) ([]time.Time, error)
	// Promote moves tp's events due at or before now into the outbox, at
	// most limit of them, in promotion order. It returns how many it took
	// off the schedule (promoted, or failed for good and left visible).
	Promote(ctx context.Context, tp TopicPartition, now time.Time, limit int) (int, error)
}

// Config configures the loops of a Set.
type Config struct {
	Store Store
	// Horizon is how many due times a partition keeps in memory. Defaults
	// to 256.
	Horizon int
	// Batch is the most events one promotion transaction moves. Defaults
	// to 256.
	Batch int
	// Refill is how often a partition reads its horizon again whatever it
	// was told. Defaults to 30 s.
	Refill  time.Duration
	Backoff retry.Backoff
	Logger  *slog.Logger
	// Now is the clock due times are compared with. Defaults to time.Now.
	Now func() time.Time
	// Promoted, when set, is called after each promotion that moved events.
	Promoted func(tp TopicPartition, n int)
	// Failed, when set, is called with each error of a read or promotion.
	Failed func(err error)
}

func (c *Config) defaults() {
	c.Horizon = cmp.Or(c.Horizon, 256)
	c.Batch = cmp.Or(c.Batch, 256)
	c.Refill = cmp.Or(c.Refill, 30*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Set holds the promotion loops of the partitions a publisher owns. It
// follows the group's rebalance callbacks, which pass deltas (possibly
// empty or repeating what is known), so every method is idempotent.
type Set struct {
	cfg Config

	mu     sync.Mutex
	loops  map[TopicPartition]*loop
	closed bool
}

// NewSet returns an empty set.
func NewSet(cfg Config) *Set {
	cfg.defaults()
	return &Set{cfg: cfg, loops: map[TopicPartition]*loop{}}
}

// Assign starts a loop for every partition not owned yet. After Close it
// does nothing.
func (s *Set) Assign(tps []TopicPartition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, tp := range tps {
		if _, ok := s.loops[tp]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		l := &loop{tp: tp, cfg: &s.cfg, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
		s.loops[tp] = l
		go l.run(ctx)
	}
}

// Revoke stops the loops of tps and returns after they exited. A
// promotion in flight is aborted.
func (s *Set) Revoke(tps []TopicPartition) {
	s.mu.Lock()
	var stop []*loop
	for _, tp := range tps {
		if l, ok := s.loops[tp]; ok {
			delete(s.loops, tp)
			stop = append(stop, l)
		}
	}
	s.mu.Unlock()
	for _, l := range stop {
		l.cancel()
	}
	for _, l := range stop {
		<-l.done
	}
}

// Close stops every loop, returns after they exited, and makes Assign a
// no-op.
func (s *Set) Close() {
	s.mu.Lock()
	s.closed = true
	tps := make([]TopicPartition, 0, len(s.loops))
	for tp := range s.loops {
		tps = append(tps, tp)
	}
	s.mu.Unlock()
	s.Revoke(tps)
}

// Owned reports how many partitions have a loop.
func (s *Set) Owned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.loops)
}

// Notify tells the loop of tp, if this set owns it, of an event scheduled
// for due.
func (s *Set) Notify(tp TopicPartition, due time.Time) {
	s.mu.Lock()
	l := s.loops[tp]
	s.mu.Unlock()
	if l != nil {
		l.notify(due, false)
	}
}

// RefillAll makes every loop read its horizon again: notifications may
// have been lost (the stream that brings them was reopened).
func (s *Set) RefillAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.loops {
		l.notify(time.Time{}, true)
	}
}

// loop promotes the events of one partition at their due times.
type loop struct {
	tp     TopicPartition
	cfg    *Config
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{} // buffered 1: a notification is waiting

	mu       sync.Mutex
	incoming []time.Time // due times notified since the loop last looked
	refill   bool        // read the horizon again
}

// maxIncoming bounds the notifications kept between two looks of the
// loop; beyond it the loop reads its horizon from the index instead.
const maxIncoming = 4096

func (l *loop) notify(due time.Time, refill bool) {
	l.mu.Lock()
	if refill || len(l.incoming) >= maxIncoming {
		l.refill, l.incoming = true, nil
	} else {
		l.incoming = append(l.incoming, due)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *loop) take() ([]time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	in, refill := l.incoming, l.refill
	l.incoming, l.refill = nil, false
	return in, refill
}

// run is the loop's goroutine: it reads the horizon, sleeps until the
// first due time, a notification or the refill interval, and promotes
// what is due. Failures are retried with backoff; it returns when ctx
// ends.
func (l *loop) run(ctx context.Context) {
	defer close(l.done)
	cfg := l.cfg
	h := horizon{max: cfg.Horizon}
	needRefill := true
	var filledAt time.Time
	failures := 0
	fail := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		if failures == 1 || failures%20 == 0 {
			cfg.Logger.Warn("scheduled events: "+what+" failed; retrying", "partition", l.tp.String(), "error", err, "failures", failures)
		}
		if cfg.Failed != nil {
			cfg.Failed(err)
		}
		return retry.Sleep(ctx, nil, cfg.Backoff.Delay(failures))
	}
	for ctx.Err() == nil {
		in, refill := l.take()
		if refill || needRefill || time.Since(filledAt) >= cfg.Refill {
			// Notifications taken before this read are in it: each came
			// after its event committed.
			due, err := cfg.Store.Upcoming(ctx, l.tp, cfg.Horizon+1)
			if err != nil {
				l.notify(time.Time{}, true)
				if !fail("reading the next due times", err) {
					return
				}
				continue
			}
			h.fill(due)
			needRefill, filledAt = false, time.Now()
		} else {
			for _, t := range in {
				h.add(t)
			}
		}
		now := cfg.Now()
		if t, ok := h.next(); ok && !t.After(now) {
			if err := l.promote(ctx, now); err != nil {
				if !fail("promotion", err) {
					return
				}
				continue
			}
			failures = 0
			needRefill = h.drop(now)
			continue
		}
		failures = 0
		wait := cfg.Refill - time.Since(filledAt)
		if t, ok := h.next(); ok {
			wait = min(wait, t.Sub(now))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-l.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// promote promotes every event due at now, a batch per transaction.
func (l *loop) promote(ctx context.Context, now time.Time) error {
	for {
		n, err := l.cfg.Store.Promote(ctx, l.tp, now, l.cfg.Batch)
		if n > 0 && l.cfg.Promoted != nil {
			l.cfg.Promoted(l.tp, n)
		}
		if err != nil || n < l.cfg.Batch {
			return err
		}
	}
}

package publish

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
)

// Marker marks events published in the background, for every worker of a
// publisher at once: workers following the change stream hand it the ids
// Kafka acknowledged and go on producing, and it writes them with one
// updateMany per Delay (or sooner when Max ids are waiting). Marking is
// off the latency path, and at a moderate load one write covers the events
// of every partition for Delay.
//
// An id waits in the marker at most Delay plus the time MongoDB takes to
// accept the write. Until then a scan would return the event again, so a
// worker calls Flush before it scans; a crash in that window publishes
// the event again (a duplicate, never a loss). Ids of a worker that lost
// its partition are still marked: they are in Kafka.
//
// Run is the marker's goroutine; its owner starts it and cancels its
// context after every worker has stopped. It then writes what is left,
// bounded by Timeout.
type Marker struct {
	Store Store
	// Delay is how long an acknowledged id may wait before it is written.
	Delay time.Duration
	// Max is how many waiting ids trigger a write before Delay.
	Max int
	// Timeout bounds one write, and the final write when Run stops.
	Timeout time.Duration
	Backoff retry.Backoff
	Logger  *slog.Logger
	Stats   *Stats

	flushMu sync.Mutex // serializes writes, so Flush covers what was queued before it
	mu      sync.Mutex
	queue   []any
	kick    chan struct{} // capacity 1: ids are waiting
}

// NewMarker returns a marker; every field may be changed before Run.
func NewMarker(store Store, delay time.Duration, maxIDs int) *Marker {
	return &Marker{Store: store, Delay: delay, Max: maxIDs, Timeout: 10 * time.Second, kick: make(chan struct{}, 1)}
}

// Add queues ids to be marked published. It never blocks on MongoDB.
func (m *Marker) Add(ids []any) {
	if len(ids) == 0 {
		return
	}
	m.mu.Lock()
	m.queue = append(m.queue, ids...)
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Waiting returns how many ids wait to be written.
func (m *Marker) Waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queue)
}

// Flush writes every id queued before the call, and returns once they are
// marked or ctx ends. Ids whose write failed stay queued.
func (m *Marker) Flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	m.mu.Lock()
	ids := m.queue
	m.queue = nil
	m.mu.Unlock()
	for len(ids) > 0 {
		n := min(len(ids), markChunk)
		if err := m.Store.MarkPublished(ctx, ids[:n], time.Now()); err != nil {
			m.mu.Lock()
			m.queue = append(ids, m.queue...)
			m.mu.Unlock()
			return fmt.Errorf("mark %d events published: %w", len(ids), err)
		}
		m.Stats.published.Add(int64(n))
		ids = ids[n:]
	}
	return nil
}

// markChunk caps the ids of one updateMany (about 20 bytes each in the
// command).
const markChunk = 10000

// Run writes queued ids until ctx ends, then writes what is left (bounded
// by Timeout) and returns.
func (m *Marker) Run(ctx context.Context) {
	attempt := 0
	for {
		select {
		case <-m.kick:
		case <-ctx.Done():
			m.final()
			return
		}
		// Gather for Delay unless enough ids are waiting already.
		if m.Waiting() < m.Max && !retry.Sleep(ctx, nil, m.Delay) {
			m.final()
			return
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, m.Timeout)
			err := m.Flush(wctx)
			cancel()
			if err == nil {
				attempt = 0
				break
			}
			if ctx.Err() != nil {
				m.final()
				return
			}
			m.Stats.SetError(err)
			d := m.Backoff.Delay(attempt)
			attempt++
			m.Logger.Warn("outbox publisher: marking events published failed; retrying", "error", err, "retry_in", d)
			if !retry.Sleep(ctx, nil, d) {
				m.final()
				return
			}
		}
	}
}

func (m *Marker) final() {
	ctx, cancel := context.WithTimeout(context.Background(), m.Timeout)
	defer cancel()
	if err := m.Flush(ctx); err != nil {
		m.Stats.SetError(err)
		m.Logger.Warn("outbox publisher: events left unmarked at stop; they will be published again", "error", err, "events", m.Waiting())
	}
}

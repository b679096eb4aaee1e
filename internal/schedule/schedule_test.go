package schedule

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/internal/retry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHorizonBounded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	h := horizon{max: 3}
	h.fill([]time.Time{at(1), at(2), at(3), at(4)}) // one more than max: more exist
	require.Equal(t, []time.Time{at(1), at(2), at(3)}, h.due)
	require.False(t, h.complete)
	h.add(at(9)) // beyond what the horizon knows: left to the refill
	require.Len(t, h.due, 3)
	h.add(at(0)) // before its end: in, the last one falls off
	require.Equal(t, []time.Time{at(0), at(1), at(2)}, h.due)
	require.False(t, h.drop(at(1)))
	require.Equal(t, []time.Time{at(2)}, h.due)
	require.True(t, h.drop(at(5)), "an incomplete horizon run out asks for a refill")

	h.fill([]time.Time{at(1)})
	require.True(t, h.complete)
	h.add(at(9)) // a complete horizon takes any later time
	require.Equal(t, []time.Time{at(1), at(9)}, h.due)
	require.False(t, h.drop(at(10)))
}

// memStore is a Store over a slice of due times; a promotion records when
// it ran for each time it took.
type memStore struct {
	mu       sync.Mutex
	due      []time.Time
	promoted map[time.Time]time.Time
	changed  chan struct{}
}

func (s *memStore) add(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.due = append(s.due, t)
	sort.Slice(s.due, func(i, j int) bool { return s.due[i].Before(s.due[j]) })
}

func (s *memStore) Upcoming(_ context.Context, _ TopicPartition, n int) ([]time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.due[:min(n, len(s.due))]...), nil
}

func (s *memStore) Promote(_ context.Context, _ TopicPartition, now time.Time, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < limit && len(s.due) > 0 && !s.due[0].After(now) {
		s.promoted[s.due[0]] = time.Now()
		s.due = s.due[1:]
		n++
	}
	if n > 0 {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	return n, nil
}

func (s *memStore) done(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.promoted) == n
}

// A loop promotes what is due, never before its time, including events it
// is told of after it went to sleep until one due in an hour (more than
// its horizon holds); Close returns after the loop exited.
func TestLoopPromotesAtDueTimes(t *testing.T) {
	st := &memStore{promoted: map[time.Time]time.Time{}, changed: make(chan struct{}, 1)}
	now := time.Now()
	late := now.Add(time.Hour)
	st.add(late)
	set := NewSet(Config{Store: st, Horizon: 2, Batch: 1, Refill: time.Hour, Backoff: retry.Backoff{Min: time.Millisecond, Max: 10 * time.Millisecond}})
	tp := TopicPartition{Topic: "t", Partition: 0}
	set.Assign([]TopicPartition{tp})
	set.Assign([]TopicPartition{tp}) // idempotent
	require.Equal(t, 1, set.Owned())
	early := time.Now().Add(100 * time.Millisecond)
	st.add(early)
	set.Notify(tp, early) // the loop sleeps until late: only the notification wakes it
	for _, extra := range []time.Duration{150, 160, 170} {
		t := now.Add(extra * time.Millisecond) // more than the horizon holds
		st.add(t)
		set.Notify(tp, t)
	}
	deadline := time.After(10 * time.Second)
	for !st.done(4) {
		select {
		case <-st.changed:
		case <-deadline:
			t.Fatal("not every event was promoted")
		}
	}
	set.Close()
	require.Equal(t, 0, set.Owned())
	for due, at := range st.promoted {
		require.False(t, at.Before(due), "promoted at %v, before its due time %v", at, due)
	}
	_, ok := st.promoted[late]
	require.False(t, ok, "promoted an hour early")
}

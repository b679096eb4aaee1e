package schedule

import (
	"slices"
	"time"
)

// horizon is the next due times of one partition, earliest first, at most
// max of them. When the index held more than max when it was read
// (complete is false), the horizon knows nothing after its last entry: an
// event due later is left to the next refill.
type horizon struct {
	max      int
	due      []time.Time
	complete bool
}

// fill replaces the horizon with due, as read from the index (at most
// max+1 entries: one more than max tells that more exist).
func (h *horizon) fill(due []time.Time) {
	h.complete = len(due) <= h.max
	if len(due) > h.max {
		due = due[:h.max]
	}
	h.due = append(h.due[:0], due...)
}

// add takes in a newly scheduled due time, if it falls inside the horizon.
func (h *horizon) add(t time.Time) {
	if !h.complete && (len(h.due) == 0 || !t.Before(h.due[len(h.due)-1])) {
		return // beyond what the horizon knows: the refill reads it
	}
	i, _ := slices.BinarySearchFunc(h.due, t, func(a, b time.Time) int { return a.Compare(b) })
	h.due = slices.Insert(h.due, i, t)
	if len(h.due) > h.max {
		h.due = h.due[:h.max]
		h.complete = false
	}
}

// next returns the first due time.
func (h *horizon) next() (time.Time, bool) {
	if len(h.due) == 0 {
		return time.Time{}, false
	}
	return h.due[0], true
}

// drop removes the due times at or before now; it reports whether the
// horizon must be read again (it ran out while the index held more).
func (h *horizon) drop(now time.Time) bool {
	i := 0
	for i < len(h.due) && !h.due[i].After(now) {
		i++
	}
	h.due = slices.Delete(h.due, 0, i)
	return len(h.due) == 0 && !h.complete
}

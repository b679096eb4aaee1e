package consume

import (
	"container/heap"
	"strconv"
	"time"
)

// The scheduler of one partition: which events may run now, together in
// one transaction or side by side, and which offset may be committed.
//
// Events of a partition key form a lane, in offset order; a lane runs one
// unit at a time, so the events of a key never run concurrently and never
// overtake each other. Events without a partition key promise no order:
// each is a lane of its own. A unit is either a run of deliveries (one
// transaction: several lanes' heads, and consecutive events of a lane, in
// offset order) or one step of a key's release (see Worker). Up to slots
// units run at once. A lane whose head waits for a retry sleeps until its
// time and holds nothing else: other lanes go on.
//
// The window holds every event taken from Kafka and not yet passed by the
// committed offset, in offset order; the committable offset is that of the
// first event not settled (handled, skipped, parked or held), or the one
// after the last event when all are. So a crash or a lost partition
// redelivers at most the window, and the inbox skips what was settled.
//
// The scheduler is a plain data structure owned by the worker goroutine.

// eventState is where an event is in its partition's scheduler.
type eventState uint8

const (
	stateWaiting eventState = iota
	stateRunning
	stateSettled
)

// lane is the unsettled events of one partition key, in offset order, and
// the key's pending release.
type lane struct {
	key    string
	events []*Event
	// busy is set while a unit holds the lane.
	busy bool
	// release is set while the key's held sequence has a step to run; its
	// next step may run at releaseAt.
	release   bool
	releaseAt time.Time
	// cursor counts the lane's events taken into the unit being formed.
	cursor int
	// idx is the lane's position in the ready heap, -1 when not in it.
	idx int
}

// head returns the lane's first unsettled event, or nil.
func (l *lane) head() *Event {
	if len(l.events) == 0 {
		return nil
	}
	return l.events[0]
}

// Unit is what one goroutine runs at a time for a partition: deliveries in
// offset order (Events), or one step of the release of Release's key.
type Unit struct {
	Events  []*Event
	Release string
	// IsRelease tells a release step from deliveries (a key may be "").
	IsRelease bool
	// suspect: one of the first units after the assignment (see
	// Worker.lookup).
	suspect bool
	// attempts is the first event's stored attempts when the unit started,
	// for Waits (the unit's goroutine owns its events while it runs).
	attempts int
	lanes    []*lane
}

// sched is the scheduling state of one partition.
type sched struct {
	slots   int // units that may run at once
	running int
	lanes   map[string]*lane
	ready   laneHeap          // lanes whose head may run now, by head offset
	asleep  map[*lane]bool    // lanes whose head waits for a retry time
	relQ    []*lane           // lanes with a release step pending, in request order
	window  []*Event          // taken events not passed by the committed offset
	next    int64             // offset after the last event added
	pending int               // events in the window not settled
	bytes   int               // payload bytes of the unsettled events
	last    *Event            // the last event added (epoch of the end offset)
	tookRel bool              // the last unit formed was a release step (fairness)
	batchOK func(*Event) bool // may the event share a transaction
}

func newSched(slots int, batchOK func(*Event) bool) *sched {
	return &sched{slots: max(slots, 1), lanes: map[string]*lane{}, asleep: map[*lane]bool{}, next: -1, batchOK: batchOK}
}

// laneKey is the lane of an event: its partition key, or a lane of its own
// for an event without one.
func laneKey(e *Event) string {
	if e.Key == "" {
		return "\x00" + strconv.FormatInt(e.Offset, 10)
	}
	return "k" + e.Key
}

// add appends events taken from Kafka, in offset order. Events at or
// before an offset already added are dropped: a poll that raced with a
// revoke and a new assignment may hand them over again, and they are
// fetched again from the committed offset if needed.
func (s *sched) add(evs []*Event, now time.Time) {
	for _, e := range evs {
		if s.next >= 0 && e.Offset < s.next {
			continue
		}
		s.next = e.Offset + 1
		s.last = e
		s.window = append(s.window, e)
		s.pending++
		s.bytes += e.Bytes
		k := laneKey(e)
		l := s.lanes[k]
		if l == nil {
			l = &lane{key: k, idx: -1}
			s.lanes[k] = l
		}
		l.events = append(l.events, e)
		if len(l.events) == 1 && !l.busy {
			s.place(l, now)
		}
	}
}

// place puts an idle lane where its head belongs: ready, asleep until its
// retry time, or nowhere (empty).
func (s *sched) place(l *lane, now time.Time) {
	delete(s.asleep, l)
	if l.idx >= 0 {
		heap.Remove(&s.ready, l.idx)
	}
	h := l.head()
	switch {
	case h == nil:
		if !l.release {
			delete(s.lanes, l.key)
		}
	case h.readyAt.After(now):
		s.asleep[l] = true
	default:
		heap.Push(&s.ready, l)
	}
}

// wake moves the lanes whose retry time has come to the ready heap and
// returns the earliest time something asleep becomes ready (zero: none).
func (s *sched) wake(now time.Time) time.Time {
	var next time.Time
	for l := range s.asleep {
		at := l.head().readyAt
		if !at.After(now) {
			delete(s.asleep, l)
			heap.Push(&s.ready, l)
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	for _, l := range s.relQ {
		if l.releaseAt.After(now) && (next.IsZero() || l.releaseAt.Before(next)) {
			next = l.releaseAt
		}
	}
	return next
}

// requestRelease asks for a release step of key (a partition key).
func (s *sched) requestRelease(key string, at time.Time) {
	k := "k" + key
	l := s.lanes[k]
	if l == nil {
		l = &lane{key: k, idx: -1}
		s.lanes[k] = l
	}
	if l.release {
		if at.Before(l.releaseAt) {
			l.releaseAt = at
		}
		return
	}
	l.release, l.releaseAt = true, at
	s.relQ = append(s.relQ, l)
}

// releasing reports whether key has a release step pending or running.
func (s *sched) releasing(key string) bool {
	l := s.lanes["k"+key]
	return l != nil && l.release
}

// next forms the next unit that may run now (maxBatch caps the events of a
// run of deliveries), or returns nil. Release steps and deliveries take
// turns when both wait, so neither starves the other.
func (s *sched) nextUnit(now time.Time, maxBatch int) *Unit {
	if s.running >= s.slots {
		return nil
	}
	if !s.tookRel || s.ready.Len() == 0 {
		if u := s.nextRelease(now); u != nil {
			s.tookRel = true
			s.running++
			return u
		}
	}
	if s.ready.Len() == 0 {
		return nil
	}
	s.tookRel = false
	s.running++
	return s.nextDeliveries(maxBatch)
}

// nextRelease takes a pending release step whose lane is idle, its time
// has come, and no delivery of the key waits (deliveries of a held key are
// added to its sequence first: they settle at once and the release takes
// them in turn).
func (s *sched) nextRelease(now time.Time) *Unit {
	for i, l := range s.relQ {
		if l.busy || l.releaseAt.After(now) {
			continue
		}
		if h := l.head(); h != nil && !h.readyAt.After(now) {
			continue
		}
		s.relQ = append(s.relQ[:i:i], s.relQ[i+1:]...)
		l.release = false
		s.hold(l)
		return &Unit{Release: l.key[1:], IsRelease: true, lanes: []*lane{l}}
	}
	return nil
}

// hold marks a lane busy and takes it out of the ready and asleep sets.
func (s *sched) hold(l *lane) {
	l.busy = true
	if l.idx >= 0 {
		heap.Remove(&s.ready, l.idx)
	}
	delete(s.asleep, l)
}

// nextDeliveries forms a run of deliveries from the ready lanes, in offset
// order: the first ready head, then, while they may share a transaction,
// the next heads and the following events of the lanes already taken.
func (s *sched) nextDeliveries(maxBatch int) *Unit {
	l := heap.Pop(&s.ready).(*lane)
	u := &Unit{}
	first := l.head()
	s.take(u, l)
	if !s.batchOK(first) || first.alone {
		s.finishForm(u)
		return u
	}
	for len(u.Events) < maxBatch && s.ready.Len() > 0 {
		cand := s.ready[0]
		e := cand.events[cand.cursor]
		if !s.batchOK(e) || e.alone || !e.readyAt.IsZero() {
			break
		}
		heap.Pop(&s.ready)
		s.take(u, cand)
	}
	s.finishForm(u)
	return u
}

// take adds the lane's next event to u and puts the lane back into the
// heap (by its following event) when that one may join too.
func (s *sched) take(u *Unit, l *lane) {
	if l.cursor == 0 {
		u.lanes = append(u.lanes, l)
	}
	e := l.events[l.cursor]
	e.state = stateRunning
	u.Events = append(u.Events, e)
	l.cursor++
	if l.cursor < len(l.events) {
		n := l.events[l.cursor]
		if s.batchOK(n) && !n.alone && n.readyAt.IsZero() && n.state == stateWaiting {
			heap.Push(&s.ready, l)
		}
	}
}

// finishForm marks the unit's lanes busy once the unit is formed.
func (s *sched) finishForm(u *Unit) {
	for _, l := range u.lanes {
		l.cursor = 0
		s.hold(l)
	}
}

// Outcome is what became of an event of a unit.
type Outcome struct {
	// Settled: handled, skipped, parked or held; its offset may be passed.
	Settled bool
	// RetryAt, when not settled, is when the event may run again (zero:
	// at once). Alone asks for a transaction of its own next time.
	RetryAt time.Time
	Alone   bool
}

// done records the outcomes of a unit of deliveries (one per event; events
// past the outcomes' length are not settled and may run again at once).
func (s *sched) done(u *Unit, outs []Outcome, now time.Time) {
	s.running--
	for i, e := range u.Events {
		var o Outcome
		if i < len(outs) {
			o = outs[i]
		}
		if o.Settled {
			s.settle(e)
			continue
		}
		e.state = stateWaiting
		e.readyAt = o.RetryAt
		e.alone = e.alone || o.Alone
	}
	for _, l := range u.lanes {
		l.busy = false
		// Settled events leave their lane from the front, in order.
		n := 0
		for n < len(l.events) && l.events[n].state == stateSettled {
			n++
		}
		l.events = l.events[n:]
		s.place(l, now)
	}
}

// releaseDone records the end of a release step: more asks for another
// step at at (zero: as soon as possible).
func (s *sched) releaseDone(u *Unit, more bool, at time.Time, now time.Time) {
	s.running--
	l := u.lanes[0]
	l.busy = false
	switch {
	case more && l.release: // asked again while the step ran
		if at.Before(l.releaseAt) {
			l.releaseAt = at
		}
	case more:
		l.release, l.releaseAt = true, at
		s.relQ = append(s.relQ, l)
	}
	s.place(l, now)
}

func (s *sched) settle(e *Event) {
	e.state = stateSettled
	s.pending--
	s.bytes -= e.Bytes
	e.Data = nil // the payload is not needed any more
}

// committable returns the offset the partition may commit (the first
// unsettled event's, or the one after the last event) and the leader
// epoch to commit with; ok is false when nothing was added yet. Events
// passed by it leave the window.
func (s *sched) committable() (offset int64, epoch int32, ok bool) {
	n := 0
	for n < len(s.window) && s.window[n].state == stateSettled {
		n++
	}
	clear(s.window[:n])
	s.window = s.window[n:]
	if len(s.window) > 0 {
		return s.window[0].Offset, s.window[0].Epoch, true
	}
	if s.last == nil {
		return 0, 0, false
	}
	return s.last.Offset + 1, s.last.Epoch, true
}

// lookahead is how many events the window holds past the committable
// offset, settled or not: what a crash would redeliver.
func (s *sched) lookahead() int { return len(s.window) }

// laneHeap orders ready lanes by the offset of the event they would give
// next.
type laneHeap []*lane

func (h laneHeap) Len() int { return len(h) }
func (h laneHeap) Less(i, j int) bool {
	return h[i].events[h[i].cursor].Offset < h[j].events[h[j].cursor].Offset
}
func (h laneHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *laneHeap) Push(x any) {
	l := x.(*lane)
	l.idx = len(*h)
	*h = append(*h, l)
}
func (h *laneHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.idx = -1
	*h = old[:len(old)-1]
	return l
}

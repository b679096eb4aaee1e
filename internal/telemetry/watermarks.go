package telemetry

import "sync"

// Partition names a topic's partition.
type Partition struct {
	Topic     string
	Partition int32
}

// Watermarks are the ends of the handled partitions as the consumer saw
// them: high watermarks listed by its lag poller or seen in fetches, log
// start offsets listed by the lag poller. The lag gauge reads them, so no
// Kafka request is made per scrape, and a partition that is not fetched
// (stalled, paused) still shows its lag growing.
type Watermarks struct {
	mu  sync.Mutex
	hwm map[Partition]int64
	lwm map[Partition]int64
}

// Fetched raises a partition's high watermark to one seen in a fetch. A
// fetch only raises it: its watermark may be older than the lag poller's
// last listing.
func (w *Watermarks) Fetched(p Partition, hwm int64) {
	if hwm < 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if hwm > w.hwm[p] {
		w.setLocked(p, hwm)
	}
}

// Listed sets a partition's high watermark as the lag poller listed it,
// the authority (it may also lower it, after a truncation).
func (w *Watermarks) Listed(p Partition, hwm int64) {
	if hwm < 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setLocked(p, hwm)
}

func (w *Watermarks) setLocked(p Partition, hwm int64) {
	if w.hwm == nil {
		w.hwm = map[Partition]int64{}
	}
	w.hwm[p] = hwm
}

// SetLogStart sets a partition's log start offset, listed by the lag
// poller.
func (w *Watermarks) SetLogStart(p Partition, lwm int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lwm == nil {
		w.lwm = map[Partition]int64{}
	}
	w.lwm[p] = lwm
}

// Ends returns a partition's high watermark (listed or fetched) and log
// start offset (listed; 0 when not listed yet); ok is false when no
// watermark is known.
func (w *Watermarks) Ends(p Partition) (hwm, logStart int64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	hwm, ok = w.hwm[p]
	return hwm, w.lwm[p], ok
}

// Lag returns, per partition of owned, the high watermark minus the
// committed offset, or minus the log start offset when committed has none
// for the partition (a new group stalled on its first record shows its lag
// too); partitions without a known watermark are left out.
func (w *Watermarks) Lag(owned []Partition, committed func(Partition) (int64, bool)) map[Partition]int64 {
	out := map[Partition]int64{}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range owned {
		hwm, ok := w.hwm[p]
		if !ok {
			continue
		}
		from := w.lwm[p]
		if co, ok := committed(p); ok && co >= 0 {
			from = co
		}
		out[p] = max(hwm-from, 0)
	}
	return out
}

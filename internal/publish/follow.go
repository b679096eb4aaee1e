package publish

// The state a worker shares with the change-stream watcher: which stream
// covers the partition, whether the worker follows it, and the events the
// stream delivered. See Worker for the rule that switches modes.

// attach records that stream id now covers the partition, and resets: the
// worker scans, then follows.
func (w *Worker) attach(id uint64) {
	w.mu.Lock()
	w.streamID = id
	w.resetLocked()
	w.mu.Unlock()
	w.Wake()
}

// detach records that stream id ended; the worker scans until another
// stream covers it.
func (w *Worker) detach(id uint64) {
	w.mu.Lock()
	if w.streamID == id {
		w.streamID = 0
		w.resetLocked()
	}
	w.mu.Unlock()
	w.Wake()
}

// push hands the worker an event that stream id delivered. Events of
// another stream are ignored: the scan that follows the attach of the
// current stream covers them. When the buffer is full the worker drops it
// and scans instead.
func (w *Worker) push(id uint64, it Item) {
	w.mu.Lock()
	if w.streamID != id || id == 0 {
		w.mu.Unlock()
		return
	}
	size := recordSize(it)
	if len(w.buffer) >= w.bufferCap() || (len(w.buffer) > 0 && w.bufBytes+size > w.bufferBytesCap()) {
		w.resetLocked()
		w.mu.Unlock()
		w.cfg.Logger.Debug("outbox publisher: stream buffer full; scanning", "partition", w.tp.String())
		w.Wake()
		return
	}
	w.buffer = append(w.buffer, it)
	w.bufBytes += size
	w.mu.Unlock()
	w.Wake()
}

// defaultBatchBytes caps, by default, both what a scan reads per round and
// what the stream buffer holds, per partition.
const defaultBatchBytes = 16 << 20

func (w *Worker) bufferBytesCap() int {
	if w.cfg.StreamBufferBytes > 0 {
		return w.cfg.StreamBufferBytes
	}
	return defaultBatchBytes
}

// scanLimit bounds one scan: BatchSize events and BatchBytes bytes.
func (w *Worker) scanLimit() Limit {
	l := Limit{Events: w.cfg.BatchSize, Bytes: w.cfg.BatchBytes}
	if l.Bytes <= 0 {
		l.Bytes = defaultBatchBytes
	}
	return l
}

// recordSize approximates the memory an item's record holds.
func recordSize(it Item) int {
	if it.Record == nil {
		return 0
	}
	n := len(it.Record.Key) + len(it.Record.Value)
	for _, h := range it.Record.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (w *Worker) bufferCap() int {
	if w.cfg.StreamBuffer > 0 {
		return w.cfg.StreamBuffer
	}
	return 4 * w.cfg.BatchSize
}

// reset makes the worker scan before it follows again. With id != 0 it
// only acts while stream id covers the partition.
func (w *Worker) reset(id uint64) {
	w.mu.Lock()
	if id == 0 || w.streamID == id {
		w.resetLocked()
	}
	w.mu.Unlock()
	w.Wake()
}

func (w *Worker) resetLocked() {
	w.following = false
	w.epoch++
	clear(w.buffer)
	w.buffer = w.buffer[:0]
	w.bufBytes = 0
}

// epochNow returns the reset count, read before a scan begins.
func (w *Worker) epochNow() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch
}

// follow switches to following after a scan that began at epoch and read
// less than a full batch, when no reset happened since and a stream covers
// the partition. It reports whether the worker follows.
func (w *Worker) follow(epoch uint64) bool {
	if w.cfg.Marker == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.epoch == epoch && w.streamID != 0 {
		w.following = true
	}
	return w.following
}

// takeBuffered returns up to BatchSize buffered events not produced yet,
// and ok when the worker follows the stream.
func (w *Worker) takeBuffered() (items []Item, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.following {
		return nil, false
	}
	n := 0
	for n < len(w.buffer) && len(items) < w.cfg.BatchSize {
		it := w.buffer[n]
		n++
		w.bufBytes -= recordSize(it)
		if !w.recent.has(it.ID) {
			items = append(items, it)
		}
	}
	rest := copy(w.buffer, w.buffer[n:])
	clear(w.buffer[rest:])
	w.buffer = w.buffer[:rest]
	return items, true
}

// Following reports whether the worker follows the change stream; for
// tests and status.
func (w *Worker) Following() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.following
}

// recentIDs remembers the last max ids a worker produced, to skip events
// that both a scan and the stream delivered. Ids must be comparable.
type recentIDs struct {
	max  int
	ring []any
	next int
	set  map[any]struct{}
}

func (r *recentIDs) add(ids []any) {
	if r.max <= 0 {
		return
	}
	for _, id := range ids {
		if r.has(id) {
			continue
		}
		if len(r.ring) < r.max {
			r.ring = append(r.ring, id)
		} else {
			delete(r.set, r.ring[r.next])
			r.ring[r.next] = id
			r.next = (r.next + 1) % r.max
		}
		r.set[id] = struct{}{}
	}
}

func (r *recentIDs) has(id any) bool {
	_, ok := r.set[id]
	return ok
}

package main

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/tuning"
)

// The Kafka side of the run, as the replicas' own clients saw it: every
// record each replica's producer finished (a produce hook), the intervals
// in which each replica's publisher owned each partition (a callback of the
// publisher, internal/tuning), every record each replica's consumer polled
// (a fetch hook), and the clients themselves (the offset rewind needs a
// live member's identity). The hooks are added through Config.KafkaOptions
// (kgo.WithHooks), which the framework passes to every client it creates.

// recordPos is a record's place in the topics.
type recordPos struct {
	Topic     string
	Partition int32
	Offset    int64
}

// recordPosID is a record's place and its idempotency key header.
type recordPosID struct {
	recordPos
	ID string
}

// idOf is a record's idempotency key header, or its event-outbox body's
// idempotency key (a record of the Python library has no header), or "".
func idOf(r *kgo.Record) string {
	if id := headerValue(r, outbox.HeaderIdempotencyKey); id != "" {
		return id
	}
	id, _ := bodyIdentity(r)
	return id
}

// doubtKey identifies a record whose produce failed: it may be in the
// topic, at an unknown offset.
type doubtKey struct {
	Topic     string
	Partition int32
	ID        string
}

// pubRecord is one record a replica's producer finished.
type pubRecord struct {
	Replica   string
	Topic     string
	Partition int32
	Offset    int64  // meaningless when Err
	ID        string // the record's idempotency key header
	Buffered  time.Time
	Done      time.Time
	Err       bool // the promise failed: the record may still be in the topic (in doubt)
}

// ownership is an interval in which a replica's publisher owned a
// partition: from the assignment (before its worker started) to the revoke
// or loss (after its worker stopped); To is zero while still owned.
type ownership struct {
	Replica   string
	Topic     string
	Partition int32
	From, To  time.Time
	Ended     string // "revoked", "lost", or "" while owned
}

// interruption is a replica's kill or graceful stop.
type interruption struct {
	Replica string
	At      time.Time
	Kind    string // "kill" or "stop"
}

// poll is one delivery of a record to a replica's consumer.
type poll struct {
	Topic, ID string
	At        time.Time
}

// kafkaLog gathers the Kafka facts of a run. Safe for concurrent use.
type kafkaLog struct {
	mu            sync.Mutex
	buffered      map[*kgo.Record]pubRecord // handed to a producer, not yet completed
	produced      []pubRecord
	owned         []ownership
	open          map[ownKey]int // index in owned of the open intervals
	polls         []poll
	clients       map[string][]*kgo.Client // by replica
	replicaOf     map[any]string           // *outbox.Client -> replica
	interruptions []interruption
	gone          map[string]time.Time // replica -> when it could produce no more (kill, or Run returned)
	recent        []*kgo.Record        // a ring of small records produced lately, for the rogue producer
	recentNext    int
	rogue         map[recordPos]bool // the rogue producer's records
	rogueDoubt    map[doubtKey]int   // the rogue producer's failed records (maybe in the topic)
	// fetched is how far each replica's consumer client fetched and
	// polled each partition, for the report of a stalled partition.
	fetched map[ownKey]*fetchMark
	// watched is each fetch watch's last verdict on a partition it owns
	// (tuning.FetchWatchTrace), with its time.
	watched map[ownKey]string
}

// fetchMark is the highest offset a replica's client buffered (fetched)
// and handed to a poll for one partition, and when.
type fetchMark struct {
	Buffered, Polled     int64
	BufferedAt, PolledAt time.Time
	// Last is the last record fetched, whatever its offset (a client
	// fetching old records again shows here, not in Buffered).
	Last   int64
	LastAt time.Time
}

type ownKey struct {
	replica, topic string
	partition      int32
}

// recentRecords bounds the ring the rogue producer samples from.
const recentRecords = 8192

func newKafkaLog() *kafkaLog {
	return &kafkaLog{buffered: map[*kgo.Record]pubRecord{}, open: map[ownKey]int{}, clients: map[string][]*kgo.Client{},
		replicaOf: map[any]string{}, gone: map[string]time.Time{}, rogue: map[recordPos]bool{}, rogueDoubt: map[doubtKey]int{},
		fetched: map[ownKey]*fetchMark{}, watched: map[ownKey]string{}}
}

// install makes the log receive every publisher's ownership changes and
// every fetch watch verdict.
func (l *kafkaLog) install() {
	f := l.ownershipChanged
	tuning.PublisherOwnership.Store(&f)
	w := l.fetchWatched
	tuning.FetchWatchTrace.Store(&w)
}

// uninstall undoes install.
func (l *kafkaLog) uninstall() {
	tuning.PublisherOwnership.Store(nil)
	tuning.FetchWatchTrace.Store(nil)
}

// fetchWatched keeps a fetch watch's last verdict on a partition.
func (l *kafkaLog) fetchWatched(owner any, topic string, partition int32, verdict string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	replica, ok := l.replicaOf[owner]
	if !ok {
		return
	}
	l.watched[ownKey{replica, bareTopic(topic), partition}] = fmt.Sprintf("%s (%s)", verdict, now.Format(tsFormat))
}

// register names the replica of an outbox client, before it runs.
func (l *kafkaLog) register(client *outbox.Client, replica string) {
	l.mu.Lock()
	l.replicaOf[client] = replica
	l.mu.Unlock()
}

// ownershipChanged is the publishers' callback.
func (l *kafkaLog) ownershipChanged(owner any, change string, partitions map[string][]int32) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	replica, ok := l.replicaOf[owner]
	if !ok {
		return
	}
	for ktopic, ps := range partitions {
		topic := bareTopic(ktopic)
		for _, p := range ps {
			k := ownKey{replica, topic, p}
			i, isOpen := l.open[k]
			switch {
			case change == "assigned" && !isOpen:
				l.open[k] = len(l.owned)
				l.owned = append(l.owned, ownership{Replica: replica, Topic: topic, Partition: p, From: now})
			case change != "assigned" && isOpen:
				l.owned[i].To, l.owned[i].Ended = now, change
				delete(l.open, k)
			}
		}
	}
}

// publishing reports whether a replica's publisher owns partitions now.
func (l *kafkaLog) publishing(replica string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.open {
		if k.replica == replica {
			return true
		}
	}
	return false
}

// interrupted notes a kill or stop; a killed replica can produce nothing
// from then on (its network is cut).
func (l *kafkaLog) interrupted(replica, kind string) {
	now := time.Now()
	l.mu.Lock()
	l.interruptions = append(l.interruptions, interruption{Replica: replica, At: now, Kind: kind})
	if kind == "kill" {
		l.goneAt(replica, now)
	}
	l.mu.Unlock()
}

// killedAt returns when a replica was killed.
func (l *kafkaLog) killedAt(replica string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, in := range l.interruptions {
		if in.Replica == replica && in.Kind == "kill" {
			return in.At, true
		}
	}
	return time.Time{}, false
}

// ended notes that a replica's Run returned: it produces no more.
func (l *kafkaLog) ended(replica string) {
	l.mu.Lock()
	l.goneAt(replica, time.Now())
	l.mu.Unlock()
}

func (l *kafkaLog) goneAt(replica string, t time.Time) {
	if g, ok := l.gone[replica]; !ok || t.Before(g) {
		l.gone[replica] = t
	}
}

// unfinished returns the produces no promise ever completed, as failed
// ones (in doubt: they may be in the topic): a replica killed with records
// in flight, its client abandoned, never hears how they went. They end
// when the replica was gone, or at now. Under l.mu.
func (l *kafkaLog) unfinished(now time.Time) []pubRecord {
	var out []pubRecord
	for _, p := range l.buffered {
		p.Err, p.Done = true, now
		if g, ok := l.gone[p.Replica]; ok && g.After(p.Buffered) {
			p.Done = g
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b pubRecord) int { return a.Buffered.Compare(b.Buffered) })
	return out
}

// hooks returns the kgo hooks of a replica's clients.
func (l *kafkaLog) hooks(replica string) kgo.Opt { return kgo.WithHooks(replicaHooks{l, replica}) }

// replicaHooks are one replica's kgo hooks.
type replicaHooks struct {
	l       *kafkaLog
	replica string
}

func (k replicaHooks) OnNewClient(cl *kgo.Client) {
	k.l.mu.Lock()
	k.l.clients[k.replica] = append(k.l.clients[k.replica], cl)
	k.l.mu.Unlock()
}

func (k replicaHooks) OnProduceRecordBuffered(r *kgo.Record) {
	// The publisher partitions its records itself: the partition is known.
	p := pubRecord{Replica: k.replica, Topic: bareTopic(r.Topic), Partition: r.Partition, ID: idOf(r), Buffered: time.Now()}
	k.l.mu.Lock()
	k.l.buffered[r] = p
	k.l.mu.Unlock()
}

func (k replicaHooks) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	now := time.Now()
	p := pubRecord{Replica: k.replica, Topic: bareTopic(r.Topic), Partition: r.Partition, Offset: r.Offset, ID: idOf(r),
		Done: now, Err: err != nil}
	k.l.mu.Lock()
	defer k.l.mu.Unlock()
	p.Buffered = k.l.buffered[r].Buffered
	delete(k.l.buffered, r)
	if p.Buffered.IsZero() {
		p.Buffered = now
	}
	k.l.produced = append(k.l.produced, p)
	if err == nil && len(r.Value) <= 4096 {
		c := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: slices.Clone(r.Headers)}
		if len(k.l.recent) < recentRecords {
			k.l.recent = append(k.l.recent, c)
		} else {
			k.l.recent[k.l.recentNext] = c
			k.l.recentNext = (k.l.recentNext + 1) % recentRecords
		}
	}
}

func (k replicaHooks) OnFetchRecordBuffered(r *kgo.Record) {
	now := time.Now()
	k.l.mu.Lock()
	m := k.l.mark(k.replica, r)
	if r.Offset >= m.Buffered {
		m.Buffered, m.BufferedAt = r.Offset, now
	}
	m.Last, m.LastAt = r.Offset, now
	k.l.mu.Unlock()
}

func (k replicaHooks) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled {
		return
	}
	p := poll{Topic: bareTopic(r.Topic), ID: idOf(r), At: time.Now()}
	k.l.mu.Lock()
	k.l.polls = append(k.l.polls, p)
	m := k.l.mark(k.replica, r)
	if r.Offset >= m.Polled {
		m.Polled, m.PolledAt = r.Offset, p.At
	}
	k.l.mu.Unlock()
}

// mark returns the fetch mark of r's partition in replica's client. Under
// l.mu.
func (l *kafkaLog) mark(replica string, r *kgo.Record) *fetchMark {
	key := ownKey{replica, bareTopic(r.Topic), r.Partition}
	m := l.fetched[key]
	if m == nil {
		m = &fetchMark{Buffered: -1, Polled: -1}
		l.fetched[key] = m
	}
	return m
}

// fetchedBy describes how far replica's clients fetched and polled a
// partition (bare topic), and whether its client in group has it paused.
func (l *kafkaLog) fetchedBy(replica, group, topic string, partition int32) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	paused := "not paused in its client"
	for _, cl := range l.clients[replica] {
		if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != group {
			continue
		}
		for t, ps := range cl.PauseFetchPartitions(nil) {
			if bareTopic(t) == topic && slices.Contains(ps, partition) {
				paused = "PAUSED in its client"
			}
		}
	}
	watch := ", its fetch watch said nothing of it"
	if v, ok := l.watched[ownKey{replica, topic, partition}]; ok {
		watch = ", its fetch watch's last verdict: " + v
	}
	m := l.fetched[ownKey{replica, topic, partition}]
	if m == nil {
		return "its clients fetched nothing of it, " + paused + watch
	}
	return fmt.Sprintf("its clients fetched up to offset %d (%s), last offset %d (%s), and polled up to %d (%s), %s%s",
		m.Buffered, m.BufferedAt.Format(tsFormat), m.Last, m.LastAt.Format(tsFormat), m.Polled, m.PolledAt.Format(tsFormat), paused, watch)
}

// consumerMember returns the member id and generation of the consumer
// group client of the first of the replicas that has one, or ok false.
func (l *kafkaLog) consumerMember(group string, live []string) (member string, generation int32, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, name := range live {
		for _, cl := range l.clients[name] {
			if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != group {
				continue
			}
			if m, gen := cl.GroupMetadata(); m != "" && gen > 0 {
				return m, gen, true
			}
		}
	}
	return "", 0, false
}

// sample returns up to n of the recently produced small records, spread
// over the ring.
func (l *kafkaLog) sample(n int, pick func(int) int) []*kgo.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recent) == 0 {
		return nil
	}
	out := make([]*kgo.Record, 0, n)
	for range n {
		r := l.recent[pick(len(l.recent))]
		out = append(out, &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers})
	}
	return out
}

// noteRogue records the rogue producer's records: those produced, and
// those whose produce failed (they may be in the topic all the same).
func (l *kafkaLog) noteRogue(ok, doubt []recordPosID) {
	l.mu.Lock()
	for _, r := range ok {
		l.rogue[r.recordPos] = true
	}
	for _, r := range doubt {
		l.rogueDoubt[doubtKey{r.Topic, r.Partition, r.ID}]++
	}
	l.mu.Unlock()
}

// headerValue returns a record's header, or "".
func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

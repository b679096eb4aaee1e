package telemetry

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"

	"github.com/event-outbox/outbox/internal/consume"
)

// Backlog is one publish topic's storage gauges.
type Backlog struct {
	Topic                                 string
	Pending, Failed, HeldKeys, HeldEvents int64
	OldestPending                         time.Duration
	// Scheduled events wait for their due time; NextDue is the earliest
	// (zero: none).
	Scheduled int64
	NextDue   time.Time
}

// Storage is what the storage gauges observe: the outbox's backlog per
// topic and the inbox's parked and held counts.
type Storage struct {
	Topics       []Backlog
	Parked, Held int64
}

// Gauges says where the observable gauges read their values. The meter
// calls each function on its collection goroutine, once per collection.
type Gauges struct {
	// Owned returns the number of partitions the role ("publisher" or
	// "consumer") owns.
	Owned func(role string) int
	// Lag returns the lag of each handled partition.
	Lag func() map[Partition]int64
	// Consumer returns the running consumer's per-partition stats and
	// waits; ok is false when no consumer runs.
	Consumer func() (stats map[consume.TopicPartition]consume.Stats, waits []consume.Wait, ok bool)
	// Storage returns the storage gauges' values; its error fails the
	// collection's callback (the meter reports it).
	Storage func(ctx context.Context) (Storage, error)
	// PublishTopics are the topics whose storage gauges read 0 rather
	// than vanish when nothing waits: dashboards and absence alerts then
	// see a steady series.
	PublishTopics []string
}

// RegisterGauges registers one callback observing every gauge but the
// doctor's from g. The caller unregisters it when the values it reads stop
// being kept (Run's end).
func (ins *Instruments) RegisterGauges(meter metric.Meter, g Gauges) (metric.Registration, error) {
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, role := range []string{"publisher", "consumer"} {
			o.ObserveInt64(ins.Owned, int64(g.Owned(role)), metric.WithAttributes(AttrRole.String(role)))
		}
		for p, lag := range g.Lag() {
			o.ObserveInt64(ins.Lag, lag, PartitionAttrs(p.Topic, p.Partition))
		}
		if stats, waits, ok := g.Consumer(); ok {
			ins.ObserveConsumer(o, stats, waits)
		}
		st, err := g.Storage(ctx)
		if err != nil {
			return err
		}
		seen := make(map[string]bool, len(st.Topics))
		for _, b := range st.Topics {
			seen[b.Topic] = true
			ins.observeBacklog(o, b)
		}
		for _, topic := range g.PublishTopics {
			if !seen[topic] {
				ins.observeBacklog(o, Backlog{Topic: topic})
			}
		}
		o.ObserveInt64(ins.ParkedNow, st.Parked)
		o.ObserveInt64(ins.Held, st.Held)
		return nil
	}, ins.Pending, ins.Failed, ins.ParkedNow, ins.Held, ins.Owned, ins.Lag, ins.OldestPending, ins.HeldKeys, ins.HeldEvents,
		ins.Scheduled, ins.NextDue, ins.InFlight, ins.Waiting, ins.WaitAge)
}

func (ins *Instruments) observeBacklog(o metric.Observer, b Backlog) {
	attrs := TopicAttrs(b.Topic)
	o.ObserveInt64(ins.Pending, b.Pending, attrs)
	o.ObserveInt64(ins.Failed, b.Failed, attrs)
	o.ObserveInt64(ins.HeldKeys, b.HeldKeys, attrs)
	o.ObserveInt64(ins.HeldEvents, b.HeldEvents, attrs)
	o.ObserveFloat64(ins.OldestPending, b.OldestPending.Seconds(), attrs)
	o.ObserveInt64(ins.Scheduled, b.Scheduled, attrs)
	if !b.NextDue.IsZero() {
		o.ObserveFloat64(ins.NextDue, time.Until(b.NextDue).Seconds(), attrs)
	}
}

// ConsumerLag returns the lag of each owned partition (see Lag), measured
// from the group's committed offsets. committed is keyed by the topics'
// names on the brokers, which kafkaTopic gives for a bare topic name.
func (w *Watermarks) ConsumerLag(owned []consume.TopicPartition, committed map[string]map[int32]kgo.EpochOffset, kafkaTopic func(string) string) map[Partition]int64 {
	ps := make([]Partition, len(owned))
	for i, tp := range owned {
		ps[i] = Partition{Topic: tp.Topic, Partition: tp.Partition}
	}
	return w.Lag(ps, func(p Partition) (int64, bool) {
		co, ok := committed[kafkaTopic(p.Topic)][p.Partition]
		return co.Offset, ok
	})
}

// Committed counts the events of a committed transaction by topic, and
// those of them whose payload went out of band (claims).
func (ins *Instruments) Committed(ctx context.Context, counts, claims map[string]int64) {
	for topic, n := range counts {
		ins.Recorded.Add(ctx, n, TopicAttrs(topic))
	}
	for topic, n := range claims {
		ins.ClaimStored.Add(ctx, n, TopicAttrs(topic))
	}
}

// Rebalanced counts one assignment change of role ("publisher",
// "consumer") by change ("assigned", "revoked", "lost"), unless it moved
// no partition.
func (ins *Instruments) Rebalanced(role, change string, parts map[string][]int32) {
	n := 0
	for _, ps := range parts {
		n += len(ps)
	}
	if n == 0 {
		return
	}
	ins.Rebalances.Add(context.Background(), 1, metric.WithAttributes(AttrRole.String(role), AttrChange.String(change)))
}

// FetchRestarted counts a restart of a partition's fetching, by how
// ("set_offsets", "resubscribe").
func (ins *Instruments) FetchRestarted(topic string, partition int32, how string) {
	ins.FetchRestarts.Add(context.Background(), 1, PartitionAttrs(topic, partition, AttrReason.String(how)))
}

package telemetry

import (
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Attribute keys. Topic and partition follow the OpenTelemetry messaging
// semantic conventions; the others are part of the metrics' contract.
const (
	AttrTopic     = attribute.Key("messaging.destination.name")
	AttrPartition = attribute.Key("messaging.destination.partition.id")
	AttrSchema    = attribute.Key("outbox.content_schema")
	AttrReason    = attribute.Key("outbox.reason")
	AttrOutcome   = attribute.Key("outbox.outcome")
	AttrRole      = attribute.Key("outbox.role")
	AttrChange    = attribute.Key("outbox.change")
	AttrWait      = attribute.Key("outbox.wait")
	AttrSeverity  = attribute.Key("outbox.severity")
)

// Measurement options are cached by attribute values: building an
// attribute set sorts and allocates, and the same few combinations recur
// for every event. The cache is capped, so that arbitrary names (the
// schema of a malformed record) cannot grow it without bound.
var (
	attrCache     sync.Map // AttrKey -> metric.MeasurementOption
	attrCacheSize atomic.Int64
)

const attrCacheMax = 4096

// AttrKey identifies a cached attribute set: a topic, an optional schema,
// at most one more string attribute.
type AttrKey struct {
	Topic, Schema string
	HasSchema     bool
	Extra         attribute.Key // "": none
	ExtraValue    string
}

// CachedAttrs returns the measurement option of k's attributes.
func CachedAttrs(k AttrKey) metric.MeasurementOption {
	if o, ok := attrCache.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{AttrTopic.String(k.Topic)}
	if k.HasSchema {
		kvs = append(kvs, AttrSchema.String(k.Schema))
	}
	if k.Extra != "" {
		kvs = append(kvs, k.Extra.String(k.ExtraValue))
	}
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	if attrCacheSize.Load() < attrCacheMax {
		if _, loaded := attrCache.LoadOrStore(k, o); !loaded {
			attrCacheSize.Add(1)
		}
	}
	return o
}

// TopicAttrs returns the measurement option of a topic alone.
func TopicAttrs(topic string) metric.MeasurementOption {
	return CachedAttrs(AttrKey{Topic: topic})
}

// PartitionAttrs returns the attributes of a topic's partition, plus extra.
func PartitionAttrs(topic string, partition int32, extra ...attribute.KeyValue) metric.MeasurementOption {
	kvs := append([]attribute.KeyValue{AttrTopic.String(topic), AttrPartition.String(strconv.Itoa(int(partition)))}, extra...)
	return metric.WithAttributes(kvs...)
}

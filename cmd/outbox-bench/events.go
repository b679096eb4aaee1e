package main

import (
	"strconv"
	"strings"
)

// Topic names of the benchmark. They get a per-run suffix (see setTopics) so
// that runs against shared real brokers never see each other's records.
var topics = struct {
	relay, floor, raw, naive, poll, latency, pollLatency, consume, memory string
	// The keyconc phase: the slow handler's backlog, its latency runs (one
	// topic per key concurrency), the trivial handler's backlog; the
	// takeover phase's backlog.
	kcSlow, kcLat1, kcLatHigh, kcTrivial, takeover string
}{}

func setTopics(suffix string) {
	topics.relay = "bench.relay." + suffix
	topics.floor = "bench.floor." + suffix
	topics.raw = "bench.raw." + suffix
	topics.naive = "bench.naive." + suffix
	topics.poll = "bench.poll." + suffix
	topics.latency = "bench.latency." + suffix
	topics.pollLatency = "bench.poll-latency." + suffix
	topics.consume = "bench.consume." + suffix
	topics.memory = "bench.memory." + suffix
	topics.kcSlow = "bench.kc-slow." + suffix
	topics.kcLat1 = "bench.kc-lat-1." + suffix
	topics.kcLatHigh = "bench.kc-lat-high." + suffix
	topics.kcTrivial = "bench.kc-trivial." + suffix
	topics.takeover = "bench.takeover." + suffix
}

func allTopics() []string {
	return []string{topics.relay, topics.floor, topics.raw, topics.naive, topics.poll, topics.latency,
		topics.pollLatency, topics.consume, topics.memory, topics.kcSlow, topics.kcLat1, topics.kcLatHigh,
		topics.kcTrivial, topics.takeover}
}

// payload is the body of every benchmark event: a sequence number and
// padding up to the requested event size.
type payload struct {
	N    int    `json:"n"`
	Data string `json:"data"`
}

// newPayload returns a payload whose JSON encoding is about size bytes.
func newPayload(n, size int) payload {
	pad := size - len(`{"n":,"data":""}`) - len(strconv.Itoa(n))
	return payload{N: n, Data: strings.Repeat("x", max(pad, 0))}
}

func keyOf(n int) string { return "key-" + strconv.Itoa(n) }

// kcKeys is how many partition keys the keyconc phase's events spread over.
const kcKeys = 1000

// kcKeyOf is the key of event n of the keyconc phase: one of kcKeys.
func kcKeyOf(n int) string { return "key-" + strconv.Itoa((n%kcKeys+kcKeys)%kcKeys) }

// One event type per topic: an event's topic is a method of its type.
type (
	relayEvent       struct{ payload }
	floorEvent       struct{ payload }
	naiveEvent       struct{ payload }
	pollEvent        struct{ payload }
	latencyEvent     struct{ payload }
	pollLatencyEvent struct{ payload }
	consumeEvent     struct{ payload }
	memoryEvent      struct{ payload }
	kcSlowEvent      struct{ payload }
	kcLat1Event      struct{ payload }
	kcLatHighEvent   struct{ payload }
	kcTrivialEvent   struct{ payload }
	takeoverEvent    struct{ payload }
)

func (relayEvent) Topic() string                { return topics.relay }
func (relayEvent) ContentSchema() string        { return "BenchRelay.v1" }
func (e relayEvent) PartitionKey() string       { return keyOf(e.N) }
func (floorEvent) Topic() string                { return topics.floor }
func (floorEvent) ContentSchema() string        { return "BenchFloor.v1" }
func (e floorEvent) PartitionKey() string       { return keyOf(e.N) }
func (naiveEvent) Topic() string                { return topics.naive }
func (naiveEvent) ContentSchema() string        { return "BenchNaive.v1" }
func (e naiveEvent) PartitionKey() string       { return keyOf(e.N) }
func (pollEvent) Topic() string                 { return topics.poll }
func (pollEvent) ContentSchema() string         { return "BenchPoll.v1" }
func (e pollEvent) PartitionKey() string        { return keyOf(e.N) }
func (latencyEvent) Topic() string              { return topics.latency }
func (latencyEvent) ContentSchema() string      { return "BenchLatency.v1" }
func (e latencyEvent) PartitionKey() string     { return keyOf(e.N) }
func (pollLatencyEvent) Topic() string          { return topics.pollLatency }
func (pollLatencyEvent) ContentSchema() string  { return "BenchPollLatency.v1" }
func (e pollLatencyEvent) PartitionKey() string { return keyOf(e.N) }
func (consumeEvent) Topic() string              { return topics.consume }
func (consumeEvent) ContentSchema() string      { return "BenchConsume.v1" }
func (e consumeEvent) PartitionKey() string     { return keyOf(e.N) }
func (memoryEvent) Topic() string               { return topics.memory }
func (memoryEvent) ContentSchema() string       { return "BenchMemory.v1" }
func (e memoryEvent) PartitionKey() string      { return keyOf(e.N) }
func (kcSlowEvent) Topic() string               { return topics.kcSlow }
func (kcSlowEvent) ContentSchema() string       { return "BenchKCSlow.v1" }
func (e kcSlowEvent) PartitionKey() string      { return kcKeyOf(e.N) }
func (kcLat1Event) Topic() string               { return topics.kcLat1 }
func (kcLat1Event) ContentSchema() string       { return "BenchKCLatency.v1" }
func (e kcLat1Event) PartitionKey() string      { return kcKeyOf(e.N) }
func (kcLatHighEvent) Topic() string            { return topics.kcLatHigh }
func (kcLatHighEvent) ContentSchema() string    { return "BenchKCLatency.v1" }
func (e kcLatHighEvent) PartitionKey() string   { return kcKeyOf(e.N) }
func (kcTrivialEvent) Topic() string            { return topics.kcTrivial }
func (kcTrivialEvent) ContentSchema() string    { return "BenchKCTrivial.v1" }
func (e kcTrivialEvent) PartitionKey() string   { return keyOf(e.N) }
func (takeoverEvent) Topic() string             { return topics.takeover }
func (takeoverEvent) ContentSchema() string     { return "BenchTakeover.v1" }
func (e takeoverEvent) PartitionKey() string    { return keyOf(e.N) }

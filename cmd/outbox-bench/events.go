package main

import (
	"strconv"
	"strings"
)

// Topic names of the benchmark. They get a per-run suffix (see setTopics) so
// that runs against shared real brokers never see each other's records.
var topics = struct {
	relay, floor, raw, naive, poll, latency, pollLatency, consume, memory string
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
}

func allTopics() []string {
	return []string{topics.relay, topics.floor, topics.raw, topics.naive, topics.poll, topics.latency,
		topics.pollLatency, topics.consume, topics.memory}
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

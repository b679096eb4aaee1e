package outbox

import (
	"fmt"
	"strings"
)

// Config.TopicPrefix applies at the Kafka boundary only: the framework's
// own names (MongoDB documents, handlers, inbox ids, Metadata, status,
// metrics) are bare topics, and these helpers translate where a name
// crosses to or from Kafka.

// checkTopicPrefix reports why prefix is not a valid Config.TopicPrefix:
// Kafka's legal topic characters, and room left for a topic name.
func checkTopicPrefix(prefix string) error {
	if len(prefix) >= maxNameLen {
		return fmt.Errorf("is %d bytes, leaving no room for a topic within Kafka's %d", len(prefix), maxNameLen)
	}
	for _, r := range prefix {
		if !kafkaTopicRune(r) {
			return fmt.Errorf("%q has %q: Kafka topics allow letters, digits, '.', '_' and '-' only", prefix, r)
		}
	}
	return nil
}

// kafkaTopic returns the Kafka topic of the bare topic t.
func (c *Config) kafkaTopic(t string) string { return c.TopicPrefix + t }

// kafkaTopics returns the Kafka topics of the bare topics ts.
func (c *Config) kafkaTopics(ts []string) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = c.kafkaTopic(t)
	}
	return out
}

// bareTopic returns the bare topic of the Kafka topic k. Every Kafka topic
// the framework reads is one it named with kafkaTopic, so k has the prefix.
func (c *Config) bareTopic(k string) string { return strings.TrimPrefix(k, c.TopicPrefix) }

// barePartitions returns m (Kafka topic to partitions, as rebalance
// callbacks give it) keyed by bare topics.
func (c *Config) barePartitions(m map[string][]int32) map[string][]int32 {
	if c.TopicPrefix == "" {
		return m
	}
	out := make(map[string][]int32, len(m))
	for k, ps := range m {
		out[c.bareTopic(k)] = ps
	}
	return out
}

// Package kafkax holds the Kafka helpers of the outbox framework that users
// may call directly: the connection to a cluster read from the environment
// (FromEnv: brokers, TLS, SASL, as client options for
// outbox.Config.KafkaOptions), Kafka-compatible partitioning (Partition),
// and the group session hooks the publisher's lease rests on
// (SessionHook, SessionProbe).
package kafkax

import "github.com/twmb/franz-go/pkg/kgo"

var keyPartitioner = kgo.StickyKeyPartitioner(nil)

// keyHasher partitions keyed records. Made once: ForTopic seeds a random
// source, which cost more than the hash itself when done per call. Its
// keyed path is stateless, so it is safe for concurrent use.
var keyHasher = keyPartitioner.ForTopic("")

// Partition returns the partition Kafka's default partitioner chooses for a
// keyed record: murmur2(key) made positive, modulo the partition count. Other
// producers (Java, librdkafka with the murmur2_random partitioner, franz-go's
// default) put the same key on the same partition. It returns 0 when
// partitions is not positive.
func Partition(key []byte, partitions int) int32 {
	if partitions <= 0 {
		return 0
	}
	// The sticky key partitioner hashes keyed records exactly as Kafka's
	// DefaultPartitioner does; topic name does not matter for keyed records.
	if key == nil {
		// A nil key is an unkeyed record (sticky, random partition), whose
		// partitioner state is not safe to share.
		return int32(keyPartitioner.ForTopic("").Partition(&kgo.Record{}, partitions))
	}
	return int32(keyHasher.Partition(&kgo.Record{Key: key}, partitions))
}

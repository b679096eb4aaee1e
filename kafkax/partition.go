// Package kafkax holds the Kafka helpers of the outbox framework that users
// may call directly: Kafka-compatible partitioning and client options.
package kafkax

import "github.com/twmb/franz-go/pkg/kgo"

var keyPartitioner = kgo.StickyKeyPartitioner(nil)

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
	return int32(keyPartitioner.ForTopic("").Partition(&kgo.Record{Key: key}, partitions))
}

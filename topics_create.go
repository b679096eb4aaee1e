package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// createMissing creates the topics of topics that details reports unknown
// to Kafka, when Config.CreateTopicPartitions asks for it, and returns
// details with the created topics' partitions. A topic another replica
// created meanwhile stays unknown in details until the next metadata read.
// The caller wraps errors in ErrTopicMetadata.
func (pc *partitionCounts) createMissing(ctx context.Context, adm *kadm.Client, details kadm.TopicDetails, topics []string) (kadm.TopicDetails, error) {
	n := pc.cfg.CreateTopicPartitions
	if n <= 0 {
		return details, nil
	}
	var missing []string
	for _, t := range topics {
		if d, ok := details[t]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return details, nil
	}
	res, err := adm.CreateTopics(ctx, n, -1, nil, missing...)
	if err != nil {
		return details, fmt.Errorf("create topics %q: %w", missing, err)
	}
	for _, r := range res.Sorted() {
		switch {
		case r.Err == nil:
			// Metadata may lag behind the creation (kadm caches it, and
			// brokers learn of a new topic asynchronously): the count
			// comes from the creation's answer.
			pc.cfg.Logger.Info("outbox: created topic (Config.CreateTopicPartitions)", "topic", r.Topic, "partitions", r.NumPartitions)
			parts := kadm.PartitionDetails{}
			for p := range max(r.NumPartitions, 0) {
				parts[p] = kadm.PartitionDetail{Topic: r.Topic, Partition: p}
			}
			details[r.Topic] = kadm.TopicDetail{Topic: r.Topic, ID: r.ID, Partitions: parts}
		case errors.Is(r.Err, kerr.TopicAlreadyExists):
			// Created meanwhile by another replica: its count is read at
			// the next metadata read (the details still say unknown, so
			// the caller retries).
		default:
			return details, fmt.Errorf("create topic %q: %w", r.Topic, r.Err)
		}
	}
	return details, nil
}

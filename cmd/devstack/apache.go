package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/apachekafka"
)

// resolveJars fetches the pinned Apache Kafka jars into the cache (for an
// install step) and reports where they are.
func resolveJars(ctx context.Context, stdout io.Writer) error {
	dir, err := apachekafka.CacheDir()
	if err != nil {
		return err
	}
	if apachekafka.Resolved(dir) {
		fmt.Fprintf(stdout, "Apache Kafka %s jars already in %s\n", apachekafka.Version, dir)
		return nil
	}
	lib, err := apachekafka.Resolve(ctx, dir, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Apache Kafka %s jars in %s\n", apachekafka.Version, lib)
	return nil
}

// startApache starts nodes Apache Kafka brokers, the first one's client
// listener on addr, and creates topics with the given partitions and the
// brokers' default replication factor (min(nodes, 3)). Progress goes to
// progress. The caller stops the cluster.
func startApache(ctx context.Context, addr string, nodes int, partitions int32, topics []string, progress io.Writer) (*apachekafka.Cluster, error) {
	cluster, err := apachekafka.Start(ctx, apachekafka.Options{
		Nodes:            nodes,
		BrokerAddr:       addr,
		Progress:         progress,
		AutoCreateTopics: true, // as the kfake devstack: for clients that ask
	})
	if err != nil {
		return nil, err
	}
	if err := createTopics(ctx, cluster.Brokers(), partitions, topics); err != nil {
		_ = cluster.Stop()
		return nil, err
	}
	return cluster, nil
}

// createTopics creates topics (those that exist are kept) and waits until
// each partition has a leader.
func createTopics(ctx context.Context, brokers []string, partitions int32, topics []string) error {
	if len(topics) == 0 {
		return nil
	}
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resps, err := adm.CreateTopics(ctx, partitions, -1, nil, topics...)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %q: %w", r.Topic, r.Err)
		}
	}
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		md, err := adm.Metadata(ctx, topics...)
		if err == nil && allLed(md, topics) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics %v not led: %w", topics, ctx.Err())
		case <-time.After(backoff):
		}
	}
}

// allLed reports whether every partition of every topic has a leader.
func allLed(md kadm.Metadata, topics []string) bool {
	for _, t := range topics {
		td, ok := md.Topics[t]
		if !ok || td.Err != nil || len(td.Partitions) == 0 {
			return false
		}
		for _, p := range td.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
	}
	return true
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// parsePartitions reads -partitions: topic=N pairs separated by commas.
func parsePartitions(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		topic, n, ok := strings.Cut(pair, "=")
		count, err := strconv.Atoi(n)
		if !ok || topic == "" || err != nil || count < 1 {
			return nil, usagef("-partitions %q: want topic=N with N at least 1", pair)
		}
		if _, dup := out[topic]; dup {
			return nil, usagef("-partitions names topic %q twice", topic)
		}
		out[topic] = count
	}
	return out, nil
}

// migrateEventOutbox converts a Python event-outbox service's collections
// (see outbox.Admin.MigrateEventOutbox), once the operator's partition
// counts agree with Kafka's.
func (o *cliOptions) migrateEventOutbox(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	partitions, err := parsePartitions(o.partitions)
	if err != nil {
		return err
	}
	if err := checkPartitions(ctx, splitList(o.brokers), o.topicPrefix, partitions); err != nil {
		return err
	}
	rep, err := admin.MigrateEventOutbox(ctx, partitions, o.dryRun)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, rep)
	}
	verb := "converted"
	if o.dryRun {
		verb = "dry run: would convert"
	}
	topics := make([]string, 0, len(rep.Converted))
	for t := range rep.Converted {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	total := 0
	for _, t := range topics {
		total += rep.Converted[t]
	}
	fmt.Fprintf(w, "%s %d unpublished event-outbox document(s)\n", verb, total)
	for _, t := range topics {
		fmt.Fprintf(w, "  %s\t%d\n", t, rep.Converted[t])
	}
	for _, name := range rep.DroppedIndexes {
		if o.dryRun {
			fmt.Fprintf(w, "dry run: would drop index %s\n", name)
		} else {
			fmt.Fprintf(w, "dropped index %s\n", name)
		}
	}
	if o.dryRun {
		fmt.Fprintf(w, "dry run: would set parked: false on %d inbox document(s)\n", rep.InboxNotParked)
	} else {
		fmt.Fprintf(w, "set parked: false on %d inbox document(s)\n", rep.InboxNotParked)
	}
	if len(rep.Refused) > 0 {
		for _, r := range rep.Refused {
			fmt.Fprintf(w, "refused %s\n", r)
		}
		return fmt.Errorf("%d document(s) could not be converted and were left as they are", len(rep.Refused))
	}
	return nil
}

// checkPartitions compares the operator's partition counts with the topics'
// in Kafka (prefix + topic): an event converted with a wrong count would be
// stored for a partition that no publisher owns, or that other producers do
// not use for its key.
func checkPartitions(ctx context.Context, brokers []string, prefix string, partitions map[string]int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("outboxctl-migrate"))
	if err != nil {
		return fmt.Errorf("create a Kafka client: %w", err)
	}
	defer cl.Close()
	topics := make([]string, 0, len(partitions))
	for t := range partitions {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	kafka := make([]string, len(topics))
	for i, t := range topics {
		kafka[i] = prefix + t
	}
	details, err := kadm.NewClient(cl).ListTopics(ctx, kafka...)
	if err != nil {
		return fmt.Errorf("read the partition counts of %q from Kafka: %w", kafka, err)
	}
	var errs []error
	for i, t := range topics {
		d, ok := details[kafka[i]]
		switch {
		case !ok || d.Err != nil:
			errs = append(errs, fmt.Errorf("-partitions %s=%d: Kafka has no topic %q (%v)", t, partitions[t], kafka[i], d.Err))
		case len(d.Partitions) != partitions[t]:
			errs = append(errs, fmt.Errorf("-partitions %s=%d: Kafka topic %q has %d partitions; converting with another count would store events for partitions their keys do not map to (or that do not exist)",
				t, partitions[t], kafka[i], len(d.Partitions)))
		}
	}
	return errors.Join(errs...)
}

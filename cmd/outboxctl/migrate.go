package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

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
		out[topic] = count
	}
	return out, nil
}

// migrateEventOutbox converts a Python event-outbox service's collections
// (see outbox.Admin.MigrateEventOutbox).
func (o *cliOptions) migrateEventOutbox(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	partitions, err := parsePartitions(o.partitions)
	if err != nil {
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

package doctor

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/kafkax"
)

// The doctor's Kafka checks, per publish and consumed topic. Each judge*
// function turns facts into findings and does no I/O.

// Kafka's topic config defaults, for a broker that does not describe a key.
var kafkaTopicDefaults = map[string]string{
	"unclean.leader.election.enable": "false",
	"min.insync.replicas":            "1",
	"cleanup.policy":                 "delete",
	"retention.ms":                   "604800000",
	"retention.bytes":                "-1",
	"max.message.bytes":              "1048588",
	"compression.type":               "producer",
}

const (
	// sizeSample is how many of the latest outbox events the size checks
	// read.
	sizeSample = 10000
	// recordOverhead is added to an event's fields to estimate the size
	// of its record batch: the headers' names and occurred_at, the
	// record's and the batch's framing.
	recordOverhead = 200
	// nearLimit is the share of max.message.bytes above which the largest
	// event is a risk.
	nearLimit = 0.8
)

// topicFacts is what the doctor read about one topic.
type topicFacts struct {
	topic, kafka      string // bare and Kafka names
	publish, consume  bool
	err               error // the topic could not be described (missing...)
	partitions        int
	replicationFactor int // the least replica count of its partitions
	configs           map[string]string
	stored            int             // partition count in outbox_meta; 0 when none
	committed, start  map[int32]int64 // the consumer group's commits, the log start offsets
	offsetsErr        error           // committed or start offsets could not be read
	sizes             []int64         // estimated record sizes of the sampled events, sorted
	largestID         any             // the _id of the largest sampled event
	largestSent       int64           // its estimated size as the publisher sends it (compressed)
	sampleBytes       int64           // their total
	sampleSpan        time.Duration   // from the oldest sampled event to now
}

// config returns a topic config's value, Kafka's default when the broker
// did not describe it.
func (f *topicFacts) config(key string) string {
	if v, ok := f.configs[key]; ok {
		return v
	}
	return kafkaTopicDefaults[key]
}

func (f *topicFacts) subject() string {
	roles := map[[2]bool]string{{true, false}: "published", {false, true}: "consumed", {true, true}: "published and consumed"}[[2]bool{f.publish, f.consume}]
	if f.kafka != f.topic {
		return fmt.Sprintf("topic %s (Kafka %s, %s)", f.topic, f.kafka, roles)
	}
	return fmt.Sprintf("topic %s (%s)", f.topic, roles)
}

// kafka runs the Kafka checks.
func (d *run) kafka(ctx context.Context) {
	adm := d.opts.Kafka
	d.groupProtocol(ctx)
	// Partition counts stored by the service; they also name its publish
	// topics when none are given.
	stored, err := d.store.StoredPartitions(ctx)
	if err != nil {
		d.couldNot("kafka.partitions", "collection "+d.store.Database().Name()+"."+d.store.MetaName(), "the stored partition counts", err)
	}
	publish := d.opts.PublishTopics
	if publish == nil {
		for t := range stored {
			publish = append(publish, t)
		}
	}

	// The consumer group's commits; they also name its topics when none
	// are given.
	group := d.opts.ConsumerGroup
	var commits kadm.OffsetResponses
	if group != "" {
		// A group that never committed does not exist yet: no commits.
		if commits, err = adm.FetchOffsets(ctx, group); err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
			d.couldNot("kafka.expired_unread", "consumer group "+group, "its committed offsets", err)
		}
	}
	consume := d.opts.ConsumeTopics
	if consume == nil && group != "" {
		seen := map[string]bool{}
		add := func(kt string) {
			if t, ok := strings.CutPrefix(kt, d.opts.TopicPrefix); ok && !seen[t] {
				seen[t] = true
				consume = append(consume, t)
			}
		}
		for kt := range commits {
			add(kt)
		}
		// A KIP-848 group's subscription is read with ConsumerGroupDescribe
		// (DescribeGroups does not describe such a group).
		if gs, err := adm.DescribeConsumerGroups(ctx, group); err == nil {
			for _, g := range gs {
				if g.Err == nil {
					for _, t := range g.SubscribedTopics() {
						add(t)
					}
				}
			}
		}
		if gs, err := adm.DescribeGroups(ctx, group); err == nil {
			for _, g := range gs {
				for _, m := range g.Members {
					if a, ok := m.Assigned.AsConsumer(); ok {
						for _, t := range a.Topics {
							add(t.Topic)
						}
					}
				}
			}
		}
	}

	byTopic := map[string]*topicFacts{}
	fact := func(t string) *topicFacts {
		if byTopic[t] == nil {
			byTopic[t] = &topicFacts{topic: t, kafka: d.opts.TopicPrefix + t, configs: map[string]string{}}
		}
		return byTopic[t]
	}
	for _, t := range publish {
		f := fact(t)
		f.publish, f.stored = true, stored[t]
	}
	for _, t := range consume {
		fact(t).consume = true
	}
	if len(byTopic) == 0 {
		d.add(Finding{Severity: SeverityNote, Check: "kafka.topics", Subject: "Kafka",
			Read: "no publish topic stored in " + d.store.MetaName() + ", no consumer group commits", Problem: "no topic to check", Guarantee: "-",
			Fix: "run the doctor after the service ran once, or name the topics (outboxctl: -publish, -consume, -group)"})
		return
	}
	facts := make([]*topicFacts, 0, len(byTopic))
	names := make([]string, 0, len(byTopic))
	for _, f := range byTopic {
		facts = append(facts, f)
		names = append(names, f.kafka)
	}
	slices.SortFunc(facts, func(a, b *topicFacts) int { return cmp.Compare(a.topic, b.topic) })
	d.gatherTopics(ctx, facts, names, commits)
	d.gatherSizes(ctx, byTopic)
	for _, f := range facts {
		d.judgeTopic(f, group)
	}
	if len(publish) > 0 {
		d.checks++
		d.findings = append(d.findings, judgeProducerCompression(d.codec())...)
	}
}

// judgeProducerCompression notes a publisher codec that some consumers
// cannot read.
func judgeProducerCompression(codec string) []Finding {
	switch codec {
	case "snappy", "lz4", "zstd":
	default:
		return nil
	}
	return []Finding{{Severity: SeverityRisk, Check: "kafka.producer_compression", Subject: "publisher",
		Read:      "the publisher compresses with " + codec + " (Config.Compression)",
		Problem:   "consumers without the " + codec + " codec cannot read one record (kafkajs without a codec plugin, kafka-python without its " + codec + " library, aiokafka without its extras)",
		Guarantee: GuaranteeReadability,
		Fix:       "set Config.Compression to CompressionGzip (the default, which every mainstream client reads) or CompressionNone, or make sure every consumer has the codec"}}
}

// gatherTopics reads the topics' partitions, replicas, configs and offsets.
func (d *run) gatherTopics(ctx context.Context, facts []*topicFacts, names []string, commits kadm.OffsetResponses) {
	adm := d.opts.Kafka
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		for _, f := range facts {
			f.err = err
		}
		return
	}
	configs, cfgErr := adm.DescribeTopicConfigs(ctx, names...)
	var starts kadm.ListedOffsets
	var consumed []string
	for _, f := range facts {
		if f.consume {
			consumed = append(consumed, f.kafka)
		}
	}
	var startErr error
	if len(consumed) > 0 {
		starts, startErr = adm.ListStartOffsets(ctx, consumed...)
	}
	for _, f := range facts {
		td, ok := details[f.kafka]
		switch {
		case !ok:
			f.err = fmt.Errorf("not in the metadata")
			continue
		case td.Err != nil:
			f.err = td.Err
			continue
		}
		f.partitions = len(td.Partitions)
		f.replicationFactor = 0
		for _, p := range td.Partitions {
			if f.replicationFactor == 0 || len(p.Replicas) < f.replicationFactor {
				f.replicationFactor = len(p.Replicas)
			}
		}
		if cfgErr != nil {
			f.err = cfgErr
			continue
		}
		rc, err := configs.On(f.kafka, nil)
		if err == nil {
			err = rc.Err
		}
		if err != nil {
			f.err = err
			continue
		}
		for _, c := range rc.Configs {
			if c.Value != nil {
				f.configs[c.Key] = *c.Value
			}
		}
		if !f.consume {
			continue
		}
		if startErr != nil {
			f.offsetsErr = startErr
			continue
		}
		f.committed, f.start = map[int32]int64{}, map[int32]int64{}
		for p, o := range commits[f.kafka] {
			if o.Err == nil && o.At >= 0 {
				f.committed[p] = o.At
			}
		}
		for p, o := range starts[f.kafka] {
			if o.Err == nil {
				f.start[p] = o.Offset
			}
		}
	}
}

// gatherSizes estimates the record sizes of the latest outbox events, per
// topic: the sizes of the event's fields that go into the record plus
// recordOverhead.
func (d *run) gatherSizes(ctx context.Context, byTopic map[string]*topicFacts) {
	docs, err := d.store.LatestEvents(ctx, sizeSample)
	if err != nil {
		d.couldNot("kafka.max_message_bytes", "collection "+d.store.Database().Name()+"."+d.store.OutboxName(), "the sizes of the latest events", err)
		return
	}
	oldest := map[string]time.Time{}
	for _, doc := range docs {
		f := byTopic[doc.Topic]
		if f == nil {
			continue
		}
		size := doc.Size + recordOverhead
		if len(f.sizes) == 0 || size > slices.Max(f.sizes) {
			f.largestID, f.largestSent = doc.ID, size
		}
		f.sizes = append(f.sizes, size)
		f.sampleBytes += size
		if o, ok := oldest[doc.Topic]; !ok || doc.CreatedAt.Before(o) {
			oldest[doc.Topic] = doc.CreatedAt
		}
	}
	for t, o := range oldest {
		f := byTopic[t]
		slices.Sort(f.sizes)
		f.sampleSpan = max(d.now.Sub(o), time.Second)
		if d.codec() != "none" {
			d.compressedSize(ctx, f)
		}
	}
}

// codec is the publisher's codec name.
func (d *run) codec() string {
	if d.opts.ProducerCompression == "" {
		return "gzip"
	}
	return d.opts.ProducerCompression
}

// compressedSize estimates the size of the largest sampled event as the
// publisher sends it: its fields compressed with gzip (for the other
// codecs too: an estimate) plus recordOverhead.
func (d *run) compressedSize(ctx context.Context, f *topicFacts) {
	fields, err := d.store.EventFields(ctx, f.largestID)
	if err != nil {
		return // gone meanwhile (TTL): the uncompressed estimate stands
	}
	f.largestSent = gzipSize([]byte(fields)) + recordOverhead
}

// gzipSize is the size of b compressed with gzip at the default level.
func gzipSize(b []byte) int64 {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return int64(buf.Len())
}

// judgeTopic runs every Kafka check on one topic.
func (d *run) judgeTopic(f *topicFacts, group string) {
	subject := f.subject()
	d.checks++
	if f.err != nil {
		sev := SeverityRisk
		problem := "the topic's settings could not be checked"
		if strings.Contains(f.err.Error(), "UNKNOWN_TOPIC") || strings.Contains(f.err.Error(), "not in the metadata") {
			problem = "the topic does not exist: events recorded for it wait unpublished (Record fails while its partition count is unknown), its consumers wait"
		}
		d.add(Finding{Severity: sev, Check: "kafka.topic", Subject: subject, Read: d.redact(f.err.Error()),
			Problem: problem, Guarantee: GuaranteePublishing,
			Fix: "create the topic (kadm, kafka-topics.sh), or set Config.CreateTopicPartitions"})
		return
	}
	d.checks += 5
	d.findings = append(d.findings, judgeUnclean(subject, f.config("unclean.leader.election.enable"))...)
	d.findings = append(d.findings, judgeMinISR(subject, f.config("min.insync.replicas"), f.replicationFactor, d.minISRCap)...)
	d.findings = append(d.findings, judgeCleanupPolicy(subject, f.config("cleanup.policy"))...)
	d.findings = append(d.findings, judgeRetention(subject, f, d.expectedOutage(), d.opts.InboxRetention)...)
	d.findings = append(d.findings, judgeCompression(subject, f.config("compression.type"))...)
	if f.publish {
		d.checks += 2
		d.findings = append(d.findings, judgeMaxMessageBytes(subject, f.config("max.message.bytes"), f.sizes, f.largestSent, d.codec())...)
		d.findings = append(d.findings, judgePartitionCount(subject, f.partitions, f.stored, d.store.MetaName())...)
	}
	if f.consume && group != "" {
		d.checks++
		if f.offsetsErr != nil {
			d.couldNot("kafka.expired_unread", subject, "the log start offsets", f.offsetsErr)
		} else {
			d.findings = append(d.findings, judgeExpiredUnread(subject, group, f.committed, f.start)...)
		}
	}
}

func judgeUnclean(subject, v string) []Finding {
	if !strings.EqualFold(strings.TrimSpace(v), "true") {
		return nil
	}
	return []Finding{{Severity: SeverityBreaks, Check: "kafka.unclean_leader_election", Subject: subject,
		Read:      "unclean.leader.election.enable=true",
		Problem:   "a replica that is out of sync may become leader: records Kafka acknowledged (events marked published) vanish",
		Guarantee: GuaranteePublishing,
		Fix:       "set unclean.leader.election.enable=false on the topic (Kafka's default)"}}
}

// minISRCap says whether the brokers cap a topic's min.insync.replicas at
// its replica count: Apache Kafka 3.7 and later use min(min.insync.replicas,
// replicas) for acks=all writes (KAFKA-15583, part of KIP-966), earlier
// releases refuse every such write when the minimum is above the replica
// count. Produce v10 (KIP-951) came in the same release, so a broker that
// serves it caps.
type minISRCap int8

const (
	minISRCapUnknown minISRCap = iota // the brokers' versions could not be read
	minISRCapped                      // every broker serves Produce v10 or later
	minISRNotCapped                   // some broker serves no Produce v10
)

// minISRCapOf judges the brokers' Produce versions (the highest each
// serves).
func minISRCapOf(produceMax []int16) minISRCap {
	if len(produceMax) == 0 {
		return minISRCapUnknown
	}
	for _, v := range produceMax {
		if v < 10 {
			return minISRNotCapped
		}
	}
	return minISRCapped
}

func judgeMinISR(subject, v string, rf int, capped minISRCap) []Finding {
	minISR, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return []Finding{{Severity: SeverityNote, Check: "kafka.min_insync_replicas", Subject: subject,
			Read: "min.insync.replicas=" + v, Problem: "not a number: not checked", Guarantee: "-", Fix: "set a number"}}
	}
	read := fmt.Sprintf("min.insync.replicas=%d, replication factor %d, producer acks=all (the publisher's)", minISR, rf)
	fixAbove := fmt.Sprintf("set min.insync.replicas to at most %d (replication factor - 1 is usual), or add replicas", rf)
	switch {
	case minISR > rf && capped == minISRCapped:
		return []Finding{{Severity: SeverityRisk, Check: "kafka.min_insync_replicas", Subject: subject,
			Read:      read + ", brokers of Kafka 3.7 or later (Produce v10)",
			Problem:   fmt.Sprintf("the brokers cap the minimum at the replica count (%d): every replica must be in sync, so one broker down stops publishing to the topic until it is back (events wait in the outbox)", rf),
			Guarantee: GuaranteePublishing,
			Fix:       fixAbove}}
	case minISR > rf && capped == minISRNotCapped:
		return []Finding{{Severity: SeverityBreaks, Check: "kafka.min_insync_replicas", Subject: subject,
			Read:      read + ", a broker older than Kafka 3.7 (no Produce v10)",
			Problem:   "Kafka before 3.7 refuses every acks=all write (NOT_ENOUGH_REPLICAS): no event is ever published",
			Guarantee: GuaranteePublishing,
			Fix:       fixAbove}}
	case minISR > rf:
		return []Finding{{Severity: SeverityBreaks, Check: "kafka.min_insync_replicas", Subject: subject,
			Read:      read + ", the brokers' versions unknown",
			Problem:   fmt.Sprintf("Kafka before 3.7 refuses every acks=all write (NOT_ENOUGH_REPLICAS): no event is ever published; 3.7 and later cap the minimum at the replica count (%d), so one broker down stops publishing", rf),
			Guarantee: GuaranteePublishing,
			Fix:       fixAbove}}
	case rf == 1:
		return []Finding{{Severity: SeverityRisk, Check: "kafka.min_insync_replicas", Subject: subject, Read: read,
			Problem:   "each record has one copy: losing that broker's disk loses acknowledged events (fine for development)",
			Guarantee: GuaranteePublishing,
			Fix:       "use a replication factor of 3 with min.insync.replicas=2 in production"}}
	case minISR < 2:
		return []Finding{{Severity: SeverityBreaks, Check: "kafka.min_insync_replicas", Subject: subject, Read: read,
			Problem:   "acks=all is satisfied by the leader alone once the followers fall behind: an acknowledged event may exist on one broker only, and is lost with it",
			Guarantee: GuaranteePublishing,
			Fix:       "set min.insync.replicas=2 (with a replication factor of 3)"}}
	case minISR == rf:
		return []Finding{{Severity: SeverityRisk, Check: "kafka.min_insync_replicas", Subject: subject, Read: read,
			Problem:   "one broker down stops publishing to the topic until it is back (events wait in the outbox)",
			Guarantee: GuaranteePublishing,
			Fix:       fmt.Sprintf("set min.insync.replicas to %d, or add a replica", rf-1)}}
	}
	return nil
}

func judgeCleanupPolicy(subject, v string) []Finding {
	if !strings.Contains(v, "compact") {
		return nil
	}
	return []Finding{{Severity: SeverityBreaks, Check: "kafka.cleanup_policy", Subject: subject,
		Read:      "cleanup.policy=" + v,
		Problem:   "compaction keeps only the latest record of each key: a consumer that is behind never sees the earlier events of a key",
		Guarantee: GuaranteeDelivery,
		Fix:       "set cleanup.policy=delete"}}
}

// judgeRetention compares retention.ms and retention.bytes with the
// expected outage and, for a consumed topic, with the inbox retention.
func judgeRetention(subject string, f *topicFacts, outage, inboxRetention time.Duration) []Finding {
	var out []Finding
	ms, err := strconv.ParseInt(strings.TrimSpace(f.config("retention.ms")), 10, 64)
	if err == nil {
		retention := time.Duration(ms) * time.Millisecond
		read := fmt.Sprintf("retention.ms=%d (%s), expected outage %s", ms, fmtDuration(retention), fmtDuration(outage))
		switch {
		case ms >= 0 && retention < outage:
			out = append(out, Finding{Severity: SeverityBreaks, Check: "kafka.retention", Subject: subject, Read: read,
				Problem:   "records expire before a consumer that was down for the expected outage reads them: they are lost to it",
				Guarantee: GuaranteeDelivery,
				Fix:       fmt.Sprintf("set retention.ms to at least %d (%s), or plan for shorter outages (ExpectedOutage, outboxctl -outage)", outage.Milliseconds(), fmtDuration(outage))})
		case f.consume && (ms < 0 || retention+outage > inboxRetention):
			read += fmt.Sprintf(", InboxRetention %s", fmtDuration(inboxRetention))
			if ms < 0 {
				read = "retention.ms=-1 (records kept for ever), InboxRetention " + fmtDuration(inboxRetention)
			}
			out = append(out, Finding{Severity: SeverityRisk, Check: "kafka.retention", Subject: subject, Read: read,
				Problem:   "a record can be redelivered (an offset reset, expired group offsets) after its inbox document expired: it is handled a second time",
				Guarantee: GuaranteeIdempotency,
				Fix:       "set Config.InboxRetention to at least the topic's retention plus the expected outage, or shorten retention.ms"})
		}
	}
	bytes, err := strconv.ParseInt(strings.TrimSpace(f.config("retention.bytes")), 10, 64)
	if err != nil || bytes < 0 {
		return out
	}
	read := fmt.Sprintf("retention.bytes=%d per partition", bytes)
	if f.sampleBytes == 0 || f.partitions == 0 {
		return append(out, Finding{Severity: SeverityRisk, Check: "kafka.retention", Subject: subject,
			Read:      read + "; no outbox traffic to estimate the time it holds",
			Problem:   "records expire once a partition holds this many bytes, however young: a busy day can expire records a stopped consumer has not read",
			Guarantee: GuaranteeDelivery,
			Fix:       "set retention.bytes=-1 and bound the topic by retention.ms, or size it for the expected outage at peak traffic"})
	}
	perPartition := float64(f.sampleBytes) / f.sampleSpan.Seconds() / float64(f.partitions) // bytes per second
	holds := time.Duration(float64(bytes) / perPartition * float64(time.Second))
	if holds >= outage {
		return out
	}
	return append(out, Finding{Severity: SeverityBreaks, Check: "kafka.retention", Subject: subject,
		Read: fmt.Sprintf("%s; at the outbox's recent rate (%.0f bytes/s per partition, over %d events) it holds about %s, expected outage %s",
			read, perPartition, len(f.sizes), fmtDuration(holds), fmtDuration(outage)),
		Problem:   "records expire by size before a consumer that was down for the expected outage reads them: they are lost to it",
		Guarantee: GuaranteeDelivery,
		Fix:       "set retention.bytes=-1 (bound by retention.ms), or raise it above the traffic of the expected outage"})
}

func judgeCompression(subject, v string) []Finding {
	codec := strings.ToLower(strings.TrimSpace(v))
	switch codec {
	case "snappy", "lz4", "zstd":
	default:
		return nil // producer, uncompressed, gzip: every mainstream client reads them
	}
	return []Finding{{Severity: SeverityRisk, Check: "kafka.compression_type", Subject: subject,
		Read:      "compression.type=" + codec,
		Problem:   "the broker recompresses every batch with " + codec + ": consumers without that codec cannot read one record (kafkajs without a codec plugin, kafka-python without its " + codec + " library, the Python event-outbox library's aiokafka without its extras); this framework's consumers read it",
		Guarantee: GuaranteeReadability,
		Fix:       "set compression.type=producer (the publisher sends gzip batches by default) or gzip"}}
}

// judgeMaxMessageBytes compares the largest event, as the publisher sends
// it (sent: compressed with codec), and the largest and median estimated
// record sizes (sorted, uncompressed) with max.message.bytes, which Kafka
// applies to a batch after compression.
func judgeMaxMessageBytes(subject, v string, sizes []int64, sent int64, codec string) []Finding {
	limit, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || len(sizes) == 0 {
		return nil
	}
	largest, median := sizes[len(sizes)-1], sizes[len(sizes)/2]
	if codec == "none" || sent <= 0 {
		sent = largest
	}
	read := fmt.Sprintf("max.message.bytes=%d; of the latest %d events the largest record is about %d bytes (about %d as sent, %s), the median %d",
		limit, len(sizes), largest, sent, codec, median)
	switch {
	case sent > limit:
		return []Finding{{Severity: SeverityBreaks, Check: "kafka.max_message_bytes", Subject: subject, Read: read,
			Problem:   "Kafka refuses a record above the limit for good: it is marked failed and holds the later events of its key",
			Guarantee: GuaranteePublishing,
			Fix:       fmt.Sprintf("raise max.message.bytes above %d (and the consumers' fetch limits), or record smaller events", sent)}}
	case float64(sent) > nearLimit*float64(limit) || largest > limit:
		return []Finding{{Severity: SeverityRisk, Check: "kafka.max_message_bytes", Subject: subject, Read: read,
			Problem:   "the largest events come close to the limit (or fit only compressed): a slightly larger or less compressible one is refused for good, marked failed, and holds its key",
			Guarantee: GuaranteePublishing,
			Fix:       "raise max.message.bytes, or bound the events' size where they are recorded"}}
	}
	return nil
}

func judgePartitionCount(subject string, kafkaN, storedN int, meta string) []Finding {
	if storedN == 0 || kafkaN == storedN {
		return nil
	}
	read := fmt.Sprintf("%d partitions in Kafka, %d stored in %s (the count events were recorded with)", kafkaN, storedN, meta)
	problem := "partitions were added since events were recorded: a key's later events go to another partition than its earlier ones, and a consumer may handle them before the earlier ones"
	if kafkaN < storedN {
		problem = "the topic has fewer partitions than events were recorded for (it was recreated): events recorded for the missing partitions cannot be published"
	}
	return []Finding{{Severity: SeverityBreaks, Check: "kafka.partitions", Subject: subject, Read: read,
		Problem:   problem,
		Guarantee: GuaranteeOrder,
		Fix:       "run the service: it stores the new count within a minute; let consumers drain the topic before adding partitions, and plan the count so that it never changes"}}
}

func judgeExpiredUnread(subject, group string, committed, start map[int32]int64) []Finding {
	var parts []string
	var lost int64
	ps := make([]int32, 0, len(committed))
	for p := range committed {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	for _, p := range ps {
		c, s := committed[p], start[p]
		if c < s {
			parts = append(parts, fmt.Sprintf("partition %d committed %d, log start %d", p, c, s))
			lost += s - c
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return []Finding{{Severity: SeverityBreaks, Check: "kafka.expired_unread", Subject: subject,
		Read:      fmt.Sprintf("consumer group %s: %s", group, strings.Join(parts, "; ")),
		Problem:   fmt.Sprintf("%d records expired before the consumer group read them: their events were never handled", lost),
		Guarantee: GuaranteeDelivery,
		Fix:       "republish the lost events from their source (the producing service's outbox keeps published events for its OutboxRetention), and raise the topic's retention above the longest consumer outage"}}
}

// groupProtocol reports the group protocol the service asks for and
// whether every broker serves Kafka 4's (ConsumerGroupHeartbeat v1, which
// franz-go requires; it falls back to the classic protocol otherwise).
func (d *run) groupProtocol(ctx context.Context) {
	versions, err := d.opts.Kafka.ApiVersions(ctx)
	if err != nil {
		d.couldNot("kafka.group_protocol", "Kafka", "the brokers' API versions", err)
		return
	}
	var with, without []int32
	var errs []error
	var produceMax []int16
	versions.Each(func(v kadm.BrokerApiVersions) {
		if v.Err != nil {
			errs = append(errs, fmt.Errorf("broker %d: %w", v.NodeID, v.Err))
			return
		}
		if _, maxV, ok := v.KeyVersions(int16(kmsg.Produce)); ok {
			produceMax = append(produceMax, maxV)
		}
		if _, maxV, ok := v.KeyVersions(int16(kmsg.ConsumerGroupHeartbeat)); ok && maxV >= 1 {
			with = append(with, v.NodeID)
		} else {
			without = append(without, v.NodeID)
		}
	})
	d.minISRCap = minISRCapOf(produceMax)
	if len(errs) > 0 && d.minISRCap == minISRCapped {
		d.minISRCap = minISRCapUnknown // a broker not read may be older
	}
	if len(with)+len(without) == 0 {
		d.couldNot("kafka.group_protocol", "Kafka", "the brokers' API versions", errors.Join(errs...))
		return
	}
	slices.Sort(with)
	slices.Sort(without)
	var session time.Duration
	if len(without) == 0 {
		// Best effort: the brokers' setting, the shortest of which the
		// publisher's lease uses (a group's own override aside).
		if rcs, err := d.opts.Kafka.DescribeBrokerConfigs(ctx, with...); err == nil {
			for _, rc := range rcs {
				for _, c := range rc.Configs {
					ms, err := strconv.ParseInt(c.MaybeValue(), 10, 64)
					if c.Key == kafkax.BrokerConsumerSessionTimeout && err == nil && ms > 0 {
						if v := time.Duration(ms) * time.Millisecond; session == 0 || v < session {
							session = v
						}
					}
				}
			}
		}
	}
	d.checks++
	d.findings = append(d.findings, judgeGroupProtocol(d.opts.GroupProtocol, d.opts.ConsumerProtocol, with, without, session)...)
}

// judgeGroupProtocol reports the group protocol in use: a note naming it
// and the brokers' support for KIP-848, a risk when GroupConsumer is asked
// of brokers that do not all serve it (franz-go then runs the classic
// protocol, with Config.SessionTimeout rather than the broker's settings).
// p names the protocol asked for, kip848 says it is GroupConsumer; session
// is the brokers' KIP-848 session timeout when read, else 0.
func judgeGroupProtocol(p string, kip848 bool, with, without []int32, session time.Duration) []Finding {
	support := fmt.Sprintf("brokers %v serve ConsumerGroupHeartbeat v1 (KIP-848)", with)
	switch {
	case len(with) == 0:
		support = "no broker serves ConsumerGroupHeartbeat v1 (KIP-848 needs Kafka 4.0 or later)"
	case len(without) > 0:
		support += fmt.Sprintf(", brokers %v do not", without)
	}
	if session > 0 {
		support += fmt.Sprintf("; their %s is %s", kafkax.BrokerConsumerSessionTimeout, fmtDuration(session))
	}
	read := "Config.GroupProtocol " + p + "; " + support
	if kip848 && len(without) > 0 {
		return []Finding{{Severity: SeverityRisk, Check: "kafka.group_protocol", Subject: "consumer groups",
			Read:      read,
			Problem:   "the groups do not run the protocol asked for: franz-go falls back to the classic protocol when the coordinator does not serve ConsumerGroupHeartbeat v1, so the classic rules apply (client-side assignment, Config.SessionTimeout and HeartbeatInterval), not the broker's group.consumer.* settings",
			Guarantee: "-",
			Fix:       "upgrade every broker to Kafka 4.0 or later (4.3 or later recommended), or set Config.GroupProtocol to GroupClassic"}}
	}
	f := Finding{Severity: SeverityNote, Check: "kafka.group_protocol", Subject: "consumer groups", Read: read, Guarantee: "-", Fix: "none needed"}
	switch {
	case kip848:
		f.Problem = "none: the groups run Kafka 4's protocol (KIP-848); the brokers' group.consumer.session.timeout.ms and heartbeat interval apply, and the publisher's lease is that session timeout minus FenceMargin"
	case len(with) > 0 && len(without) == 0:
		f.Problem = "none: the groups run the classic protocol; the brokers also serve Kafka 4's (Config.GroupProtocol GroupConsumer, see docs/guarantees.md)"
	default:
		f.Problem = "none: the groups run the classic protocol"
	}
	return []Finding{f}
}

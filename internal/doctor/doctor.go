package doctor

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Severity says how much a Finding matters; the root's public Severity has
// the same values in the same order.
type Severity int

// Severities, least first.
const (
	SeverityNote Severity = iota
	SeverityRisk
	SeverityBreaks
)

// Guarantees a Finding touches, as Finding.Guarantee names them. The root
// exports the same strings.
const (
	GuaranteePublishing  = "at-least-once publishing"
	GuaranteeDelivery    = "at-least-once delivery"
	GuaranteeIdempotency = "idempotent processing"
	GuaranteeOrder       = "per-key order"
	GuaranteeProcessing  = "at-least-once processing"
	GuaranteeCleanup     = "bounded collections"
	GuaranteeReadability = "records every client reads"
)

// Finding is one result of a check; the root converts it field by field
// into its public Finding.
type Finding struct {
	Severity  Severity
	Check     string // "kafka.cleanup_policy"
	Subject   string // "topic orders", "collection shop.outbox", "MongoDB"
	Read      string // what was read, with its values
	Problem   string // what goes wrong with it
	Guarantee string // one of the Guarantee constants, or "-"
	Fix       string // how to repair it
}

// Report is what one Run found: the findings worst first, then by check
// and subject.
type Report struct {
	Findings  []Finding
	Checks    int // each check on each subject
	CheckedAt time.Time
}

// DefaultExpectedOutage is Options.ExpectedOutage's default: a long
// weekend, which Kafka's default retention (7 days) and the default inbox
// retention (30 days) cover.
const DefaultExpectedOutage = 3 * 24 * time.Hour

// Options says what Run checks. Zero fields are read from the servers
// where they can be (the retentions from the TTL indexes, the consumer
// group from the inbox's owner, the topics from the stored partition counts
// and the group's commits), else take Defaults.
type Options struct {
	Kafka               *kadm.Client // nil: the Kafka checks are skipped, with a note
	TopicPrefix         string
	PublishTopics       []string
	ConsumeTopics       []string
	ConsumerGroup       string
	OutboxRetention     time.Duration
	InboxRetention      time.Duration
	HandlerTimeout      time.Duration
	ExpectedOutage      time.Duration
	ProducerCompression string // "none", "gzip", "snappy", "lz4", "zstd"; "" is gzip
	// GroupProtocol is the group protocol's name as the findings print it;
	// ConsumerProtocol says that it is Kafka 4's (KIP-848).
	GroupProtocol    string
	ConsumerProtocol bool
	Consumes         *bool // nil: true when ConsumeTopics is given or found, or the inbox exists
	// Payloads is the claim check's payload collection of a service that
	// stores payloads out of band, nil for none: its indexes are checked,
	// the TTL against the outbox retention plus PayloadMargin.
	Payloads      *mongo.Collection
	PayloadMargin time.Duration
	// Defaults are the configuration's defaults for the zero durations
	// above that no server setting gives.
	Defaults Defaults
	// Redact hides secrets (URL passwords) in error text a finding quotes.
	// Defaults to leaving the text as it is.
	Redact func(string) string
}

// Defaults are the configuration defaults Options falls back on.
type Defaults struct {
	OutboxRetention, InboxRetention, HandlerTimeout time.Duration
}

// Store is the service's collections as the doctor reads them. The storage
// format (collection and field names, index definitions) belongs to the
// caller, which implements Store over it; the doctor itself reads only
// server settings and index lists.
type Store interface {
	// Database is the service's database; server settings are read
	// through its client.
	Database() *mongo.Database
	// OutboxName, InboxName and MetaName name the outbox, the inbox and
	// the metadata collection.
	OutboxName() string
	InboxName() string
	MetaName() string
	// StoredPartitions returns the partition counts the service stored,
	// by topic.
	StoredPartitions(ctx context.Context) (map[string]int, error)
	// InboxOwner returns the inbox's owner stamp, nil when it has none.
	InboxOwner(ctx context.Context) (*Owner, error)
	// LatestEvents returns the newest n outbox events with the summed
	// size of the fields that go into their records.
	LatestEvents(ctx context.Context, n int) ([]EventSize, error)
	// EventFields returns the fields of one outbox event that go into its
	// record, concatenated; an error when the event is gone.
	EventFields(ctx context.Context, id any) (string, error)
	// ListIndexes returns the index documents of a collection.
	ListIndexes(ctx context.Context, coll string) ([]bson.D, error)
	// OutboxIndexes, InboxIndexes and MetaIndexes are the indexes the
	// collections need, with the given retentions as TTLs.
	OutboxIndexes(retention time.Duration) Indexes
	InboxIndexes(retention time.Duration) Indexes
	MetaIndexes() Indexes
}

// Owner is the stamp naming the consumer group that owns an inbox.
type Owner struct {
	ConsumerGroup, Service string
}

// EventSize is one sampled outbox event.
type EventSize struct {
	ID        any
	Topic     string
	CreatedAt time.Time
	Size      int64 // the summed bytes of the fields that go into the record
}

// Indexes are the indexes one collection needs, and how to read existing
// ones: both are the storage format's, which matches indexes by definition
// (key pattern and partial filter), not by name.
type Indexes struct {
	Specs []IndexSpec
	// Expiring reports whether a TTL index's partial filter restricts it
	// to the documents the framework lets expire (its own TTL index's
	// filter); a TTL index without it deletes documents still needed.
	Expiring func(partial any) bool
	// Field reads a field of an index document.
	Field func(ix bson.D, key string) (any, bool)
	// Format prints an index document for a finding.
	Format func(ix bson.D) string
	// TTL reads an index document's expireAfterSeconds.
	TTL func(ix bson.D) (int64, bool)
}

// IndexSpec is one index a collection needs.
type IndexSpec struct {
	Name   string
	Doc    bson.D // the spec as listIndexes shows it
	TTL    *int32 // expireAfterSeconds; nil: not a TTL index
	Unique bool
	// Matches reports whether an existing index has this spec's key
	// pattern and partial filter.
	Matches func(ix bson.D) bool
}

// run is the state of one Run: options, facts, findings.
type run struct {
	store    Store
	opts     Options
	now      time.Time
	findings []Finding
	checks   int
	// minISRCap is whether the brokers cap min.insync.replicas at the
	// replica count, read with their API versions (groupProtocol).
	minISRCap minISRCap
}

// Run checks the settings of the service's MongoDB deployment and, with
// opts.Kafka, of its Kafka topics and consumer group. It returns an error
// only when MongoDB cannot be read at all; a check that cannot read what it
// needs is a note in the report. It reads only: it changes nothing.
func Run(ctx context.Context, store Store, opts Options) (Report, error) {
	d := &run{store: store, opts: opts, now: time.Now()}
	if err := d.mongo(ctx); err != nil {
		return Report{}, err
	}
	if opts.Kafka == nil {
		d.add(Finding{Severity: SeverityNote, Check: "kafka.skipped", Subject: "Kafka",
			Read: "no Kafka client", Problem: "the Kafka checks did not run", Guarantee: "-",
			Fix: "give the brokers (outboxctl: -brokers or KAFKA_BROKERS)"})
	} else {
		d.kafka(ctx)
	}
	return d.report(), nil
}

// add records a finding.
func (d *run) add(f Finding) { d.findings = append(d.findings, f) }

// couldNot records a check that could not read what it needs: a note, so
// that a missing permission is seen without failing the whole report.
func (d *run) couldNot(check, subject, what string, err error) {
	d.add(Finding{Severity: SeverityNote, Check: check, Subject: subject,
		Read:    "could not read " + what + ": " + d.redact(err.Error()),
		Problem: "this check did not run", Guarantee: "-",
		Fix: "grant the reading rights this check needs, or run the doctor where the servers answer"})
}

// redact hides the secrets of an error text a finding quotes.
func (d *run) redact(s string) string {
	if d.opts.Redact == nil {
		return s
	}
	return d.opts.Redact(s)
}

// report sorts the findings: worst first, then by check and subject.
func (d *run) report() Report {
	slices.SortStableFunc(d.findings, func(x, y Finding) int {
		return cmp.Or(cmp.Compare(y.Severity, x.Severity), cmp.Compare(x.Check, y.Check), cmp.Compare(x.Subject, y.Subject))
	})
	return Report{Findings: d.findings, Checks: d.checks, CheckedAt: d.now.UTC()}
}

// fmtDuration writes a duration the way the findings show it: 7d, 3d12h,
// 45s, 1h30m.
func fmtDuration(d time.Duration) string {
	if d >= 24*time.Hour {
		days, rest := d/(24*time.Hour), (d % (24 * time.Hour)).Round(time.Hour)
		if rest == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, rest/time.Hour)
	}
	// time.Duration.String writes whole minutes as "2m0s" and whole hours
	// as "1h0m0s": only a zero seconds field after minutes, and then a
	// zero minutes field after hours, is dropped, never a digit of the
	// seconds (10s stays "10s", 2m30s stays "2m30s").
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

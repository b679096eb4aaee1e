package outbox

// The doctor's public face: the report types, Admin.Doctor and
// Client.Doctor. The checks live in internal/doctor (facts gathered, pure
// judgements) with the service's collections it reads (doctor.Collections);
// this file converts at the boundary. Run runs the doctor once
// at start (doctor_run.go), outboxctl doctor and the console's Health page
// show it.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/internal/doctor"
	"github.com/event-outbox/outbox/internal/store"
)

// Severity says how much a Finding matters.
type Severity int

const (
	// SeverityNote is worth knowing; no guarantee is at stake.
	SeverityNote Severity = iota
	// SeverityRisk weakens a guarantee under some failure (a broker's disk
	// lost, an outage longer than expected, an offset reset).
	SeverityRisk
	// SeverityBreaks breaks a guarantee in normal operation: events can be
	// lost, handled twice, reordered, or never published.
	SeverityBreaks
)

// String returns "note", "risk" or "breaks".
func (s Severity) String() string {
	switch s {
	case SeverityNote:
		return "note"
	case SeverityRisk:
		return "risk"
	case SeverityBreaks:
		return "breaks"
	}
	return fmt.Sprintf("Severity(%d)", int(s))
}

// MarshalText writes the String form.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads the String form.
func (s *Severity) UnmarshalText(b []byte) error {
	for _, v := range []Severity{SeverityNote, SeverityRisk, SeverityBreaks} {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("outbox: unknown severity %q (want note, risk or breaks)", b)
}

// Guarantees a Finding touches, as Finding.Guarantee names them.
const (
	GuaranteePublishing  = doctor.GuaranteePublishing  // "at-least-once publishing": every committed event reaches Kafka, and stays there once acknowledged
	GuaranteeDelivery    = doctor.GuaranteeDelivery    // "at-least-once delivery": every published record reaches the consumers
	GuaranteeIdempotency = doctor.GuaranteeIdempotency // "idempotent processing": an event is handled once, whatever the redeliveries
	GuaranteeOrder       = doctor.GuaranteeOrder       // "per-key order": the events of one partition key are handled in the order they were recorded
	GuaranteeProcessing  = doctor.GuaranteeProcessing  // "at-least-once processing": every delivered event is handled or parked
	GuaranteeCleanup     = doctor.GuaranteeCleanup     // "bounded collections": handled and published documents expire, waiting ones never
	GuaranteeReadability = doctor.GuaranteeReadability // "records every client reads": consumers that are not this framework can read the records
)

// Finding is one result of the doctor.
type Finding struct {
	// Severity says how much it matters.
	Severity Severity `json:"severity"`
	// Check names the check, for example "kafka.cleanup_policy".
	Check string `json:"check"`
	// Subject is what was checked: "topic orders", "collection
	// shop.outbox", "MongoDB".
	Subject string `json:"subject"`
	// Read is what was read, with its values.
	Read string `json:"read"`
	// Problem says what goes wrong with it.
	Problem string `json:"problem"`
	// Guarantee is the guarantee at stake (one of the Guarantee
	// constants).
	Guarantee string `json:"guarantee"`
	// Fix says how to repair it.
	Fix string `json:"fix"`
}

// String writes the finding on one line.
func (f Finding) String() string {
	return fmt.Sprintf("[%s] %s: %s (read: %s; guarantee: %s). Fix: %s", f.Severity, f.Subject, f.Problem, f.Read, f.Guarantee, f.Fix)
}

// DoctorReport is what the doctor found.
type DoctorReport struct {
	// Findings, worst first, then by check and subject.
	Findings []Finding `json:"findings"`
	// Checks counts the checks that ran (each check on each subject).
	Checks int `json:"checks"`
	// CheckedAt is when the checks ran.
	CheckedAt time.Time `json:"checked_at"`
}

// Breaking returns the findings that break a guarantee.
func (r DoctorReport) Breaking() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Severity == SeverityBreaks {
			out = append(out, f)
		}
	}
	return out
}

// Count returns the number of findings of severity s.
func (r DoctorReport) Count(s Severity) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == s {
			n++
		}
	}
	return n
}

// Summary is one line: "doctor: 1 breaks a guarantee; 2 risks, 3 notes
// (24 checks)", or "doctor: nothing breaks a guarantee; ...".
func (r DoctorReport) Summary() string {
	b, k, n := r.Count(SeverityBreaks), r.Count(SeverityRisk), r.Count(SeverityNote)
	verdict := "nothing breaks a guarantee"
	if b > 0 {
		verdict = fmt.Sprintf("%d break%s a guarantee", b, plural(b, "s", ""))
	}
	return fmt.Sprintf("doctor: %s; %d risk%s, %d note%s (%d checks)", verdict, k, plural(k, "", "s"), n, plural(n, "", "s"), r.Checks)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// DoctorOptions says what Admin.Doctor checks. Zero fields are read from
// the servers where they can be (see each field), else take the Config
// defaults.
type DoctorOptions struct {
	// Kafka reads the topics and the consumer group. Defaults to nil: the
	// Kafka checks are skipped, and a note says so.
	Kafka *kadm.Client
	// TopicPrefix is Config.TopicPrefix. Defaults to "".
	TopicPrefix string
	// PublishTopics are the topics the service records events for
	// (Config.PublishTopics). Defaults to the topics whose partition
	// count the service stored in outbox_meta.
	PublishTopics []string
	// ConsumeTopics are the topics the service handles. Defaults to the
	// topics ConsumerGroup has committed offsets for or subscribes to.
	ConsumeTopics []string
	// ConsumerGroup is Config.ConsumerGroup. Defaults to the group that
	// owns the inbox collection (its stamp in outbox_meta).
	ConsumerGroup string
	// OutboxRetention is Config.OutboxRetention. Defaults to the TTL of
	// the outbox's TTL index, else Config's default (7 days).
	OutboxRetention time.Duration
	// InboxRetention is Config.InboxRetention. Defaults to the TTL of the
	// inbox's TTL index, else Config's default (30 days).
	InboxRetention time.Duration
	// HandlerTimeout is Config.HandlerTimeout. Defaults to 45 s.
	HandlerTimeout time.Duration
	// ExpectedOutage is the longest time a publisher or a consumer may be
	// down (or stuck) without losing events: the topics' retention must
	// outlast it, and the oplog should. The framework's documented
	// tolerance, which Kafka's default retention (7 days) and the default
	// InboxRetention (30 days) cover. Defaults to 3 days (a long weekend).
	ExpectedOutage time.Duration
	// ProducerCompression names the publisher's codec ("none", "gzip",
	// "snappy", "lz4", "zstd"), for the size and readability checks.
	// Defaults to "gzip", Config.Compression's default.
	ProducerCompression string
	// GroupProtocol is Config.GroupProtocol, for the group protocol check
	// (which also says whether the brokers serve Kafka 4's protocol).
	// Defaults to GroupClassic.
	GroupProtocol GroupProtocol
	// Consumes says that the service handles events, so its inbox indexes
	// are required. Defaults to true when ConsumeTopics is given or
	// found, or the inbox collection exists.
	Consumes *bool
	// ClaimCheck is the Config.ClaimCheck of a service that publishes: the
	// indexes of its payload collection (outbox_payloads in
	// ClaimCheck.Database, else the outbox's database) are checked, the
	// TTL of published payloads against OutboxRetention plus
	// ClaimCheck.Margin (30 days when 0). Defaults to nil: not checked.
	ClaimCheck *ClaimCheck
}

// doctorTimeout bounds Run's check at start.
const doctorTimeout = 60 * time.Second

// Doctor checks the settings of the service's MongoDB deployment and, with
// opts.Kafka, of its Kafka topics and consumer group, against the
// guarantees the framework gives (see the README's "Before production"
// section for each check). It returns an error only when MongoDB cannot be
// read at all; a check that cannot read what it needs is a note in the
// report. It changes nothing.
func (a *Admin) Doctor(ctx context.Context, opts DoctorOptions) (DoctorReport, error) {
	def := Config{}.withDefaults()
	var payloads *mongo.Collection
	var margin time.Duration
	if cc := opts.ClaimCheck; cc != nil {
		db := cc.Database
		if db == nil {
			db = a.outbox.Database()
		}
		payloads = db.Collection(store.PayloadsCollection)
		margin = Config{ClaimCheck: cc}.claimCheckDefaults().ClaimCheck.Margin
	}
	r, err := doctor.Run(ctx, doctor.Collections{Outbox: a.outbox, Inbox: a.inbox,
		MetaSpecs: metaIndexes(), MetaExpiring: bson.D{{Key: "kind", Value: replicaKind}}}, doctor.Options{
		Kafka:               opts.Kafka,
		TopicPrefix:         opts.TopicPrefix,
		PublishTopics:       opts.PublishTopics,
		ConsumeTopics:       opts.ConsumeTopics,
		ConsumerGroup:       opts.ConsumerGroup,
		OutboxRetention:     opts.OutboxRetention,
		InboxRetention:      opts.InboxRetention,
		HandlerTimeout:      opts.HandlerTimeout,
		ExpectedOutage:      opts.ExpectedOutage,
		ProducerCompression: opts.ProducerCompression,
		GroupProtocol:       opts.GroupProtocol.String(),
		ConsumerProtocol:    opts.GroupProtocol == GroupConsumer,
		Consumes:            opts.Consumes,
		Payloads:            payloads,
		PayloadMargin:       margin,
		Defaults: doctor.Defaults{OutboxRetention: def.OutboxRetention, InboxRetention: def.InboxRetention,
			HandlerTimeout: def.HandlerTimeout},
		Redact: redactSecrets,
	})
	if err != nil {
		return DoctorReport{}, err
	}
	out := DoctorReport{Checks: r.Checks, CheckedAt: r.CheckedAt}
	for _, f := range r.Findings {
		out.Findings = append(out.Findings, Finding{Severity: Severity(f.Severity), Check: f.Check, Subject: f.Subject,
			Read: f.Read, Problem: f.Problem, Guarantee: f.Guarantee, Fix: f.Fix})
	}
	return out, nil
}

// Doctor runs Admin.Doctor with the Client's configuration: its topics,
// consumer group, retentions and handler timeout, and a Kafka client made
// from Config.Brokers and Config.KafkaOptions.
func (c *Client) Doctor(ctx context.Context) (DoctorReport, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, c.cfg.KafkaOptions...), kgo.SeedBrokers(c.cfg.Brokers...))...)
	if err != nil {
		return DoctorReport{}, fmt.Errorf("outbox: doctor: create Kafka client: %w", err)
	}
	defer cl.Close()
	consumes := c.consumes()
	var claims *ClaimCheck
	if c.claims != nil && len(c.cfg.PublishTopics) > 0 {
		claims = &ClaimCheck{Database: c.claims.Coll.Database(), Margin: c.cfg.ClaimCheck.Margin}
	}
	return c.Admin().Doctor(ctx, DoctorOptions{
		Kafka:               kadm.NewClient(cl),
		TopicPrefix:         c.cfg.TopicPrefix,
		PublishTopics:       c.cfg.PublishTopics,
		ConsumeTopics:       c.subscribedTopics(),
		ConsumerGroup:       c.cfg.ConsumerGroup,
		OutboxRetention:     c.cfg.OutboxRetention,
		InboxRetention:      c.cfg.InboxRetention,
		HandlerTimeout:      c.cfg.HandlerTimeout,
		Consumes:            &consumes,
		ProducerCompression: string(c.cfg.Compression),
		GroupProtocol:       c.cfg.GroupProtocol,
		ClaimCheck:          claims,
	})
}

// MarshalJSON writes the report with a "summary" line added.
func (r DoctorReport) MarshalJSON() ([]byte, error) {
	findings := r.Findings
	if findings == nil {
		findings = []Finding{}
	}
	return json.Marshal(struct {
		Summary   string    `json:"summary"`
		Findings  []Finding `json:"findings"`
		Checks    int       `json:"checks"`
		CheckedAt time.Time `json:"checked_at"`
	}{r.Summary(), findings, r.Checks, r.CheckedAt})
}

package outbox

// The doctor: settings of servers the framework does not own that silently
// break its guarantees.
//
// Every guarantee rests on MongoDB and Kafka settings: a topic with
// unclean.leader.election.enable loses acknowledged events, a compacted
// topic drops records of a key before a consumer reads them, a
// transactionLifetimeLimitSeconds below HandlerTimeout aborts every slow
// handler. Admin.Doctor reads those settings and reports each one that
// breaks a guarantee, risks one, or deserves a note, with what it read and
// the fix; Client.Doctor runs it with the Client's configuration, Run runs
// it once at start (doctor_run.go), outboxctl doctor and the console's
// Health page show it. The checks read only: they change nothing.
//
// The checks live in doctor_kafka.go and doctor_mongo.go, each in two
// steps: gather the facts (server reads), then judge them (pure functions,
// tested on hand-made facts as well as on the embedded servers).

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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
	GuaranteePublishing  = "at-least-once publishing"   // every committed event reaches Kafka, and stays there once acknowledged
	GuaranteeDelivery    = "at-least-once delivery"     // every published record reaches the consumers
	GuaranteeIdempotency = "idempotent processing"      // an event is handled once, whatever the redeliveries
	GuaranteeOrder       = "per-key order"              // the events of one partition key are handled in the order they were recorded
	GuaranteeProcessing  = "at-least-once processing"   // every delivered event is handled or parked
	GuaranteeCleanup     = "bounded collections"        // handled and published documents expire, waiting ones never
	GuaranteeReadability = "records every client reads" // consumers that are not this framework can read the records
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
}

// defaultExpectedOutage is DoctorOptions.ExpectedOutage's default.
const defaultExpectedOutage = 3 * 24 * time.Hour

// doctorTimeout bounds Run's check at start.
const doctorTimeout = 60 * time.Second

// doctorRun is the state of one Doctor call: options, facts, findings.
type doctorRun struct {
	a        *Admin
	opts     DoctorOptions
	now      time.Time
	findings []Finding
	checks   int
	// minISRCap is whether the brokers cap min.insync.replicas at the
	// replica count, read with their API versions (groupProtocol).
	minISRCap minISRCap
}

// add records a finding.
func (d *doctorRun) add(f Finding) { d.findings = append(d.findings, f) }

// couldNot records a check that could not read what it needs: a note, so
// that a missing permission is seen without failing the whole report.
func (d *doctorRun) couldNot(check, subject, what string, err error) {
	d.add(Finding{Severity: SeverityNote, Check: check, Subject: subject,
		Read:    "could not read " + what + ": " + redactSecrets(err.Error()),
		Problem: "this check did not run", Guarantee: "-",
		Fix: "grant the reading rights this check needs, or run the doctor where the servers answer"})
}

// Doctor checks the settings of the service's MongoDB deployment and, with
// opts.Kafka, of its Kafka topics and consumer group, against the
// guarantees the framework gives (see the README's "Before production"
// section for each check). It returns an error only when MongoDB cannot be
// read at all; a check that cannot read what it needs is a note in the
// report. It changes nothing.
func (a *Admin) Doctor(ctx context.Context, opts DoctorOptions) (DoctorReport, error) {
	d := &doctorRun{a: a, opts: opts, now: time.Now()}
	if err := d.mongo(ctx); err != nil {
		return DoctorReport{}, err
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

// report sorts the findings: worst first, then by check and subject.
func (d *doctorRun) report() DoctorReport {
	slices.SortStableFunc(d.findings, func(x, y Finding) int {
		return cmp.Or(cmp.Compare(y.Severity, x.Severity), cmp.Compare(x.Check, y.Check), cmp.Compare(x.Subject, y.Subject))
	})
	return DoctorReport{Findings: d.findings, Checks: d.checks, CheckedAt: d.now.UTC()}
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
	})
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

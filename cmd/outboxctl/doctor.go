package main

// outboxctl doctor: the settings of MongoDB and Kafka that break or risk
// the framework's guarantees (outbox.Admin.Doctor).
//
//	outboxctl [flags] doctor [-brokers host:port,...] [-group g] [-publish t,...] [-consume t,...]
//	    [-prefix p] [-outage 72h] [-handler-timeout 45s] [-json]
//
// It reads MONGODB_URI / -uri and OUTBOX_DB / -db like the other commands,
// and KAFKA_BROKERS / -brokers for the Kafka checks (skipped, with a note,
// without brokers). The publish topics default to those whose partition
// count the service stored in outbox_meta, the consumer group to the
// inbox's owner, the consumed topics to the group's; -publish, -consume and
// -group name them instead. It prints each finding (worst first) and a
// one-line summary, or with -json the report as JSON ("summary",
// "findings", "checks", "checked_at"). Exit status: 0 when nothing breaks a
// guarantee, 1 when something does (or the checks could not run), 2 for a
// usage error.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// errBreaks ends the doctor command with exit status 1 once its report is
// printed.
var errBreaks = errors.New("a setting breaks a guarantee (see the findings above)")

// doctorOptions are the doctor's flags.
type doctorOptions struct {
	group, publish, consume, prefix string
	outage, handlerTimeout          time.Duration
	groupProtocol                   string
}

func (o *cliOptions) doctor(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	var proto outbox.GroupProtocol
	switch o.doc.groupProtocol {
	case "", "classic":
	case "consumer":
		proto = outbox.GroupConsumer
	default:
		return usagef("-group-protocol %q: want classic or consumer", o.doc.groupProtocol)
	}
	opts := outbox.DoctorOptions{
		GroupProtocol:  proto,
		ConsumerGroup:  o.doc.group,
		PublishTopics:  splitList(o.doc.publish),
		ConsumeTopics:  splitList(o.doc.consume),
		TopicPrefix:    o.doc.prefix,
		ExpectedOutage: o.doc.outage,
		HandlerTimeout: o.doc.handlerTimeout,
	}
	if brokers := splitList(o.brokers); len(brokers) > 0 {
		kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("outboxctl-doctor"))
		if err != nil {
			return usagef("-brokers %q: %v", o.brokers, err)
		}
		defer kc.Close()
		opts.Kafka = kadm.NewClient(kc)
	}
	r, err := admin.Doctor(ctx, opts)
	if err != nil {
		return err
	}
	if o.json {
		if err := writeJSON(w, r); err != nil {
			return err
		}
	} else if err := printDoctor(w, r); err != nil {
		return err
	}
	if len(r.Breaking()) > 0 {
		return errBreaks
	}
	return nil
}

// printDoctor writes the findings, one block each, then the summary.
func printDoctor(w io.Writer, r outbox.DoctorReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s: %s\n", strings.ToUpper(f.Severity.String()), f.Subject, f.Problem)
		fmt.Fprintf(tw, "\tread:\t%s\n", f.Read)
		if f.Guarantee != "-" {
			fmt.Fprintf(tw, "\tguarantee:\t%s\n", f.Guarantee)
		}
		fmt.Fprintf(tw, "\tfix:\t%s\n", f.Fix)
		fmt.Fprintf(tw, "\tcheck:\t%s\n\n", f.Check)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, r.Summary())
	return err
}

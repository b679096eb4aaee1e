// Command outboxctl inspects and repairs the outbox and inbox collections of
// a service built on github.com/event-outbox/outbox, directly in MongoDB.
// It needs neither Kafka nor the service's handlers.
//
// Usage:
//
//	outboxctl [flags] migrate event-outbox -partitions topic=N,... -brokers host:port,...
//	outboxctl [flags] status
//	outboxctl [flags] parked list
//	outboxctl [flags] parked redrive (<id>... | -all)
//	outboxctl [flags] parked purge (<id>... | -all)
//	outboxctl [flags] outbox failed list
//	outboxctl [flags] outbox failed retry (<id>... | -all)
//	outboxctl [flags] outbox failed discard (<id>... | -all)
//	outboxctl [flags] ui [-addr 127.0.0.1:8090] [-brokers ...] [-service ...] [-allowed-hosts ...] [-actions]
//	outboxctl [flags] doctor [-brokers ...] [-group ...] [-outage 72h] [-json]
//
// "doctor" checks the settings of MongoDB and Kafka that the guarantees
// rest on; see doctor.go.
//
// "ui" serves the operations console (package console) in a browser; see
// ui.go. -actions needs an operator password in $OUTBOX_CONSOLE_PASSWORD.
//
// Flags may come before or after the command:
//
//	-uri      MongoDB connection string (default: $MONGODB_URI)
//	-db       the service's database (default: $OUTBOX_DB)
//	-outbox   outbox collection (default "outbox")
//	-inbox    inbox collection (default "inbox")
//	-json     JSON output instead of tables
//	-dry-run  report what a destructive command would change, change nothing
//	-all      act on every selected event (redrive, purge, retry, discard)
//	-topic, -schema   narrow the selection
//	-before   only events parked before this time (RFC 3339) or this long ago (duration, e.g. 24h)
//	-limit    list at most this many events (default 100; 0 for all)
//	-timeout  overall deadline (default 30s)
//	-partitions  partition counts of the topics, topic=N,... (migrate), checked against Kafka
//	-brokers  Kafka brokers (ui, migrate; default: $KAFKA_BROKERS)
//	-topic-prefix  the service's Config.TopicPrefix (migrate)
//
// Parked event ids have the form topic/schema/key, each part escaped (a
// slash inside a part is %2F, a percent sign %25), as "parked list" prints
// them (with -json too: "id" and "held_by" are strings in that form,
// "inbox_id" has the fields); failed outbox event ids are hex ObjectIDs.
// "status" fails when the database, or both its outbox and inbox
// collections, do not exist, and warns when one of the two is missing.
// "parked redrive" refuses a malformed record whose envelope could not be
// read (it can never be re-driven: purge it). "parked list" shows each
// event's state: "parked", or "held" behind an earlier parked event of its
// partition key (HELD BY), which releases it when re-driven or purged.
//
// "parked redrive" does not run handlers itself: it marks the events, and a
// running consumer of the service that has their handler re-drives them
// within a few seconds (see the package documentation of outbox, section
// "Operations"). "parked purge" gives up on events: they are
// marked handled (discarded), so a redelivery is skipped, and the inbox TTL
// removes them later. "outbox failed retry" clears the failed mark so the
// publisher tries the events again; "outbox failed discard" deletes them.
// Under the default poison policy (HoldKey) a failed event holds the later
// events of its partition key in the outbox: "status" counts these held
// keys and events, and a retry or a discard releases them, in order.
//
// Exit status: 0 success, 1 failure (MongoDB unreachable, event not
// parked...), 2 usage error. A change naming several ids changes those
// that match and names each id that matched nothing on stderr; any such id
// makes the exit status 1, so a script never takes a partial change for a
// whole one. The connection string never appears in the
// output: a mistake in it is named (the invalid option, or "user name or
// password is malformed"), not quoted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct {
	msg     string
	printed bool // the flag package printed it already
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// options are the parsed command line.
type cliOptions struct {
	uri, db, outbox, inbox  string
	json, dryRun, all       bool
	scheduled               bool
	topic, schema, before   string
	limit                   int
	timeout                 time.Duration
	partitions, topicPrefix string
	words                   []string // command words and ids
	// ui only
	addr, brokers, services       string
	claimCheckDBs                 string
	actions, findIndexes          bool
	allowedHosts, consolePassword string
	secureCookies                 bool
	// doctor only
	doc doctorOptions

	// stderr receives warnings; mdb is the service's database once
	// connected.
	stderr io.Writer
	mdb    *mongo.Database
}

func parse(args []string, stderr io.Writer, getenv func(string) string) (*cliOptions, error) {
	o := &cliOptions{}
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.uri, "uri", getenv("MONGODB_URI"), "MongoDB connection string (default $MONGODB_URI)")
	fs.StringVar(&o.db, "db", getenv("OUTBOX_DB"), "the service's database (default $OUTBOX_DB)")
	fs.StringVar(&o.outbox, "outbox", "outbox", "outbox collection")
	fs.StringVar(&o.inbox, "inbox", "inbox", "inbox collection")
	fs.BoolVar(&o.json, "json", false, "JSON output")
	fs.BoolVar(&o.dryRun, "dry-run", false, "change nothing; report what would change")
	fs.BoolVar(&o.all, "all", false, "act on every selected event")
	fs.StringVar(&o.topic, "topic", "", "only events of this topic")
	fs.BoolVar(&o.scheduled, "scheduled", false, "outbox failed list, discard: the scheduled events whose promotion was refused, not the outbox's failed events")
	fs.StringVar(&o.schema, "schema", "", "only events of this content schema")
	fs.StringVar(&o.before, "before", "", "only events parked before this RFC 3339 time, or this long ago (e.g. 24h)")
	fs.IntVar(&o.limit, "limit", 100, "list at most this many events (0: all)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "overall deadline")
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8090", "ui: listen address")
	fs.StringVar(&o.brokers, "brokers", getenv("KAFKA_BROKERS"), "Kafka brokers, comma-separated: ui, for the partitions page; doctor; migrate, to check -partitions (default $KAFKA_BROKERS)")
	fs.StringVar(&o.topicPrefix, "topic-prefix", "", "migrate: the service's Config.TopicPrefix, to find its Kafka topics")
	fs.StringVar(&o.services, "service", "", "ui: service names, comma-separated, one per -db database (default the database names)")
	fs.StringVar(&o.claimCheckDBs, "claim-check-db", "", "ui: the services' claim-check databases (Config.ClaimCheck.Database) on the -uri cluster, comma-separated, one per -db database or one for all (default each service's own database)")
	fs.BoolVar(&o.actions, "actions", false, "ui: enable re-drive, purge, retry and discard")
	fs.BoolVar(&o.findIndexes, "find-indexes", false, "ui: create the indexes of the find page first")
	fs.StringVar(&o.allowedHosts, "allowed-hosts", "", "ui: host names, comma-separated, the console answers to besides localhost and IP addresses (the name operators open it by)")
	fs.BoolVar(&o.secureCookies, "secure-cookies", false, "ui: mark cookies Secure (behind a proxy that terminates TLS)")
	o.consolePassword = getenv(envConsolePassword)
	fs.StringVar(&o.partitions, "partitions", "", "partition counts of the topics, topic=N,... (migrate event-outbox)")
	fs.StringVar(&o.doc.group, "group", "", "doctor: the service's consumer group (default the inbox's owner)")
	fs.StringVar(&o.doc.publish, "publish", "", "doctor: the topics the service publishes, comma-separated (default those stored in outbox_meta)")
	fs.StringVar(&o.doc.consume, "consume", "", "doctor: the topics the service handles, comma-separated (default the consumer group's)")
	fs.StringVar(&o.doc.prefix, "prefix", "", "doctor: the service's Config.TopicPrefix")
	fs.DurationVar(&o.doc.outage, "outage", 0, "doctor: the longest outage the topics and the oplog must outlast (default 72h)")
	fs.DurationVar(&o.doc.handlerTimeout, "handler-timeout", 0, "doctor: the service's Config.HandlerTimeout (default 45s)")
	fs.StringVar(&o.doc.groupProtocol, "group-protocol", "classic", "doctor: the service's Config.GroupProtocol: classic or consumer (Kafka 4, KIP-848)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage:
  outboxctl [flags] migrate event-outbox -partitions topic=N,... -brokers host:port,...
  outboxctl [flags] status
  outboxctl [flags] parked list
  outboxctl [flags] parked redrive (<id>... | -all)
  outboxctl [flags] parked purge (<id>... | -all)
  outboxctl [flags] outbox failed list [-scheduled]
  outboxctl [flags] outbox failed retry (<id>... | -all)
  outboxctl [flags] outbox failed discard [-scheduled] (<id>... | -all)
  outboxctl [flags] ui [-addr host:port] [-brokers ...] [-service ...] [-claim-check-db ...] [-allowed-hosts ...] [-actions]
  outboxctl [flags] doctor [-brokers ...] [-group ...] [-outage 72h] [-json]
flags:
`)
		fs.PrintDefaults()
	}
	// Flags and words may be interleaved: parse up to each word, keep it,
	// go on after it. After "--" everything is a word.
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{msg: err.Error(), printed: true}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			o.words = append(o.words, rest...)
			break
		}
		o.words = append(o.words, rest[0])
		args = rest[1:]
	}
	switch {
	case len(o.words) == 0:
		fs.Usage()
		return nil, usagef("no command")
	case o.uri == "":
		return nil, usagef("no MongoDB URI: set -uri or MONGODB_URI")
	case o.db == "":
		return nil, usagef("no database: set -db or OUTBOX_DB")
	case o.limit < 0:
		return nil, usagef("-limit must not be negative")
	case o.timeout <= 0:
		return nil, usagef("-timeout must be positive")
	case o.doc.outage < 0:
		return nil, usagef("-outage must not be negative")
	case o.doc.handlerTimeout < 0:
		return nil, usagef("-handler-timeout must not be negative")
	case strings.TrimSpace(o.outbox) == "":
		return nil, usagef("-outbox must not be empty")
	case strings.TrimSpace(o.inbox) == "":
		return nil, usagef("-inbox must not be empty")
	}
	if _, err := o.parkedFilter(); err != nil {
		return nil, err
	}
	if _, err := parsePartitions(o.partitions); err != nil {
		return nil, err
	}
	return o, nil
}

// run runs one command and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	o, err := parse(args, stderr, getenv)
	var secrets []string
	if o != nil {
		secrets = uriSecrets(o.uri)
	}
	if err == nil {
		o.stderr = stderr
		err = o.execute(ctx, stdout)
	}
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &uerr):
		if !uerr.printed {
			fmt.Fprintln(stderr, "outboxctl:", redact(err.Error(), secrets))
		}
		return exitUsage
	default:
		fmt.Fprintln(stderr, "outboxctl:", redact(err.Error(), secrets))
		return exitFailure
	}
}

func (o *cliOptions) execute(ctx context.Context, stdout io.Writer) error {
	cmd := strings.Join(o.words[:min(len(o.words), 3)], " ")
	if len(o.words) == 1 && o.words[0] == "ui" {
		return o.ui(ctx, stdout)
	}
	var do func(context.Context, *outbox.Admin, io.Writer) error
	switch {
	case len(o.words) == 2 && o.words[0] == "migrate" && o.words[1] == "event-outbox":
		if _, err := parsePartitions(o.partitions); err != nil {
			return err
		}
		if len(splitList(o.brokers)) == 0 {
			return usagef("migrate event-outbox checks -partitions against Kafka: set -brokers or KAFKA_BROKERS (and -topic-prefix if the service has a TopicPrefix)")
		}
		do = o.migrateEventOutbox
	case len(o.words) == 1 && o.words[0] == "status":
		do = o.status
	case len(o.words) == 1 && o.words[0] == "doctor":
		do = o.doctor
	case len(o.words) == 2 && o.words[0] == "parked" && o.words[1] == "list":
		do = o.parkedList
	case len(o.words) >= 2 && o.words[0] == "parked" && (o.words[1] == "redrive" || o.words[1] == "purge"):
		do = o.parkedChange
	case len(o.words) == 3 && o.words[0] == "outbox" && o.words[1] == "failed" && o.words[2] == "list":
		do = o.failedList
	case len(o.words) >= 3 && o.words[0] == "outbox" && o.words[1] == "failed" && (o.words[2] == "retry" || o.words[2] == "discard"):
		do = o.failedChange
	default:
		return usagef("unknown command %q (commands: status, doctor, parked list|redrive|purge, outbox failed list|retry|discard, migrate event-outbox, ui)", cmd)
	}
	// Check the whole command line before connecting.
	if _, err := o.parkedFilter(); err != nil {
		return err
	}
	switch {
	case o.words[0] == "parked" && len(o.words) >= 2 && o.words[1] != "list":
		ids, err := o.ids(2, "parked "+o.words[1])
		if err != nil {
			return err
		}
		for _, s := range ids {
			if _, err := outbox.ParseInboxID(s); err != nil {
				return usagef("%v", err)
			}
		}
	case o.words[0] == "outbox" && o.words[2] != "list":
		ids, err := o.ids(3, "outbox failed "+o.words[2])
		if err != nil {
			return err
		}
		for _, s := range ids {
			if _, err := bson.ObjectIDFromHex(s); err != nil {
				return usagef("outbox failed %s: id %q: want the 24 hex digits of an ObjectID, as \"outbox failed list\" prints them", o.words[2], s)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	client, err := o.connect("outboxctl", min(o.timeout, 10*time.Second))
	if err != nil {
		return err
	}
	defer disconnect(ctx, client)
	o.mdb = client.Database(o.db)
	admin := outbox.NewAdmin(o.mdb, o.outbox, o.inbox)
	return do(ctx, admin, stdout)
}

// checkCollections fails when the service's database or both of its
// collections do not exist, and warns when one of them does not (a service
// that only publishes has no inbox; one that only consumes may have no
// outbox).
func (o *cliOptions) checkCollections(ctx context.Context) error {
	names, err := o.mdb.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$in", Value: bson.A{o.outbox, o.inbox}}}}})
	if err != nil {
		return fmt.Errorf("list the collections of %s: %w", o.db, err)
	}
	switch {
	case len(names) == 0:
		dbs, err := o.mdb.Client().ListDatabaseNames(ctx, bson.D{{Key: "name", Value: o.db}})
		if err == nil && len(dbs) == 0 {
			return fmt.Errorf("database %q does not exist (check -db or $OUTBOX_DB)", o.db)
		}
		return fmt.Errorf("database %q has neither an outbox collection %q nor an inbox collection %q (check -db, -outbox and -inbox)",
			o.db, o.outbox, o.inbox)
	case len(names) == 1:
		missing, role := o.inbox, "inbox"
		if names[0] == o.inbox {
			missing, role = o.outbox, "outbox"
		}
		fmt.Fprintf(o.stderr, "outboxctl: warning: database %q has no %s collection %q: its counts read 0 (check -%s if the service has one)\n",
			o.db, role, missing, role)
	}
	return nil
}

// parkedEventJSON is a parked event as "parked list -json" prints it: the
// ids in the topic/schema/key form that "parked redrive" and "parked
// purge" take, and the id's fields under inbox_id.
type parkedEventJSON struct {
	ID      string         `json:"id"`
	InboxID outbox.InboxID `json:"inbox_id"`
	HeldBy  string         `json:"held_by,omitempty"`
	outbox.ParkedEvent
}

func parkedJSON(events []outbox.ParkedEvent) []parkedEventJSON {
	out := make([]parkedEventJSON, len(events))
	for i, e := range events {
		out[i] = parkedEventJSON{ID: e.ID.String(), InboxID: e.ID, ParkedEvent: e}
		if e.HeldBy != nil {
			out[i].HeldBy = e.HeldBy.String()
		}
	}
	return out
}

// parkedFilter builds the selection of the parked commands from -topic,
// -schema, -before, -limit and the ids after the command words.
func (o *cliOptions) parkedFilter() (outbox.ParkedFilter, error) {
	f := outbox.ParkedFilter{Topic: o.topic, ContentSchema: o.schema, Limit: o.limit}
	if o.before != "" {
		if d, err := time.ParseDuration(o.before); err == nil {
			if d < 0 {
				// A time in the future would select every event.
				return f, usagef("-before %q: a duration must not be negative", o.before)
			}
			f.ParkedBefore = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, o.before); err == nil {
			f.ParkedBefore = t
		} else {
			return f, usagef("-before %q: want an RFC 3339 time or a duration", o.before)
		}
	}
	return f, nil
}

// ids returns the ids given after n command words, checking them against
// -all: exactly one of the two must be given.
func (o *cliOptions) ids(n int, what string) ([]string, error) {
	ids := o.words[n:]
	switch {
	case len(ids) == 0 && !o.all:
		return nil, usagef("%s: name events by id, or pass -all", what)
	case len(ids) > 0 && o.all:
		return nil, usagef("%s: ids and -all exclude each other", what)
	}
	return ids, nil
}

func (o *cliOptions) status(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	// A mistyped -db, -outbox or -inbox reads as a healthy, empty service:
	// say so instead.
	if err := o.checkCollections(ctx); err != nil {
		return err
	}
	st, err := admin.StoreStatus(ctx)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, st)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "database\t%s (collections %s, %s)\n", o.db, o.outbox, o.inbox)
	fmt.Fprintf(tw, "pending\t%d\toldest %s\n", st.Pending, age(st.OldestPendingAge))
	fmt.Fprintf(tw, "failed\t%d\theld keys %d, held events %d (under PoisonPolicy HoldKey)\n", st.Failed, st.OutboxHeldKeys, st.OutboxHeldEvents)
	// As the console counts them: the parked heads, and the events held
	// behind them (StoreStatus.Parked counts both).
	fmt.Fprintf(tw, "parked\t%d\theld behind them %d, re-drive requested %d (waiting to run again %d)\n", st.Parked-st.Held, st.Held, st.RedriveRequested, st.RedriveDeferred)
	if st.Scheduled > 0 || st.ScheduledFailed > 0 {
		fmt.Fprintf(tw, "scheduled\t%d\tnext due %s, promotion refused %d\n", st.Scheduled, dueTime(st.NextDue), st.ScheduledFailed)
		for _, b := range st.Topics {
			if b.Scheduled > 0 {
				fmt.Fprintf(tw, "  %s\t%d\tnext due %s\n", b.Topic, b.Scheduled, dueTime(b.NextDue))
			}
		}
	}
	if cc := st.ClaimCheck; cc.Pending > 0 || cc.Unresolved > 0 {
		fmt.Fprintf(tw, "claim check\t%d\tpayloads out of band waiting for publication, %d bytes, oldest %s; parked unresolved %d\n",
			cc.Pending, cc.PendingBytes, age(cc.OldestPendingAge), cc.Unresolved)
	}
	if len(st.Topics) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "TOPIC\tPENDING\tOLDEST\tFAILED\tHELD KEYS\tHELD EVENTS")
		for _, b := range st.Topics {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\n", b.Topic, b.Pending, age(b.OldestPendingAge), b.Failed, b.HeldKeys, b.HeldEvents)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range st.Topics {
		if cause := b.UnroutableCause(); cause != "" {
			fmt.Fprintf(w, "\nwarning: %s\n", cause)
		}
	}
	return nil
}

// dueTime shows a scheduled event's due time, "-" for none.
func dueTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func (o *cliOptions) parkedList(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	f, err := o.parkedFilter()
	if err != nil {
		return err
	}
	events, err := admin.ParkedEvents(ctx, f)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, parkedJSON(events))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tHELD BY\tPARKED AT\tATTEMPTS\tPARTITION@OFFSET\tREDRIVE\tLAST ERROR")
	for _, e := range events {
		redrive := "-"
		if !e.RedriveRequestedAt.IsZero() {
			redrive = "requested"
			if e.RedriveDeferred != "" {
				redrive = "waiting (" + oneLine(e.RedriveDeferred, 60) + ")"
			}
		}
		heldBy := "-"
		if e.HeldBy != nil {
			heldBy = e.HeldBy.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d@%d\t%s\t%s\n", e.ID, e.State, heldBy, e.ParkedAt.UTC().Format(time.RFC3339), e.Attempts,
			e.Partition, e.Offset, redrive, oneLine(e.LastError, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(events) == o.limit && o.limit > 0 {
		fmt.Fprintf(w, "(first %d shown; -limit 0 lists all)\n", o.limit)
	}
	return nil
}

func (o *cliOptions) parkedChange(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	action := o.words[1]
	raw, err := o.ids(2, "parked "+action)
	if err != nil {
		return err
	}
	f, err := o.parkedFilter()
	if err != nil {
		return err
	}
	for _, s := range raw {
		id, err := outbox.ParseInboxID(s)
		if err != nil {
			return usagef("%v", err)
		}
		f.IDs = append(f.IDs, id)
	}
	change := admin.PurgeParked
	if action == "redrive" {
		change = admin.RequestRedrive
	}
	missing, err := o.unmatched(raw, func(i int) (int64, error) {
		one := f
		one.IDs = f.IDs[i : i+1]
		n, err := change(ctx, one, true)
		if errors.Is(err, outbox.ErrNotParked) {
			return 0, nil
		}
		return n, err
	})
	if err != nil {
		return err
	}
	if len(missing) == len(raw) && len(raw) > 0 {
		// Nothing to change: the error of the change itself says so.
		_, err := change(ctx, f, o.dryRun)
		return err
	}
	n, err := change(ctx, f, o.dryRun)
	if err != nil {
		return err
	}
	what := map[string]string{
		"redrive": "requested re-drive of %d parked event(s); a running consumer of the service re-drives them within seconds",
		"purge":   "purged %d parked event(s): marked handled (discarded); redeliveries are skipped",
	}[action]
	if o.dryRun {
		what = map[string]string{
			"redrive": "dry run: would request re-drive of %d parked event(s)",
			"purge":   "dry run: would purge %d parked event(s)",
		}[action]
	}
	if err := o.report(w, "parked "+action, n, what); err != nil {
		return err
	}
	return o.missing("parked "+action, "no parked event with id", missing)
}

// unmatched returns the ids (in the order given) for which count(i), the
// dry run of the change for ids[i] alone, matches nothing. They are found
// before the change: after it, a purged or retried event no longer matches.
func (o *cliOptions) unmatched(ids []string, count func(i int) (int64, error)) ([]string, error) {
	var missing []string
	for i, id := range ids {
		n, err := count(i)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// missing names each id of a change that matched nothing on stderr, one a
// line, and returns the failure that gives exit status 1; nil when none.
func (o *cliOptions) missing(command, what string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	for _, id := range ids {
		fmt.Fprintf(o.stderr, "outboxctl: %s: %s %s\n", command, what, id)
	}
	return fmt.Errorf("%s: %d of the ids given matched nothing", command, len(ids))
}

func (o *cliOptions) failedList(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	events, err := admin.FailedEvents(ctx, outbox.FailedFilter{Topic: o.topic, Limit: o.limit, Scheduled: o.scheduled})
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, events)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOPIC/PARTITION\tSCHEMA\tFAILED AT\tSIZE\tERROR")
	for _, e := range events {
		fmt.Fprintf(tw, "%s\t%s/%d\t%s\t%s\t%d\t%s\n", e.ID, e.Topic, e.Partition, e.ContentSchema,
			e.FailedAt.UTC().Format(time.RFC3339), e.PayloadSize, oneLine(e.Error, 80))
	}
	return tw.Flush()
}

func (o *cliOptions) failedChange(ctx context.Context, admin *outbox.Admin, w io.Writer) error {
	action := o.words[2]
	ids, err := o.ids(3, "outbox failed "+action)
	if err != nil {
		return err
	}
	change, what := admin.RetryFailed, "retrying %d failed event(s): the publisher tries them again at its next scan (the events their keys held follow, in order)"
	if action == "discard" {
		change, what = admin.DiscardFailed, "discarded %d failed event(s): the events their keys held are published, in order"
		if o.scheduled {
			what = "discarded %d failed scheduled event(s)"
		}
	}
	f := outbox.FailedFilter{Topic: o.topic, Scheduled: o.scheduled}
	missing, err := o.unmatched(ids, func(i int) (int64, error) {
		return change(ctx, f, ids[i:i+1], true)
	})
	if err != nil {
		return err
	}
	if len(missing) == len(ids) && len(ids) > 0 {
		return fmt.Errorf("no failed outbox event with id %s", strings.Join(ids, ", "))
	}
	n, err := change(ctx, f, ids, o.dryRun)
	if err != nil {
		return err
	}
	if o.dryRun {
		what = "dry run: would " + action + " %d failed event(s)"
	}
	if err := o.report(w, "outbox failed "+action, n, what); err != nil {
		return err
	}
	return o.missing("outbox failed "+action, "no failed outbox event with id", missing)
}

// report prints the outcome of a change.
func (o *cliOptions) report(w io.Writer, command string, n int64, format string) error {
	if o.json {
		return writeJSON(w, map[string]any{"command": command, "dry_run": o.dryRun, "count": n})
	}
	_, err := fmt.Fprintf(w, format+"\n", n)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}

// oneLine shortens a message to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

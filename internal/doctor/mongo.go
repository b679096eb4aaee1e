package doctor

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The doctor's MongoDB checks. Each judge* function turns facts into
// findings and does no I/O.

// clockTolerance is the clock difference between the service and MongoDB
// that the clock check lets pass (beyond the round trip).
const clockTolerance = 5 * time.Second

// mongo runs the MongoDB checks. It fails only when MongoDB does not
// answer hello.
func (d *run) mongo(ctx context.Context) error {
	client := d.store.Database().Client()
	admin := client.Database("admin")

	// Replica set, and the clock difference.
	var hello struct {
		SetName   string    `bson:"setName"`
		Msg       string    `bson:"msg"`
		LocalTime time.Time `bson:"localTime"`
	}
	sent := time.Now()
	if err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return fmt.Errorf("outbox: doctor: MongoDB hello: %w", err)
	}
	received := time.Now()
	d.checks += 2
	d.findings = append(d.findings, judgeReplicaSet(hello.SetName, hello.Msg)...)
	if !hello.LocalTime.IsZero() {
		rtt := received.Sub(sent)
		skew := hello.LocalTime.Sub(sent.Add(rtt / 2))
		d.findings = append(d.findings, judgeClock(skew, rtt)...)
	}

	// The oplog window (a replica set member only: mongos has none).
	if hello.SetName != "" {
		d.checks++
		first, last, err := oplogBounds(ctx, client)
		if err != nil {
			d.couldNot("mongo.oplog_window", "MongoDB", "the oplog (local.oplog.rs)", err)
		} else {
			d.findings = append(d.findings, judgeOplog(first, last, d.expectedOutage())...)
		}
	}

	// transactionLifetimeLimitSeconds against HandlerTimeout.
	d.checks++
	var param struct {
		Limit *int64 `bson:"transactionLifetimeLimitSeconds"`
	}
	err := admin.RunCommand(ctx, bson.D{{Key: "getParameter", Value: 1}, {Key: "transactionLifetimeLimitSeconds", Value: 1}}).Decode(&param)
	switch {
	case err != nil:
		d.couldNot("mongo.transaction_lifetime", "MongoDB", "transactionLifetimeLimitSeconds (getParameter)", err)
	case param.Limit != nil:
		d.findings = append(d.findings, judgeTransactionLifetime(time.Duration(*param.Limit)*time.Second, d.handlerTimeout())...)
	}

	// The default write concern.
	d.checks++
	var rw struct {
		WriteConcern bson.Raw `bson:"defaultWriteConcern"`
		Source       string   `bson:"defaultWriteConcernSource"`
	}
	if err := admin.RunCommand(ctx, bson.D{{Key: "getDefaultRWConcern", Value: 1}}).Decode(&rw); err != nil {
		d.couldNot("mongo.write_concern", "MongoDB", "the default write concern (getDefaultRWConcern)", err)
	} else {
		var w any
		if rw.WriteConcern != nil {
			if v, err := rw.WriteConcern.LookupErr("w"); err == nil {
				w = rawValue(v)
			}
		}
		d.findings = append(d.findings, judgeWriteConcern(w, rw.Source)...)
	}

	// Indexes, the inbox's owner.
	return d.mongoCollections(ctx)
}

// rawValue returns a BSON value as a Go value (numbers as int64, strings
// as string), for the findings' text.
func rawValue(v bson.RawValue) any {
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	if n, ok := v.AsInt64OK(); ok {
		return n
	}
	return v.String()
}

// oplogBounds reads the wall times of the first and last oplog entries
// (falling back to their timestamps' seconds).
func oplogBounds(ctx context.Context, client *mongo.Client) (first, last time.Time, err error) {
	oplog := client.Database("local").Collection("oplog.rs")
	read := func(dir int) (time.Time, error) {
		var e struct {
			TS   bson.Timestamp `bson:"ts"`
			Wall time.Time      `bson:"wall"`
		}
		err := oplog.FindOne(ctx, bson.D{}, options.FindOne().
			SetSort(bson.D{{Key: "$natural", Value: dir}}).
			SetProjection(bson.D{{Key: "ts", Value: 1}, {Key: "wall", Value: 1}})).Decode(&e)
		if err != nil {
			return time.Time{}, err
		}
		if e.Wall.IsZero() {
			return time.Unix(int64(e.TS.T), 0), nil
		}
		return e.Wall, nil
	}
	if first, err = read(1); err != nil {
		return first, last, err
	}
	last, err = read(-1)
	return first, last, err
}

// expectedOutage is Options.ExpectedOutage or its default.
func (d *run) expectedOutage() time.Duration {
	if d.opts.ExpectedOutage > 0 {
		return d.opts.ExpectedOutage
	}
	return DefaultExpectedOutage
}

// handlerTimeout is Options.HandlerTimeout or the configuration's default.
func (d *run) handlerTimeout() time.Duration {
	if d.opts.HandlerTimeout > 0 {
		return d.opts.HandlerTimeout
	}
	return d.opts.Defaults.HandlerTimeout
}

// mongoCollections checks the indexes of the outbox, inbox and outbox_meta
// collections and the inbox's owner, and fills the options' defaults that
// come from them (retentions, consumer group).
func (d *run) mongoCollections(ctx context.Context) error {
	db := d.store.Database()
	outbox, inbox, meta := d.store.OutboxName(), d.store.InboxName(), d.store.MetaName()
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("outbox: doctor: list the collections of %s: %w", db.Name(), err)
	}
	exists := map[string]bool{}
	for _, n := range names {
		exists[n] = true
	}

	// The inbox stamp names its owner.
	var stamp *Owner
	if exists[meta] {
		stamp, err = d.store.InboxOwner(ctx)
		if err != nil {
			d.couldNot("mongo.inbox_owner", "collection "+db.Name()+"."+inbox, "its stamp in "+meta, err)
		}
	}
	if d.opts.ConsumerGroup == "" && stamp != nil {
		d.opts.ConsumerGroup = stamp.ConsumerGroup
	}
	consumes := exists[inbox] || len(d.opts.ConsumeTopics) > 0
	if d.opts.Consumes != nil {
		consumes = *d.opts.Consumes
	}
	if consumes {
		d.checks++
		d.findings = append(d.findings, judgeInboxOwner(db.Name(), inbox, meta, stamp, d.opts.ConsumerGroup, exists[inbox])...)
	}

	// A collection that does not exist yet has no indexes to check: Run
	// creates both.
	list := func(coll string) ([]bson.D, bool) {
		if !exists[coll] {
			d.add(Finding{Severity: SeverityNote, Check: "mongo.indexes", Subject: "collection " + db.Name() + "." + coll,
				Read: "the collection does not exist", Problem: "its indexes were not checked", Guarantee: "-",
				Fix: "run the service: Run creates its collections' indexes at start (check -db, -outbox and -inbox if it ran)"})
			return nil, false
		}
		ixs, err := d.store.ListIndexes(ctx, coll)
		if err != nil {
			d.couldNot("mongo.indexes", "collection "+db.Name()+"."+coll, "its indexes", err)
			return nil, false
		}
		return ixs, true
	}
	outboxIdx, okOut := list(outbox)
	var inboxIdx []bson.D
	okIn := false
	if consumes {
		inboxIdx, okIn = list(inbox)
	}
	metaIdx, okMeta := list(meta)

	// Retentions: given, else the TTL indexes', else the configuration's
	// defaults. A collection has one TTL index, whatever its retention.
	def := d.opts.Defaults
	ttlOf := func(ixs []bson.D, want Indexes) time.Duration {
		for _, s := range want.Specs {
			if s.TTL == nil {
				continue
			}
			for _, ix := range ixs {
				if !s.Matches(ix) {
					continue
				}
				if ttl, ok := want.TTL(ix); ok {
					return time.Duration(ttl) * time.Second
				}
			}
		}
		return 0
	}
	givenOut, givenIn := d.opts.OutboxRetention > 0, d.opts.InboxRetention > 0
	if !givenOut {
		d.opts.OutboxRetention = cmp0(ttlOf(outboxIdx, d.store.OutboxIndexes(def.OutboxRetention)), def.OutboxRetention)
	}
	if !givenIn {
		d.opts.InboxRetention = cmp0(ttlOf(inboxIdx, d.store.InboxIndexes(def.InboxRetention)), def.InboxRetention)
	}
	collName := func(c string) string { return db.Name() + "." + c }
	if okOut {
		d.checks++
		d.findings = append(d.findings, judgeIndexes(collName(outbox), outboxIdx, d.store.OutboxIndexes(d.opts.OutboxRetention), givenOut,
			"unpublished events", "published events")...)
	}
	if okIn {
		d.checks++
		d.findings = append(d.findings, judgeIndexes(collName(inbox), inboxIdx, d.store.InboxIndexes(d.opts.InboxRetention), givenIn,
			"unhandled and parked events", "handled events")...)
	}
	if okMeta {
		d.checks++
		d.findings = append(d.findings, judgeIndexes(collName(meta), metaIdx, d.store.MetaIndexes(), false,
			"inbox stamps and partition counts", "replica liveness records")...)
	}
	d.checkPayloads(ctx, givenOut)
	return nil
}

// checkPayloads checks the indexes of the claim check's payload collection
// (Options.Payloads): its chunks are read by {ref, n}, and published ones
// expire the outbox retention plus the margin after their publication, so
// that a payload outlives the outbox documents that refer to it by the
// margin that covers redelivery. A collection that does not exist yet is
// a note: the service creates it with its indexes at start.
func (d *run) checkPayloads(ctx context.Context, retentionGiven bool) {
	coll := d.opts.Payloads
	if coll == nil {
		return
	}
	subject := "collection " + coll.Database().Name() + "." + coll.Name()
	ixs, err := listIndexes(ctx, coll)
	if err != nil {
		d.couldNot("mongo.indexes", subject, "its indexes", err)
		return
	}
	if len(ixs) == 0 {
		d.add(Finding{Severity: SeverityNote, Check: "mongo.indexes", Subject: subject,
			Read: "the collection does not exist", Problem: "its indexes were not checked", Guarantee: "-",
			Fix: "run the service: Run creates the claim check's indexes at start"})
		return
	}
	d.checks++
	d.findings = append(d.findings, judgeIndexes(coll.Database().Name()+"."+coll.Name(), ixs,
		PayloadIndexes(d.opts.OutboxRetention+d.opts.PayloadMargin), retentionGiven,
		"payloads of unpublished events", "payloads of published events")...)
}

// cmp0 returns d, or def when d is 0.
func cmp0(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func judgeReplicaSet(setName, msg string) []Finding {
	switch {
	case setName != "":
		return nil
	case msg == "isdbgrid":
		return []Finding{{Severity: SeverityNote, Check: "mongo.replica_set", Subject: "MongoDB",
			Read: "mongos (a sharded cluster)", Problem: "the oplog checks need a replica set member and were skipped",
			Guarantee: "-", Fix: "run the doctor against a member of each shard's replica set to check their oplogs"}}
	}
	return []Finding{{Severity: SeverityBreaks, Check: "mongo.replica_set", Subject: "MongoDB",
		Read:      "hello has no setName: a standalone server",
		Problem:   "transactions and change streams need a replica set: no event can be recorded, handled or followed",
		Guarantee: GuaranteePublishing,
		Fix:       "run MongoDB as a replica set (a single-node one will do for development: mongod --replSet rs0, then rs.initiate())"}}
}

func judgeClock(skew, rtt time.Duration) []Finding {
	abs := max(skew, -skew)
	if abs <= clockTolerance+rtt {
		return nil
	}
	return []Finding{{Severity: SeverityRisk, Check: "mongo.clock", Subject: "MongoDB",
		Read:      fmt.Sprintf("the server's clock is %s %s this service's (round trip %s)", fmtDuration(abs), map[bool]string{true: "ahead of", false: "behind"}[skew > 0], rtt.Round(time.Millisecond)),
		Problem:   "occurred_at and created_at come from this service's clock, the TTL monitor and liveness records from the server's: published events expire early or late by the difference, and the ages in Status and the console (oldest pending event) are off by it",
		Guarantee: GuaranteeCleanup,
		Fix:       "synchronise both clocks (NTP, chrony)"}}
}

func judgeOplog(first, last time.Time, outage time.Duration) []Finding {
	window := last.Sub(first)
	if window >= outage {
		return nil
	}
	return []Finding{{Severity: SeverityRisk, Check: "mongo.oplog_window", Subject: "MongoDB",
		Read: fmt.Sprintf("oplog window %s (first entry %s, last %s), expected outage %s",
			fmtDuration(window), first.UTC().Format(time.RFC3339), last.UTC().Format(time.RFC3339), fmtDuration(outage)),
		Problem: "a publisher down longer than the window cannot resume its change stream: it falls back to a scan of the unpublished events (nothing is lost, catching up is slower). " +
			"A young replica set's window grows until the oplog is full: measure it again under production load",
		Guarantee: GuaranteePublishing,
		Fix:       "size the oplog for the expected outage (replSetResizeOplog, or storage.oplogMinRetentionHours)"}}
}

func judgeTransactionLifetime(limit, handlerTimeout time.Duration) []Finding {
	if limit > handlerTimeout {
		return nil
	}
	return []Finding{{Severity: SeverityBreaks, Check: "mongo.transaction_lifetime", Subject: "MongoDB",
		Read:      fmt.Sprintf("transactionLifetimeLimitSeconds %d, HandlerTimeout %s", int64(limit/time.Second), fmtDuration(handlerTimeout)),
		Problem:   "the server aborts a handling transaction before the handler's time is up: every slow handler fails its commit, uses its attempts and is parked",
		Guarantee: GuaranteeProcessing,
		Fix:       fmt.Sprintf("raise transactionLifetimeLimitSeconds above %d (setParameter), or lower Config.HandlerTimeout below %s", int64(handlerTimeout/time.Second), fmtDuration(limit))}}
}

func judgeWriteConcern(w any, source string) []Finding {
	switch v := w.(type) {
	case nil:
		return nil // the server's implicit default: majority (5.0+), unless arbiters
	case string:
		if v == "majority" {
			return nil
		}
	case int64:
		if v >= 2 {
			return nil
		}
	}
	return []Finding{{Severity: SeverityRisk, Check: "mongo.write_concern", Subject: "MongoDB",
		Read:      fmt.Sprintf("default write concern w: %v (source %s)", w, source),
		Problem:   "the framework's transactions and inbox writes ask for w: majority, but the publisher's published marks and your own writes use this default: a failover may roll them back, and their events are published again (duplicates, which the inbox absorbs) or your data lost",
		Guarantee: GuaranteeIdempotency,
		Fix:       `setDefaultRWConcern with defaultWriteConcern: {w: "majority"}`}}
}

// judgeIndexes compares a collection's indexes with the ones the
// framework needs (want). retentionGiven says that the specs' TTLs are the
// configured retentions (not read from the indexes). what names what a TTL
// index other than the framework's would delete, expires what the
// framework's TTL index deletes.
func judgeIndexes(coll string, existing []bson.D, want Indexes, retentionGiven bool, what, expires string) []Finding {
	var out []Finding
	subject := "collection " + coll
	for _, s := range want.Specs {
		var same []bson.D
		for _, ix := range existing {
			if s.Matches(ix) {
				same = append(same, ix)
			}
		}
		if len(same) == 0 {
			conflict := false
			for _, ix := range existing {
				if want.name(ix) == s.Name {
					conflict = true
					out = append(out, Finding{Severity: SeverityBreaks, Check: "mongo.indexes", Subject: subject,
						Read:      fmt.Sprintf("index %s is %s, needed %s", s.Name, want.Format(ix), want.Format(s.Doc)),
						Problem:   "Run refuses to start (ErrIndexConflict): nothing is published or handled",
						Guarantee: GuaranteePublishing,
						Fix:       "drop or rename the index " + s.Name + "; Run then creates the framework's"})
				}
			}
			if conflict {
				continue
			}
			problem := "queries that need it scan the collection"
			if s.TTL != nil {
				problem = expires + " never expire: the collection grows without bound"
			}
			out = append(out, Finding{Severity: SeverityRisk, Check: "mongo.indexes", Subject: subject,
				Read:      "index " + s.Name + " " + want.Format(s.Doc) + " is missing",
				Problem:   problem,
				Guarantee: GuaranteeCleanup,
				Fix:       "run the service (Run creates its indexes at start) or call Client.EnsureIndexes"})
			continue
		}
		for _, ix := range same {
			if err := indexMismatch(ix, s, want); err != "" {
				out = append(out, Finding{Severity: SeverityBreaks, Check: "mongo.indexes", Subject: subject,
					Read:      fmt.Sprintf("index %s: %s", want.Format(ix), err),
					Problem:   "Run refuses to start (ErrIndexConflict): nothing is published or handled",
					Guarantee: GuaranteePublishing,
					Fix:       "drop the index " + want.name(ix) + "; Run then creates the framework's"})
				continue
			}
			if ttl, ok := want.TTL(ix); ok && s.TTL != nil && retentionGiven && ttl != int64(*s.TTL) {
				out = append(out, Finding{Severity: SeverityNote, Check: "mongo.indexes", Subject: subject,
					Read:      fmt.Sprintf("index %s expires after %s, the configured retention is %s", want.name(ix), fmtDuration(time.Duration(ttl)*time.Second), fmtDuration(time.Duration(*s.TTL)*time.Second)),
					Problem:   "the retention in force is not the configured one",
					Guarantee: GuaranteeCleanup,
					Fix:       "run the service: Run updates the TTL at start (collMod)"})
			}
		}
	}
	// A TTL index other than the framework's deletes documents whatever
	// their state, unless it is restricted as the framework's are.
	for _, ix := range existing {
		if _, ok := want.TTL(ix); !ok || isSpecIndex(ix, want.Specs) {
			continue
		}
		partial, _ := want.Field(ix, "partialFilterExpression")
		if partial != nil && want.Expiring(partial) {
			continue
		}
		out = append(out, Finding{Severity: SeverityBreaks, Check: "mongo.indexes", Subject: subject,
			Read:      "TTL index " + want.Format(ix),
			Problem:   "it deletes " + what + " when they expire: they are lost",
			Guarantee: GuaranteePublishing,
			Fix:       "drop the index " + want.name(ix) + " (the framework's own TTL index is partial and keeps them)"})
	}
	return out
}

// isSpecIndex reports whether ix is equivalent to one of specs.
func isSpecIndex(ix bson.D, specs []IndexSpec) bool {
	for _, s := range specs {
		if s.Matches(ix) {
			return true
		}
	}
	return false
}

// indexMismatch says why an index with a spec's key and filter cannot
// serve as it (what EnsureIndexes refuses to adjust), or "".
func indexMismatch(ix bson.D, s IndexSpec, want Indexes) string {
	_, hasTTL := want.TTL(ix)
	switch {
	case want.flag(ix, "unique") != s.Unique:
		return "it differs in uniqueness"
	case want.flag(ix, "sparse"):
		return "it is sparse"
	case s.TTL == nil && hasTTL:
		return "it expires documents"
	case s.TTL != nil && !hasTTL:
		return "it is not a TTL index"
	}
	return ""
}

// name returns an index document's name.
func (want Indexes) name(ix bson.D) string {
	v, _ := want.Field(ix, "name")
	s, _ := v.(string)
	return s
}

// flag returns a boolean option of an index document (false when absent).
func (want Indexes) flag(ix bson.D, key string) bool {
	v, _ := want.Field(ix, key)
	b, _ := v.(bool)
	return b
}

func judgeInboxOwner(db, inbox, meta string, stamp *Owner, group string, inboxExists bool) []Finding {
	subject := "collection " + db + "." + inbox
	switch {
	case stamp == nil && inboxExists:
		return []Finding{{Severity: SeverityNote, Check: "mongo.inbox_owner", Subject: subject,
			Read:      "the inbox has no owner stamp in " + meta,
			Problem:   "written by another library or an older version: nothing keeps a second consumer group from sharing it (two groups sharing an inbox skip each other's events)",
			Guarantee: GuaranteeProcessing,
			Fix:       "run the service once: Run stamps the inbox for its consumer group"}}
	case stamp != nil && group != "" && stamp.ConsumerGroup != group:
		return []Finding{{Severity: SeverityBreaks, Check: "mongo.inbox_owner", Subject: subject,
			Read:      fmt.Sprintf("owned by consumer group %q (service %q), this service's group is %q", stamp.ConsumerGroup, stamp.Service, group),
			Problem:   "two consumer groups sharing an inbox skip each other's events (the inbox id has no group); Run refuses to start (ErrInboxOwned)",
			Guarantee: GuaranteeProcessing,
			Fix:       "give this service an inbox collection of its own (Config.InboxCollection)"}}
	}
	return nil
}

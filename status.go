package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"

	"github.com/event-outbox/outbox/internal/consume"
)

// Status is a snapshot of a Client for health pages and operators: what
// this process owns, what waits in the collections, and what went wrong
// last. It never contains connection strings or credentials.
type Status struct {
	// Service is Config.Service.
	Service string
	// Replica is Config.ReplicaID: this process.
	Replica string
	// Running reports whether Run runs.
	Running bool
	// Publishing lists the partitions this process publishes (its
	// assignment in Config.PublisherGroup), sorted.
	Publishing []TopicPartition
	// Handling lists the partitions whose events this process handles (its
	// assignment in Config.ConsumerGroup), sorted.
	Handling []TopicPartition
	// Consumer describes each partition this process handles: events in
	// flight, the offset it may commit (the lowest not yet settled), the
	// last committed one.
	Consumer []PartitionStatus
	// Waiting lists what this process's handled partitions have waited on
	// for longer than a few seconds (a handler failing and retried, MongoDB
	// failing, an inbox entry locked by a dead replica's transaction, a long
	// transaction, a release of held events that fails), oldest first.
	Waiting []Wait
	// PublisherLeaseValid reports whether the publisher's group session is
	// confirmed recently enough to publish (see Config.FenceMargin).
	PublisherLeaseValid bool
	// Store is the state of the service's collections (shared by all
	// replicas), at most a few seconds old.
	Store StoreStatus
	// LastError is the most recent of the consumer's last error (handling,
	// re-drive requests) and the publisher's, with secrets redacted, or "".
	LastError string
	// LastErrorAt is when LastError happened; zero when there is none.
	LastErrorAt time.Time
	// Doctor is the report of the doctor's check at Run's start (see
	// Client.Doctor): the settings of MongoDB and Kafka that break or risk
	// a guarantee. Nil until the check finished.
	Doctor *DoctorReport
}

// MarshalJSON writes snake_case keys, partitions grouped by topic
// ({"orders": [0, 2]}) and ages in seconds.
func (s Status) MarshalJSON() ([]byte, error) {
	consumerJSON := s.Consumer
	if consumerJSON == nil {
		consumerJSON = []PartitionStatus{}
	}
	waiting := s.Waiting
	if waiting == nil {
		waiting = []Wait{}
	}
	return json.Marshal(struct {
		Service             string             `json:"service"`
		Replica             string             `json:"replica"`
		Running             bool               `json:"running"`
		Publishing          map[string][]int32 `json:"publishing"`
		Handling            map[string][]int32 `json:"handling"`
		Consumer            []PartitionStatus  `json:"consumer"`
		Waiting             []Wait             `json:"waiting"`
		PublisherLeaseValid bool               `json:"publisher_lease_valid"`
		storeStatusJSON
		LastError   string        `json:"last_error,omitempty"`
		LastErrorAt time.Time     `json:"last_error_at,omitzero"`
		Doctor      *DoctorReport `json:"doctor,omitempty"`
	}{s.Service, s.Replica, s.Running, byTopic(s.Publishing), byTopic(s.Handling), consumerJSON, waiting, s.PublisherLeaseValid,
		s.Store.jsonForm(), s.LastError, s.LastErrorAt, s.Doctor})
}

func byTopic(tps []TopicPartition) map[string][]int32 {
	out := map[string][]int32{}
	for _, tp := range tps {
		out[tp.Topic] = append(out[tp.Topic], tp.Partition)
	}
	return out
}

// PartitionStatus is the state of one partition this process handles.
type PartitionStatus struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// InFlight counts the events in running transactions.
	InFlight int `json:"in_flight"`
	// Unsettled counts the events taken from Kafka and not yet settled
	// (handled, skipped, parked or held).
	Unsettled int `json:"unsettled"`
	// LowestUnsettled is the offset the partition may commit: the lowest
	// not yet settled (-1 before any record).
	LowestUnsettled int64 `json:"lowest_unsettled"`
	// Committed is the last offset this process committed (-1 before the
	// first).
	Committed int64 `json:"committed"`
	// HeldKeys counts the partition keys held behind parked events.
	HeldKeys int `json:"held_keys"`
	// Paused is true while the partition's fetching is paused because it
	// holds its bound of records or bytes not yet settled.
	Paused bool `json:"paused"`
}

// Wait is something a handled partition has waited on for longer than a
// few seconds.
type Wait struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// PartitionKey is the key of the event that waits (empty for "fetch").
	PartitionKey string `json:"partition_key"`
	// Offset is the event's offset; -1 for a release of held events; for
	// "fetch", the offset the partition's fetching should go on from.
	Offset int64 `json:"offset"`
	// What it waits on: "retry" (its handler failed), "snooze",
	// "conflict", "infra" (MongoDB failing), "locked" (its inbox entry held
	// by another session's open transaction: a replica that died), "running"
	// (a long transaction), "release" (a release of held events failing)
	// or "fetch" (the partition has records its Kafka client has not
	// fetched for a while: Detail says what the broker answered and how
	// often the framework restarted the partition's fetching).
	What string `json:"what"`
	// Since is when the wait began.
	Since time.Time `json:"since"`
	// Detail is the last error, if any.
	Detail string `json:"detail,omitempty"`
	// Attempts counts the attempts stored for the event.
	Attempts int `json:"attempts"`
	// Next is when the event runs again; zero while it runs.
	Next time.Time `json:"next,omitzero"`
}

func waitOf(w consume.Wait) Wait {
	return Wait{Topic: w.Partition.Topic, Partition: w.Partition.Partition, PartitionKey: w.Key, Offset: w.Offset,
		What: w.What, Since: w.Since, Detail: redactSecrets(w.Detail), Attempts: w.Attempts, Next: w.Next}
}

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	// Topic is the Kafka topic.
	Topic string
	// Partition is the partition number.
	Partition int32
}

// StoreStatus is the state of a service's collections: what waits to be
// published and what needs an operator. The counts are the service's (all
// replicas share the collections).
type StoreStatus struct {
	// Pending counts outbox events not yet published (failed ones excluded).
	Pending int64
	// OldestPendingAge is the age of the oldest pending event, 0 when none
	// is pending. A value that keeps growing means publishing is stuck.
	OldestPendingAge time.Duration
	// Failed counts outbox events Kafka refused for good; they are not
	// retried (see FailedEvents).
	Failed int64
	// OutboxHeldKeys counts the partition keys that have a failed event.
	// Under Config.PoisonPolicy HoldKey (the default) each holds the later
	// events of its key in the outbox until the failed event is retried
	// (RetryFailed) or discarded (DiscardFailed). Client.Status reports 0
	// under SkipEvent.
	OutboxHeldKeys int64
	// OutboxHeldEvents counts the pending events of those keys (included in
	// Pending): what waits behind failed events under HoldKey.
	OutboxHeldEvents int64
	// Parked counts parked inbox events (see ParkedEvents), held ones
	// included.
	Parked int64
	// Held counts the parked events held behind an earlier parked event of
	// their partition key (Config.PoisonPolicy HoldKey).
	Held int64
	// RedriveRequested counts parked events waiting for a running consumer
	// to re-drive them (see RequestRedrive).
	RedriveRequested int64
	// RedriveDeferred counts the re-drive requests (included in
	// RedriveRequested) whose last try could not run for a reason that is
	// not the handler's failure (ParkedEvent.RedriveDeferred says which):
	// they are tried again until they run.
	RedriveDeferred int64
	// ParkedNoHandler counts the parked events no handler of the service
	// accepted (included in Parked): a new event type or version a
	// producer deployed before this service's handler. The first replica
	// that has the handler releases them.
	ParkedNoHandler int64
	// Unroutable counts pending events stored for a partition their topic
	// does not have (see TopicBacklog.Unroutable); they are in Pending
	// too, and are never published while it is so.
	Unroutable int64
	// Scheduled counts the events recorded with WithPublishAt or WithDelay
	// that wait for their due time (not in Pending), and NextDue is the
	// earliest due time among them (zero when none waits). A NextDue
	// that stays in the past means no publisher promotes them.
	Scheduled int64
	NextDue   time.Time
	// ScheduledFailed counts the scheduled events whose promotion was
	// refused for good (a duplicate idempotency key under
	// Config.UniqueIdempotencyKeys); they are never published.
	ScheduledFailed int64
	// ClaimCheck counts the payloads stored out of band (Config.ClaimCheck)
	// that wait for their events, and the parked events whose payload was
	// not resolved.
	ClaimCheck ClaimCheckStatus
	// Topics breaks the outbox counts down by topic, sorted by topic.
	Topics []TopicBacklog
	// CheckedAt is when the counts were read.
	CheckedAt time.Time
}

// TopicBacklog is the outbox state of one topic.
type TopicBacklog struct {
	// Topic is the Kafka topic.
	Topic string
	// Pending counts events not yet published (failed ones excluded).
	Pending int64
	// OldestPendingAge is the age of the oldest pending event.
	OldestPendingAge time.Duration
	// Failed counts events Kafka refused for good.
	Failed int64
	// HeldKeys and HeldEvents are StoreStatus.OutboxHeldKeys and
	// OutboxHeldEvents for this topic.
	HeldKeys, HeldEvents int64
	// Partitions is the topic's partition count as a running service last
	// read it from Kafka (stored in the outbox_meta collection), 0 when
	// none is stored or nothing is pending.
	Partitions int
	// Scheduled and NextDue are StoreStatus.Scheduled and NextDue for
	// this topic.
	Scheduled int64
	NextDue   time.Time
	// Unroutable counts the pending events stored for a partition at or
	// beyond Partitions. No publisher owns such a partition, so they wait,
	// unpublished, until the topic has that many partitions (add them), or
	// an operator deletes them. They were recorded with a wrong count
	// (outboxctl migrate -partitions), or the topic was recreated with
	// fewer partitions.
	Unroutable int64
}

// UnroutableCause names why the topic's Unroutable events wait, or "" when
// there are none.
func (b TopicBacklog) UnroutableCause() string {
	if b.Unroutable == 0 {
		return ""
	}
	return fmt.Sprintf("%d pending events of topic %q are stored for partitions beyond its %d: no publisher owns those partitions, so they are never published until the topic has that many partitions (recorded with a wrong partition count, or the topic was recreated smaller)",
		b.Unroutable, b.Topic, b.Partitions)
}

// MarshalJSON writes snake_case keys and the age in seconds.
func (b TopicBacklog) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Topic            string     `json:"topic"`
		Pending          int64      `json:"pending"`
		OldestPendingAge float64    `json:"oldest_pending_age_seconds"`
		Failed           int64      `json:"failed"`
		HeldKeys         int64      `json:"held_keys"`
		HeldEvents       int64      `json:"held_events"`
		Partitions       int        `json:"partitions,omitempty"`
		Unroutable       int64      `json:"unroutable,omitempty"`
		UnroutableCause  string     `json:"unroutable_cause,omitempty"`
		Scheduled        int64      `json:"scheduled,omitempty"`
		NextDue          *time.Time `json:"next_due,omitempty"`
	}{b.Topic, b.Pending, b.OldestPendingAge.Seconds(), b.Failed, b.HeldKeys, b.HeldEvents,
		b.Partitions, b.Unroutable, b.UnroutableCause(), b.Scheduled, timeOrNil(b.NextDue)})
}

// ClaimCheckStatus is the state of the payloads the claim check stores out
// of band (Config.ClaimCheck), as the outbox and the inbox show it.
type ClaimCheckStatus struct {
	// Database names the claim-check database in Client.Status when
	// Config.ClaimCheck is set; "" otherwise, and in Admin.StoreStatus,
	// which does not know the configuration.
	Database string
	// Pending counts the pending events (included in StoreStatus.Pending)
	// whose payload is stored out of band: their chunks never expire
	// before the event is published. PendingBytes sums their payloads'
	// sizes; OldestPendingAge is the age of the oldest of them, 0 when
	// none waits.
	Pending          int64
	PendingBytes     int64
	OldestPendingAge time.Duration
	// Unresolved counts the parked events (held ones excluded) whose
	// payload their producer stored out of band and the inbox holds
	// without it: it could not be resolved (the claim-check database
	// unreachable, the payload expired or missing, or Config.ClaimCheck
	// not set on the consumer) or not decoded. Their last error says
	// which; a re-drive resolves the payload again.
	Unresolved int64
}

// MarshalJSON writes snake_case keys and the age in seconds.
func (c ClaimCheckStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Database         string  `json:"database,omitempty"`
		Pending          int64   `json:"pending"`
		PendingBytes     int64   `json:"pending_bytes"`
		OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
		Unresolved       int64   `json:"unresolved"`
	}{c.Database, c.Pending, c.PendingBytes, c.OldestPendingAge.Seconds(), c.Unresolved})
}

// storeStatusJSON is the JSON form of StoreStatus, shared with Status.
type storeStatusJSON struct {
	Pending          int64            `json:"pending"`
	OldestPendingAge float64          `json:"oldest_pending_age_seconds"`
	Failed           int64            `json:"failed"`
	OutboxHeldKeys   int64            `json:"outbox_held_keys"`
	OutboxHeldEvents int64            `json:"outbox_held_events"`
	Parked           int64            `json:"parked"`
	Held             int64            `json:"held"`
	RedriveRequested int64            `json:"redrive_requested"`
	RedriveDeferred  int64            `json:"redrive_deferred"`
	ParkedNoHandler  int64            `json:"parked_no_handler"`
	Unroutable       int64            `json:"unroutable,omitempty"`
	Scheduled        int64            `json:"scheduled"`
	NextDue          *time.Time       `json:"next_due,omitempty"`
	ScheduledFailed  int64            `json:"scheduled_failed,omitempty"`
	ClaimCheck       ClaimCheckStatus `json:"claim_check"`
	Topics           []TopicBacklog   `json:"topics"`
	CheckedAt        time.Time        `json:"checked_at"`
}

func (s StoreStatus) jsonForm() storeStatusJSON {
	topics := s.Topics
	if topics == nil {
		topics = []TopicBacklog{}
	}
	return storeStatusJSON{Pending: s.Pending, OldestPendingAge: s.OldestPendingAge.Seconds(), Failed: s.Failed,
		OutboxHeldKeys: s.OutboxHeldKeys, OutboxHeldEvents: s.OutboxHeldEvents, Parked: s.Parked, Held: s.Held,
		RedriveRequested: s.RedriveRequested, RedriveDeferred: s.RedriveDeferred, ParkedNoHandler: s.ParkedNoHandler, Unroutable: s.Unroutable,
		Scheduled: s.Scheduled, NextDue: timeOrNil(s.NextDue), ScheduledFailed: s.ScheduledFailed, ClaimCheck: s.ClaimCheck, Topics: topics, CheckedAt: s.CheckedAt}
}

// timeOrNil leaves a zero time out of JSON.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// MarshalJSON writes snake_case keys and ages in seconds.
func (s StoreStatus) MarshalJSON() ([]byte, error) { return json.Marshal(s.jsonForm()) }

// statusMaxAge is how old the collections' counts in Status may be.
const statusMaxAge = time.Second

// Status returns a snapshot of the Client. The collections' counts come from
// Admin.StoreStatus, cached for a second, so a health check polled often
// costs at most one aggregation per second. The runtime part is returned
// even when the counts cannot be read, together with the error.
func (c *Client) Status(ctx context.Context) (Status, error) {
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	st := Status{Service: c.cfg.Service, Replica: c.cfg.ReplicaID, Running: running}
	ps := c.publisherStatus()
	st.PublisherLeaseValid = ps.LeaseValid
	st.Publishing = ps.Owned
	if cons := c.tel.cons.Load(); cons != nil {
		stats := cons.set.Stats()
		for tp, ps := range stats {
			st.Handling = append(st.Handling, TopicPartition{Topic: tp.Topic, Partition: tp.Partition})
			st.Consumer = append(st.Consumer, PartitionStatus{Topic: tp.Topic, Partition: tp.Partition, InFlight: ps.InFlight,
				Unsettled: ps.Unsettled, LowestUnsettled: ps.LowestUnsettled, Committed: ps.Committed, HeldKeys: ps.HeldKeys, Paused: ps.Paused})
		}
		slices.SortFunc(st.Handling, func(a, b TopicPartition) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
		})
		slices.SortFunc(st.Consumer, func(a, b PartitionStatus) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
		})
		for _, w := range cons.set.Waits() {
			st.Waiting = append(st.Waiting, waitOf(w))
		}
	}
	st.LastError, st.LastErrorAt = c.tel.lastError()
	st.Doctor = c.doctor.Load()
	if ps.LastError != "" && (st.LastError == "" || ps.LastErrorAt.After(st.LastErrorAt)) {
		st.LastError, st.LastErrorAt = redactSecrets(ps.LastError), ps.LastErrorAt
	}
	store, err := c.storeStatus(ctx, statusMaxAge)
	st.Store = store
	if c.claims != nil {
		st.Store.ClaimCheck.Database = c.claims.Coll.Database().Name()
	}
	return st, err
}

// StatusHandler returns an http.Handler that serves Status as JSON on GET
// (and HEAD): 200 when the collections could be read, 503 with the
// (redacted) error in "error" otherwise. Mount it where operators and
// health checks look, for example at /outbox/status.
func (c *Client) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), backlogQueryTimeout)
		defer cancel()
		st, err := c.Status(ctx)
		code := http.StatusOK
		var body any = st
		if err != nil {
			// Status has its own MarshalJSON: add "error" to its object.
			code = http.StatusServiceUnavailable
			raw, _ := json.Marshal(st)
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			m["error"] = redactSecrets(err.Error())
			body = m
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		if r.Method == http.MethodHead {
			return
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(body)
	})
}

// userinfoPassword matches the password of a URL's userinfo
// ("scheme://user:password@host").
var userinfoPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):([^@/?#\s]*)@`)

// redactSecrets hides URL passwords in a message (connection strings that
// found their way into an error).
func redactSecrets(s string) string {
	return userinfoPassword.ReplaceAllString(s, "$1:xxxxx@")
}

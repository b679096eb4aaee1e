package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel/metric"

	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/consume"
	"github.com/event-outbox/outbox/internal/store"
	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// ClaimCheck configures the claim check (Config.ClaimCheck): payloads too
// large for a Kafka record are stored in MongoDB, in the outbox_payloads
// collection of Database, and the record carries a reference instead.
//
// On the producer side, Record stores an event's payload out of band when
// its record would exceed the topic's max.message.bytes (as the publisher
// reads it from Kafka, see ErrEventTooLarge), or when its JSON is at least
// Threshold bytes. The payload is cut into chunks of at most 8 MiB,
// inserted in the caller's transaction with the outbox document, so both
// commit or neither does (plain chunk documents rather than GridFS, whose
// chunks have no field a TTL index could expire them by). The
// record keeps its key and headers; its value is empty and it carries the
// reference "outbox-payload:<24 hex digits>": in the header outbox-dataref
// for the native format, in CloudEvents' dataref extension attribute
// (ce_dataref) for CloudEvents. A topic in the event-outbox format, whose
// record is the event in its value, has no place for a reference: an event
// over its limit is refused as before (ErrEventTooLarge, saying so), and
// Threshold does not apply to it. The largest payload stored is 64 MiB;
// Record refuses a larger one with ErrEventTooLarge.
//
// On the consumer side, a record carrying a reference is resolved before
// its handler runs, so the handler sees the whole event. A payload that
// cannot be read (the database unreachable, the payload missing) fails the
// attempt with an error wrapping ErrPayloadUnavailable: it is retried,
// then parked as usual. A consumer without Config.ClaimCheck parks such a
// record at once with an error wrapping ErrClaimCheckNotConfigured, which
// says what to configure; once it is configured, a re-drive resolves it.
// A consumer of another kind sees the reference and an empty value, never
// a cut payload.
//
// Cleanup: a payload's chunks are marked published when the publisher
// marks its event published (again at each publication), and a partial TTL
// index deletes them OutboxRetention plus Margin after that. Unpublished
// payloads never expire. A consumer must therefore resolve a record within
// OutboxRetention plus Margin of its publication: Margin must cover how long
// a record can wait in Kafka and be redelivered (topic retention, consumer
// downtime) and how long a parked event may wait for its re-drive when the
// inbox could not keep its whole payload (more than about 16 MiB).
//
// Permissions: the producer needs insert, update, find and createIndex on
// the collection (it creates its indexes, EnsureIndexes); a consumer needs
// find only.
type ClaimCheck struct {
	// Database holds the outbox_payloads collection. A producer (a Client
	// with PublishTopics) writes it in its transactions, so it must be a
	// database of Config.Mongo; a consumer reads it, and may reach it
	// through any client (the producer's database, which the consuming
	// service usually does not own: connect a mongo.Client to its URI).
	// Defaults to Config.Database of Config.Mongo.
	Database *mongo.Database
	// Threshold stores the payloads of at least this many bytes out of
	// band, even when they fit in their topic. Defaults to 0: only payloads
	// whose record would not fit.
	Threshold int
	// Margin is how long a payload is kept after OutboxRetention has run
	// since its event's latest publication. Defaults to 30 days, the
	// default InboxRetention, which bounds redelivery the same way.
	Margin time.Duration
}

// ErrClaimCheckNotConfigured is wrapped by the park reason of a record
// whose payload was stored out of band by its producer (it carries a
// reference) when the consuming Client has no Config.ClaimCheck.
var ErrClaimCheckNotConfigured = errors.New("outbox: record carries a payload reference but Config.ClaimCheck is not set")

// ErrPayloadUnavailable is wrapped by the error of an attempt whose
// payload, stored out of band, could not be read from the claim-check
// database: it is retried, then parked as any failing attempt.
var ErrPayloadUnavailable = errors.New("outbox: payload stored out of band unavailable")

// claimCheckDefaults fills the defaults of Config.ClaimCheck, on a copy.
func (c Config) claimCheckDefaults() Config {
	if c.ClaimCheck != nil {
		cc := *c.ClaimCheck
		if cc.Margin == 0 {
			cc.Margin = 30 * 24 * time.Hour
		}
		c.ClaimCheck = &cc
	}
	return c
}

// validateClaimCheck checks Config.ClaimCheck.
func (c Config) validateClaimCheck() []error {
	cc := c.ClaimCheck
	if cc == nil {
		return nil
	}
	var errs []error
	bad := func(field, why string) {
		errs = append(errs, fmt.Errorf("%w: ClaimCheck.%s %s", ErrConfig, field, why))
	}
	if cc.Threshold < 0 {
		bad("Threshold", "must not be negative")
	}
	if cc.Margin < 0 {
		bad("Margin", "must not be negative")
	}
	if cc.Database != nil && c.Mongo != nil && len(c.PublishTopics) > 0 && cc.Database.Client() != c.Mongo {
		bad("Database", "must be a database of Config.Mongo when PublishTopics are set: payloads are written in the caller's transaction")
	}
	return errs
}

// claimStore returns the claim-check store of cfg, or nil without one.
func claimStore(cfg *Config) *claimcheck.Store {
	if cfg.ClaimCheck == nil {
		return nil
	}
	db := cfg.ClaimCheck.Database
	if db == nil {
		db = cfg.Mongo.Database(cfg.Database)
	}
	return &claimcheck.Store{Coll: db.Collection(store.PayloadsCollection)}
}

// claimIndexes are the indexes of the payload collection: a producer's
// (it sets the TTL from its retention).
func (c *Client) claimIndexes() []store.IndexSpec {
	return claimcheck.Indexes(c.cfg.OutboxRetention + c.cfg.ClaimCheck.Margin)
}

// claimCheck decides whether doc's payload goes out of band and, if so,
// moves it into chunks (returned, to insert with doc) and leaves doc the
// reference. Without Config.ClaimCheck it is the size check of Record.
func (c *Client) claimCheck(doc *outboxDoc) ([]any, error) {
	tooLarge := c.checkSize(doc)
	if c.claims == nil {
		return nil, tooLarge
	}
	over := c.cfg.ClaimCheck.Threshold > 0 && len(doc.Payload) >= c.cfg.ClaimCheck.Threshold
	var tl *EventTooLargeError
	switch {
	case tooLarge != nil && !errors.As(tooLarge, &tl):
		return nil, tooLarge
	case tooLarge == nil && !over:
		return nil, nil
	case formatOfStored(doc.Format) == FormatEventOutbox:
		if tooLarge != nil {
			return nil, fmt.Errorf("%w (the event-outbox format carries the event in the record's value, with no place for a claim-check reference)", tooLarge)
		}
		return nil, nil
	case len(doc.Payload) > claimcheck.MaxPayload:
		return nil, fmt.Errorf("%w: %w: %s: payload of %d bytes, above the claim check's largest of %d bytes",
			ErrInvalidEvent, ErrEventTooLarge, doc.Schema, len(doc.Payload), claimcheck.MaxPayload)
	}
	chunks := claimcheck.Chunks(doc.ID, []byte(doc.Payload))
	ref := doc.ID
	doc.PayloadRef, doc.PayloadSize, doc.Payload = &ref, int64(len(doc.Payload)), ""
	return chunks, nil
}

// claimedID is the publish.Item ID of an event whose payload is stored out
// of band: its outbox document's _id and its payload_ref, the ref of its
// chunks. The two differ once a scheduled event is promoted (its outbox
// document gets a new _id, its chunks keep the ref they were inserted
// with), so the publisher, which knows only the items' IDs when it marks
// them, carries both: the outbox documents are marked by _id, the chunks
// by ref. A comparable value, as publish.Item requires.
type claimedID struct{ doc, ref bson.ObjectID }

// itemID returns the publish.Item ID of d: its _id, or a claimedID when
// its payload is stored out of band.
func itemID(d *outboxDoc) any {
	if d.PayloadRef != nil {
		return claimedID{doc: d.ID, ref: *d.PayloadRef}
	}
	return d.ID
}

// docID returns the outbox _id of id, a publish.Item ID.
func docID(id any) any {
	if c, ok := id.(claimedID); ok {
		return c.doc
	}
	return id
}

// splitIDs returns the outbox _ids of ids (publish.Item IDs) and the refs
// of the chunks of those whose payload is stored out of band.
func splitIDs(ids []any) (docs, refs []any) {
	docs = make([]any, len(ids))
	for i, id := range ids {
		docs[i] = docID(id)
		if c, ok := id.(claimedID); ok {
			refs = append(refs, c.ref)
		}
	}
	return docs, refs
}

// addPayloadRef adds to rec, the record of d, the reference of its payload
// stored out of band, if any.
func addPayloadRef(d *outboxDoc, env *Envelope, rec *kgo.Record) {
	if d.PayloadRef != nil {
		claimcheck.AddRef(rec, env.Format == FormatCloudEvents, claimcheck.Ref(*d.PayloadRef))
	}
}

// resolvePayload reads the payload of d, a delivery whose record carries a
// reference, and decodes its event for its handler.
func (c *Client) resolvePayload(ctx context.Context, d *delivery) error {
	if c.claims == nil {
		return fmt.Errorf("%w: the payload of %s %s is stored out of band as %s; set Config.ClaimCheck.Database to the producer's claim-check database (its outbox_payloads collection, find permission) and re-drive it",
			ErrClaimCheckNotConfigured, d.env.ContentSchema, d.env.IdempotencyKey, d.ref)
	}
	payload, err := c.claims.Resolve(ctx, d.ref)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPayloadUnavailable, err)
	}
	evt, err := d.h.decode(c, payload)
	if err != nil {
		return err
	}
	d.payload, d.evt = payload, evt
	return nil
}

// resolveAll resolves the payloads of evs stored out of band, before
// their transaction (the claim-check database may be another
// deployment's). ok is false when one could not be: res says which and
// how it fails (parked at once when nothing can resolve it here).
func (c *Client) resolveAll(ctx, actx context.Context, evs []*consume.Event) (res consume.Result, ok bool) {
	for i, e := range evs {
		d := deliveryOf(e)
		if d.ref == "" || d.evt != nil {
			continue
		}
		err := c.resolvePayload(actx, d)
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return consume.Result{Kind: consume.Canceled, Err: err}, false
		}
		reason, park := "malformed", true
		switch {
		case errors.Is(err, ErrPayloadUnavailable):
			reason, park = "unavailable", false
		case errors.Is(err, ErrClaimCheckNotConfigured):
			reason = "not_configured"
		}
		c.tel.ins.Unresolved.Add(ctx, 1, metric.WithAttributes(itel.AttrTopic.String(d.env.Topic), itel.AttrReason.String(reason)))
		return consume.Result{Kind: consume.Failed, At: i, Err: err, Park: park}, false
	}
	return consume.Result{}, true
}

// transientPayloadError reports whether err is a claim-check store that
// could not be read, rather than a payload missing from it.
func transientPayloadError(err error) bool {
	return errors.Is(err, ErrPayloadUnavailable) && !errors.Is(err, claimcheck.ErrMissing)
}

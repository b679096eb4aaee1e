package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Index names, part of the storage format.
const (
	indexOutboxPending = "outbox_pending"
	indexOutboxTTL     = "outbox_published_ttl"
	indexOutboxFailed  = "outbox_failed"
	indexInboxTTL      = "inbox_handled_ttl"
	indexInboxParked   = "inbox_parked"
	// indexInboxParkedPartition serves the held keys (PoisonPolicy HoldKey).
	indexInboxParkedPartition = "inbox_parked_partition"
)

// MongoDB error codes met while creating indexes.
const (
	codeNamespaceNotFound     = 26
	codeIndexNotFound         = 27
	codeIndexOptConflict      = 85 // IndexOptionsConflict
	codeIndexKeySpecsConflict = 86 // IndexKeySpecsConflict
)

// indexSpec is an index the framework needs. Indexes are matched by
// definition (key pattern and partial filter), not by name: an equivalent
// index created under another name (by hand, or by the Python event-outbox
// library, whose TTL indexes are named "expiration") is reused.
type indexSpec struct {
	name    string
	keys    bson.D
	partial bson.D // nil: not partial
	ttl     *int32 // expireAfterSeconds; nil: not a TTL index
	unique  bool
	// replaces, when set, recognises an earlier definition of the index
	// under its name, which EnsureIndexes drops and creates anew.
	replaces func(ix bson.D) bool
}

// outboxIndexes are the indexes of the outbox collection.
func (c *Client) outboxIndexes() []indexSpec {
	ttl := int32(c.cfg.OutboxRetention.Seconds())
	specs := []indexSpec{
		{
			name:    indexOutboxPending,
			keys:    bson.D{{Key: "topic", Value: 1}, {Key: "partition", Value: 1}, {Key: "seq", Value: 1}, {Key: "_id", Value: 1}},
			partial: bson.D{{Key: "published", Value: false}},
		},
		{
			name:    indexOutboxFailed,
			keys:    bson.D{{Key: "failed_at", Value: 1}},
			partial: bson.D{{Key: "failed", Value: true}},
		},
		{
			name:    indexOutboxTTL,
			keys:    bson.D{{Key: "published_at", Value: 1}},
			partial: bson.D{{Key: "published", Value: true}},
			ttl:     &ttl,
		},
	}
	if c.cfg.UniqueIdempotencyKeys {
		specs = append(specs, outboxIdempotencySpec())
	}
	return specs
}

// inboxIndexes are the indexes of the inbox collection. Only a client that
// consumes (has handlers) creates them, after checking that the inbox
// belongs to its consumer group (see stampInbox).
func (c *Client) inboxIndexes() []indexSpec {
	ttl := int32(c.cfg.InboxRetention.Seconds())
	return []indexSpec{
		{
			name:    indexInboxParked,
			keys:    bson.D{{Key: "parked_at", Value: 1}},
			partial: bson.D{{Key: "parked", Value: true}},
		},
		{
			// The held keys of a partition, the chain of a key and the
			// events held behind a head, in offset order (PoisonPolicy
			// HoldKey, poison.go). Partial: it holds parked events only.
			name: indexInboxParkedPartition,
			keys: bson.D{{Key: "_id.topic", Value: 1}, {Key: "partition", Value: 1},
				{Key: "partition_key", Value: 1}, {Key: "offset", Value: 1}},
			partial: bson.D{{Key: "parked", Value: true}},
		},
		{
			name:    indexInboxTTL,
			keys:    bson.D{{Key: "handled_at", Value: 1}},
			partial: bson.D{{Key: "handled", Value: true}},
			ttl:     &ttl,
		},
	}
}

// EnsureIndexes prepares the collections, and is idempotent. On the outbox:
//
//   - outbox_pending: {topic, partition, seq, _id} where published is false,
//     the publisher's backlog query (each replica reads only the partitions
//     it owns, in order);
//   - outbox_published_ttl: TTL on published_at where published is true,
//     deleting published events after Config.OutboxRetention;
//   - outbox_failed: {failed_at} where failed is true, for operators;
//   - outbox_idempotency, with Config.UniqueIdempotencyKeys: unique on
//     {topic, schema, idempotency_key}, so an event recorded twice fails
//     with ErrDuplicateEvent.
//
// When handlers are registered (the client consumes), it first checks that
// the inbox collection belongs to Config.ConsumerGroup, stamping it for that
// group if it is new (see ErrInboxOwned), then creates on the inbox:
//
//   - inbox_handled_ttl: TTL on handled_at where handled is true, deleting
//     handled events after Config.InboxRetention;
//   - inbox_parked: {parked_at} where parked is true, for listing parked
//     events;
//   - inbox_parked_partition: {_id.topic, partition, partition_key, offset}
//     where parked is true, for the held keys of a partition
//     (Config.PoisonPolicy HoldKey).
//
// On the outbox_meta collection, meta_replica_ttl: TTL on last_seen where
// kind is "replica", deleting the liveness records of replicas (see
// Admin.Replicas) ten minutes after their last refresh.
//
// A client without handlers leaves the inbox alone: its InboxRetention
// must not change the TTL of another service's inbox.
//
// Unpublished, unhandled and parked documents never expire. Indexes are
// matched by key pattern and partial filter, whatever their names: an
// equivalent index created by hand or by another library (the Python
// event-outbox library names its TTL indexes "expiration") is reused, and a
// changed retention updates the TTL of whichever index it is, in place
// (collMod). Several replicas may call it at once. An index that cannot be
// reconciled returns an error wrapping ErrIndexConflict, an inbox of another
// group one wrapping ErrInboxOwned, an outbox collection that a Python
// event-outbox service still uses or that was not migrated from one (its
// "idempotency" index, its unpublished events) one wrapping
// ErrEventOutboxNotMigrated, before anything changes; Run returns these
// instead of retrying.
// Run calls EnsureIndexes on start.
func (c *Client) EnsureIndexes(ctx context.Context) error {
	if err := c.checkNotLibraryOutbox(ctx); err != nil {
		return err
	}
	if err := ensureIndexes(ctx, c.outbox, c.outboxIndexes()...); err != nil {
		return err
	}
	c.uniqueIndex.Store(c.cfg.UniqueIdempotencyKeys)
	if err := ensureIndexes(ctx, c.meta, metaIndexes()...); err != nil {
		return err
	}
	if !c.consumes() {
		return nil
	}
	if err := c.stampInbox(ctx); err != nil {
		return err
	}
	if err := ensureIndexes(ctx, c.inbox, c.inboxIndexes()...); err != nil {
		return err
	}
	return c.migrateUnreadable(ctx)
}

// consumes reports whether handlers are registered.
func (c *Client) consumes() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.handlers) > 0
}

// ensureIndexes makes sure coll has an index equivalent to each spec:
// reused whatever its name (its TTL adjusted), or created under spec.name.
//
// A creation that fails with IndexOptionsConflict or IndexKeySpecsConflict
// may have raced with another replica or tool creating an equivalent index:
// the indexes are listed again and the spec checked once more before the
// conflict is reported.
func ensureIndexes(ctx context.Context, coll *mongo.Collection, specs ...indexSpec) error {
	existing, err := listIndexes(ctx, coll)
	if err != nil {
		return err
	}
	for _, s := range specs {
		for attempt := 1; ; attempt++ {
			created, err := ensureIndex(ctx, coll, existing, s)
			if err == nil {
				if created {
					existing = append(existing, s.document())
				}
				break
			}
			if !isIndexConflict(err) {
				return err
			}
			if attempt == 2 {
				if !errors.Is(err, ErrIndexConflict) {
					err = fmt.Errorf("%w: %w", ErrIndexConflict, err)
				}
				return err
			}
			if existing, err = listIndexes(ctx, coll); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureIndex reconciles one spec with the existing indexes; created
// reports whether it created the index.
func ensureIndex(ctx context.Context, coll *mongo.Collection, existing []bson.D, s indexSpec) (created bool, err error) {
	if same := findEquivalents(existing, s); len(same) > 0 {
		// Every equivalent index gets the spec's TTL: with two TTLs, the
		// shorter would win.
		for _, ix := range same {
			if err := adjustIndex(ctx, coll, ix, s); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	for _, ix := range existing {
		if indexName(ix) != s.name {
			continue
		}
		if s.replaces == nil || !s.replaces(ix) {
			return false, conflictf(coll, s, ix, "an index with this name has another key or partial filter")
		}
		// An earlier definition of ours: drop it, then create it anew. A
		// replica doing the same meanwhile makes the drop fail (not
		// found) or the creation conflict: ensureIndexes lists again.
		if err := coll.Indexes().DropOne(ctx, s.name); err != nil {
			return false, fmt.Errorf("%w: drop earlier index %s on %s: %w", ErrIndexConflict, s.name, coll.Name(), err)
		}
	}
	opts := options.Index().SetName(s.name)
	if s.partial != nil {
		opts.SetPartialFilterExpression(s.partial)
	}
	if s.ttl != nil {
		opts.SetExpireAfterSeconds(*s.ttl)
	}
	if s.unique {
		opts.SetUnique(true)
	}
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: s.keys, Options: opts}); err != nil {
		return false, fmt.Errorf("outbox: create index %s on %s: %w", s.name, coll.Name(), err)
	}
	return true, nil
}

// adjustIndex makes an existing index with the spec's key and partial
// filter serve as the spec: the same options, and the spec's TTL (set with
// collMod on the index's own name).
func adjustIndex(ctx context.Context, coll *mongo.Collection, ix bson.D, s indexSpec) error {
	ttl, hasTTL := indexTTL(ix)
	switch {
	case indexBool(ix, "unique") != s.unique:
		return conflictf(coll, s, ix, "an index with the same key and filter differs in uniqueness")
	case indexBool(ix, "sparse"):
		return conflictf(coll, s, ix, "an index with the same key and filter is sparse")
	case s.ttl == nil && hasTTL:
		return conflictf(coll, s, ix, "an index with the same key and filter expires documents")
	case s.ttl != nil && !hasTTL:
		return conflictf(coll, s, ix, "an index with the same key and filter is not a TTL index")
	case s.ttl == nil || ttl == int64(*s.ttl):
		return nil
	}
	name := indexName(ix)
	err := coll.Database().RunCommand(ctx, bson.D{
		{Key: "collMod", Value: coll.Name()},
		{Key: "index", Value: bson.D{{Key: "name", Value: name}, {Key: "expireAfterSeconds", Value: *s.ttl}}},
	}).Err()
	if err != nil {
		// IndexNotFound: dropped meanwhile; reported as a conflict so that
		// ensureIndexes lists the indexes again and retries once.
		if code := commandCode(err); code == codeIndexNotFound {
			return fmt.Errorf("%w: index %s on %s disappeared while its TTL was updated: %w", ErrIndexConflict, name, coll.Name(), err)
		}
		return fmt.Errorf("outbox: update TTL of index %s on %s: %w", name, coll.Name(), err)
	}
	return nil
}

// listIndexes returns the index documents of coll (none when the
// collection does not exist yet).
func listIndexes(ctx context.Context, coll *mongo.Collection) ([]bson.D, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		if commandCode(err) == codeNamespaceNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("outbox: list indexes of %s: %w", coll.Name(), err)
	}
	var out []bson.D
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("outbox: list indexes of %s: %w", coll.Name(), err)
	}
	return out, nil
}

// findEquivalents returns the existing indexes with the spec's key pattern
// (same fields, order and directions) and partial filter.
func findEquivalents(existing []bson.D, s indexSpec) []bson.D {
	var out []bson.D
	for _, ix := range existing {
		key, _ := lookup(ix, "key")
		partial, ok := lookup(ix, "partialFilterExpression")
		if !ok {
			partial = bson.D{}
		}
		want := s.partial
		if want == nil {
			want = bson.D{}
		}
		if sameBSON(key, s.keys, true) && sameBSON(partial, want, false) {
			out = append(out, ix)
		}
	}
	return out
}

// document renders the spec as listIndexes shows it.
func (s indexSpec) document() bson.D {
	d := bson.D{{Key: "key", Value: s.keys}, {Key: "name", Value: s.name}}
	if s.unique {
		d = append(d, bson.E{Key: "unique", Value: true})
	}
	if s.partial != nil {
		d = append(d, bson.E{Key: "partialFilterExpression", Value: s.partial})
	}
	if s.ttl != nil {
		d = append(d, bson.E{Key: "expireAfterSeconds", Value: *s.ttl})
	}
	return d
}

func conflictf(coll *mongo.Collection, s indexSpec, ix bson.D, why string) error {
	return fmt.Errorf("%w on %s.%s: %s: needed %s, found %s; drop or rename the existing index, or use other collections",
		ErrIndexConflict, coll.Database().Name(), coll.Name(), why, formatIndex(s.document()), formatIndex(ix))
}

func isIndexConflict(err error) bool {
	if errors.Is(err, ErrIndexConflict) {
		return true
	}
	code := commandCode(err)
	return code == codeIndexOptConflict || code == codeIndexKeySpecsConflict
}

// commandCode returns the server error code of err, or 0.
func commandCode(err error) int32 {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return ce.Code
	}
	var se mongo.ServerError
	if errors.As(err, &se) {
		for _, code := range []int32{codeNamespaceNotFound, codeIndexNotFound, codeIndexOptConflict, codeIndexKeySpecsConflict} {
			if se.HasErrorCode(int(code)) {
				return code
			}
		}
	}
	return 0
}

func formatIndex(ix bson.D) string {
	var parts []string
	for _, e := range ix {
		switch e.Key {
		case "v", "ns":
			continue
		}
		b, err := bson.MarshalExtJSON(bson.D{e}, false, false)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", e.Key, e.Value))
			continue
		}
		parts = append(parts, strings.TrimSuffix(strings.TrimPrefix(string(b), "{"), "}"))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func lookup(d bson.D, key string) (any, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

func indexName(ix bson.D) string {
	name, _ := lookup(ix, "name")
	s, _ := name.(string)
	return s
}

func indexBool(ix bson.D, key string) bool {
	v, _ := lookup(ix, key)
	b, _ := v.(bool)
	return b
}

// indexTTL returns an index's expireAfterSeconds.
func indexTTL(ix bson.D) (int64, bool) {
	v, ok := lookup(ix, "expireAfterSeconds")
	if !ok {
		return 0, false
	}
	f, ok := toFloat(v)
	return int64(f), ok
}

// sameBSON compares two values as index definitions: numbers by value
// whatever their BSON type (1 written by Python is an int32, by Go an int64
// or an int32), documents field by field (in order when ordered, as key
// patterns are; in any order otherwise, as a partial filter's conjunction
// is).
func sameBSON(a, b any, ordered bool) bool {
	if da, ok := asDoc(a); ok {
		db, ok := asDoc(b)
		if !ok || len(da) != len(db) {
			return false
		}
		if ordered {
			for i := range da {
				if da[i].Key != db[i].Key || !sameBSON(da[i].Value, db[i].Value, ordered) {
					return false
				}
			}
			return true
		}
		for _, e := range da {
			v, ok := lookup(db, e.Key)
			if !ok || !sameBSON(e.Value, v, ordered) {
				return false
			}
		}
		return true
	}
	if _, ok := asDoc(b); ok {
		return false
	}
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		return ok && fa == fb
	}
	if aa, ok := a.(bson.A); ok {
		ab, ok := b.(bson.A)
		if !ok || len(aa) != len(ab) {
			return false
		}
		for i := range aa {
			if !sameBSON(aa[i], ab[i], ordered) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// asDoc returns v as a document.
func asDoc(v any) (bson.D, bool) {
	switch d := v.(type) {
	case bson.D:
		return d, true
	case bson.M:
		out := make(bson.D, 0, len(d))
		for k, v := range d {
			out = append(out, bson.E{Key: k, Value: v})
		}
		return out, true
	case bson.Raw:
		var out bson.D
		if err := bson.Unmarshal(d, &out); err != nil {
			return nil, false
		}
		return out, true
	}
	return nil, false
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		if math.IsNaN(n) {
			return 0, false
		}
		return n, true
	case bson.Decimal128:
		x, err := strconv.ParseFloat(n.String(), 64)
		return x, err == nil
	}
	return 0, false
}

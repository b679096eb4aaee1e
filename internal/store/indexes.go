package store

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

// ErrIndexConflict reports an existing index that cannot serve as one the
// framework needs (same name with another definition, or the same
// definition with other options). The root package exports it as
// outbox.ErrIndexConflict.
var ErrIndexConflict = errors.New("outbox: conflicting index")

// MongoDB error codes met while creating indexes.
const (
	// CodeNamespaceNotFound is the code of a command on a collection
	// that does not exist (yet).
	CodeNamespaceNotFound     = 26
	codeIndexNotFound         = 27
	codeIndexOptConflict      = 85 // IndexOptionsConflict
	codeIndexKeySpecsConflict = 86 // IndexKeySpecsConflict
)

// IndexSpec is an index the framework needs. Indexes are matched by
// definition (key pattern and partial filter), not by name: an equivalent
// index created under another name (by hand, or by the Python event-outbox
// library, whose TTL indexes are named "expiration") is reused.
type IndexSpec struct {
	Name    string
	Keys    bson.D
	Partial bson.D // nil: not partial
	TTL     *int32 // expireAfterSeconds; nil: not a TTL index
	Unique  bool
	// Replaces, when set, recognises an earlier definition of the index
	// under its name, which EnsureIndexes drops and creates anew.
	Replaces func(ix bson.D) bool
}

// EnsureIndexes makes sure coll has an index equivalent to each spec:
// reused whatever its name (its TTL adjusted), or created under spec.Name.
//
// A creation that fails with IndexOptionsConflict or IndexKeySpecsConflict
// may have raced with another replica or tool creating an equivalent index:
// the indexes are listed again and the spec checked once more before the
// conflict is reported.
func EnsureIndexes(ctx context.Context, coll *mongo.Collection, specs ...IndexSpec) error {
	existing, err := ListIndexes(ctx, coll)
	if err != nil {
		return err
	}
	for _, s := range specs {
		for attempt := 1; ; attempt++ {
			created, err := ensureIndex(ctx, coll, existing, s)
			if err == nil {
				if created {
					existing = append(existing, s.Document())
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
			if existing, err = ListIndexes(ctx, coll); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureIndex reconciles one spec with the existing indexes; created
// reports whether it created the index.
func ensureIndex(ctx context.Context, coll *mongo.Collection, existing []bson.D, s IndexSpec) (created bool, err error) {
	if same := FindEquivalents(existing, s); len(same) > 0 {
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
		if IndexName(ix) != s.Name {
			continue
		}
		if s.Replaces == nil || !s.Replaces(ix) {
			return false, conflictf(coll, s, ix, "an index with this name has another key or partial filter")
		}
		// An earlier definition of ours: drop it, then create it anew. A
		// replica doing the same meanwhile makes the drop fail (not
		// found) or the creation conflict: EnsureIndexes lists again.
		if err := coll.Indexes().DropOne(ctx, s.Name); err != nil {
			return false, fmt.Errorf("%w: drop earlier index %s on %s: %w", ErrIndexConflict, s.Name, coll.Name(), err)
		}
	}
	opts := options.Index().SetName(s.Name)
	if s.Partial != nil {
		opts.SetPartialFilterExpression(s.Partial)
	}
	if s.TTL != nil {
		opts.SetExpireAfterSeconds(*s.TTL)
	}
	if s.Unique {
		opts.SetUnique(true)
	}
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: s.Keys, Options: opts}); err != nil {
		return false, fmt.Errorf("outbox: create index %s on %s: %w", s.Name, coll.Name(), err)
	}
	return true, nil
}

// adjustIndex makes an existing index with the spec's key and partial
// filter serve as the spec: the same options, and the spec's TTL (set with
// collMod on the index's own name).
func adjustIndex(ctx context.Context, coll *mongo.Collection, ix bson.D, s IndexSpec) error {
	ttl, hasTTL := IndexTTL(ix)
	switch {
	case IndexBool(ix, "unique") != s.Unique:
		return conflictf(coll, s, ix, "an index with the same key and filter differs in uniqueness")
	case IndexBool(ix, "sparse"):
		return conflictf(coll, s, ix, "an index with the same key and filter is sparse")
	case s.TTL == nil && hasTTL:
		return conflictf(coll, s, ix, "an index with the same key and filter expires documents")
	case s.TTL != nil && !hasTTL:
		return conflictf(coll, s, ix, "an index with the same key and filter is not a TTL index")
	case s.TTL == nil || ttl == int64(*s.TTL):
		return nil
	}
	name := IndexName(ix)
	err := coll.Database().RunCommand(ctx, bson.D{
		{Key: "collMod", Value: coll.Name()},
		{Key: "index", Value: bson.D{{Key: "name", Value: name}, {Key: "expireAfterSeconds", Value: *s.TTL}}},
	}).Err()
	if err != nil {
		// IndexNotFound: dropped meanwhile; reported as a conflict so that
		// EnsureIndexes lists the indexes again and retries once.
		if code := CommandCode(err); code == codeIndexNotFound {
			return fmt.Errorf("%w: index %s on %s disappeared while its TTL was updated: %w", ErrIndexConflict, name, coll.Name(), err)
		}
		return fmt.Errorf("outbox: update TTL of index %s on %s: %w", name, coll.Name(), err)
	}
	return nil
}

// ListIndexes returns the index documents of coll (none when the
// collection does not exist yet).
func ListIndexes(ctx context.Context, coll *mongo.Collection) ([]bson.D, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		if CommandCode(err) == CodeNamespaceNotFound {
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

// FindEquivalents returns the existing indexes with the spec's key pattern
// (same fields, order and directions) and partial filter.
func FindEquivalents(existing []bson.D, s IndexSpec) []bson.D {
	var out []bson.D
	for _, ix := range existing {
		key, _ := Lookup(ix, "key")
		partial, ok := Lookup(ix, "partialFilterExpression")
		if !ok {
			partial = bson.D{}
		}
		want := s.Partial
		if want == nil {
			want = bson.D{}
		}
		if SameBSON(key, s.Keys, true) && SameBSON(partial, want, false) {
			out = append(out, ix)
		}
	}
	return out
}

// Document renders the spec as ListIndexes shows it.
func (s IndexSpec) Document() bson.D {
	d := bson.D{{Key: "key", Value: s.Keys}, {Key: "name", Value: s.Name}}
	if s.Unique {
		d = append(d, bson.E{Key: "unique", Value: true})
	}
	if s.Partial != nil {
		d = append(d, bson.E{Key: "partialFilterExpression", Value: s.Partial})
	}
	if s.TTL != nil {
		d = append(d, bson.E{Key: "expireAfterSeconds", Value: *s.TTL})
	}
	return d
}

func conflictf(coll *mongo.Collection, s IndexSpec, ix bson.D, why string) error {
	return fmt.Errorf("%w on %s.%s: %s: needed %s, found %s; drop or rename the existing index, or use other collections",
		ErrIndexConflict, coll.Database().Name(), coll.Name(), why, FormatIndex(s.Document()), FormatIndex(ix))
}

func isIndexConflict(err error) bool {
	if errors.Is(err, ErrIndexConflict) {
		return true
	}
	code := CommandCode(err)
	return code == codeIndexOptConflict || code == codeIndexKeySpecsConflict
}

// CommandCode returns the server error code of err, or 0.
func CommandCode(err error) int32 {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return ce.Code
	}
	var se mongo.ServerError
	if errors.As(err, &se) {
		for _, code := range []int32{CodeNamespaceNotFound, codeIndexNotFound, codeIndexOptConflict, codeIndexKeySpecsConflict} {
			if se.HasErrorCode(int(code)) {
				return code
			}
		}
	}
	return 0
}

// FormatIndex renders an index document for an error message, without
// its version and namespace.
func FormatIndex(ix bson.D) string {
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

// Lookup returns the value of key in d.
func Lookup(d bson.D, key string) (any, bool) {
	for _, e := range d {
		if e.Key == key {
			return e.Value, true
		}
	}
	return nil, false
}

// IndexName returns the name of an index document.
func IndexName(ix bson.D) string {
	name, _ := Lookup(ix, "name")
	s, _ := name.(string)
	return s
}

// IndexBool returns a boolean option of an index document (false when
// absent).
func IndexBool(ix bson.D, key string) bool {
	v, _ := Lookup(ix, key)
	b, _ := v.(bool)
	return b
}

// IndexTTL returns an index's expireAfterSeconds.
func IndexTTL(ix bson.D) (int64, bool) {
	v, ok := Lookup(ix, "expireAfterSeconds")
	if !ok {
		return 0, false
	}
	f, ok := toFloat(v)
	return int64(f), ok
}

// SameBSON compares two values as index definitions: numbers by value
// whatever their BSON type (1 written by Python is an int32, by Go an int64
// or an int32), documents field by field (in order when ordered, as key
// patterns are; in any order otherwise, as a partial filter's conjunction
// is).
func SameBSON(a, b any, ordered bool) bool {
	if da, ok := asDoc(a); ok {
		db, ok := asDoc(b)
		if !ok || len(da) != len(db) {
			return false
		}
		if ordered {
			for i := range da {
				if da[i].Key != db[i].Key || !SameBSON(da[i].Value, db[i].Value, ordered) {
					return false
				}
			}
			return true
		}
		for _, e := range da {
			v, ok := Lookup(db, e.Key)
			if !ok || !SameBSON(e.Value, v, ordered) {
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
			if !SameBSON(aa[i], ab[i], ordered) {
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

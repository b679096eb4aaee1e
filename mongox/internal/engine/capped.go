package engine

import (
	"context"
	"fmt"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// CollectionOptions are the options a collection is created with.
type CollectionOptions struct {
	// Clustered is the clusteredIndex option, nil for none.
	Clustered bson.D
	// PrePostImages is the changeStreamPreAndPostImages option.
	PrePostImages bool
	// Capped makes a capped collection of at most CappedSize bytes of
	// documents and, when CappedMax > 0, at most CappedMax documents
	// (https://www.mongodb.com/docs/v7.0/core/capped-collections/).
	Capped     bool
	CappedSize int64
	CappedMax  int64
}

// minCappedSize is the smallest cap mongod applies: a smaller size
// becomes 4096 bytes.
const minCappedSize = 4096

// CreateCollectionWith creates a collection with options; 48
// NamespaceExists when it exists.
func (e *Engine) CreateCollectionWith(ctx context.Context, ns NS, opts CollectionOptions) error {
	return e.ddl(ctx, nil, func() error {
		if e.collLocked(ns) != nil {
			return &Error{Code: CodeNamespaceExists, CodeName: "NamespaceExists", Msg: "Collection " + ns.String() + " already exists."}
		}
		c, err := newCollection(ns)
		if err != nil {
			return err
		}
		c.clustered = opts.Clustered
		c.prePostImages = opts.PrePostImages
		if opts.Capped {
			c.capped = &cappedLimits{size: opts.CappedSize, max: opts.CappedMax}
		}
		e.attachLocked(c, e.tick())
		e.appendOplog([]Entry{c.createEntry(c.createdTS)})
		return nil
	})
}

// cappedLimits are the limits of a capped collection.
type cappedLimits struct {
	size int64 // bytes of documents, as given (rounded up to 256)
	max  int64 // documents; 0 for no limit
}

// cap returns the byte limit applied: the size, at least 4096.
func (l *cappedLimits) cap() int64 { return max(l.size, minCappedSize) }

// errCappedInTxn is mongod's refusal of a write to a capped collection in
// a multi-document transaction.
func errCappedInTxn(ns NS) *Error {
	return &Error{Code: 263, CodeName: "OperationNotSupportedInTransaction",
		Msg: fmt.Sprintf("Collection '%s' is a capped collection. Writes in transactions are not allowed on capped collections.", ns)}
}

// checkCappedInsert refuses a document larger than the collection's cap.
func checkCappedInsert(c *collection, doc bson.D) error {
	if c.capped != nil && int64(bsonkit.Size(doc)) > c.capped.cap() {
		return &Error{Code: CodeBadValue, CodeName: "BadValue", Msg: "object to insert exceeds cappedMaxSize"}
	}
	return nil
}

// trimCapped deletes the oldest documents of a capped collection until its
// documents fit its limits again, never the document just inserted (rid
// keep), as mongod does after each insert. The deletions are part of the
// statement and reach the oplog and change streams as deletes.
func (v *View) trimCapped(c *collection, keep uint64) error {
	if c.capped == nil {
		return nil
	}
	type rec struct {
		id   any
		size int64
		rid  uint64
	}
	var recs []rec
	var total int64
	v.live(c, func(d bson.D, rid uint64) bool {
		id, _ := bsonkit.Get(d, "_id")
		s := int64(bsonkit.Size(d))
		recs = append(recs, rec{id: id, size: s, rid: rid})
		total += s
		return true
	})
	count := int64(len(recs))
	for _, r := range recs {
		if total <= c.capped.cap() && (c.capped.max <= 0 || count <= c.capped.max) {
			break
		}
		if r.rid == keep {
			break
		}
		if _, err := v.Delete(c.ns, r.id); err != nil {
			return err
		}
		total -= r.size
		count--
	}
	return nil
}

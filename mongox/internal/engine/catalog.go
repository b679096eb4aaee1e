package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

type database struct {
	name  string
	colls map[string]*collection
}

// collection holds the version chains of its documents, keyed by the
// bsonkit.Key of _id, and its natural order: one entry per record (an
// insertion lifetime of a document) in insertion order. Entries of records
// no longer retained are skipped and compacted away.
type collection struct {
	ns      NS
	uuid    bson.Binary
	chains  map[string]*chain
	order   []orderEntry
	stale   int
	indexes []*index // indexes[0] is _id_
	// createdTS is when the collection appeared under its namespace
	// (created, renamed to it, or committed by the transaction that
	// created it): a transaction whose snapshot is older does not see it.
	createdTS bson.Timestamp
	// catalogTS is the last catalog change that writes depend on (creation,
	// an index built or dropped, a rename): a transaction whose snapshot is
	// older cannot write the collection (246 SnapshotUnavailable).
	catalogTS bson.Timestamp
	// prePostImages is the changeStreamPreAndPostImages option: change
	// events of updates, replaces and deletes carry the document's images.
	prePostImages bool
	// clustered is the clusteredIndex option ({key: {_id: 1}, unique,
	// name, v}) of a clustered collection, nil otherwise. Documents are
	// always kept by _id here, so it only changes what the catalog reports.
	clustered bson.D
	// capped holds the limits of a capped collection, nil otherwise.
	capped *cappedLimits
	// ddlWaiting counts the catalog operations waiting for the
	// transactions that use the collection; while one waits, no other
	// transaction may start using it.
	ddlWaiting int
	// pending is the open transaction that created the collection: it is
	// not in the catalog but private to that transaction until it commits,
	// as MongoDB keeps an uncommitted collection in the creating
	// transaction's snapshot. When two transactions create the same
	// namespace, the second to commit gets a WriteConflict.
	pending *Txn
}

type orderEntry struct {
	c   *chain
	rid uint64
}

// version is one committed state of a document; doc nil is a deletion.
type version struct {
	ts  bson.Timestamp
	rid uint64 // record id: the insertion this version belongs to
	doc bson.D
}

// chain is the history of one document key.
type chain struct {
	coll     *collection
	key      string
	versions []version // ascending ts
	owner    *Txn      // open transaction holding a pending write
	dead     bool      // removed from the collection
}

func (c *chain) latest() *version {
	if len(c.versions) == 0 {
		return nil
	}
	return &c.versions[len(c.versions)-1]
}

// at returns the version visible at snapshot ts, or nil.
func (c *chain) at(ts bson.Timestamp) *version {
	for i := len(c.versions) - 1; i >= 0; i-- {
		if bsonkit.CompareTimestamps(c.versions[i].ts, ts) <= 0 {
			return &c.versions[i]
		}
	}
	return nil
}

// prefixesHeld returns the index key prefixes of c's retained and pending
// versions.
func (c *chain) prefixesHeld(ix *index) map[string]bool {
	held := map[string]bool{}
	add := func(doc bson.D) {
		for _, k := range ix.keysOf(doc) {
			for _, p := range k.prefixes {
				held[p] = true
			}
		}
	}
	for _, v := range c.versions {
		if v.doc != nil {
			add(v.doc)
		}
	}
	if c.owner != nil {
		if p := c.owner.writes[c]; p != nil && p.doc != nil {
			add(p.doc)
		}
	}
	return held
}

func (c *chain) anyVersionHas(ix *index, hash string) bool {
	for _, v := range c.versions {
		if v.doc != nil && ix.hasKey(v.doc, hash) {
			return true
		}
	}
	if c.owner != nil {
		if p := c.owner.writes[c]; p != nil && p.doc != nil && ix.hasKey(p.doc, hash) {
			return true
		}
	}
	return false
}

// CollectionInfo describes a collection for listCollections.
type CollectionInfo struct {
	Name string
	UUID bson.Binary
	// PrePostImages is the changeStreamPreAndPostImages option.
	PrePostImages bool
	// Clustered is the clusteredIndex option, nil when not clustered.
	Clustered bson.D
	// Capped reports a capped collection of at most CappedSize bytes and,
	// when CappedMax > 0, CappedMax documents.
	Capped     bool
	CappedSize int64
	CappedMax  int64
}

// DatabaseInfo describes a database for listDatabases.
type DatabaseInfo struct {
	Name  string
	Size  int64 // approximate size of the documents in bytes
	Empty bool
}

func validNS(ns NS) error {
	if ns.DB == "" || strings.ContainsAny(ns.DB, "/\\. \"$\x00") {
		return &Error{Code: CodeInvalidNamespace, CodeName: "InvalidNamespace", Msg: "Invalid database name: '" + ns.DB + "'"}
	}
	if ns.Coll == "" || strings.HasPrefix(ns.Coll, ".") || strings.Contains(ns.Coll, "$") || strings.Contains(ns.Coll, "\x00") {
		return &Error{Code: CodeInvalidNamespace, CodeName: "InvalidNamespace", Msg: "Invalid collection name: " + ns.Coll}
	}
	return nil
}

// collLocked returns the collection, or nil. Caller holds e.mu.
func (e *Engine) collLocked(ns NS) *collection {
	db := e.dbs[ns.DB]
	if db == nil {
		return nil
	}
	return db.colls[ns.Coll]
}

// createLocked creates a collection (with its _id_ index) in the catalog.
// Caller holds e.mu.
func (e *Engine) createLocked(ns NS) (*collection, error) {
	c, err := newCollection(ns)
	if err != nil {
		return nil, err
	}
	e.attachLocked(c, e.tick())
	return c, nil
}

// newCollection returns a collection with its _id_ index, not yet in the
// catalog.
func newCollection(ns NS) (*collection, error) {
	if err := validNS(ns); err != nil {
		return nil, err
	}
	idIdx, _ := newIndex(IndexSpec{Name: "_id_", Key: bson.D{{Key: "_id", Value: int32(1)}}, Unique: true})
	idIdx.entries = nil // the chains map is the _id index
	u := bson.NewObjectID()
	return &collection{
		ns:      ns,
		uuid:    bson.Binary{Subtype: 4, Data: append(u[:], 0, 0, 0, 0)},
		chains:  map[string]*chain{},
		indexes: []*index{idIdx},
	}, nil
}

// attachLocked puts a collection into the catalog under its namespace, as
// of ts. Caller holds e.mu.
func (e *Engine) attachLocked(c *collection, ts bson.Timestamp) {
	db := e.dbs[c.ns.DB]
	if db == nil {
		db = &database{name: c.ns.DB, colls: map[string]*collection{}}
		e.dbs[c.ns.DB] = db
	}
	c.pending = nil
	c.createdTS, c.catalogTS = ts, ts
	db.colls[c.ns.Coll] = c
}

// goneLocked records that namespace ns lost its collection at ts (a drop
// or a rename away): a transaction whose snapshot is older cannot write it.
// Records no open transaction can be older than are forgotten.
func (e *Engine) goneLocked(ns NS, ts bson.Timestamp) {
	if e.gone == nil {
		e.gone = map[NS]bson.Timestamp{}
	}
	oldest, open := e.minSnapshotLocked()
	for k, at := range e.gone {
		if !open || bsonkit.CompareTimestamps(at, oldest) <= 0 {
			delete(e.gone, k)
		}
	}
	e.gone[ns] = ts
}

// ensureLocked returns the collection, creating it when missing.
func (e *Engine) ensureLocked(ns NS) (*collection, bool, error) {
	if c := e.collLocked(ns); c != nil {
		return c, false, nil
	}
	c, err := e.createLocked(ns)
	return c, err == nil, err
}

// busyLocked returns an open transaction that uses the collection (read or
// written in it), other than except, or nil.
func (e *Engine) busyLocked(c *collection, except *Txn) *Txn {
	for t := range e.txns {
		if t == except {
			continue
		}
		_, wrote := t.colls[c]
		_, used := t.touched[c]
		if wrote || used {
			return t
		}
	}
	return nil
}

// ddl runs fn under the lock once no open transaction uses the collections
// it names (a collection name "" stands for the whole database): it waits
// for them, bounded by ctx, as a catalog operation waits for the
// transactions holding locks on its collections. While it waits, the
// collections refuse transactions that have not used them yet (see
// View.coll).
func (e *Engine) ddl(ctx context.Context, nss []NS, fn func() error) error {
	var marked []*collection
	unmark := func() {
		for _, c := range marked {
			c.ddlWaiting--
		}
		marked = nil
	}
	for {
		e.mu.Lock()
		var wait *Txn
		var blocked []*collection
		for _, ns := range nss {
			if ns.Coll == "" { // whole database
				if db := e.dbs[ns.DB]; db != nil {
					for _, c := range db.colls {
						if t := e.busyLocked(c, nil); t != nil {
							wait = t
							blocked = append(blocked, c)
						}
					}
				}
			} else if c := e.collLocked(ns); c != nil {
				if t := e.busyLocked(c, nil); t != nil {
					wait = t
					blocked = append(blocked, c)
				}
			}
		}
		if wait == nil {
			unmark()
			err := fn()
			e.mu.Unlock()
			return err
		}
		unmark()
		for _, c := range blocked {
			c.ddlWaiting++
		}
		marked = blocked
		ch := wait.done
		e.mu.Unlock()
		if err := waitCtx(ctx, ch); err != nil {
			e.mu.Lock()
			unmark()
			e.mu.Unlock()
			return err
		}
	}
}

// CreateCollection creates a collection; 48 NamespaceExists when it exists.
func (e *Engine) CreateCollection(ctx context.Context, ns NS) error {
	return e.CreateCollectionWith(ctx, ns, CollectionOptions{})
}

// createEntry is the oplog entry of the collection's creation.
func (c *collection) createEntry(ts bson.Timestamp) Entry {
	return Entry{TS: ts, Op: OpCreate, NS: c.ns, UUID: c.uuid, Desc: bson.D{{Key: "idIndex", Value: bson.D{
		{Key: "v", Value: int32(2)}, {Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "name", Value: "_id_"}}}}}
}

// DropCollection drops a collection and records a drop in the oplog. It
// reports whether the collection existed.
func (e *Engine) DropCollection(ctx context.Context, ns NS) (bool, error) {
	existed := false
	err := e.ddl(ctx, []NS{ns}, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return nil
		}
		existed = true
		e.dropLocked(c)
		ts := e.tick()
		e.goneLocked(ns, ts)
		e.appendOplog([]Entry{{TS: ts, Op: OpDrop, NS: ns, UUID: c.uuid}})
		return nil
	})
	return existed, err
}

func (e *Engine) dropLocked(c *collection) {
	db := e.dbs[c.ns.DB]
	delete(db.colls, c.ns.Coll)
	if len(db.colls) == 0 {
		delete(e.dbs, c.ns.DB)
	}
	for _, ch := range c.chains {
		ch.dead = true
		delete(e.dirty, ch)
	}
}

// DropDatabase drops every collection of a database (a drop entry each,
// then a dropDatabase entry). It reports whether the database existed.
func (e *Engine) DropDatabase(ctx context.Context, name string) (bool, error) {
	existed := false
	err := e.ddl(ctx, []NS{{DB: name}}, func() error {
		db := e.dbs[name]
		if db == nil {
			return nil
		}
		existed = true
		names := make([]string, 0, len(db.colls))
		for n := range db.colls {
			names = append(names, n)
		}
		sort.Strings(names)
		var entries []Entry
		for _, n := range names {
			c := db.colls[n]
			e.dropLocked(c)
			ts := e.tick()
			e.goneLocked(c.ns, ts)
			entries = append(entries, Entry{TS: ts, Op: OpDrop, NS: NS{DB: name, Coll: n}, UUID: c.uuid})
		}
		delete(e.dbs, name)
		entries = append(entries, Entry{TS: e.tick(), Op: OpDropDatabase, NS: NS{DB: name}})
		e.appendOplog(entries)
		return nil
	})
	return existed, err
}

// RenameCollection renames a collection, optionally dropping an existing
// target. It records a rename entry.
func (e *Engine) RenameCollection(ctx context.Context, from, to NS, dropTarget bool) error {
	return e.ddl(ctx, []NS{from, to}, func() error {
		if err := validNS(to); err != nil {
			return err
		}
		c := e.collLocked(from)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "Source collection " + from.String() + " does not exist"}
		}
		if from == to {
			return &Error{Code: CodeIllegalOperation, CodeName: "IllegalOperation", Msg: "Can't rename a collection to itself"}
		}
		var entries []Entry
		desc := bson.D{{Key: "to", Value: bson.D{{Key: "db", Value: to.DB}, {Key: "coll", Value: to.Coll}}}}
		if t := e.collLocked(to); t != nil {
			if !dropTarget {
				return &Error{Code: CodeNamespaceExists, CodeName: "NamespaceExists", Msg: "target namespace exists"}
			}
			e.dropLocked(t)
			ts := e.tick()
			e.goneLocked(to, ts)
			entries = append(entries, Entry{TS: ts, Op: OpDrop, NS: to, UUID: t.uuid})
			desc = append(desc, bson.E{Key: "dropTarget", Value: t.uuid})
		}
		db := e.dbs[from.DB]
		delete(db.colls, from.Coll)
		if len(db.colls) == 0 {
			delete(e.dbs, from.DB)
		}
		tdb := e.dbs[to.DB]
		if tdb == nil {
			tdb = &database{name: to.DB, colls: map[string]*collection{}}
			e.dbs[to.DB] = tdb
		}
		c.ns = to
		tdb.colls[to.Coll] = c
		ts := e.tick()
		c.createdTS, c.catalogTS = ts, ts
		e.goneLocked(from, ts)
		entries = append(entries, Entry{TS: ts, Op: OpRename, NS: from, To: to, UUID: c.uuid, Desc: desc})
		e.appendOplog(entries)
		return nil
	})
}

// ListCollections returns the collections of a database, sorted by name.
func (e *Engine) ListCollections(db string) []CollectionInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.dbs[db]
	if d == nil {
		return nil
	}
	out := make([]CollectionInfo, 0, len(d.colls))
	for n, c := range d.colls {
		info := CollectionInfo{Name: n, UUID: c.uuid, PrePostImages: c.prePostImages, Clustered: c.clustered}
		if c.capped != nil {
			info.Capped, info.CappedSize, info.CappedMax = true, c.capped.size, c.capped.max
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b CollectionInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ListDatabases returns the databases, sorted by name.
func (e *Engine) ListDatabases() []DatabaseInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]DatabaseInfo, 0, len(e.dbs))
	for n, d := range e.dbs {
		info := DatabaseInfo{Name: n, Empty: true}
		for _, c := range d.colls {
			for _, ch := range c.chains {
				if v := ch.latest(); v != nil && v.doc != nil {
					info.Empty = false
					info.Size += int64(bsonkit.Size(v.doc))
				}
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b DatabaseInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// CollectionStats returns the number of documents and their approximate
// size of the latest committed state; ok is false when the collection does
// not exist.
func (e *Engine) CollectionStats(ns NS) (count int64, size int64, nindexes int, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.collLocked(ns)
	if c == nil {
		return 0, 0, 0, false
	}
	for _, ch := range c.chains {
		if v := ch.latest(); v != nil && v.doc != nil {
			count++
			size += int64(bsonkit.Size(v.doc))
		}
	}
	return count, size, len(c.indexes), true
}

// CreateIndexes creates indexes (creating the collection when missing). It
// returns whether the collection was created and the index counts before
// and after. Identical existing indexes are no-ops.
func (e *Engine) CreateIndexes(ctx context.Context, ns NS, specs []IndexSpec) (created bool, before, after int, err error) {
	// Indexes that all exist already (or a conflicting spec) are answered at
	// once: as in mongod, only a build waits for the transactions using the
	// collection.
	e.mu.Lock()
	if c := e.collLocked(ns); c != nil {
		todo, err := newIndexSpecs(c, specs)
		if err != nil || len(todo) == 0 {
			n := len(c.indexes)
			e.mu.Unlock()
			return false, n, n, err
		}
	}
	e.mu.Unlock()
	err = e.ddl(ctx, []NS{ns}, func() error {
		c, made, err := e.ensureLocked(ns)
		if err != nil {
			return err
		}
		created = made
		before = len(c.indexes)
		add, err := e.buildIndexesLocked(c, specs)
		if err != nil {
			return err
		}
		c.indexes = append(c.indexes, add...)
		after = len(c.indexes)
		var entries []Entry
		if made {
			entries = append(entries, c.createEntry(c.createdTS))
		}
		for _, ix := range add {
			ts := e.tick()
			c.catalogTS = ts
			entries = append(entries, createIndexEntry(c, ix, ts))
		}
		if len(entries) > 0 {
			e.appendOplog(entries)
		}
		return nil
	})
	return created, before, after, err
}

func createIndexEntry(c *collection, ix *index, ts bson.Timestamp) Entry {
	return Entry{TS: ts, Op: OpCreateIndexes, NS: c.ns, UUID: c.uuid,
		Desc: bson.D{{Key: "indexes", Value: bson.A{specDoc(ix.spec())}}}}
}

// maxIndexes is the most indexes a collection may have, _id_ included.
const maxIndexes = 64

// buildIndexesLocked validates and builds the indexes of specs that c does
// not have yet and returns them (not yet attached). Caller holds e.mu.
func (e *Engine) buildIndexesLocked(c *collection, specs []IndexSpec) ([]*index, error) {
	todo, err := newIndexSpecs(c, specs)
	if err != nil {
		return nil, err
	}
	if n := len(c.indexes) + len(todo); n > maxIndexes {
		return nil, &Error{Code: CodeCannotCreateIndex, CodeName: "CannotCreateIndex",
			Msg: fmt.Sprintf("add index fails, too many indexes for %s key:%s", c.ns, FormatValue(todo[len(todo)-1].Key))}
	}
	add := make([]*index, 0, len(todo))
	for _, s := range todo {
		ix, err := newIndex(s)
		if err != nil {
			return nil, err
		}
		if err := e.buildIndexLocked(c, ix); err != nil {
			return nil, err
		}
		add = append(add, ix)
	}
	return add, nil
}

// newIndexSpecs returns the specs that c does not have yet, in order, with
// their default names: an identical existing index is skipped, a conflicting
// one (same name or same key and filter with other options) fails with 85
// IndexOptionsConflict or 86 IndexKeySpecsConflict.
func newIndexSpecs(c *collection, specs []IndexSpec) ([]IndexSpec, error) {
	var todo []IndexSpec
	existing := make([]IndexSpec, 0, len(c.indexes)+len(specs))
	for _, ix := range c.indexes {
		existing = append(existing, ix.spec())
	}
specLoop:
	for _, s := range specs {
		if s.Name == "" {
			s.Name = DefaultIndexName(s.Key)
		}
		for _, x := range existing {
			sameKey := bsonkit.Equal(x.Key, s.Key) && keyTypesEqual(x.Key, s.Key)
			if x.Name == s.Name {
				if sameKey && sameOptions(x, s) {
					continue specLoop
				}
				if x.Name == "_id_" && sameKey {
					continue specLoop
				}
				if sameKey {
					return nil, &Error{Code: CodeIndexOptionsConflict, CodeName: "IndexOptionsConflict",
						Msg: "An equivalent index already exists with the same name but different options. Requested index: " +
							FormatValue(specDoc(s)) + ", existing index: " + FormatValue(specDoc(x))}
				}
				return nil, &Error{Code: CodeIndexKeySpecsConflict, CodeName: "IndexKeySpecsConflict",
					Msg: "An existing index has the same name as the requested index but different options or key. Requested index: " +
						FormatValue(specDoc(s)) + ", existing index: " + FormatValue(specDoc(x))}
			}
			if sameKey && bsonkit.Equal(x.PartialFilter, s.PartialFilter) {
				if sameOptions(x, s) {
					return nil, &Error{Code: CodeIndexOptionsConflict, CodeName: "IndexOptionsConflict",
						Msg: "Index already exists with a different name: " + x.Name}
				}
				return nil, &Error{Code: CodeIndexOptionsConflict, CodeName: "IndexOptionsConflict",
					Msg: "An equivalent index already exists with the same name but different options. Requested index: " +
						FormatValue(specDoc(s)) + ", existing index: " + FormatValue(specDoc(x))}
			}
		}
		todo = append(todo, s)
		existing = append(existing, s)
	}
	return todo, nil
}

// CreateIndexes creates indexes inside a transaction. On a collection the
// transaction creates they become visible with it at commit; on any other
// collection an index that already exists is a no-op and a new one fails
// with 263 OperationNotSupportedInTransaction, as mongod does. It reports
// whether it created the collection and the index counts before and after.
func (v *View) CreateIndexes(ns NS, specs []IndexSpec) (created bool, before, after int, err error) {
	if v.readOnly || v.t == nil || v.t.auto {
		return false, 0, 0, errors.New("engine: View.CreateIndexes needs a transaction")
	}
	c := v.coll(ns)
	if c == nil {
		if c, err = v.writable(ns); err != nil {
			return false, 0, 0, err
		}
		created = true
	}
	before = len(c.indexes)
	if c.pending != v.t {
		todo, err := newIndexSpecs(c, specs)
		if err != nil {
			return false, before, before, err
		}
		if len(todo) > 0 {
			return false, before, before, &Error{Code: 263, CodeName: "OperationNotSupportedInTransaction",
				Msg: "Cannot create new indexes on existing collection " + ns.String() + " in a multi-document transaction."}
		}
		return false, before, before, nil
	}
	add, err := v.e.buildIndexesLocked(c, specs)
	if err != nil {
		return created, before, before, err
	}
	c.indexes = append(c.indexes, add...)
	for _, ix := range add {
		v.t.ops = append(v.t.ops, createIndexEntry(c, ix, bson.Timestamp{}))
	}
	return created, before, len(c.indexes), nil
}

func keyTypesEqual(a, b bson.D) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || bsonkit.Rank(a[i].Value) != bsonkit.Rank(b[i].Value) {
			return false
		}
	}
	return true
}

func sameOptions(a, b IndexSpec) bool {
	if a.Unique != b.Unique || a.Sparse != b.Sparse || !bsonkit.Equal(a.PartialFilter, b.PartialFilter) {
		return false
	}
	if (a.ExpireAfterSeconds == nil) != (b.ExpireAfterSeconds == nil) {
		return false
	}
	return a.ExpireAfterSeconds == nil || *a.ExpireAfterSeconds == *b.ExpireAfterSeconds
}

// specDoc renders an index spec as listIndexes shows it.
func specDoc(s IndexSpec) bson.D {
	d := bson.D{{Key: "v", Value: int32(2)}, {Key: "key", Value: s.Key}, {Key: "name", Value: s.Name}}
	if s.Unique && s.Name != "_id_" {
		d = append(d, bson.E{Key: "unique", Value: true})
	}
	if s.Sparse {
		d = append(d, bson.E{Key: "sparse", Value: true})
	}
	if s.PartialFilter != nil {
		d = append(d, bson.E{Key: "partialFilterExpression", Value: s.PartialFilter})
	}
	if s.ExpireAfterSeconds != nil {
		var ttl any = *s.ExpireAfterSeconds
		if v := *s.ExpireAfterSeconds; v == int64(int32(v)) {
			ttl = int32(v)
		}
		d = append(d, bson.E{Key: "expireAfterSeconds", Value: ttl})
	}
	return d
}

// SpecDocument renders an index spec as listIndexes shows it.
func SpecDocument(s IndexSpec) bson.D { return specDoc(s) }

// buildIndexLocked fills a new unique index from the retained versions and
// checks the latest committed state for duplicates. No transaction holds
// pending writes in the collection (ddl waited for them).
func (e *Engine) buildIndexLocked(c *collection, ix *index) error {
	if !ix.unique {
		for _, ch := range c.chainsInOrder() {
			for _, v := range ch.versions {
				ix.addPrefixes(ch, v.doc)
			}
		}
		return nil
	}
	seen := map[string]bool{}
	for _, ch := range c.chainsInOrder() {
		if v := ch.latest(); v != nil && v.doc != nil {
			for _, k := range ix.keysOf(v.doc) {
				if seen[k.hash] {
					return errDupKey(c.ns, ix, ix.keyValue(k))
				}
				seen[k.hash] = true
			}
		}
		for _, v := range ch.versions {
			for _, k := range ix.keysOf(v.doc) {
				ix.add(k.hash, ch)
			}
		}
	}
	return nil
}

// chainsInOrder returns the live chains in natural order.
func (c *collection) chainsInOrder() []*chain {
	out := make([]*chain, 0, len(c.chains))
	seen := map[*chain]bool{}
	for _, o := range c.order {
		if !o.c.dead && !seen[o.c] {
			seen[o.c] = true
			out = append(out, o.c)
		}
	}
	return out
}

// ListIndexes returns the index specs of a collection; ok is false when the
// collection does not exist.
func (e *Engine) ListIndexes(ns NS) ([]IndexSpec, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.collLocked(ns)
	if c == nil {
		return nil, false
	}
	out := make([]IndexSpec, len(c.indexes))
	for i, ix := range c.indexes {
		out[i] = ix.spec()
	}
	return out, true
}

// DropIndexes drops indexes by name, by key pattern (key non-nil), or all
// but _id_ (name "*"). It returns the number of indexes before the drop.
func (e *Engine) DropIndexes(ctx context.Context, ns NS, names []string, key bson.D) (before int, err error) {
	err = e.ddl(ctx, []NS{ns}, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "ns not found " + ns.String()}
		}
		before = len(c.indexes)
		if key != nil {
			ix, err := indexByKey(c, key)
			if err != nil {
				return err
			}
			names = []string{ix.name}
		}
		if len(names) == 1 && names[0] == "*" {
			e.appendOplog(dropIndexEntries(e, c, c.indexes[1:]))
			c.indexes = c.indexes[:1]
			return nil
		}
		keep := slices.Clone(c.indexes)
		var dropped []*index
		for _, n := range names {
			if n == "_id_" {
				return &Error{Code: 72, CodeName: "InvalidOptions", Msg: "cannot drop _id index"}
			}
			i := slices.IndexFunc(keep, func(ix *index) bool { return ix.name == n })
			if i < 0 {
				return &Error{Code: CodeIndexNotFound, CodeName: "IndexNotFound", Msg: "index not found with name [" + n + "]"}
			}
			dropped = append(dropped, keep[i])
			keep = slices.Delete(keep, i, i+1)
		}
		c.indexes = keep
		e.appendOplog(dropIndexEntries(e, c, dropped))
		return nil
	})
	return before, err
}

// SetIndexTTL sets the expireAfterSeconds of an index found by name or by
// key pattern (collMod), making a single-field index a TTL index (MongoDB
// 5.1+). It returns the previous value, nil when the index had none. A key
// pattern several indexes share fails with 181 AmbiguousIndexKeyPattern;
// the _id index and compound indexes cannot become TTL indexes (72).
func (e *Engine) SetIndexTTL(ctx context.Context, ns NS, name string, key bson.D, seconds int64) (old *int64, err error) {
	err = e.ddl(ctx, nil, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "ns does not exist: " + ns.String()}
		}
		var ix *index
		if name != "" {
			i := slices.IndexFunc(c.indexes, func(x *index) bool { return x.name == name })
			if i < 0 {
				return &Error{Code: CodeIndexNotFound, CodeName: "IndexNotFound", Msg: "cannot find index " + name + " for ns " + ns.String()}
			}
			ix = c.indexes[i]
		} else {
			var err error
			if ix, err = indexByKey(c, key); err != nil {
				return err
			}
		}
		if ix.ttl == nil {
			switch {
			case ix.name == "_id_":
				return &Error{Code: CodeInvalidOptions, CodeName: "InvalidOptions", Msg: "the _id field does not support TTL indexes"}
			case len(ix.fields) != 1:
				return &Error{Code: CodeInvalidOptions, CodeName: "InvalidOptions", Msg: "TTL indexes are single-field indexes, compound indexes do not support TTL"}
			}
		} else {
			v := *ix.ttl
			old = &v
		}
		v := seconds
		ix.ttl = &v
		return nil
	})
	return old, err
}

// SetPrePostImages sets a collection's changeStreamPreAndPostImages
// option; writes from then on record their images. It fails with 26
// NamespaceNotFound when the collection does not exist.
func (e *Engine) SetPrePostImages(ctx context.Context, ns NS, enabled bool) error {
	return e.ddl(ctx, nil, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "ns does not exist: " + ns.String()}
		}
		c.prePostImages = enabled
		return nil
	})
}

// dropIndexEntries are the oplog entries of dropped indexes, one each.
func dropIndexEntries(e *Engine, c *collection, dropped []*index) []Entry {
	out := make([]Entry, 0, len(dropped))
	for _, ix := range dropped {
		c.catalogTS = e.tick()
		out = append(out, Entry{TS: c.catalogTS, Op: OpDropIndexes, NS: c.ns, UUID: c.uuid,
			Desc: bson.D{{Key: "indexes", Value: bson.A{specDoc(ix.spec())}}}})
	}
	return out
}

// RecordModify records a collMod of an existing collection in the oplog,
// with desc as its operationDescription. It fails with 26
// NamespaceNotFound when the collection does not exist.
func (e *Engine) RecordModify(ctx context.Context, ns NS, desc bson.D) error {
	return e.ddl(ctx, nil, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "ns does not exist: " + ns.String()}
		}
		e.appendOplog([]Entry{{TS: e.tick(), Op: OpModify, NS: ns, UUID: c.uuid, Desc: desc}})
		return nil
	})
}

// SetClustered records the clusteredIndex option of a collection created
// clustered by _id.
func (e *Engine) SetClustered(ctx context.Context, ns NS, spec bson.D) error {
	return e.ddl(ctx, nil, func() error {
		c := e.collLocked(ns)
		if c == nil {
			return &Error{Code: CodeNamespaceNotFound, CodeName: "NamespaceNotFound", Msg: "ns does not exist: " + ns.String()}
		}
		c.clustered = spec
		return nil
	})
}

// ClusteredIndex returns the clusteredIndex option of a collection (nil
// when it is not clustered).
func (e *Engine) ClusteredIndex(ns NS) bson.D {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.collLocked(ns); c != nil {
		return c.clustered
	}
	return nil
}

// indexByKey returns the one index of c whose key pattern is key: 27
// IndexNotFound when none has it, 181 AmbiguousIndexKeyPattern when several
// do (partial indexes may share a key pattern); the index must then be named.
func indexByKey(c *collection, key bson.D) (*index, error) {
	var found []*index
	for _, ix := range c.indexes {
		if bsonkit.Equal(ix.keys, key) && keyTypesEqual(ix.keys, key) {
			found = append(found, ix)
		}
	}
	switch len(found) {
	case 0:
		return nil, &Error{Code: CodeIndexNotFound, CodeName: "IndexNotFound", Msg: "can't find index with key: " + FormatValue(key)}
	case 1:
		return found[0], nil
	}
	return nil, &Error{Code: CodeAmbiguousIndexKeyPattern, CodeName: "AmbiguousIndexKeyPattern",
		Msg: fmt.Sprintf("index keyPattern %s matches %d indexes, must use index name. Conflicting indexes: %s, %s",
			FormatValue(key), len(found), FormatValue(specDoc(found[0].spec())), FormatValue(specDoc(found[1].spec())))}
}

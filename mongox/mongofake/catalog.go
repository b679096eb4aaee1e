package mongofake

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

func init() {
	register(
		commandSpec{names: []string{"create"}, handler: dataCommand(cmdCreate)},
		commandSpec{names: []string{"drop"}, handler: dataCommand(cmdDrop)},
		commandSpec{names: []string{"listCollections"}, handler: dataCommand(cmdListCollections)},
		commandSpec{names: []string{"listDatabases"}, handler: dataCommand(cmdListDatabases), adminOnly: true},
		commandSpec{names: []string{"dropDatabase"}, handler: dataCommand(cmdDropDatabase)},
		commandSpec{names: []string{"renameCollection"}, handler: dataCommand(cmdRenameCollection), adminOnly: true},
		commandSpec{names: []string{"dbStats", "dbstats"}, handler: dataCommand(cmdDBStats)},
		commandSpec{names: []string{"collStats"}, handler: dataCommand(cmdCollStats)},
	)
}

// explicitCreateInTxn refuses create and createIndexes in a transaction
// whose read concern is not "local": MongoDB creates collections and
// indexes explicitly only in such transactions
// (https://www.mongodb.com/docs/v7.0/core/transactions/#create-collections-and-indexes-in-a-transaction).
// The code mongod answers is not documented; this server answers 263.
func explicitCreateInTxn(r *request, tc *txnCtx) error {
	if tc.txn == nil {
		return nil
	}
	if lvl := tc.sess.txnLevel; lvl != "" && lvl != "local" {
		return errorf(263, "OperationNotSupportedInTransaction", fmt.Sprintf(
			"Cannot run '%s' in a multi-document transaction with read concern '%s': explicit creation of collections and indexes needs read concern 'local'", r.name, lvl))
	}
	return nil
}

func cmdCreate(r *request, tc *txnCtx) (bson.D, error) {
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	prePost := false
	var clustered bson.D
	var capped cappedArgs
	for i, e := range r.cmd {
		if i == 0 || genericFields[e.Key] {
			continue
		}
		switch e.Key {
		case "changeStreamPreAndPostImages":
			en, err := prePostArg("create", e.Value)
			if err != nil {
				return nil, err
			}
			prePost = en
		case "clusteredIndex":
			spec, err := clusteredArg(e.Value)
			if err != nil {
				return nil, err
			}
			clustered = spec
		case "capped", "size", "max":
			if err := capped.set(e); err != nil {
				return nil, err
			}
		case "timeseries", "viewOn", "pipeline", "encryptedFields", "validator":
			if b, ok := e.Value.(bool); ok && !b {
				continue
			}
			if e.Key == "validator" {
				if d, ok := e.Value.(bson.D); ok && len(d) == 0 {
					continue
				}
			}
			return nil, errorf(238, "NotImplemented", "mongofake: create option '"+e.Key+"' is not supported")
		case "storageEngine", "validationLevel", "validationAction", "indexOptionDefaults", "collation", "expireAfterSeconds", "autoIndexId", "idIndex", "flags":
			if e.Key == "collation" {
				if err := checkCollation(e.Value, "a collection (default collation)"); err != nil {
					return nil, err
				}
			}
		default:
			return nil, errorf(40415, "Location40415", fmt.Sprintf("BSON field 'create.%s' is an unknown field.", e.Key))
		}
	}
	opts, err := capped.options()
	if err != nil {
		return nil, err
	}
	opts.Clustered, opts.PrePostImages = clustered, prePost
	if tc.txn != nil {
		if err := explicitCreateInTxn(r, tc); err != nil {
			return nil, err
		}
		if opts.Capped {
			// mongod refuses capped collections in transactions
			// (https://www.mongodb.com/docs/v7.0/core/transactions-operations/).
			return nil, errorf(263, "OperationNotSupportedInTransaction", "Cannot create a capped collection in a multi-document transaction.")
		}
		if clustered != nil || prePost {
			return nil, errorf(238, "NotImplemented", "mongofake: create with clusteredIndex or changeStreamPreAndPostImages in a transaction is not supported")
		}
		err := r.srv.engine.Write(r.ctx, tc.txn, func(v *engine.View) error {
			if v.Exists(ns) {
				return &engine.Error{Code: engine.CodeNamespaceExists, CodeName: "NamespaceExists", Msg: "Collection " + ns.String() + " already exists."}
			}
			_, err := v.EnsureCollection(ns)
			return err
		})
		return bson.D{}, err
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	return bson.D{}, r.srv.engine.CreateCollectionWith(ctx, ns, opts)
}

// cappedArgs are create's capped, size and max fields.
type cappedArgs struct {
	capped    bool
	size, max int64
	hasSize   bool
}

// set reads one of the fields as mongod's CollectionOptions parser does:
// a non-numeric size or max is ignored, a negative max means no maximum.
func (a *cappedArgs) set(e bson.E) error {
	switch e.Key {
	case "capped":
		b, ok := e.Value.(bool)
		if !ok {
			if n, isNum := bsonkit.ToFloat64(e.Value); isNum {
				b = n != 0
			} else {
				return wrongType("create.capped", e.Value, "bool")
			}
		}
		a.capped = b
	case "size":
		n, ok := bsonkit.ToFloat64(e.Value)
		if !ok {
			return wrongType("create.size", e.Value, "long")
		}
		a.size, a.hasSize = int64(n), true
	case "max":
		n, ok := bsonkit.ToFloat64(e.Value)
		if !ok {
			return wrongType("create.max", e.Value, "long")
		}
		a.max = int64(n)
	}
	return nil
}

// options validates the capped fields and returns them as engine options.
func (a *cappedArgs) options() (engine.CollectionOptions, error) {
	if !a.capped {
		return engine.CollectionOptions{}, nil
	}
	if !a.hasSize {
		return engine.CollectionOptions{}, errorf(72, "InvalidOptions", "the 'size' field is required when 'capped' is true")
	}
	const petabyte = 1 << 50
	switch {
	case a.size < 0:
		return engine.CollectionOptions{}, errorf(2, "BadValue", "size has to be >= 0")
	case a.size > petabyte:
		return engine.CollectionOptions{}, errorf(2, "BadValue", "size cannot exceed 1 PB")
	case a.max >= 1<<31 && a.max != math.MaxInt64:
		return engine.CollectionOptions{}, errorf(2, "BadValue", "max in a capped collection has to be < 2^31 or not set")
	}
	maxDocs := a.max
	if maxDocs <= 0 || maxDocs == math.MaxInt64 {
		maxDocs = 0
	}
	// mongod rounds the size up to a multiple of 256 bytes.
	size := (a.size + 0xff) &^ 0xff
	return engine.CollectionOptions{Capped: true, CappedSize: size, CappedMax: maxDocs}, nil
}

// clusteredArg parses the clusteredIndex option, which MongoDB 5.3+ allows
// only on _id and unique: {key: {_id: 1}, unique: true, name?, v?}. It
// returns the option as listCollections reports it.
func clusteredArg(v any) (bson.D, error) {
	if b, ok := v.(bool); ok {
		if !b {
			return nil, errorf(2, "BadValue", "clusteredIndex: false is not allowed; omit the option")
		}
		return bson.D{{Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "unique", Value: true}, {Key: "name", Value: "_id_"}, {Key: "v", Value: int32(2)}}, nil
	}
	d, ok := v.(bson.D)
	if !ok {
		return nil, wrongType("create.clusteredIndex", v, "object")
	}
	name := "_id_"
	var key bson.D
	unique := false
	for _, e := range d {
		switch e.Key {
		case "key":
			key, _ = e.Value.(bson.D)
		case "unique":
			unique, _ = e.Value.(bool)
		case "name":
			s, ok := e.Value.(string)
			if !ok {
				return nil, wrongType("create.clusteredIndex.name", e.Value, "string")
			}
			name = s
		case "v":
		default:
			return nil, errorf(40415, "Location40415", "BSON field 'create.clusteredIndex."+e.Key+"' is an unknown field.")
		}
	}
	if len(key) != 1 || key[0].Key != "_id" {
		return nil, errorf(6053700, "Location6053700", "The clusteredIndex option is only supported for key: {_id: 1}")
	}
	if n, ok := wholeNumber(key[0].Value); !ok || n != 1 {
		return nil, errorf(6053700, "Location6053700", "The clusteredIndex option is only supported for key: {_id: 1}")
	}
	if !unique {
		return nil, errorf(5979700, "Location5979700", "The clusteredIndex option requires unique: true")
	}
	return bson.D{{Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "unique", Value: true}, {Key: "name", Value: name}, {Key: "v", Value: int32(2)}}, nil
}

// prePostArg parses changeStreamPreAndPostImages: {enabled: <bool>}.
func prePostArg(cmd string, v any) (bool, error) {
	d, ok := v.(bson.D)
	if !ok {
		return false, wrongType(cmd+".changeStreamPreAndPostImages", v, "object")
	}
	enabled, found := false, false
	for _, e := range d {
		if e.Key != "enabled" {
			return false, errorf(40415, "Location40415", fmt.Sprintf("BSON field '%s.changeStreamPreAndPostImages.%s' is an unknown field.", cmd, e.Key))
		}
		b, ok := e.Value.(bool)
		if !ok {
			return false, wrongType(cmd+".changeStreamPreAndPostImages.enabled", e.Value, "bool")
		}
		enabled, found = b, true
	}
	if !found {
		return false, errorf(40414, "Location40414", fmt.Sprintf("BSON field '%s.changeStreamPreAndPostImages.enabled' is missing but a required field", cmd))
	}
	return enabled, nil
}

func cmdDrop(r *request, tc *txnCtx) (bson.D, error) {
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	before := 0
	if specs, ok := r.srv.engine.ListIndexes(ns); ok {
		before = len(specs)
	}
	existed, err := r.srv.engine.DropCollection(ctx, ns)
	if err != nil {
		return nil, err
	}
	if !existed { // MongoDB 7.0 answers ok for a missing collection
		return bson.D{}, nil
	}
	return bson.D{{Key: "nIndexesWas", Value: int32(before)}, {Key: "ns", Value: ns.String()}}, nil
}

func cmdListCollections(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "filter", "nameOnly", "authorizedCollections", "cursor", "includePendingDrops"); err != nil {
		return nil, err
	}
	filter, err := r.docArg("filter")
	if err != nil {
		return nil, err
	}
	nameOnly, err := r.boolArg("nameOnly", false)
	if err != nil {
		return nil, err
	}
	m, err := query.Compile(filter)
	if err != nil {
		return nil, err
	}
	cur, _ := r.docArg("cursor")
	batchSize, hasBatch, err := batchSizeArg(cur, "cursor.batchSize")
	if err != nil {
		return nil, err
	}
	var docs []bson.D
	for _, c := range r.srv.engine.ListCollections(r.db) {
		var d bson.D
		if nameOnly {
			d = bson.D{{Key: "name", Value: c.Name}, {Key: "type", Value: "collection"}}
		} else {
			d = bson.D{
				{Key: "name", Value: c.Name},
				{Key: "type", Value: "collection"},
				{Key: "options", Value: collOptions(c)},
				{Key: "info", Value: bson.D{{Key: "readOnly", Value: false}, {Key: "uuid", Value: c.UUID}}},
				{Key: "idIndex", Value: bson.D{{Key: "v", Value: int32(2)}, {Key: "key", Value: bson.D{{Key: "_id", Value: int32(1)}}}, {Key: "name", Value: "_id_"}}},
			}
		}
		if m.Match(d) {
			docs = append(docs, d)
		}
	}
	ns := engine.NS{DB: r.db, Coll: "$cmd.listCollections"}
	return r.srv.data.firstBatch(r, tc, ns, docs, nil, batchSize, hasBatch, 0, false), nil
}

func cmdListDatabases(r *request, _ *txnCtx) (bson.D, error) {
	if err := checkFields(r, "filter", "nameOnly", "authorizedDatabases"); err != nil {
		return nil, err
	}
	filter, err := r.docArg("filter")
	if err != nil {
		return nil, err
	}
	nameOnly, err := r.boolArg("nameOnly", false)
	if err != nil {
		return nil, err
	}
	m, err := query.Compile(filter)
	if err != nil {
		return nil, err
	}
	dbs := bson.A{}
	var total int64
	list := r.srv.engine.ListDatabases()
	// A replica set member always has these.
	for _, sys := range []string{"admin", "config", "local"} {
		found := false
		for _, d := range list {
			found = found || d.Name == sys
		}
		if !found {
			list = append(list, engine.DatabaseInfo{Name: sys, Size: 40960})
		}
	}
	slices.SortFunc(list, func(a, b engine.DatabaseInfo) int { return strings.Compare(a.Name, b.Name) })
	for _, d := range list {
		doc := bson.D{{Key: "name", Value: d.Name}}
		if !nameOnly {
			size := max(d.Size, 4096)
			doc = append(doc, bson.E{Key: "sizeOnDisk", Value: size}, bson.E{Key: "empty", Value: d.Empty})
		}
		if m.Match(doc) {
			dbs = append(dbs, doc)
			total += max(d.Size, 4096)
		}
	}
	out := bson.D{{Key: "databases", Value: dbs}}
	if !nameOnly {
		out = append(out, bson.E{Key: "totalSize", Value: total}, bson.E{Key: "totalSizeMb", Value: total >> 20})
	}
	return out, nil
}

func cmdDropDatabase(r *request, tc *txnCtx) (bson.D, error) {
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	existed, err := r.srv.engine.DropDatabase(ctx, r.db)
	if err != nil {
		return nil, err
	}
	if !existed {
		return bson.D{}, nil
	}
	return bson.D{{Key: "dropped", Value: r.db}}, nil
}

func splitNS(v any, field string) (engine.NS, error) {
	s, ok := v.(string)
	i := strings.IndexByte(s, '.')
	if !ok || i <= 0 || i == len(s)-1 {
		return engine.NS{}, errorf(73, "InvalidNamespace", fmt.Sprintf("Invalid %s namespace: %v", field, v))
	}
	return engine.NS{DB: s[:i], Coll: s[i+1:]}, nil
}

func cmdRenameCollection(r *request, tc *txnCtx) (bson.D, error) {
	if err := checkFields(r, "to", "dropTarget", "stayTemp"); err != nil {
		return nil, err
	}
	from, err := splitNS(r.cmd[0].Value, "source")
	if err != nil {
		return nil, err
	}
	toV, _ := r.get("to")
	to, err := splitNS(toV, "target")
	if err != nil {
		return nil, err
	}
	dropTarget, err := r.boolArg("dropTarget", false)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := r.opCtx()
	if err != nil {
		return nil, err
	}
	defer cancel()
	return bson.D{}, r.srv.engine.RenameCollection(ctx, from, to, dropTarget)
}

func cmdDBStats(r *request, _ *txnCtx) (bson.D, error) {
	var colls, objects, size int64
	var indexes int
	for _, c := range r.srv.engine.ListCollections(r.db) {
		n, s, ni, ok := r.srv.engine.CollectionStats(engine.NS{DB: r.db, Coll: c.Name})
		if ok {
			colls++
			objects += n
			size += s
			indexes += ni
		}
	}
	avg := 0.0
	if objects > 0 {
		avg = float64(size) / float64(objects)
	}
	return bson.D{
		{Key: "db", Value: r.db},
		{Key: "collections", Value: colls},
		{Key: "views", Value: int64(0)},
		{Key: "objects", Value: objects},
		{Key: "avgObjSize", Value: avg},
		{Key: "dataSize", Value: float64(size)},
		{Key: "storageSize", Value: float64(size)},
		{Key: "indexes", Value: int64(indexes)},
		{Key: "indexSize", Value: 0.0},
		{Key: "totalSize", Value: float64(size)},
		{Key: "scaleFactor", Value: 1.0},
	}, nil
}

// keep bsonkit imported for helpers used by several files.
var _ = bsonkit.Equal

// collOptions is the options document listCollections reports.
func collOptions(c engine.CollectionInfo) bson.D {
	out := bson.D{}
	if c.Clustered != nil {
		out = append(out, bson.E{Key: "clusteredIndex", Value: c.Clustered})
	}
	if c.PrePostImages {
		out = append(out, bson.E{Key: "changeStreamPreAndPostImages", Value: bson.D{{Key: "enabled", Value: true}}})
	}
	if c.Capped {
		out = append(out, bson.E{Key: "capped", Value: true}, bson.E{Key: "size", Value: c.CappedSize})
		if c.CappedMax > 0 {
			out = append(out, bson.E{Key: "max", Value: c.CappedMax})
		}
	}
	return out
}

package mongofake

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
)

// The collection statistics of the collStats command and the $collStats
// stage (https://www.mongodb.com/docs/v7.0/reference/operator/aggregation/collStats/,
// https://www.mongodb.com/docs/v7.0/reference/command/collStats/). The
// embedded server keeps documents in memory: size is the BSON size of the
// documents, storageSize the same (no compression, no free space), and an
// index's size the BSON size of its keys. latencyStats and queryExecStats
// count nothing (the server keeps no such counters).

// storageStats returns the storageStats document of a collection, sizes
// divided by scale; ok is false when the collection does not exist.
func storageStats(r *request, tc *txnCtx, ns engine.NS, scale int64) (bson.D, bool, error) {
	info := collectionInfo(r, ns)
	if info == nil {
		return nil, false, nil
	}
	specs, _ := r.srv.engine.ListIndexes(ns)
	docs, err := allDocs(r, tc, ns)
	if err != nil {
		return nil, false, err
	}
	var size int64
	indexSizes := make([]int64, len(specs))
	for _, d := range docs {
		size += int64(bsonkit.Size(d))
		for i, s := range specs {
			indexSizes[i] += indexKeySize(d, s.Key)
		}
	}
	var totalIndex int64
	sizes := bson.D{}
	for i, s := range specs {
		totalIndex += indexSizes[i]
		sizes = append(sizes, bson.E{Key: s.Name, Value: indexSizes[i] / scale})
	}
	count := int64(len(docs))
	avg := int64(0)
	if count > 0 {
		avg = size / count
	}
	out := bson.D{
		{Key: "size", Value: size / scale},
		{Key: "count", Value: count},
		{Key: "avgObjSize", Value: avg},
		{Key: "numOrphanDocs", Value: int64(0)},
		{Key: "storageSize", Value: size / scale},
		{Key: "freeStorageSize", Value: int64(0)},
		{Key: "capped", Value: info.Capped},
	}
	if info.Capped {
		out = append(out, bson.E{Key: "max", Value: info.CappedMax}, bson.E{Key: "maxSize", Value: info.CappedSize / scale})
	}
	out = append(out,
		bson.E{Key: "nindexes", Value: int32(len(specs))},
		bson.E{Key: "indexBuilds", Value: bson.A{}},
		bson.E{Key: "totalIndexSize", Value: totalIndex / scale},
		bson.E{Key: "totalSize", Value: (size + totalIndex) / scale},
		bson.E{Key: "indexSizes", Value: sizes},
		bson.E{Key: "scaleFactor", Value: int32(scale)},
	)
	return out, true, nil
}

// collectionInfo returns the catalog entry of a collection, nil when it
// does not exist.
func collectionInfo(r *request, ns engine.NS) *engine.CollectionInfo {
	for _, c := range r.srv.engine.ListCollections(ns.DB) {
		if c.Name == ns.Coll {
			return &c
		}
	}
	return nil
}

// allDocs returns the documents of a collection the command sees, in
// natural order.
func allDocs(r *request, tc *txnCtx, ns engine.NS) ([]bson.D, error) {
	var docs []bson.D
	err := r.srv.engine.Read(r.ctx, tc.readTxn(), func(v *engine.View) error {
		var err error
		docs, err = v.Find(ns, engine.Query{})
		return err
	})
	return docs, err
}

// indexKeySize is the BSON size of a document's key in an index with the
// key pattern (one key per field; the first element stands for an array).
func indexKeySize(d bson.D, pattern bson.D) int64 {
	key := make(bson.D, 0, len(pattern))
	for _, k := range pattern {
		v, _ := bsonkit.Lookup(d, k.Key)
		if a, ok := v.(bson.A); ok && len(a) > 0 {
			v = a[0]
		}
		key = append(key, bson.E{Key: "", Value: v})
	}
	return int64(bsonkit.Size(key))
}

// scaleArg reads a scale option: a positive number, 1 when absent.
func scaleArg(v any, field string) (int64, error) {
	if v == nil {
		return 1, nil
	}
	n, ok := bsonkit.ToFloat64(v)
	if !ok {
		return 0, wrongType(field, v, "number")
	}
	if n < 1 {
		return 0, errorf(51024, "Location51024", fmt.Sprintf("BSON field '%s' value must be >= 1, actual value '%v'", field, v))
	}
	return int64(n), nil
}

func cmdCollStats(r *request, tc *txnCtx) (bson.D, error) {
	ns, err := r.ns()
	if err != nil {
		return nil, err
	}
	scaleV, _ := r.get("scale")
	st, err := scaledStorageStats(r, tc, ns, scaleV, "scale", "Collection ["+ns.String()+"] not found.")
	if err != nil {
		return nil, err
	}
	return append(bson.D{{Key: "ns", Value: ns.String()}}, st...), nil
}

// scaledStorageStats reads a scale option and returns the storage
// statistics; a missing collection fails with 26 NamespaceNotFound and the
// message notFound.
func scaledStorageStats(r *request, tc *txnCtx, ns engine.NS, scaleV any, scaleField, notFound string) (bson.D, error) {
	scale, err := scaleArg(scaleV, scaleField)
	if err != nil {
		return nil, err
	}
	st, ok, err := storageStats(r, tc, ns, scale)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errorf(26, "NamespaceNotFound", notFound)
	}
	return st, nil
}

// collStatsSource is the document a leading $collStats stage produces.
func collStatsSource(r *request, tc *txnCtx, ns engine.NS, spec any) ([]bson.D, error) {
	opts, ok := spec.(bson.D)
	if !ok {
		return nil, errorf(5447000, "Location5447000", fmt.Sprintf("$collStats must take a nested object but found: %v", spec))
	}
	out := bson.D{
		{Key: "ns", Value: ns.String()},
		{Key: "host", Value: r.srv.advertisedHost(r.conn)},
		{Key: "localTime", Value: bson.NewDateTimeFromTime(time.Now())},
	}
	for _, e := range opts {
		sub, isDoc := e.Value.(bson.D)
		if !isDoc {
			return nil, wrongType("$collStats."+e.Key, e.Value, "object")
		}
		switch e.Key {
		case "latencyStats":
			zero := bson.D{{Key: "latency", Value: int64(0)}, {Key: "ops", Value: int64(0)}}
			out = append(out, bson.E{Key: "latencyStats", Value: bson.D{
				{Key: "reads", Value: zero}, {Key: "writes", Value: zero},
				{Key: "commands", Value: zero}, {Key: "transactions", Value: zero},
			}})
		case "storageStats":
			scaleV, _ := bsonkit.Get(sub, "scale")
			st, err := scaledStorageStats(r, tc, ns, scaleV, "$collStats.storageStats.scale",
				"Unable to retrieve storageStats in $collStats stage :: caused by :: Collection ["+ns.String()+"] not found.")
			if err != nil {
				return nil, err
			}
			out = append(out, bson.E{Key: "storageStats", Value: st})
		case "count":
			st, err := scaledStorageStats(r, tc, ns, nil, "",
				"Unable to retrieve count in $collStats stage :: caused by :: Collection ["+ns.String()+"] not found.")
			if err != nil {
				return nil, err
			}
			n, _ := bsonkit.Get(st, "count")
			out = append(out, bson.E{Key: "count", Value: n})
		case "queryExecStats":
			out = append(out, bson.E{Key: "queryExecStats", Value: bson.D{{Key: "collectionScans", Value: bson.D{
				{Key: "total", Value: int64(0)}, {Key: "nonTailable", Value: int64(0)},
			}}}})
		default:
			return nil, errorf(40168, "Location40168", "unrecognized option to $collStats: "+e.Key)
		}
	}
	return []bson.D{out}, nil
}

package mongofake

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/plan"
)

// findKeys are find's returnKey and showRecordId options
// (https://www.mongodb.com/docs/v7.0/reference/command/find/): returnKey
// returns, instead of each document, the index key the query plan found
// it by ({} for a collection scan); showRecordId adds the document's
// record id as $recordId. With both, returnKey wins, as in mongod.
type findKeys struct {
	returnKey, showRecordID bool
	// keyOf maps a document's _id (bsonkit.Key) to its index key, set by
	// choose; rids maps it to the record id, set by records.
	keyOf map[string]bson.D
	rids  map[string]int64
}

func keyArgs(r *request) (findKeys, error) {
	var k findKeys
	var err error
	if k.returnKey, err = r.boolArg("returnKey", false); err != nil {
		return k, err
	}
	if k.showRecordID, err = r.boolArg("showRecordId", false); err != nil {
		return k, err
	}
	if k.returnKey {
		k.showRecordID = false
	}
	return k, nil
}

func (k *findKeys) any() bool { return k.returnKey || k.showRecordID }

func idKey(d bson.D) string {
	id, _ := bsonkit.Get(d, "_id")
	return bsonkit.Key(id)
}

// records returns the documents of recs and remembers their record ids.
func (k *findKeys) records(recs []engine.Record) []bson.D {
	k.rids = make(map[string]int64, len(recs))
	docs := make([]bson.D, len(recs))
	for i, rec := range recs {
		docs[i] = rec.Doc
		k.rids[idKey(rec.Doc)] = rec.RID
	}
	return docs
}

// choose finds the plan MongoDB's planner would choose for the query over
// the matching documents, and the index key of each document under it.
func (k *findKeys) choose(r *request, ns engine.NS, docs []bson.D, filter, sortSpec bson.D) error {
	hint, _ := r.get("hint")
	if s, ok := hint.(string); ok && s == "" {
		hint = nil
	}
	if d, ok := hint.(bson.D); ok && len(d) == 0 {
		hint = nil
	}
	p, _, err := plan.Choose(planIndexes(r, ns), docs, plan.Query{Filter: filter, Sort: sortSpec, Hint: hint})
	if err != nil {
		return err
	}
	k.keyOf = make(map[string]bson.D, len(p.Keys))
	for i, key := range p.Keys {
		k.keyOf[idKey(docs[i])] = key
	}
	return nil
}

// specialIndexType returns the type of a key pattern that is not an
// ordered index ("text", "2dsphere", "hashed"...), "" for an ordered one.
func specialIndexType(key bson.D) string {
	for _, e := range key {
		if s, ok := e.Value.(string); ok {
			return s
		}
	}
	return ""
}

// render replaces each document by its index key, or adds its record id.
// mongod ignores the projection with returnKey, and adds $recordId after
// applying it: the caller passes the projection here and no longer
// applies it.
func (k *findKeys) render(docs []bson.D, proj func(bson.D) bson.D) []bson.D {
	out := make([]bson.D, len(docs))
	for i, d := range docs {
		id := idKey(d)
		switch {
		case k.returnKey:
			out[i] = k.keyOf[id]
			if out[i] == nil {
				out[i] = bson.D{}
			}
		default:
			if proj != nil {
				d = proj(d)
			}
			out[i] = append(append(bson.D{}, d...), bson.E{Key: "$recordId", Value: k.rids[id]})
		}
	}
	return out
}

package engine

import (
	"sort"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// OpType is the kind of an oplog entry.
type OpType string

// Oplog entry kinds, named as change stream operationTypes.
const (
	OpInsert       OpType = "insert"
	OpUpdate       OpType = "update"
	OpReplace      OpType = "replace"
	OpDelete       OpType = "delete"
	OpDrop         OpType = "drop"
	OpRename       OpType = "rename"
	OpDropDatabase OpType = "dropDatabase"
	// DDL entries change streams report only with showExpandedEvents.
	OpCreate        OpType = "create"
	OpCreateIndexes OpType = "createIndexes"
	OpDropIndexes   OpType = "dropIndexes"
	OpModify        OpType = "modify"
)

// Entry is one oplog entry. Entries are ordered by (TS, TxnOpIndex); all
// entries of one commit share TS and have increasing TxnOpIndex.
type Entry struct {
	TS         bson.Timestamp
	TxnOpIndex int32
	Wall       time.Time
	Op         OpType
	NS         NS // for dropDatabase only DB is set
	To         NS // rename target
	DocKey     bson.D
	// Doc is the post-image for insert, update and replace.
	Doc    bson.D
	Update *UpdateDescription
	// Images is set for updates, replaces and deletes of a collection with
	// changeStreamPreAndPostImages enabled at the time; Pre is then the
	// document before the change.
	Images bool
	Pre    bson.D
	// UUID is the collection's UUID (collectionUUID of expanded events).
	UUID bson.Binary
	// Desc is the operationDescription of DDL entries (create,
	// createIndexes, dropIndexes, modify, rename).
	Desc bson.D
	// LSID and TxnNumber are set for entries of multi-document transactions.
	LSID      bson.D
	TxnNumber *int64
}

// Position is a point in the oplog: entries strictly after it are read.
type Position struct {
	TS    bson.Timestamp
	Index int64 // TxnOpIndex; -1 means "before every entry of TS"
}

// before reports whether position p lies strictly before entry e.
func (p Position) before(e *Entry) bool {
	if c := bsonkit.CompareTimestamps(e.TS, p.TS); c != 0 {
		return c > 0
	}
	return int64(e.TxnOpIndex) > p.Index
}

func (p Position) less(q Position) bool {
	if c := bsonkit.CompareTimestamps(p.TS, q.TS); c != 0 {
		return c < 0
	}
	return p.Index < q.Index
}

// oplogChunk is the number of entries per chunk of the oplog. Entries are
// large structs: kept in fixed chunks, appending never copies the entries
// already held (a single growing slice did, and with a 100,000-entry bound
// that copying was the engine's largest cost per write).
const oplogChunk = 256

// oplog holds the retained entries, oldest first, in chunks of oplogChunk
// entries: chunks[0][head:] then the later chunks; every chunk but the last
// is full.
type oplog struct {
	max       int
	chunks    [][]Entry
	head      int       // retained entries start at chunks[0][head]
	n         int       // number of retained entries
	truncated *Position // position of the newest dropped entry
	initiated time.Time // when the engine started: the replica set's first oplog entry (see OplogHeads)
	signal    chan struct{}
}

func (o *oplog) init(max int) {
	o.max = max
	o.signal = make(chan struct{})
}

// at returns the i-th retained entry (0 is the oldest).
func (o *oplog) at(i int) *Entry {
	i += o.head
	return &o.chunks[i/oplogChunk][i%oplogChunk]
}

func (o *oplog) push(e Entry) {
	if k := len(o.chunks); k == 0 || len(o.chunks[k-1]) == oplogChunk {
		o.chunks = append(o.chunks, make([]Entry, 0, oplogChunk))
	}
	last := &o.chunks[len(o.chunks)-1]
	*last = append(*last, e)
	o.n++
}

// dropOldest drops the k oldest retained entries.
func (o *oplog) dropOldest(k int) {
	last := o.at(k - 1)
	o.truncated = &Position{TS: last.TS, Index: int64(last.TxnOpIndex)}
	for k > 0 {
		c := o.chunks[0]
		m := min(k, len(c)-o.head)
		clear(c[o.head : o.head+m])
		o.head += m
		o.n -= m
		k -= m
		if o.head == oplogChunk {
			o.chunks[0] = nil
			o.chunks = o.chunks[1:]
			o.head = 0
		}
	}
}

// appendOplog appends entries and wakes readers. Caller holds e.mu.
func (e *Engine) appendOplog(es []Entry) {
	if len(es) == 0 {
		return
	}
	o := &e.oplog
	for i := range es {
		o.push(es[i])
	}
	if o.n > o.max {
		o.dropOldest(o.n - o.max)
	}
	close(o.signal)
	o.signal = make(chan struct{})
}

// ReadOplog returns up to max (0: all) retained entries after position p,
// a channel that closes when a newer entry is appended, and the cluster
// time at the read: when the result is not cut by max, every entry up to
// that time has been returned. It returns ErrHistoryLost when entries
// after p have been dropped from the bounded oplog.
func (e *Engine) ReadOplog(p Position, max int) ([]Entry, <-chan struct{}, bson.Timestamp, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := &e.oplog
	if o.truncated != nil && p.less(*o.truncated) {
		return nil, o.signal, e.last, ErrHistoryLost
	}
	i := sort.Search(o.n, func(i int) bool { return p.before(o.at(i)) })
	n := o.n - i
	if max > 0 && n > max {
		n = max
	}
	if n <= 0 {
		return nil, o.signal, e.last, nil
	}
	out := make([]Entry, n)
	for j := range out {
		out[j] = *o.at(i + j)
	}
	return out, o.signal, e.last, nil
}

// OplogStart returns the position of the oldest retained entry (just
// before it), or the current cluster time when the oplog is empty.
func (e *Engine) OplogStart() Position {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := &e.oplog
	if o.n > 0 {
		f := o.at(0)
		return Position{TS: f.TS, Index: int64(f.TxnOpIndex) - 1}
	}
	return Position{TS: e.last, Index: 1<<31 - 1}
}

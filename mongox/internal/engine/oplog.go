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

type oplog struct {
	max       int
	entries   []Entry // entries[head:] are retained
	head      int
	truncated *Position // position of the newest dropped entry
	signal    chan struct{}
}

func (o *oplog) init(max int) {
	o.max = max
	o.signal = make(chan struct{})
}

// appendOplog appends entries and wakes readers. Caller holds e.mu.
func (e *Engine) appendOplog(es []Entry) {
	if len(es) == 0 {
		return
	}
	o := &e.oplog
	o.entries = append(o.entries, es...)
	if n := len(o.entries) - o.head; n > o.max {
		drop := n - o.max
		last := o.entries[o.head+drop-1]
		o.truncated = &Position{TS: last.TS, Index: int64(last.TxnOpIndex)}
		clear(o.entries[o.head : o.head+drop])
		o.head += drop
		if o.head > len(o.entries)/2 && o.head > 1024 {
			o.entries = append([]Entry(nil), o.entries[o.head:]...)
			o.head = 0
		}
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
	live := o.entries[o.head:]
	i := sort.Search(len(live), func(i int) bool { return p.before(&live[i]) })
	out := live[i:]
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return append([]Entry(nil), out...), o.signal, e.last, nil
}

// OplogStart returns the position of the oldest retained entry (just
// before it), or the current cluster time when the oplog is empty.
func (e *Engine) OplogStart() Position {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := &e.oplog
	if len(o.entries) > o.head {
		f := o.entries[o.head]
		return Position{TS: f.TS, Index: int64(f.TxnOpIndex) - 1}
	}
	return Position{TS: e.last, Index: 1<<31 - 1}
}

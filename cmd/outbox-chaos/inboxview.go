package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// The harness's one view of the inbox's storage: every read of an inbox
// document's state (handled, purged, parked, held) goes through this file,
// so that a change of how the framework stores parked and held events is
// followed here alone. Where the public Admin API serves (ParkedEvents with
// its State, StoreStatus), it is used instead of the storage.
//
// Held events are stored today as parked documents with held_by (the head
// of their chain); the consumer rebuild (issue 20) stores a key's parked
// and held events as one sequence whose waiting members carry held: true.
// isHeld reads both.

// inboxState is the state of one event's inbox document.
type inboxState int

const (
	inboxAbsent    inboxState = iota // no document: not delivered yet
	inboxFailing                     // attempts noted, neither handled nor parked: being retried
	inboxParked                      // parked on its own: the head of its key
	inboxHeld                        // parked behind an earlier parked event of its key
	inboxHandled                     // handled: its handler's transaction committed
	inboxDiscarded                   // purged by an operator (handled without its handler)
)

func (s inboxState) String() string {
	switch s {
	case inboxAbsent:
		return "absent"
	case inboxFailing:
		return "failing"
	case inboxParked:
		return "parked"
	case inboxHeld:
		return "held"
	case inboxHandled:
		return "handled"
	case inboxDiscarded:
		return "purged"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// settled reports whether the state is final: handled or purged. A key's
// later events may be handled only once every earlier one is settled.
func (s inboxState) settled() bool { return s == inboxHandled || s == inboxDiscarded }

// waiting reports whether the state is parked or held: the key's later
// events must be held.
func (s inboxState) waiting() bool { return s == inboxParked || s == inboxHeld }

// inboxFields are the fields of an inbox document the harness reads (never
// the payload).
type inboxFields struct {
	store.InboxRecord[outbox.InboxID] `bson:",inline"`
	// Held marks held events in a layout where a flag, not the head's id
	// (HeldBy), says so; the harness accepts both.
	Held bool `bson:"held"`
}

// inboxHeldFlag is the field of Held.
const inboxHeldFlag = "held"

// inboxTracked are the inbox fields inboxFields reads, for projections and
// for following updates in the change stream.
var inboxTracked = []string{store.InboxHandled, store.InboxParked, store.InboxHeldBy, inboxHeldFlag, store.InboxDiscardedAt,
	store.InboxPartition, store.InboxOffset, store.InboxPartitionKey, store.InboxLastError, store.InboxParkReason}

// isHeld reports whether a parked document waits behind an earlier parked
// event of its key.
func (f *inboxFields) isHeld() bool {
	return f.Held || f.HeldBy != nil
}

// state derives the document's state.
func (f *inboxFields) state() inboxState {
	switch {
	case f.Handled && f.DiscardedAt != nil:
		return inboxDiscarded
	case f.Handled:
		return inboxHandled
	case f.Parked && f.isHeld():
		return inboxHeld
	case f.Parked:
		return inboxParked
	}
	return inboxFailing
}

// apply folds a change stream event's updateDescription into f.
func (f *inboxFields) apply(updated bson.Raw, removed []string) error {
	set := bson.D{}
	for _, name := range inboxTracked {
		if v, err := updated.LookupErr(name); err == nil {
			set = append(set, bson.E{Key: name, Value: v})
		}
	}
	for _, name := range removed {
		switch name {
		case store.InboxHandled:
			f.Handled = false
		case store.InboxParked:
			f.Parked = false
		case store.InboxHeldBy:
			f.HeldBy = nil
		case inboxHeldFlag:
			f.Held = false
		case store.InboxDiscardedAt:
			f.DiscardedAt = nil
		case store.InboxLastError:
			f.LastError = ""
		case store.InboxParkReason:
			f.ParkReason = ""
		}
	}
	if len(set) == 0 {
		return nil
	}
	raw, err := bson.Marshal(set)
	if err != nil {
		return err
	}
	// Unmarshal overwrites only the fields present.
	return bson.Unmarshal(raw, f)
}

// inboxProjection leaves the payload out of the harness's inbox reads.
func inboxProjection() bson.D {
	p := bson.D{{Key: store.InboxID, Value: 1}}
	for _, name := range inboxTracked {
		p = append(p, bson.E{Key: name, Value: 1})
	}
	return p
}

// readInbox reads every inbox document's tracked fields.
func (h *harness) readInbox(ctx context.Context) (map[outbox.InboxID]*inboxFields, error) {
	var docs []inboxFields
	if err := h.findAll(ctx, "inbox", bson.D{}, inboxProjection(), &docs); err != nil {
		return nil, err
	}
	out := make(map[outbox.InboxID]*inboxFields, len(docs))
	for i := range docs {
		out[docs[i].ID] = &docs[i]
	}
	return out, nil
}

// inboxStateOf reads one event's state now.
func (h *harness) inboxStateOf(ctx context.Context, id outbox.InboxID) (inboxState, error) {
	var f inboxFields
	err := h.db.Collection("inbox").FindOne(ctx, bson.D{{Key: store.InboxID, Value: id}},
		options.FindOne().SetProjection(inboxProjection())).Decode(&f)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return inboxAbsent, nil
	}
	if err != nil {
		return inboxAbsent, err
	}
	return f.state(), nil
}

// parkedNow lists the parked events, held ones included (Admin API).
func (h *harness) parkedNow(ctx context.Context, admin *outbox.Admin) ([]outbox.ParkedEvent, error) {
	return admin.ParkedEvents(ctx, outbox.ParkedFilter{})
}

// parkedIsHeld reports whether a listed parked event is held.
func parkedIsHeld(p *outbox.ParkedEvent) bool { return p.State == outbox.ParkedStateHeld }

// describeKey lists the parked and held inbox documents of a key, oldest
// first, for a FAIL line.
func (h *harness) describeKey(ctx context.Context, topic string, partition int32, key string) string {
	var docs []inboxFields
	err := h.findAll(ctx, "inbox", bson.D{{Key: store.InboxIDTopic, Value: topic}, {Key: store.InboxPartition, Value: partition},
		{Key: store.InboxPartitionKey, Value: key}, {Key: store.InboxParked, Value: true}}, inboxProjection(), &docs)
	if err != nil {
		return fmt.Sprintf("unreadable: %v", err)
	}
	parts := make([]string, 0, len(docs))
	for _, d := range docs {
		parts = append(parts, fmt.Sprintf("%s@%d %s (%q)", d.ID.IdempotencyKey, d.Offset, d.state(), d.LastError))
	}
	return "parked of the key: [" + strings.Join(parts, ", ") + "]"
}

// isMalformedID reports whether an inbox document is a malformed
// record's: the harness gives them the idempotency key "malformed-N", and
// the framework invents "malformed:<partition>:<offset>" for one without.
func isMalformedID(id outbox.InboxID) bool { return strings.HasPrefix(id.IdempotencyKey, "malformed") }

// isMalformedKey reports whether a partition key is a malformed record's
// own unique key (not a workload key).
func isMalformedKey(key string) bool { return strings.HasPrefix(key, "malformed") }

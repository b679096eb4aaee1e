package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/claimcheck"
	"github.com/event-outbox/outbox/internal/store"
)

// The claim check (-claim-check): the replicas store payloads of at least
// claimThreshold bytes out of band, and about claimRatio of the
// transactions pad one event to claimPad. Pause storms' events (stormPad)
// go out of band too.
const (
	claimThreshold = 32 << 10
	claimPad       = 40 << 10
	claimRatio     = 0.05
)

// claimCheckOf is the replicas' Config.ClaimCheck: on the run's database.
func claimCheckOf(on bool) *outbox.ClaimCheck {
	if !on {
		return nil
	}
	return &outbox.ClaimCheck{Threshold: claimThreshold}
}

// padSum is the digest of a pad, "" for none: the ledger keeps the
// recorded one, each effect the one its handler saw.
func padSum(pad string) string {
	if pad == "" {
		return ""
	}
	s := sha256.Sum256([]byte(pad))
	return hex.EncodeToString(s[:8])
}

// claimFacts is what judgeClaims reads.
type claimFacts struct {
	// Recorded are the committed padded step events: id -> recorded digest.
	Recorded map[string]string
	// Seen are the digests their handlers saw, by event (one per effect).
	Seen map[string][]string
	// OutOfBand counts the payload chunks in outbox_payloads (0 without the
	// claim check, or when none went out of band).
	OutOfBand int64
	// On reports -claim-check.
	On bool
	// Scheduled are the padded scheduled events (-scheduled with
	// -claim-check), whose payload waited out of band for their due time;
	// ScheduledOn reports -scheduled.
	Scheduled   map[string]bool
	ScheduledOn bool
}

// judgeClaims fails on a padded event handled with another payload than
// the one recorded (payload-mismatch): an event whose payload went out of
// band must reach its handler whole. With -claim-check it also fails when
// no payload went out of band (claim-unexercised): the rule would then
// judge nothing; with -scheduled too, when no padded scheduled event was
// handled (claim-scheduled-unexercised): the two features would not have
// crossed. It returns how many padded events were judged, and how many of
// those were scheduled ones.
func judgeClaims(f *claimFacts, v *verdict) (n, scheduled int) {
	for id, want := range f.Recorded {
		for _, got := range f.Seen[id] {
			n++
			if f.Scheduled[id] {
				scheduled++
			}
			if got != want {
				v.fail("payload-mismatch", "padded event %s handled with a payload of digest %q, recorded %q", id, got, want)
			}
		}
	}
	if f.On && f.OutOfBand == 0 {
		v.fail("claim-unexercised", "-claim-check: no payload went out of band (outbox_payloads is empty)")
	}
	if f.On && f.ScheduledOn && scheduled == 0 {
		v.fail("claim-scheduled-unexercised", "-claim-check -scheduled: no padded scheduled event was handled")
	}
	return n, scheduled
}

// checkClaims gathers the facts of judgeClaims from the ledger and the
// effects.
func (h *harness) checkClaims(ctx context.Context, byID map[string]*ledgerEntry, v *verdict) (n, scheduled int, err error) {
	f := &claimFacts{Recorded: map[string]string{}, Seen: map[string][]string{}, On: h.env.claimCheck,
		Scheduled: map[string]bool{}, ScheduledOn: h.cfg.scheduled}
	for id, e := range byID {
		if e.PadSum != "" {
			f.Recorded[id] = e.PadSum
			if e.Kind == kindScheduled {
				f.Scheduled[id] = true
			}
		}
	}
	var effects []struct {
		Event  string `bson:"event"`
		PadSum string `bson:"pad_sum"`
	}
	if err := h.findAll(ctx, collEffects, bson.D{{Key: "pad_sum", Value: bson.D{{Key: "$exists", Value: true}}}},
		bson.D{{Key: "event", Value: 1}, {Key: "pad_sum", Value: 1}}, &effects); err != nil {
		return 0, 0, err
	}
	for _, e := range effects {
		if _, ok := f.Recorded[e.Event]; ok {
			f.Seen[e.Event] = append(f.Seen[e.Event], e.PadSum)
		}
	}
	chunks, err := h.db.Collection(store.PayloadsCollection).CountDocuments(ctx, bson.D{})
	if err != nil {
		return 0, 0, err
	}
	f.OutOfBand = chunks
	n, scheduled = judgeClaims(f, v)
	return n, scheduled, nil
}

// recordValue is the event's JSON a record carries: its value, or the
// payload its claim-check reference names, read from the run's database
// as the replicas' consumers read it.
func (h *harness) recordValue(ctx context.Context, r *kgo.Record) ([]byte, error) {
	ref, ok := claimcheck.RefOf(r)
	if !ok {
		return r.Value, nil
	}
	st := claimcheck.Store{Coll: h.db.Collection(store.PayloadsCollection)}
	return st.Resolve(ctx, ref)
}

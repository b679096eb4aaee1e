package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox"
	"github.com/event-outbox/outbox/internal/store"
)

// A migrated dataset (-migrated, issue 20's sixth defect): the run starts
// on the database a Python event-outbox service (v0.4.0) left, migrated in
// place as the README's steps say (Admin.MigrateEventOutbox), and every
// replica runs with Config.UniqueIdempotencyKeys. The library's published
// outbox documents stay until they expire; they have their identity
// inside their payload only, so a unique index on the top-level fields
// that is not partial collides on them and no replica could start. The
// run then checks (judgeMigration) that the unique index is there, unique
// and partial, that the library's documents are untouched, and that the
// duplicate recordings the load makes now and then (workload.dupRatio)
// were all refused with ErrDuplicateEvent.
//
// The unique index has a cost for the dedup check: a follow-up recorded
// twice (a handling that ran twice) fails its second transaction, so a
// double handling of a chaining step event leaves one effect. The step
// events that do not chain (-chain, 75% by default) judge dedup in full.

// legacyTopic is the library service's topic: its documents are never
// published again, and no replica consumes it.
const legacyTopic = "legacy-payments"

// legacyDocs is how many published library documents the dataset holds.
const legacyDocs = 40

// seedMigrated writes the library's dataset into the run's outbox and
// inbox collections, with the library's indexes, and migrates it.
func (h *harness) seedMigrated(ctx context.Context) error {
	outboxColl, inbox := h.db.Collection("outbox"), h.db.Collection("inbox")
	published := time.Now().UTC().Add(-time.Minute)
	docs := make([]any, legacyDocs)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "payload", Value: bson.D{
			{Key: "topic", Value: legacyTopic}, {Key: "content_schema", Value: "PaymentRequested"},
			{Key: "partition_key", Value: int32(i)}, {Key: "idempotency_key", Value: fmt.Sprintf("lib-%d", i)},
			{Key: "occurred_at", Value: "2026-01-02T03:04:05.123456Z"}, {Key: "amount", Value: 12.5}}},
			{Key: store.OutboxPublished, Value: true}, {Key: store.OutboxPublishedAt, Value: published}}
	}
	if _, err := outboxColl.InsertMany(ctx, docs); err != nil {
		return fmt.Errorf("migrated dataset: %w", err)
	}
	libID := func(k string) bson.D {
		return bson.D{{Key: "topic", Value: legacyTopic}, {Key: "content_schema", Value: "PaymentRequested"}, {Key: "idempotency_key", Value: k}}
	}
	if _, err := inbox.InsertMany(ctx, []any{
		bson.D{{Key: store.InboxID, Value: libID("lib-handled")}, {Key: store.InboxHandled, Value: true}, {Key: store.InboxHandledAt, Value: published}},
		bson.D{{Key: store.InboxID, Value: libID("lib-handled-2")}, {Key: store.InboxHandled, Value: true}, {Key: store.InboxHandledAt, Value: published}},
	}); err != nil {
		return fmt.Errorf("migrated dataset: %w", err)
	}
	if _, err := outboxColl.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: store.LibraryIdempotencyKeys(), Options: options.Index().SetName(store.LibraryIdempotencyIndex).SetUnique(true)},
		{Keys: bson.D{{Key: store.OutboxPublishedAt, Value: 1}}, Options: options.Index().SetName("expiration").
			SetPartialFilterExpression(bson.D{{Key: store.OutboxPublished, Value: true}}).SetExpireAfterSeconds(86400)},
	}); err != nil {
		return fmt.Errorf("migrated dataset: library indexes: %w", err)
	}
	rep, err := outbox.NewAdmin(h.db, "outbox", "inbox").MigrateEventOutbox(ctx, map[string]int{legacyTopic: 3}, false)
	if err != nil {
		return fmt.Errorf("migrated dataset: MigrateEventOutbox: %w", err)
	}
	h.logf("migrated dataset: %d published library documents, dropped %v, %d inbox documents unparked",
		legacyDocs, rep.DroppedIndexes, rep.InboxNotParked)
	return nil
}

// migrationFacts are what judgeMigration judges.
type migrationFacts struct {
	// Index is the outbox's outbox_idempotency index as listIndexes shows
	// it (nil when missing).
	Index bson.M
	// LegacyLeft counts the library's documents still as they were
	// (published, without a top-level topic).
	LegacyLeft int64
	// DupRefused and DupRecorded count the duplicate recordings refused
	// with ErrDuplicateEvent, and committed.
	DupRefused, DupRecorded int64
}

// judgeMigration fails (migrated) when the unique index of
// Config.UniqueIdempotencyKeys is missing, not unique or not partial, when
// a library document was changed or lost, or when a duplicate recording
// was committed. It returns the refused duplicates.
func judgeMigration(f *migrationFacts, v *verdict) int64 {
	switch {
	case f.Index == nil:
		v.fail("migrated", "the outbox has no outbox_idempotency index: Config.UniqueIdempotencyKeys did not take effect")
	case f.Index["unique"] != true:
		v.fail("migrated", "the outbox_idempotency index is not unique: %v", f.Index)
	case f.Index["partialFilterExpression"] == nil:
		v.fail("migrated", "the outbox_idempotency index is not partial: the library's documents would collide in it: %v", f.Index)
	}
	if f.LegacyLeft != legacyDocs {
		v.fail("migrated", "%d of the %d published library documents left as they were", f.LegacyLeft, legacyDocs)
	}
	if f.DupRecorded > 0 {
		v.fail("migrated", "%d duplicate recordings committed, although Config.UniqueIdempotencyKeys must refuse them", f.DupRecorded)
	}
	return f.DupRefused
}

// migrationFacts reads the facts of the migrated dataset.
func (h *harness) migrationFacts(ctx context.Context) (*migrationFacts, error) {
	f := &migrationFacts{DupRefused: h.work.dupRefused.Load(), DupRecorded: h.work.dupRecorded.Load()}
	cur, err := h.db.Collection("outbox").Indexes().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox indexes: %w", err)
	}
	var ixs []bson.M
	if err := cur.All(ctx, &ixs); err != nil {
		return nil, fmt.Errorf("outbox indexes: %w", err)
	}
	for _, ix := range ixs {
		if ix["name"] == store.IndexOutboxIdempotency {
			f.Index = ix
		}
	}
	f.LegacyLeft, err = h.db.Collection("outbox").CountDocuments(ctx, bson.D{{Key: "payload.topic", Value: legacyTopic},
		{Key: store.OutboxPublished, Value: true}, {Key: store.OutboxTopic, Value: bson.D{{Key: "$exists", Value: false}}}})
	if err != nil {
		return nil, fmt.Errorf("library documents: %w", err)
	}
	return f, nil
}

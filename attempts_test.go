package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/mongofake"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

// keyed is an envelope of ordersTopic with its own partition key.
func (b *bundle) keyed(id, key string) Envelope {
	env := b.envelope(id)
	env.PartitionKey = key
	return env
}

// A handler that outlives the transaction lifetime gets NoSuchTransaction at
// its commit, and that counts as an attempt: otherwise it would run for ever
// and the next event would wait for ever.
func TestSlowHandlerOutlivingTransactionIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(300*time.Millisecond)))
	if b.mongo.Real {
		t.Skip("needs the embedded server's short transaction lifetime")
	}
	cfg := consumerConfig(b, "slow")
	cfg.MaxAttempts = 3
	cfg.HandlerTimeout = 20 * time.Second
	c := b.client(t, cfg)
	var slowRuns atomic.Int64
	var sawDeadline atomic.Bool
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.OrderID == "slow" {
			slowRuns.Add(1)
			if d, ok := ctx.Deadline(); ok && time.Until(d) <= cfg.HandlerTimeout {
				sawDeadline.Store(true)
			}
			// Ignores ctx, as careless handlers do, and writes nothing: the
			// commit is what fails.
			time.Sleep(600 * time.Millisecond)
			return nil
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	start(t, c)
	b.produce(t, b.keyed("slow-1", "a"), b.payload(t, "slow", 0))
	b.produce(t, b.keyed("next-1", "b"), b.payload(t, "fast", 1))
	eventually(t, "the event after the slow one handled", func() bool {
		return count(t, effects, bson.D{{Key: "key", Value: "next-1"}}) == 1
	})
	eventually(t, "the slow one parked", func() bool { return count(t, c.inbox, bson.D{{Key: "parked", Value: true}}) == 1 })
	parked, err := c.Admin().ParkedEvents(context.Background(), ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, "slow-1", parked[0].ID.IdempotencyKey)
	require.EqualValues(t, 3, parked[0].Attempts)
	require.Contains(t, parked[0].LastError, "transaction failed after the handler returned")
	// One run per attempt, and a few more at most: a failure whose
	// recording itself fails (its transaction outlives the 300 ms lifetime
	// on a loaded machine) leaves that run uncounted and the event runs
	// again (stages.go, failure); 4 runs seen once under go test -race ./...
	// beside a chaos run.
	require.GreaterOrEqual(t, slowRuns.Load(), int64(3), "one run per attempt")
	require.LessOrEqual(t, slowRuns.Load(), int64(6), "runs not counted as attempts stay few")
	require.True(t, sawDeadline.Load(), "the handler's context has a deadline within HandlerTimeout")
	require.Zero(t, count(t, effects, bson.D{{Key: "key", Value: "slow-1"}}))
}

// A revoke or a shutdown does not wait for the retries of a handler that
// outlives its transactions (the driver retries such a transaction for up to
// 120 s, past the 30 s drain).
func TestShutdownDoesNotWaitForSlowHandlerRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, mongotest.ServerOptions(mongofake.TransactionLifetime(300*time.Millisecond)))
	if b.mongo.Real {
		t.Skip("needs the embedded server's short transaction lifetime")
	}
	cfg := consumerConfig(b, "slowstop")
	cfg.MaxAttempts = 1000
	c := b.client(t, cfg)
	var runs atomic.Int64
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		runs.Add(1)
		time.Sleep(400 * time.Millisecond)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	b.produce(t, b.envelope("slow"), b.payload(t, "slow", 0))
	eventually(t, "two runs", func() bool { return runs.Load() >= 2 })
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second): // the drain alone lasts 30 s
		t.Fatal("Run waited for the handler's transaction retries")
		<-done
	}
}

// Attempts are read back from the inbox. A partition that moved after two
// failed attempts (or whose owners crashed during them) gets one attempt left,
// not MaxAttempts new ones.
func TestStoredAttemptsCountAcrossOwners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := consumerConfig(b, "owners")
	cfg.MaxAttempts = 3
	cfg.HandleBatchSize = 1 // a rolled-back batch would run the handler once more
	c := b.client(t, cfg)
	ctx := context.Background()
	// Two earlier attempts, as two owners that noted a failure leave them.
	// (Runs that ended without a result, counted in attempts only, do not
	// use up MaxAttempts: internal/consume's
	// TestWorkerUnfinishedRunsDoNotUseUpFailures.)
	env := b.keyed("moved", "m")
	_, err := c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: inboxIDOf(&env)}, {Key: "handled", Value: false},
		{Key: "parked", Value: false}, {Key: "attempts", Value: int32(2)}, {Key: "failures", Value: int32(2)},
		{Key: "partition", Value: int32(0)}, {Key: "partition_key", Value: "m"}})
	require.NoError(t, err)
	// And one whose earlier owners crashed MaxAttempts times: it is parked
	// without running again.
	env2 := b.keyed("crasher", "x")
	_, err = c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: inboxIDOf(&env2)}, {Key: "handled", Value: false},
		{Key: "parked", Value: false}, {Key: "attempts", Value: int32(3)}, {Key: "partition", Value: int32(0)}, {Key: "partition_key", Value: "x"}})
	require.NoError(t, err)
	var runs atomic.Int64
	var crasherRuns atomic.Int64
	effects := b.db.Collection("effects")
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		switch e.OrderID {
		case "moved":
			runs.Add(1)
			return errors.New("still failing")
		case "crasher":
			crasherRuns.Add(1)
		}
		_, err := effects.InsertOne(ctx, bson.D{{Key: "key", Value: m.IdempotencyKey}})
		return err
	})
	b.produce(t, env2, b.payload(t, "crasher", 0))
	b.produce(t, env, b.payload(t, "moved", 1))
	b.produce(t, b.keyed("after", "y"), b.payload(t, "after", 2))
	start(t, c)
	eventually(t, "the event after them handled", func() bool {
		return count(t, effects, bson.D{{Key: "key", Value: "after"}}) == 1
	})
	require.Zero(t, crasherRuns.Load(), "its attempts were used up by the crashes")
	require.EqualValues(t, 1, runs.Load(), "two of three attempts were used before")
	parked, err := c.Admin().ParkedEvents(ctx, ParkedFilter{})
	require.NoError(t, err)
	require.Len(t, parked, 2)
	byKey := map[string]ParkedEvent{}
	for _, p := range parked {
		byKey[p.ID.IdempotencyKey] = p
	}
	require.EqualValues(t, 3, byKey["moved"].Attempts)
	require.EqualValues(t, 3, byKey["moved"].Failures)
	require.Contains(t, byKey["moved"].LastError, "still failing")
	require.Contains(t, byKey["crasher"].LastError, ErrAttemptsExhausted.Error())
}

// An unhandled inbox document without a parked field (the Python event-outbox
// library writes none) is not parked: the event is handled, not skipped.
func TestClaimHonoursInboxDocumentWithoutParkedField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "py"))
	env := b.envelope("from-python")
	_, err := c.inbox.InsertOne(context.Background(), bson.D{{Key: "_id", Value: inboxIDOf(&env)}, {Key: "handled", Value: false}})
	require.NoError(t, err)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	start(t, c)
	b.produce(t, env, b.payload(t, "o-1", 0))
	b.produce(t, b.envelope("next"), b.payload(t, "o-2", 1))
	effects := b.db.Collection("effects")
	eventually(t, "both handled", func() bool { return count(t, effects, bson.D{}) == 2 })
	require.EqualValues(t, 1, count(t, c.inbox, bson.D{{Key: "_id", Value: inboxIDOf(&env)}, {Key: "handled", Value: true}}))
}

// A parked event redelivered as the first record after an assignment (whose
// attempt is counted before it runs) is skipped, untouched.
func TestParkedEventFirstAfterAssignmentIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, consumerConfig(b, "first"))
	ctx := context.Background()
	env := b.keyed("parked-1", "p")
	_, err := c.inbox.InsertOne(ctx, bson.D{{Key: "_id", Value: inboxIDOf(&env)}, {Key: "handled", Value: false},
		{Key: "parked", Value: true}, {Key: "attempts", Value: int32(10)}, {Key: "partition", Value: int32(0)}, {Key: "partition_key", Value: "p"}})
	require.NoError(t, err)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	b.produce(t, env, b.payload(t, "o-1", 0))
	b.produce(t, b.keyed("next", "q"), b.payload(t, "o-2", 1))
	start(t, c)
	eventually(t, "next handled", func() bool { return count(t, b.db.Collection("effects"), bson.D{}) == 1 })
	require.EqualValues(t, 1, calls.Load())
	var doc inboxDoc
	require.NoError(t, c.inbox.FindOne(ctx, bson.D{{Key: "_id", Value: inboxIDOf(&env)}}).Decode(&doc))
	require.True(t, doc.Parked)
	require.EqualValues(t, 10, doc.Attempts)
}

// A handler's write that meets a write conflict (a transient transaction
// error other than NoSuchTransaction) is retried without using an attempt.
func TestHandlerWriteConflictIsFree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Real {
		t.Skip("needs the embedded server's fail points")
	}
	cfg := consumerConfig(b, "conflict")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	var calls atomic.Int64
	MustHandle(c, effectHandler(b, &calls))
	ctx := context.Background()
	require.NoError(t, failWithConflicts(ctx, b, "insert", 3))
	start(t, c)
	b.produce(t, b.envelope("wc-1"), b.payload(t, "o-1", 0))
	eventually(t, "handled", func() bool { return count(t, b.db.Collection("effects"), bson.D{}) == 1 })
	require.EqualValues(t, 4, calls.Load())
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
}

// failWithConflicts makes the embedded server answer the next times
// commands named command with a write conflict (a transient transaction
// error).
func failWithConflicts(ctx context.Context, b *bundle, command string, times int) error {
	return b.mongo.Client.Database("admin").RunCommand(ctx, bson.D{
		{Key: "configureFailPoint", Value: "failCommand"},
		{Key: "mode", Value: bson.D{{Key: "times", Value: times}}},
		{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{command}}, {Key: "errorCode", Value: 112},
			{Key: "errorLabels", Value: bson.A{"TransientTransactionError"}}}},
	}).Err()
}

// A commit that meets a write conflict (the transaction did not commit) is
// retried without using an attempt, as a handler's write that meets one:
// it is no fault of the event.
func TestWriteConflictAtCommitIsFree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if b.mongo.Real {
		t.Skip("needs the embedded server's fail points")
	}
	cfg := consumerConfig(b, "commit-conflict")
	cfg.MaxAttempts = 1
	c := b.client(t, cfg)
	var calls atomic.Int64
	effect := effectHandler(b, &calls)
	// The first run arms the fail point, so that the next three commits,
	// its own and its reruns', meet a write conflict.
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if calls.Load() == 0 {
			if err := failWithConflicts(context.Background(), b, "commitTransaction", 3); err != nil {
				return err
			}
		}
		return effect(ctx, e, m)
	})
	start(t, c)
	b.produce(t, b.envelope("cc-1"), b.payload(t, "o-1", 0))
	eventually(t, "handled", func() bool { return count(t, b.db.Collection("effects"), bson.D{}) == 1 })
	require.EqualValues(t, 4, calls.Load(), "the handler ran once per commit")
	require.Zero(t, count(t, c.inbox, bson.D{{Key: "parked", Value: true}}))
}

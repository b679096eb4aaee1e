package topicmeta

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/internal/store"
	"github.com/event-outbox/outbox/mongox/mongotest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// config returns a Config over a fresh outbox_meta collection whose Kafka
// is never reached (a closed port).
func config(t *testing.T) Config {
	t.Helper()
	db := mongotest.Start(t).DB(t)
	return Config{
		Topics:       []string{"orders", "payments"},
		KafkaTopic:   func(bare string) string { return "p." + bare },
		KafkaOptions: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")},
		Meta:         db.Collection(store.MetaCollection),
		Database:     db.Name(),
		Outbox:       "outbox",
		Log:          slog.New(slog.DiscardHandler),
	}
}

// A count is unknown until read or loaded; Get says which topic and where
// it looked, and does no I/O.
func TestGetUnknownCount(t *testing.T) {
	t.Parallel()
	cfg := config(t)
	tp := New(cfg)
	_, err := tp.Get("orders")
	require.ErrorIs(t, err, ErrPartitionsUnknown)
	require.ErrorContains(t, err, `"orders": no count stored in `+cfg.Database+".outbox_meta")
	require.Equal(t, []string{"orders", "payments"}, tp.Missing())
}

// Counts and limits applied by one replica are persisted; another one
// (here a fresh Topics) loads them before its first transaction, without
// asking Kafka, and wakes its watchers.
func TestApplyPersistsAndPrepareLoads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config(t)
	first := New(cfg)
	changed := first.Watch()
	first.Apply(ctx, map[string]int{"orders": 3, "payments": 6}, map[string]int{"orders": 300000})
	select {
	case <-changed:
	default:
		t.Fatal("a new count wakes the watchers")
	}
	stored, err := store.ReadTopicMetas(ctx, cfg.Meta, cfg.Outbox)
	require.NoError(t, err)
	require.Len(t, stored, 2)

	cfg.LookupTimeout = time.Millisecond // Kafka would be asked only for a count not stored
	second := New(cfg)
	second.Prepare(ctx)
	require.Empty(t, second.Missing())
	require.Equal(t, map[string]int{"orders": 3, "payments": 6}, second.Snapshot())
	n, ok := second.MaxMessageBytes("orders")
	require.True(t, ok)
	require.Equal(t, 300000, n)
	_, ok = second.MaxMessageBytes("payments")
	require.False(t, ok, "a limit never read stays unknown")
	require.NoError(t, second.LastFailure())
}

// Another outbox collection's counts are its own.
func TestReadTopicMetasByOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config(t)
	New(cfg).Apply(ctx, map[string]int{"orders": 3}, nil)
	other := cfg
	other.Outbox = "outbox2"
	New(other).Apply(ctx, map[string]int{"orders": 5}, nil)

	for outbox, want := range map[string]int{"outbox": 3, "outbox2": 5} {
		all, err := store.ReadTopicMetas(ctx, cfg.Meta, outbox)
		require.NoError(t, err)
		some, err := store.ReadTopicMetas(ctx, cfg.Meta, outbox, "orders", "absent")
		require.NoError(t, err)
		for _, got := range [][]store.TopicMeta{all, some} {
			require.Len(t, got, 1)
			require.Equal(t, "orders", got[0].Topic)
			require.Equal(t, want, got[0].Partitions)
		}
	}
}

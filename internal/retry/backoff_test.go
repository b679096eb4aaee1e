package retry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for n := range 10 {
		want := min(b.Min<<n, b.Max)
		for range 50 {
			d := b.Delay(n)
			require.GreaterOrEqual(t, d, want/2, "retry %d", n)
			require.LessOrEqual(t, d, want, "retry %d", n)
		}
	}
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: 100 * time.Millisecond, Max: 10 * time.Second}
	for n := -1; n < 100; n++ {
		d := b.Delay(n)
		require.GreaterOrEqual(t, d, 50*time.Millisecond, "retry %d", n)
		require.LessOrEqual(t, d, 10*time.Second, "retry %d", n)
	}
	// A Max near the largest duration must not overflow while doubling.
	huge := Backoff{Min: time.Second, Max: time.Duration(1<<63 - 1)}
	for n := range 100 {
		require.Positive(t, huge.Delay(n), "retry %d", n)
	}
	require.Zero(t, Backoff{}.Delay(3))
}

func TestSleep(t *testing.T) {
	t.Parallel()
	require.True(t, Sleep(context.Background(), nil, time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Sleep(ctx, nil, time.Hour), "an ended context cuts the sleep short")

	stop := make(chan struct{})
	close(stop)
	require.False(t, Sleep(context.Background(), stop, time.Hour), "a closed stop cuts the sleep short")
}

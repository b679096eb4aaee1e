package testkit

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBufferConcurrentWrites(t *testing.T) {
	t.Parallel()
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { fmt.Fprintf(&b, "%d\n", i) })
	}
	wg.Wait()
	require.Len(t, b.String(), 16)
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	Eventually(t, 10*time.Second, "three calls", func() bool { return n.Add(1) == 3 })
	require.EqualValues(t, 3, n.Load())
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the calling goroutine, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventuallyFailsAfterTheDeadline(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(r, 50*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	require.Equal(t, "timed out waiting for never", r.msg)
}

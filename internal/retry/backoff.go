// Package retry spaces the retries of the framework's loops: the backoff
// delays and a sleep that ends early when the loop is told to stop. The
// consumer, the publisher and the background loops of the root package
// (indexes, topic metadata, replica records, lag polling) all use it.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: Min doubled per retry up to Max, with
// jitter (a uniformly random delay between half and all of it), so that
// replicas failing together do not retry in lockstep.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the delay before retry number n, counted from 0: Delay(0)
// is about Min, Delay(1) about 2*Min, and so on up to Max. A negative n is
// taken as 0.
func (b Backoff) Delay(n int) time.Duration {
	d := b.Min
	for i := 0; i < n && d < b.Max; i++ {
		if d > b.Max/2 {
			d = b.Max // doubling would pass Max (or overflow)
			break
		}
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	if d <= 1 {
		return max(d, 0)
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits for d and reports true, or returns false as soon as ctx ends
// or stop is closed (a nil stop never closes).
func Sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
